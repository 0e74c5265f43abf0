"""The ImGui control panel: kernel switching and tunables, live timings, history plots, parameters, benchmark.

    panel = Panel(viewer, frame_log=log)    # appends its overlay; Tab hides / shows it
    panel.close()

Everything it changes goes through `panel.controller` (app.ui.controller.Controller); the panel only
draws widgets and turns their results into controller calls. Typed parameters go through the same
validation as scene files and `--set` (app.scene.set_value -> app.model.config.coerce): a rejected value is
kept in its field, which is drawn red with the reason as tooltip, and the previous value stays in effect.

Under the kernel combo, every tunable of the current kernel's record (app.engine.forces): an IntChoice or a
Choice is a combo, a FloatRange a slider (logarithmic when its spec says so; Ctrl+click types a value,
which is not clamped, so that a value outside the range is refused and drawn red like a field); a change
goes through `Controller.set_tunable`, which the record validates, and the next step uses it.

The live numbers add, when the kernel reports them, the force time per stage (`Controller.live_stages`:
a tree's keys, sort, build, moments, walk), with several devices (--gpus) one force-time bar per device
and the exchange time (`Controller.live_devices`) and, for an approximate record, the live force error
(`Controller.force_error`, app/engine/force_error.py: median, p99, interactions per body).

The top area has the Record / Stop button (V; app.render.live_recording) and, while recording,
a red dot, the elapsed time, the frames drawn and dropped; after it the path of the last file, or in red
why a recording could not start or was stopped (an unwritable directory, a full disk).

For tests and tooling the panel records, per frame, where its widgets were (`item_rects`, logical
pixels, the coordinates vispy's mouse events use) and which fields were drawn red (`red_fields`); tests
click at those places with synthesised vispy events, never by calling into the panel.

Cost: `cost_ms` is the perf_counter time of the overlay (controller bookkeeping + the ImGui frame, less
the energy monitor's read-back and a benchmark step, which are timed apart), `bridge.gpu_ms` the GL time
of its draw calls; both are shown in the panel ("System"). `nbody-live run --panel-cost` measures what
matters for the acceptance, the frame time with the panel shown vs hidden (`measure_panel_cost`).

The widgets are rebuilt on input (and the few frames after it), at most `bridge.refresh_hz` (30) times a
second otherwise; the frames between redraw the last ImGui draw lists (see imgui_bridge), so the cost
stays flat at hundreds of FPS.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from app.backends.base import INTEROP_PATH
from app.engine.forces import FloatRange, IntChoice, unread_reason
from app.engine.timing import FLOPS_PER_INTERACTION
from app.model.physics import COARSEN, INTEGRATORS, MODELS, TIMESTEPS
from app.ui.components_panel import components_section
from app.ui.controller import HISTORY_S, LIVE_WINDOW, MEDIAN_EVERY_S, Controller
from app.ui.overlay_panel import OverlayPanel
from app.ui.ranks_panel import ranks_section

log = logging.getLogger(__name__)

RED_BG = (0.55, 0.08, 0.08, 1.0)
RED_TEXT = (1.0, 0.42, 0.38, 1.0)
OK_TEXT = (0.55, 0.85, 0.55, 1.0)
WARN_TEXT = (1.0, 0.75, 0.30, 1.0)
DIM_TEXT = (0.60, 0.64, 0.70, 1.0)
FADED_TEXT = (0.32, 0.34, 0.38, 1.0)  # a legend entry for a part this path does not have now
ACCENT = (1.0, 0.62, 0.22, 1.0)
# the frame breakdown bar: (history field, label, colour)
BREAKDOWN = (("force_ms", "force", (1.00, 0.55, 0.15, 1.0)),
             ("integrate_ms", "integrate", (0.95, 0.85, 0.30, 1.0)),
             ("mapunmap_ms", "map", (0.55, 0.80, 0.95, 1.0)),
             ("draw_ms", "draw", (0.35, 0.60, 1.00, 1.0)),
             ("upload_ms", "upload", (0.65, 0.45, 0.95, 1.0)),
             ("record_ms", "record", (0.95, 0.25, 0.25, 1.0)),
             ("panel_ms", "panel", (0.45, 0.85, 0.60, 1.0)),
             ("energy_ms", "drift", (0.90, 0.45, 0.55, 1.0)),
             ("probe_ms", "error probe", (0.80, 0.60, 0.30, 1.0)),
             ("python_ms", "Python", (0.55, 0.58, 0.62, 1.0)))
FIELD_FORMAT = {"initial.n": "{:d}", "run.steps_per_frame": "{:d}", "run.frames_per_step": "{:d}"}
PRESET_KEYS_HELP = "Space pause · [ ] kernel · R reset · C camera · F fit · V record · Tab hide · Esc quit"
REC_RED = (0.92, 0.16, 0.16, 1.0)


def _slider_ends(spec: FloatRange) -> tuple[float, float]:
    """A FloatRange's slider ends. ImGui sliders are float32: an open lower end starts at the next float32
    above it, so the slider never offers a value the record refuses."""
    lo = float(np.nextafter(np.float32(spec.lo), np.float32(spec.hi))) if spec.lo_open else float(spec.lo)
    return lo, float(spec.hi)


def _slider_value(spec: FloatRange, v: float) -> float:
    """What a FloatRange slider returned, for the record to validate: a float32 rounding of an end (0.1 is
    0.100000001 in float32) is that end; anything else, a value typed beyond the ends too, as it is (a
    slider's Ctrl+click text input does not clamp), so that the record rejects it and the field turns red."""
    for end in (spec.lo, spec.hi):
        if v != end and np.float32(v) == np.float32(end) and not (spec.lo_open and end == spec.lo):
            return float(end)
    return float(v)


def _fmt_rate(x: float) -> str:
    for scale, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x:.0f}"


