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

from app.ui.controller import LIVE_WINDOW, Controller
from app.ui.overlay_panel import OverlayPanel
from app.ui.ranks_panel import ranks_section
from app.ui.sections import TABS, kernel, live
from app.ui.style import (
    ACCENT,
    DIM_TEXT,
    FIELD_FORMAT,
    OK_TEXT,
    REC_RED,
    RED_BG,
    RED_TEXT,
    WARN_TEXT,
)

log = logging.getLogger(__name__)


class Panel(OverlayPanel):
    def __init__(
        self,
        viewer,
        controller: Controller | None = None,
        frame_log=None,
        visible: bool = True,
        screenshot_dir: str | Path = "out",
    ):
        from imgui_bundle import imgui, implot

        self.implot = implot
        super().__init__(viewer, controller or Controller(viewer, frame_log), visible)
        self.field_text: dict[str, str] = {}  # what a field shows while edited or after a rejection
        self.field_errors: dict[str, str] = {}  # key -> why the typed value was rejected
        self.unread: dict[str, str] = {}  # tunable key -> why the kernel does not read it now (greyed)
        self.red_fields: set[str] = set()  # fields drawn red in the last frame
        self.texts: dict[str, str] = {}  # what some numbers and lines said when last drawn (tests read them)
        self.shown_frames = 0
        self.screenshot_dir = Path(screenshot_dir)
        self.screenshot_with_panel = True
        self.last_screenshot: Path | None = None
        self._shot_pending = False
        self._presets: list[str] | None = None
        self._combo_rects: dict[str, tuple[float, float, float, float]] = {}  # each combo's, while closed
        self._tabs = TABS  # (app/ui/sections: one module per tab)
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
        self._combo(
            f"{label}##{key}",
            key,
            choices,
            self.controller.current_value(key),
            lambda c: self.controller.set_value(key, c),
        )
        if disabled_reason:
            imgui.end_disabled()
            self._tooltip(disabled_reason, disabled=True)

    def build(self) -> None:
        imgui = self.imgui
        self.red_fields = set()
        if self._begin_window("NBody Live###panel", max(imgui.get_io().display_size.y - 16, 200)):
            self._summary()
            kernel.draw(self)
            live.draw(self)
            if self.controller.backend.ranks > 1:
                ranks_section(self, LIVE_WINDOW)
            # every tab shrinks to fit the panel (labels cut short once they do not), never a scrolled bar
            if imgui.begin_tab_bar("tabs", imgui.TabBarFlags_.fitting_policy_shrink):
                for name, fn in self._tabs:
                    selected, _ = imgui.begin_tab_item(name)
                    self._rect(f"tab:{name}")
                    if selected:
                        fn(self)
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
        self._tooltip(
            f"V: record what the viewer draws - the particles only, without this panel - at the "
            f"window size ({w - w % 2}x{h - h % 2}) into {vr.directory}/recording-<time>.mp4 "
            f"(H.264, {vr.fps:g} fps sampled by wall time, the record "
            "command's quality settings). The file is written under a hidden temporary name and "
            "renamed when you stop (V again, or quitting). Frames the encoder cannot take are "
            "dropped and counted; the view never waits for it."
        )
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
            imgui.text_colored(
                imgui.ImVec4(*(WARN_TEXT if dropped else DIM_TEXT)), f"{rec.drawn} frames · {dropped} dropped"
            )
            self._tooltip(
                f"{rec.path}\ncapture {self.viewer.stats.record_ms:.2f} ms this frame; dropped: "
                "frames the encoder was too busy to take"
            )
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


def measure_panel_cost(
    viewer, panel: Panel, frames: int = 200, block: int | None = None, warmup: int = 10
) -> dict:
    """Frame time with the panel shown vs hidden, alternating blocks of `block` frames (the first frame
    of each block is dropped: its time spans the switch), driving `viewer.step_and_render()`.

    Reports medians and means (the mean includes the UI rebuilds, which run at most refresh_hz times a
    second; the frames between replay the last draw lists), and the panel's own CPU time per frame.
    """
    import statistics

    block = block or max(2, min(20, frames // 4))
    for _ in range(warmup):
        viewer.step_and_render()
    shown: list[float] = []
    hidden: list[float] = []
    cpu: list[float] = []
    gpu: list[float] = []
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
        return mean(x[k : len(x) - k] if len(x) > 2 * k else x)

    out = {
        "frames": frames,
        "shown_ms": med(shown),
        "hidden_ms": med(hidden),
        "shown_mean_ms": mean(shown),
        "hidden_mean_ms": mean(hidden),
        "shown_trim_ms": trimmed(shown),
        "hidden_trim_ms": trimmed(hidden),
        "panel_cpu_ms": med(cpu),
        "panel_cpu_mean_ms": mean(cpu),
        "panel_gpu_ms": med(gpu),
        "gpu_timer": panel.bridge.gpu_timer.method if panel.bridge.gpu_timed else "none",
        "rebuilds": panel.bridge.builds - builds0,
        "shown_frames": len(shown),
        "refresh_hz": panel.bridge.refresh_hz,
        "build_ms": panel.bridge.build_ms,
        "replay_ms": panel.bridge.replay_ms,
    }
    out["delta_ms"] = out["shown_ms"] - out["hidden_ms"]
    out["delta_mean_ms"] = out["shown_mean_ms"] - out["hidden_mean_ms"]
    out["delta_trim_ms"] = out["shown_trim_ms"] - out["hidden_trim_ms"]
    return out


def panel_cost_line(m: dict) -> str:
    return (
        f"panel cost over {m['frames']} frames: frame median {m['shown_ms']:.2f} ms shown vs "
        f"{m['hidden_ms']:.2f} ms hidden ({m['delta_ms']:+.2f} ms/frame), "
        f"mean {m['shown_mean_ms']:.2f} vs {m['hidden_mean_ms']:.2f} ms ({m['delta_mean_ms']:+.2f}), "
        f"5%-trimmed mean {m['delta_trim_ms']:+.2f} ms/frame; the panel's own CPU time "
        f"{m['panel_cpu_mean_ms']:.2f} ms/frame mean (median {m['panel_cpu_ms']:.2f}; UI rebuilt "
        f"{m['rebuilds']}x at <= {m['refresh_hz']:g} Hz, last rebuild {m['build_ms']:.2f} ms + upload, "
        f"replay {m['replay_ms']:.3f} ms), GPU {m['panel_gpu_ms']:.3f} ms ({m['gpu_timer']})"
    )