class Panel(OverlayPanel):
    def __init__(self, viewer, controller: Controller | None = None, frame_log=None, visible: bool = True,
                 screenshot_dir: str | Path = "out"):
        from imgui_bundle import imgui, implot

        self.implot = implot
        super().__init__(viewer, controller or Controller(viewer, frame_log), visible)
        self.field_text: dict[str, str] = {}  # what a field shows while edited or after a rejection
        self.field_errors: dict[str, str] = {}  # key -> why the typed value was rejected
        self.unread: dict[str, str] = {}  # tunable key -> why the kernel does not read it now (greyed)
        self.red_fields: set[str] = set()  # fields drawn red in the last frame
        self.shown_frames = 0
        self.screenshot_dir = Path(screenshot_dir)
        self.screenshot_with_panel = True
        self.last_screenshot: Path | None = None
        self._shot_pending = False
        self._presets: list[str] | None = None
        self._combo_rects: dict[str, tuple[float, float, float, float]] = {}  # each combo's, while closed
        self._tabs = (("Plots", self._plots_tab), ("Medians", self._median_section),
                      ("Simulation", self._sim_section), ("Benchmark", self._bench_section),
                      ("View", self._view_section), ("System", self._system_section))
        F = imgui.InputTextFlags_
        self._text_flags = int(F.enter_returns_true | F.auto_select_all | F.chars_no_blank)
        self.gl = self._gl_info()

    @staticmethod
    def _gl_info() -> dict:
        from OpenGL import GL

        def get(name):
            try:
                v = GL.glGetString(name)
                return v.decode() if isinstance(v, bytes) else str(v)
            except Exception:  # noqa: BLE001
                return "?"

        return {"renderer": get(GL.GL_RENDERER), "version": get(GL.GL_VERSION)}

    # --- the overlay (visibility, what it covers, Escape: app.ui.overlay_panel) ---------------------
    def request_screenshot(self, with_panel: bool | None = None) -> None:
        """Save what the viewer shows at the end of this frame's overlay (no second render)."""
        if with_panel is not None:
            self.screenshot_with_panel = with_panel
        self._shot_pending = True

    def draw(self, viewer) -> None:
        """The overlay: controller bookkeeping, then (when visible) one ImGui frame."""
        t0 = time.perf_counter()
        ctl = self.controller
        ctl.on_frame()
        if self._shot_pending and not (self.screenshot_with_panel and self.visible):
            self._save_screenshot()
        if self.visible:
            self.bridge.frame(self.build)
            self.shown_frames += 1
        # the energy read-back, a benchmark step and a force-error sample are features of their own
        apart = ctl.energy_ms + ctl.bench_ms + ctl.probe_ms
        self.cost_ms = max((time.perf_counter() - t0) * 1e3 - apart, 0.0)
        ctl.panel_ms = self.cost_ms
        if self._shot_pending:
            self._save_screenshot()

    def _save_screenshot(self) -> None:
        """Read the bound framebuffer (the frame as drawn so far) and write a PNG."""
        from OpenGL import GL
        from PIL import Image

        self._shot_pending = False
        x, y, w, h = (int(v) for v in GL.glGetIntegerv(GL.GL_VIEWPORT))
        GL.glPixelStorei(GL.GL_PACK_ALIGNMENT, 1)
        data = GL.glReadPixels(x, y, w, h, GL.GL_RGB, GL.GL_UNSIGNED_BYTE)
        img = np.frombuffer(data, np.uint8).reshape(h, w, 3)[::-1]
        self.screenshot_dir.mkdir(parents=True, exist_ok=True)
        path = self.screenshot_dir / f"screenshot-{time.strftime('%Y%m%d-%H%M%S')}.png"
        i = 1
        while path.exists():
            path = path.with_name(f"screenshot-{time.strftime('%Y%m%d-%H%M%S')}-{i}.png")
            i += 1
        Image.fromarray(np.ascontiguousarray(img)).save(path)
        self.last_screenshot = path
        self.controller.message = f"wrote {path}"
        log.info("wrote %s", path)

    # --- helpers (and OverlayPanel's _rect, _tooltip, _header) -----------------------------------------
    def _mono(self, text: str, color=None) -> None:
        imgui = self.imgui
        font = self.bridge.fonts.get("mono")
        if font is not None:
            imgui.push_font(font, 0.0)
        if color is None:
            imgui.text(text)
        else:
            imgui.text_colored(imgui.ImVec4(*color), text)
        if font is not None:
            imgui.pop_font()

    def _field_text(self, key: str) -> str:
        v = self.controller.current_value(key)
        fmt = FIELD_FORMAT.get(key)
        return fmt.format(int(v)) if fmt else f"{v:g}"

    def _field(self, label: str, key: str, disabled_reason: str | None = None, width: float = 150.0) -> None:
        """A typed parameter: committed on Enter or when focus leaves it; validated like the CLI."""
        from app.model import config

        imgui = self.imgui
        ctl = self.controller
        err = self.field_errors.get(key)
        text = self.field_text.get(key)
        if text is None:
            text = self._field_text(key)
        if disabled_reason:
            imgui.begin_disabled()
        if err:
            imgui.push_style_color(imgui.Col_.frame_bg, imgui.ImVec4(*RED_BG))
            imgui.push_style_color(imgui.Col_.frame_bg_hovered, imgui.ImVec4(*RED_BG))
            imgui.push_style_color(imgui.Col_.frame_bg_active, imgui.ImVec4(*RED_BG))
            self.red_fields.add(key)
        imgui.set_next_item_width(width)
        entered, new = imgui.input_text(f"{label}##{key}", text, self._text_flags)
        self._rect(key)
        active = imgui.is_item_active()
        deactivated = imgui.is_item_deactivated_after_edit()
        if err:
            imgui.pop_style_color(3)
        if disabled_reason:
            imgui.end_disabled()
            self._tooltip(disabled_reason, disabled=True)
        elif imgui.is_item_hovered(imgui.HoveredFlags_.for_tooltip):
            f = config.field_for(key)
            imgui.set_tooltip(err or f"{key}: {f.doc} ({f.describe()})")
        if active:
            self.field_text[key] = new
        if (entered or deactivated) and not disabled_reason:
            msg = ctl.set_value(key, new.strip())
            if msg:
                self.field_errors[key] = msg
                self.field_text[key] = new
            else:
                self.field_errors.pop(key, None)
                self.field_text.pop(key, None)
        elif not active and key not in self.field_errors:
            self.field_text.pop(key, None)
        if key in self.field_errors and not active:
            self._rejected(key, self._field_text(key))

    def _rejected(self, key: str, in_effect: str) -> None:
        """After a widget whose last value was refused: a red "rejected", the reason as its tooltip."""
        imgui = self.imgui
        self.red_fields.add(key)
        imgui.same_line()
        imgui.text_colored(imgui.ImVec4(*RED_TEXT), "rejected")
        self._tooltip(self.field_errors[key] + f" (in effect: {in_effect})")

    def _combo_rect(self, key: str, opened: bool) -> None:
        """Where combo `key` is drawn. While its popup is open the last item is inside the popup, so the
        combo keeps the rect it had when it was last closed."""
        if opened:
            self.item_rects[key] = self._combo_rects.get(key, (0.0, 0.0, 0.0, 0.0))
        else:
            self._rect(key)
            self._combo_rects[key] = self.item_rects[key]

    def _combo(self, label: str, key: str, choices, current, pick) -> None:
        """A combo of `choices` showing `current`; picking another calls `pick(choice)`. Items are drawn
        at `key=choice` in item_rects."""
        imgui = self.imgui
        opened = imgui.begin_combo(label, str(current))
        self._combo_rect(key, opened)
        if opened:
            for c in choices:
                clicked, _ = imgui.selectable(str(c), c == current)
                self._rect(f"{key}={c}")
                if clicked and c != current:
                    pick(c)
            imgui.end_combo()

    def _choice(self, label: str, key: str, choices, disabled_reason: str | None = None) -> None:
        imgui = self.imgui
        if disabled_reason:
            imgui.begin_disabled()
        imgui.set_next_item_width(150.0)
        self._combo(f"{label}##{key}", key, choices, self.controller.current_value(key),
                    lambda c: self.controller.set_value(key, c))
        if disabled_reason:
            imgui.end_disabled()
            self._tooltip(disabled_reason, disabled=True)

    def _tunables(self) -> None:
        """Every tunable of the current kernel's record, with the value the next step uses: IntChoice and
        Choice a combo, FloatRange a slider (logarithmic when spec.log). A change goes through the
        controller, validated by the record, and applies from the next step."""
        imgui = self.imgui
        backend = self.controller.backend
        values = backend.tunables()
        for spec in backend.tunable_specs():
            key = f"tunable:{spec.name}"
            current = values.get(spec.name, spec.default)
            unread = unread_reason(spec, values)  # greyed: the kernel does not read it at these values
            if unread:
                imgui.begin_disabled()
            imgui.set_next_item_width(150.0)
            if isinstance(spec, FloatRange):
                lo, hi = _slider_ends(spec)
                flags = imgui.SliderFlags_.no_round_to_format | (
                    imgui.SliderFlags_.logarithmic if spec.log else 0)
                red = key in self.field_errors
                if red:
                    for col in (imgui.Col_.frame_bg, imgui.Col_.frame_bg_hovered, imgui.Col_.frame_bg_active):
                        imgui.push_style_color(col, imgui.ImVec4(*RED_BG))
                changed, v = imgui.slider_float(f"{spec.name}##{key}", float(current), lo, hi, "%.4g", flags)
                self._rect(key)
                if red:
                    imgui.pop_style_color(3)
                if changed:  # dragged within the ends, or typed (Ctrl+click): the record judges it
                    self._set_tunable(key, spec.name, _slider_value(spec, v))
            else:
                options = spec.values if isinstance(spec, IntChoice) else spec.options
                self._combo(f"{spec.name}##{key}", key, options, current,
                            lambda c, key=key, name=spec.name: self._set_tunable(key, name, c))
            if unread:
                imgui.end_disabled()
                self.unread[key] = unread
            else:
                self.unread.pop(key, None)
            self._tooltip(f"{spec.name}: {spec.doc + ' ' if spec.doc else ''}({spec.describe()}, default "
                          f"{spec.default})" + (f"\n{unread}" if unread else ""), disabled=bool(unread))
            if key in self.field_errors:
                self._rejected(key, str(values.get(spec.name, spec.default)))

    def _set_tunable(self, key: str, name: str, value) -> None:
        msg = self.controller.set_tunable(name, value)
        if msg:
            self.field_errors[key] = msg
        else:
            self.field_errors.pop(key, None)

    # --- the panel -------------------------------------------------------------------------------
    def build(self) -> None:
        imgui = self.imgui
        self.red_fields = set()
        if self._begin_window("NBody Live###panel", max(imgui.get_io().display_size.y - 16, 200)):
            self._summary()
            self._kernel_section()
            self._live_section()
            if self.controller.backend.ranks > 1:
                ranks_section(self, LIVE_WINDOW)
            if imgui.begin_tab_bar("tabs"):
                for name, fn in self._tabs:
                    selected, _ = imgui.begin_tab_item(name)
                    self._rect(f"tab:{name}")
                    if selected:
                        fn()
                        imgui.end_tab_item()
                imgui.end_tab_bar()
        self._end_window()

    def _summary(self) -> None:
        imgui = self.imgui
        ctl = self.controller
        b = ctl.backend
        s = self.viewer.stats
        bold = self.bridge.fonts.get("bold")
        if bold is not None:
            imgui.push_font(bold, 20.0)
        imgui.text_colored(imgui.ImVec4(*ACCENT), f"{s.fps:6.1f} FPS")
        if bold is not None:
            imgui.pop_font()
        imgui.same_line()
        t = b.time
        imgui.text_disabled(f"  {self.viewer.scene.name}  ·  N = {b.n:,}  ·  t = {t:.3f}")
        state = "PAUSED" if self.viewer.paused else "running"
        imgui.text_colored(imgui.ImVec4(*(WARN_TEXT if self.viewer.paused else OK_TEXT)), state)
        imgui.same_line()
        imgui.text_disabled(f"·  {b.name}  ·  {b.data_path}  ·  {self.bridge.backend}")
        self._record_row()
        if ctl.message and ctl.message != ctl.view_recorder.error:  # (a recording's error is shown above)
            failed = ("failed", "unavailable", "rejected", "out of", "expected", "cannot", "must", "is not")
            color = RED_TEXT if any(w in ctl.message for w in failed) else DIM_TEXT
            imgui.push_text_wrap_pos(0.0)
            imgui.text_colored(imgui.ImVec4(*color), ctl.message)
            imgui.pop_text_wrap_pos()

    def _record_row(self) -> None:
        """The Record / Stop button (V), and while recording a red dot, elapsed time, frames, drops."""
        imgui = self.imgui
        ctl = self.controller
        vr = ctl.view_recorder
        rec = vr.recording
        dl = imgui.get_window_draw_list()
        p = imgui.get_cursor_screen_pos()
        line = imgui.get_frame_height()
        red = imgui.get_color_u32(imgui.ImVec4(*REC_RED))
        if imgui.button("     Stop (V)" if rec else "     Record (V)"):
            ctl.toggle_recording()
        self._rect("record")
        cx, cy, r = p.x + 14.0, p.y + line / 2, line * 0.26
        if rec:
            dl.add_rect_filled(imgui.ImVec2(cx - r, cy - r), imgui.ImVec2(cx + r, cy + r), red, 1.0)
        else:
            dl.add_circle_filled(imgui.ImVec2(cx, cy), r, red)
        w, h = (int(v) for v in self.viewer.physical_size)
        self._tooltip(f"V: record what the viewer draws - the particles only, without this panel - at the "
                      f"window size ({w - w % 2}x{h - h % 2}) into {vr.directory}/recording-<time>.mp4 "
                      f"(H.264, {vr.fps:g} fps sampled by wall time, the record "
                      "command's quality settings). The file is written under a hidden temporary name and "
                      "renamed when you stop (V again, or quitting). Frames the encoder cannot take are "
                      "dropped and counted; the view never waits for it.")
        imgui.same_line()
        if rec is not None:
            q = imgui.get_cursor_screen_pos()
            dot = line * 0.3
            dl.add_circle_filled(imgui.ImVec2(q.x + dot, q.y + line / 2), dot, red)
            imgui.dummy(imgui.ImVec2(2 * dot + 2, line))
            imgui.same_line()
            t = rec.elapsed
            imgui.align_text_to_frame_padding()
            imgui.text_colored(imgui.ImVec4(*REC_RED), f"REC {int(t // 60)}:{t % 60:04.1f}")
            self._rect("rec_indicator")
            imgui.same_line()
            dropped = rec.dropped
            imgui.text_colored(imgui.ImVec4(*(WARN_TEXT if dropped else DIM_TEXT)),
                               f"{rec.drawn} frames · {dropped} dropped")
            self._tooltip(f"{rec.path}\ncapture {self.viewer.stats.record_ms:.2f} ms this frame; dropped: "
                          "frames the encoder was too busy to take")
        elif vr.recordings:
            imgui.align_text_to_frame_padding()
            imgui.text_disabled(str(vr.recordings[-1].path))
            self._rect("last_recording")
            self._tooltip("the last recording")
        else:
            imgui.align_text_to_frame_padding()
            imgui.text_disabled(f"to {vr.directory}/")
        if vr.error and rec is None:
            imgui.push_text_wrap_pos(0.0)
            imgui.text_colored(imgui.ImVec4(*RED_TEXT), vr.error)
            imgui.pop_text_wrap_pos()
            self._rect("record_error")

    def _kernel_section(self) -> None:
        imgui = self.imgui
        ctl = self.controller
        cur = ctl.backend.kernel
        imgui.set_next_item_width(-1)
        opened = imgui.begin_combo("##kernel", cur, imgui.ComboFlags_.height_large)
        self._combo_rect("kernel_combo", opened)
        if opened:
            group = None
            for rec in ctl.records:
                if rec.backend != group:
                    group = rec.backend
                    imgui.separator_text(group.upper())
                reason = ctl.why_not(rec.name)
                if reason:
                    imgui.begin_disabled()
                clicked, _ = imgui.selectable(f"{rec.name}##k", rec.name == cur)
                self._rect(f"kernel:{rec.name}")
                if reason:
                    self._tooltip(f"{rec.doc}\nunavailable: {reason}", disabled=True)
                else:
                    self._tooltip(rec.doc)
                imgui.same_line(imgui.get_window_width() - 56)
                imgui.text_disabled(rec.precision)
                if reason:
                    imgui.end_disabled()
                if clicked and not reason:
                    ctl.switch_kernel(rec.name)
            imgui.end_combo()
        rec = ctl.record(cur)
        self._tooltip(rec.doc)
        imgui.push_text_wrap_pos(0.0)
        imgui.text_colored(imgui.ImVec4(*DIM_TEXT), f"{rec.doc}  [{rec.backend} · {rec.precision}]")
        imgui.pop_text_wrap_pos()
        if rec.origin:
            self._tooltip(f"{rec.doc}\nfrom: {rec.origin}\nsource: {rec.source} ({rec.entry})")
        self._tunables()

    def _live_section(self) -> None:
        imgui = self.imgui
        ctl = self.controller
        self._header("Live (median of the last frames)")
        live = ctl.live()
        host = not self.viewer.stats.data_path.startswith(INTEROP_PATH)
        cells = [("frame", live["frame_ms"], "time between two drawn frames (wall clock)"),
                 ("force", live["force_ms"], "the force kernel(s), the backend's own timer"),
                 ("integrate", live["integrate_ms"], "the integrator kernels"),
                 ("map/unmap", live["mapunmap_ms"], "mapping the GL buffers for CUDA (interop)"),
                 ("draw", live["draw_ms"], f"the particle pass on the GPU ({self.viewer.stats.draw_timer})"),
                 ("upload", live["upload_ms"],
                  "host path: read back + VBO upload" if host else "none: CUDA-GL interop"),
                 ("record", live["record_ms"], "live recording: the capture's CPU time per frame (blit "
                  "into the recorder, PBO readback, hand-over to the encoder thread); 0 when not recording"),
                 ("panel", live["panel_ms"], "this panel: bookkeeping + ImGui (CPU); the drift "
                  f"diagnostics' read-back apart: {live['energy_ms']:.2f} ms/frame"),
                 ("Python", live["python_ms"], "frame - everything measured above")]
        T = imgui.TableFlags_
        if imgui.begin_table("live", 4, T.sizing_stretch_prop | T.row_bg | T.borders_inner_v):
            for c, wgt in enumerate((1.0, 1.0, 1.0, 1.0)):
                imgui.table_setup_column(f"c{c}", imgui.TableColumnFlags_.width_stretch, wgt)
            for i, (name, ms, tip) in enumerate(cells):
                if i % 2 == 0:
                    imgui.table_next_row()
                imgui.table_next_column()
                imgui.text(name)
                self._tooltip(tip)
                imgui.table_next_column()
                self._mono(f"{ms:8.2f} ms" if ms < 1000 else f"{ms:8.0f} ms",
                           ACCENT if name == "force" else None)
            imgui.end_table()
        bold = self.bridge.fonts.get("bold")
        if bold is not None:
            imgui.push_font(bold, 0.0)
        imgui.text_colored(imgui.ImVec4(*ACCENT), f"{_fmt_rate(live['interactions_per_s'])} interactions/s")
        imgui.same_line()
        g = live["gflops"]
        imgui.text_colored(imgui.ImVec4(*ACCENT), f"  {g:,.0f} GFLOP/s" if g >= 1000 else
                           f"  {g:.1f} GFLOP/s")
        if bold is not None:
            imgui.pop_font()
        imgui.same_line()
        imgui.text_disabled("(20 flops/interaction)")
        self._stages_row()
        self._block_row()
        self._devices_rows()
        self._force_error_row()
        self._breakdown_bar(live)

    def _stages_row(self) -> None:
        """The force evaluation's split per stage (a tree: keys, sort, build, moments, walk), when the
        kernel reports one (ForceEvaluator.stage_ms -> StepTimings.extra "stage:<name>")."""
        stages = self.controller.live_stages()
        if not stages:
            return
        self.imgui.push_text_wrap_pos(0.0)  # five stages and more do not fit one line of the panel
        self._mono("force: " + " · ".join(f"{name} {ms:.2f}" for name, ms in stages.items()) + " ms")
        self.imgui.pop_text_wrap_pos()
        self._rect("stages")
        self._tooltip("the force time split per stage, ms per frame (median of the last frames), the "
                      "backend's own timer: Morton keys, sort and reorder, octree build, moments, walk")

    def _block_row(self) -> None:
        """Block time steps: the active fraction (targets walked / (N x substeps), median of the last
        frames) and the bodies per level."""
        block = self.controller.live_block()
        if block is None:
            return
        fraction, levels = block
        self.imgui.push_text_wrap_pos(0.0)
        shown = "-" if fraction != fraction else f"{100 * fraction:.1f}%"
        self._mono(f"block steps: active {shown} · levels " +
                   " ".join(f"{lv}:{int(c):,}" for lv, c in enumerate(levels) if c))
        self.imgui.pop_text_wrap_pos()
        self._rect("block")
        self._tooltip("the mean share of bodies walked per substep of the last max steps (1 = shared "
                      "steps' cost), and how many bodies step dt / 2^level at each level now")

    def _devices_rows(self) -> None:
        """Several devices (--gpus): one bar per device, its force time against the slowest one's (a
        balanced run has bars of one length), and the time the position exchange took."""
        devices, exchange_ms = self.controller.live_devices()
        if not devices:
            return
        imgui = self.imgui
        slowest = max(max(devices.values()), 1e-9)
        for name, ms in devices.items():
            imgui.progress_bar(ms / slowest, imgui.ImVec2(-1, 0), f"{name}  {ms:.2f} ms")
            self._rect(f"device:{name.split()[0]}")
            self._tooltip("this device's own clock for its share of the force, ms per frame (median of "
                          "the last frames); the shares follow each device's speed (re-balanced)")
        self._mono(f"exchange {exchange_ms:.3f} ms per frame ({len(devices)} devices)")
        self._rect("exchange")
        self._tooltip("copying each device's new positions to every other device (peer copies, NCCL or "
                      "host memory: --exchange), ms per frame")

    def _force_error_row(self) -> None:
        """An approximate kernel's live force error (app/engine/force_error.py): median and 99th percentile of
        the relative error on a random sample, and the interactions per body."""
        probe = self.controller.force_error
        if probe.note:
            self._mono(probe.note, WARN_TEXT)
            self._rect("force_error")
            return
        e = probe.latest
        if e is None:
            return
        ok = e.within_budget
        per_body = probe.interactions_per_body
        self._mono(f"error: median {e.median:.1e}  p99 {e.p99:.1e}  ·  "
                   + (f"{per_body:,.0f} inter./body" if per_body else "- inter./body"),
                   OK_TEXT if ok else WARN_TEXT if ok is False else None)
        self._rect("force_error")
        budget = f"budget p99 <= {e.budget_p99:g}" if e.budget_p99 is not None else "no p99 budget"
        self._tooltip(f"relative acceleration error |a - a_exact| / |a_exact| on {e.k:,} random bodies "
                      f"against an all-pairs sum over all {e.n:,} (resampled every {probe.interval_s:g} s "
                      f"while running; {e.ms:.1f} ms per sample); {budget}. Interactions per body: "
                      "body-body plus body-cell of the last step, per force evaluation")

    def _breakdown_bar(self, live: dict) -> None:
        """One horizontal bar: how the frame time splits between force, integrate, ..., Python."""
        imgui = self.imgui
        total = max(live["frame_ms"], sum(live[f] for f, _, _ in BREAKDOWN), 1e-9)
        width = imgui.get_content_region_avail().x
        height = 14.0
        p = imgui.get_cursor_screen_pos()
        dl = imgui.get_window_draw_list()
        x = p.x
        dl.add_rect_filled(imgui.ImVec2(p.x, p.y), imgui.ImVec2(p.x + width, p.y + height),
                           imgui.get_color_u32(imgui.ImVec4(0.15, 0.16, 0.19, 1.0)), 3.0)
        for f, _, col in BREAKDOWN:
            w = width * live[f] / total
            if w >= 0.5:
                dl.add_rect_filled(imgui.ImVec2(x, p.y), imgui.ImVec2(x + w, p.y + height),
                                   imgui.get_color_u32(imgui.ImVec4(*col)))
            x += w
        imgui.dummy(imgui.ImVec2(width, height))
        self._rect("breakdown")
        if imgui.is_item_hovered():
            imgui.set_tooltip("\n".join(f"{label:>10}: {live[f]:7.2f} ms ({100 * live[f] / total:4.1f} %)"
                                        for f, label, _ in BREAKDOWN))
        x0 = imgui.get_cursor_screen_pos().x
        right = x0 + width
        # Every part has its place in the legend, always: whether a part shows up in the median flickers
        # with timing noise (the drift read-back every few frames), and a legend that gained or lost a
        # line would move every widget below it - the tabs, the fields - under the user's pointer.
        # The parts this path has now are drawn in their colour, the others faded.
        for i, (f, label, col) in enumerate(BREAKDOWN):
            need = imgui.calc_text_size(label).x + 16
            if i:
                imgui.same_line()
                if imgui.get_cursor_screen_pos().x + need > right:
                    imgui.new_line()
            has = live[f] > 0.005 or f in ("force_ms", "python_ms")
            q = imgui.get_cursor_screen_pos()
            size = imgui.get_text_line_height() * 0.6
            top = q.y + (imgui.get_text_line_height() - size) / 2
            dl.add_rect_filled(imgui.ImVec2(q.x, top), imgui.ImVec2(q.x + size, top + size),
                               imgui.get_color_u32(imgui.ImVec4(*col[:3], 1.0 if has else 0.2)), 2.0)
            imgui.dummy(imgui.ImVec2(size + 2, imgui.get_text_line_height()))
            imgui.same_line(0, 2)
            imgui.text_colored(imgui.ImVec4(*(DIM_TEXT if has else FADED_TEXT)), label)

    def _plots_tab(self) -> None:
        self._history_section()
        self._energy_section()

    def _history_section(self) -> None:
        imgui, implot = self.imgui, self.implot
        ctl = self.controller
        self._header(f"Frame and kernel time, last {HISTORY_S:.0f} s (markers: switches)")
        t, d = ctl.history.window(HISTORY_S, ("frame_ms", "force_ms", "draw_ms"))
        if implot.begin_plot("##history", imgui.ImVec2(-1, 170)):
            implot.setup_axes("", "ms", 0, implot.AxisFlags_.auto_fit)
            implot.setup_axis_limits(implot.ImAxis_.x1, -HISTORY_S, 0.0, implot.Cond_.always)
            # kernels differ by orders of magnitude (a CPU kernel next to a GPU one): log time axis
            implot.setup_axis_scale(implot.ImAxis_.y1, implot.Scale_.log10)
            implot.setup_legend(implot.Location_.north_west,
                                implot.LegendFlags_.horizontal | implot.LegendFlags_.outside)
            if t.size:
                x = t - t[-1]
                for name, label in (("frame_ms", "frame"), ("force_ms", "force"), ("draw_ms", "draw")):
                    implot.plot_line(label, x, np.maximum(d[name], 1e-3))
                t_end = t[-1]
                marks = [m for m in ctl.markers if m.t >= t_end - HISTORY_S]
                if marks:
                    xs = np.array([m.t - t_end for m in marks])
                    spec = implot.Spec()
                    spec.line_color = imgui.ImVec4(0.85, 0.85, 0.90, 0.55)
                    spec.flags = implot.ItemFlags_.no_legend
                    implot.plot_inf_lines("switches", xs, spec)
                    tag = imgui.ImVec4(0.20, 0.25, 0.34, 1.0)
                    top = implot.get_plot_limits().y.max
                    for m in marks:
                        implot.annotation(m.t - t_end, top, tag, imgui.ImVec2(2, 2), True,
                                          m.label.replace("%", "%%"))
            implot.end_plot()
        self._rect("history_plot")

    def _median_section(self) -> None:
        imgui = self.imgui
        ctl = self.controller
        self._header("Per-kernel medians since start")
        ctl.update_medians(MEDIAN_EVERY_S)
        if not ctl.medians:
            imgui.text_disabled("(no frames yet)")
            return
        T = imgui.TableFlags_
        flags = T.row_bg | T.borders_inner_h | T.sizing_fixed_fit
        if imgui.begin_table("medians", 7, flags):
            for h in ("kernel", "N", "frames", "frame ms", "force ms", "inter./s", "GFLOP/s"):
                imgui.table_setup_column(h)
            imgui.table_headers_row()
            cur = (ctl.backend.kernel, ctl.backend.n)
            for key, m in ctl.medians.items():
                if not m:
                    continue
                imgui.table_next_row()
                if key == cur:
                    imgui.table_set_bg_color(imgui.TableBgTarget_.row_bg1,
                                             imgui.get_color_u32(imgui.ImVec4(0.35, 0.22, 0.08, 0.6)))
                for v in (key[0], f"{key[1]:,}", f"{m['frames']}", f"{m['frame_ms']:.2f}",
                          f"{m['force_ms']:.2f}", _fmt_rate(m["interactions_per_s"]),
                          f"{m['interactions_per_s'] * FLOPS_PER_INTERACTION * 1e-9:,.1f}"):
                    imgui.table_next_column()
                    imgui.text(v)
            imgui.end_table()
        imgui.text_disabled("GFLOP/s = interactions/s x 20 flops/interaction · bench frames excluded")

    def _energy_section(self) -> None:
        imgui, implot = self.imgui, self.implot
        en = self.controller.energy
        self._header("Conservation: energy and momentum drift")
        last = en.latest
        how = (f"sampled every {en.every} frames ({en.source or '...'}); |dE/E0|: energy drift since the "
               "baseline; |dP|: linear momentum drift / sum m|v|; |dL|: angular momentum drift / sum m|r||v|")
        if last is None:
            imgui.text_disabled("waiting for the first sample ...")
        else:
            e = "n/a" if last.energy is None else f"{last.energy:.2e}"
            self._mono(f"|dE/E0| {e}   |dP| {last.momentum:.1e}   |dL| {last.angular:.1e}")
        self._tooltip(how)
        if en.note:
            imgui.push_text_wrap_pos(0.0)
            imgui.text_colored(imgui.ImVec4(*WARN_TEXT), en.note)
            imgui.pop_text_wrap_pos()
        if len(en.samples) >= 3 and implot.begin_plot("##energy", imgui.ImVec2(-1, 120)):
            implot.setup_axes("", "drift", implot.AxisFlags_.auto_fit, implot.AxisFlags_.auto_fit)
            implot.setup_axis_scale(implot.ImAxis_.y1, implot.Scale_.log10)
            implot.setup_legend(implot.Location_.south_east, implot.LegendFlags_.horizontal)
            samples = en.samples[1:]  # the first is the baseline: zero drift by definition
            ts = np.array([s.time for s in samples])
            for name in ("energy", "momentum", "angular"):
                ys = np.array([np.nan if getattr(s, name) is None else getattr(s, name) for s in samples])
                ys = np.where(ys > 0, ys, 1e-17)
                if np.isfinite(ys).any():
                    implot.plot_line(name, ts, ys)
            implot.end_plot()

    def _sim_section(self) -> None:
        imgui = self.imgui
        ctl = self.controller
        if imgui.button("Resume" if self.viewer.paused else "Pause", imgui.ImVec2(80, 0)):
            ctl.toggle_pause()
        self._rect("pause")
        self._tooltip("Space")
        imgui.same_line()
        if imgui.button("Step", imgui.ImVec2(60, 0)):
            ctl.single_step()
        self._rect("step")
        self._tooltip("one integrator step, then paused")
        imgui.same_line()
        if imgui.button("Reset", imgui.ImVec2(60, 0)):
            ctl.reset()
        self._rect("reset")
        self._tooltip("R: the scene's initial bodies again (same seed, current N and kernel)")
        imgui.same_line()
        if imgui.button("Save snapshot", imgui.ImVec2(110, 0)):
            ctl.save_snapshot()
        self._rect("save_snapshot")
        self._tooltip(f"S: the current state to {ctl.view_recorder.directory}/snapshot-<time>.npz (float64, "
                      "original body order; opens with `nbody-live run FILE`)")
        if self._presets is None:
            from app.scene import preset_names

            self._presets = preset_names()
        imgui.set_next_item_width(150.0)
        if imgui.begin_combo("scene preset", self.viewer.scene.name):
            for name in self._presets:
                clicked, _ = imgui.selectable(name, name == self.viewer.scene.name)
                if clicked:
                    ctl.load_preset(name)
            imgui.end_combo()
        self._rect("preset")
        file_reason = "the bodies come from a snapshot file" if self.viewer.scene.initial.file else None
        self._field("N (bodies)", "initial.n", file_reason)
        self._field("dt", "physics.dt")
        self._field("softening ε", "physics.softening")
        self._field("G", "physics.G")
        self._choice("integrator", "physics.integrator", INTEGRATORS)
        phys = ctl.backend.physics
        self._field("damping", "physics.damping",
                    None if phys.integrator == "euler-damped" else "applies to the euler-damped integrator")
        self._choice("force model", "physics.model", MODELS)
        self._field("repulsion H", "physics.repulsion",
                    None if phys.model == "gravity-repulsion" else "applies to the gravity-repulsion model")
        self._choice("time steps", "physics.timesteps", TIMESTEPS)
        self._tooltip("shared: every body takes dt. block: hierarchical levels, body i steps dt / 2^l_i "
                      "(GADGET-2's criterion), only the active bodies are walked; dt is the max step; the "
                      "tree on one device (docs/blocksteps.md)")
        not_block = None if phys.timesteps == "block" else "applies to block time steps"
        self._field("block levels L", "physics.block_levels", not_block)
        self._field("block η", "physics.block_eta", not_block)
        self._choice("block coarsening", "physics.block_coarsen", COARSEN, not_block)
        self._field("steps / frame", "run.steps_per_frame")
        self._field("frames / max step", "run.frames_per_step", not_block)
        self._tooltip("block steps: frames drawn inside each max step, the bodies at the frame's time "
                      "(substeps that end by then run, the others predicted along their drift); a frame "
                      "advances steps/frame ÷ this many max steps")

    def _view_section(self) -> None:
        from app.model.config import COLOR_BY, COLORMAPS

        imgui = self.imgui
        ctl = self.controller
        r = self.viewer.scene.render
        components_section(self)  # first: the list a real model's user comes here for
        self._header("Sprites and colours")
        imgui.set_next_item_width(150.0)
        changed, v = imgui.slider_float("point size", float(r.point_size), 0.5, 16.0, "%.1f px")
        if changed:
            ctl.set_value("render.point_size", v)
        imgui.set_next_item_width(150.0)
        changed, v = imgui.slider_float("brightness", float(r.brightness), 0.05, 10.0, "%.2f",
                                        imgui.SliderFlags_.logarithmic)
        if changed:
            ctl.set_value("render.brightness", v)
        changed, v = imgui.checkbox("size by mass", bool(r.size_by_mass))
        if changed:
            ctl.set_value("render.size_by_mass", v)
        self._choice("colour by", "render.color_by", COLOR_BY)
        self._choice("colormap", "render.colormap", COLORMAPS)
        if imgui.button("Fit (F)"):
            self.viewer.fit()
        self._tooltip("F: the drawn bodies fitted into the part of the window the panel leaves free")
        imgui.same_line()
        if imgui.button("Camera (C)"):
            self.viewer.reset_camera()

    def _bench_section(self) -> None:
        imgui, implot = self.imgui, self.implot
        ctl = self.controller
        self._header("Every available kernel on a copy of the current state")
        bench = ctl.bench
        running = bench is not None and bench.running
        imgui.set_next_item_width(80.0)
        changed, steps = imgui.input_int("steps", ctl.bench_steps, 1, 10)
        if changed:
            ctl.bench_steps = min(max(int(steps), 1), 10_000)
        imgui.same_line()
        if running:
            imgui.begin_disabled()
        if imgui.button("Benchmark all kernels"):
            ctl.start_benchmark()
        self._rect("bench")
        if running:
            imgui.end_disabled()
        self._tooltip("each available kernel: a fresh backend loaded with a copy of the current state, "
                      "1 warm-up step, then the fixed number of steps; interactions/s from the kernel's "
                      "own timer")
        if bench is None:
            return
        imgui.progress_bar(bench.progress, imgui.ImVec2(-1, 0),
                           f"{len(bench.results)}/{bench.total} at N = {bench.n:,}, {bench.steps} steps")
        done = [r for r in bench.results if not r.error]
        for r in bench.results:
            if r.error:
                imgui.text_colored(imgui.ImVec4(*RED_TEXT), f"{r.kernel}: {r.error}")
        if not done:
            return
        labels = [r.kernel for r in done]
        vals = np.array([r.interactions_per_s / 1e9 for r in done])
        pos = np.arange(len(done), dtype=np.float64)[::-1].copy()  # the first kernel on top
        height = 70 + 28 * len(done)
        if implot.begin_plot("##bench", imgui.ImVec2(-1, height), implot.Flags_.no_legend):
            implot.setup_axes("G interactions/s", "", implot.AxisFlags_.auto_fit, implot.AxisFlags_.auto_fit)
            implot.setup_axis_ticks(implot.ImAxis_.y1, pos.tolist(), labels)
            spec = implot.Spec()
            spec.flags = implot.BarsFlags_.horizontal
            spec.fill_color = imgui.ImVec4(*ACCENT)
            implot.plot_bars("interactions/s", vals, pos, 0.6, spec)  # horizontal: (lengths, positions)
            for p, v in zip(pos, vals, strict=True):
                implot.plot_text(f"{v:.2f}", float(v), float(p), imgui.ImVec2(24, 0))
            implot.end_plot()
        self._rect("bench_plot")
        for r in done:  # a kernel that evaluates fewer pairs than N² (a tree): its all-pairs equivalent too
            if not np.isclose(r.pair_equivalent_per_s, r.interactions_per_s):
                eq = r.pair_equivalent_per_s / 1e9
                imgui.text_disabled(f"{r.kernel}: equivalent all-pairs {eq:.2f} G/s")

    def _system_section(self) -> None:
        imgui = self.imgui
        ctl = self.controller
        b = ctl.backend
        rows = [("backend", b.name), ("data path", b.data_path), ("GL", self.gl["renderer"]),
                ("GL version", self.gl["version"]), ("window", self.bridge.backend)]
        try:
            d = b.device_info()
        except Exception:  # noqa: BLE001 - a name is a nicety
            d = None
        if d is not None:
            rows.append(("device", str(d.get("name", d))))
        br = self.bridge
        gpu = f"{br.gpu_ms:.3f} ms GPU" if br.gpu_timed else "GPU: no timer queries"
        rows.append(("panel cost", f"{self.cost_ms:.2f} ms CPU · {gpu}"))
        rows.append(("UI rebuild", f"{br.build_ms:.2f} ms + {br.render_ms:.2f} ms upload/draw; "
                                   f"replay {br.replay_ms:.2f} ms"))
        for k, v in rows:
            imgui.text_disabled(f"{k:>11}")
            imgui.same_line()
            imgui.text(v)
        imgui.set_next_item_width(150.0)
        changed, hz = imgui.slider_float("UI refresh", float(br.refresh_hz), 0.0, 120.0, "%.0f Hz")
        if changed:
            br.refresh_hz = hz
        self._tooltip("how often the widgets are rebuilt without input (0: every frame); other frames "
                      "redraw the last draw lists. Input always rebuilds at once.")
        if imgui.button("Screenshot"):
            self.request_screenshot()
        self._rect("screenshot")
        imgui.same_line()
        _, self.screenshot_with_panel = imgui.checkbox("with panel", self.screenshot_with_panel)
        if self.last_screenshot is not None:
            imgui.text_disabled(str(self.last_screenshot))
        imgui.separator()
        imgui.text_disabled(PRESET_KEYS_HELP)


def measure_panel_cost(viewer, panel: Panel, frames: int = 200, block: int | None = None,
                       warmup: int = 10) -> dict:
    """Frame time with the panel shown vs hidden, alternating blocks of `block` frames (the first frame
    of each block is dropped: its time spans the switch), driving `viewer.step_and_render()`.

    Reports medians and means (the mean includes the UI rebuilds, which run at most refresh_hz times a
    second; the frames between replay the last draw lists), and the panel's own CPU time per frame.
    """
    import statistics

    block = block or max(2, min(20, frames // 4))
    for _ in range(warmup):
        viewer.step_and_render()
    shown, hidden, cpu, gpu = [], [], [], []
    builds0 = panel.bridge.builds
    for i in range(frames):
        visible = (i // block) % 2 == 0
        first = visible != panel.visible or i == 0
        panel.set_visible(visible)
        viewer.step_and_render()
        if first:
            continue
        (shown if visible else hidden).append(viewer.stats.frame_ms)
        if visible:
            cpu.append(panel.cost_ms)
            gpu.append(panel.bridge.gpu_ms)
    panel.set_visible(True)

    def med(x):
        return statistics.median(x) if x else 0.0

    def mean(x):
        return statistics.fmean(x) if x else 0.0

    def trimmed(x, cut=0.05):  # the mean without the slowest / fastest 5 % (stray OS or GC pauses)
        x = sorted(x)
        k = int(len(x) * cut)
        return mean(x[k:len(x) - k] if len(x) > 2 * k else x)

    out = {"frames": frames, "shown_ms": med(shown), "hidden_ms": med(hidden),
           "shown_mean_ms": mean(shown), "hidden_mean_ms": mean(hidden),
           "shown_trim_ms": trimmed(shown), "hidden_trim_ms": trimmed(hidden),
           "panel_cpu_ms": med(cpu), "panel_cpu_mean_ms": mean(cpu), "panel_gpu_ms": med(gpu),
           "gpu_timer": panel.bridge.gpu_timer.method if panel.bridge.gpu_timed else "none",
           "rebuilds": panel.bridge.builds - builds0, "shown_frames": len(shown),
           "refresh_hz": panel.bridge.refresh_hz, "build_ms": panel.bridge.build_ms,
           "replay_ms": panel.bridge.replay_ms}
    out["delta_ms"] = out["shown_ms"] - out["hidden_ms"]
    out["delta_mean_ms"] = out["shown_mean_ms"] - out["hidden_mean_ms"]
    out["delta_trim_ms"] = out["shown_trim_ms"] - out["hidden_trim_ms"]
    return out


def panel_cost_line(m: dict) -> str:
    return (f"panel cost over {m['frames']} frames: frame median {m['shown_ms']:.2f} ms shown vs "
            f"{m['hidden_ms']:.2f} ms hidden ({m['delta_ms']:+.2f} ms/frame), "
            f"mean {m['shown_mean_ms']:.2f} vs {m['hidden_mean_ms']:.2f} ms ({m['delta_mean_ms']:+.2f}), "
            f"5%-trimmed mean {m['delta_trim_ms']:+.2f} ms/frame; the panel's own CPU time "
            f"{m['panel_cpu_mean_ms']:.2f} ms/frame mean (median {m['panel_cpu_ms']:.2f}; UI rebuilt "
            f"{m['rebuilds']}x at <= {m['refresh_hz']:g} Hz, last rebuild {m['build_ms']:.2f} ms + upload, "
            f"replay {m['replay_ms']:.3f} ms), GPU {m['panel_gpu_ms']:.3f} ms ({m['gpu_timer']})")
