"""Dear ImGui (imgui-bundle) drawn over a `Viewer`, fed by the viewer's own vispy events.

    bridge = ImGuiBridge(viewer)            # the viewer's GL context must be current
    bridge.frame(build)                     # inside an overlay: new_frame, build(), render
    bridge.close()

Input: the bridge connects to `viewer.events` (mouse_press/release/move/wheel, key_press/release), the
path every vispy backend (glfw window, EGL) delivers events through, and forwards them with
`io.add_mouse_pos_event`, `add_mouse_button_event`, `add_mouse_wheel_event`, `add_key_event` and
`add_input_characters_utf8`. It registers `io.want_capture_mouse` / `want_capture_keyboard` (as of the
last frame, like any ImGui back end) in `viewer.capture_mouse` / `viewer.capture_keyboard`, so the
camera and the viewer's key actions ignore input that ImGui uses. imgui-bundle's own glfw back end is
never attached: it would replace vispy's callbacks.

Drawing: app.ui.imgui_renderer's ReplayRenderer, imgui-bundle's PyOpenGL `ProgrammablePipelineRenderer`
(GLSL 330) with its `render` redone on PyOpenGL's raw entry points (half the panel's CPU cost was
PyOpenGL's wrappers), draws onto whatever framebuffer is bound (window back buffer, EGL surface, the
viewer's screenshot FBO); it saves and restores the GL state it touches (program, VAO, buffers, texture,
blend, scissor, viewport), and the viewer makes vispy re-issue glUseProgram after overlays. Display
size = the viewer's logical size; framebuffer scale = bound viewport / logical size (HiDPI, screenshots
at another size).

Cost: `cpu_ms` is the perf_counter time of one whole ImGui frame (new_frame + the caller's build +
render submission), `gpu_ms` the GL_TIME_ELAPSED time of the draw calls (timer queries read back a few
frames late, never glFinish; 0 where the context has no timer queries).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path

from app.render.frames import DrawTimer

log = logging.getLogger(__name__)

SETTLE_FRAMES = 3  # after input, rebuild this many frames (a new popup is laid out, then placed)
_BUTTONS = {1: 0, 2: 1, 3: 2}  # vispy: 1 left, 2 right, 3 middle -> ImGui 0, 1, 2


def _key_map(imgui) -> dict[str, object]:
    K = imgui.Key
    # No Tab: it is the viewer's key (show / hide the panel), and ImGui's Tab moves the keyboard into the
    # next widget's text field (the θ slider), where the next V would be typed instead of recording
    m = {
        "Left": K.left_arrow,
        "Right": K.right_arrow,
        "Up": K.up_arrow,
        "Down": K.down_arrow,
        "PageUp": K.page_up,
        "PageDown": K.page_down,
        "Home": K.home,
        "End": K.end,
        "Insert": K.insert,
        "Delete": K.delete,
        "Backspace": K.backspace,
        "Space": K.space,
        "Enter": K.enter,
        "Return": K.enter,
        "Escape": K.escape,
        "Shift": K.left_shift,
        "Control": K.left_ctrl,
        "Alt": K.left_alt,
        "Meta": K.left_super,
        "[": K.left_bracket,
        "]": K.right_bracket,
        "-": K.minus,
        "=": K.equal,
        ".": K.period,
        ",": K.comma,
        "/": K.slash,
        ";": K.semicolon,
        "'": K.apostrophe,
        "\\": K.backslash,
        "`": K.grave_accent,
    }
    for c in "abcdefghijklmnopqrstuvwxyz":
        m[c.upper()] = getattr(K, c)
    for d in "0123456789":
        m[d] = getattr(K, "_" + d)
    for i in range(1, 13):
        m[f"F{i}"] = getattr(K, f"f{i}")
    return m


def _font_dir() -> Path:
    import imgui_bundle

    return Path(imgui_bundle.__file__).parent / "assets" / "fonts"


class ImGuiBridge:
    """One ImGui + ImPlot context bound to one viewer (and its GL context)."""

    def __init__(self, viewer, font_px: float = 15.0, refresh_hz: float = 30.0):
        from imgui_bundle import imgui, implot

        from app.render.gl_setup import backend_name

        self.imgui, self.implot = imgui, implot
        self.viewer = viewer
        self.enabled = True  # False: no ImGui frame at all (the panel hidden), input passes through
        viewer.set_current()
        self._prev_ctx = imgui.get_current_context()
        self.ctx: imgui.internal.Context | None = imgui.create_context()  # None once closed
        imgui.set_current_context(self.ctx)
        self.plot_ctx = implot.create_context()
        implot.set_current_context(self.plot_ctx)
        io = imgui.get_io()
        io.set_ini_filename(None)  # no imgui.ini next to wherever the user started the app
        self.fonts = self._load_fonts(io, font_px)
        self._style()
        from app.ui.imgui_renderer import ReplayRenderer  # PyOpenGL and the GL objects: now, not at import

        self.renderer = ReplayRenderer()
        self.gpu_timer = DrawTimer()
        self.gpu_timed = self.gpu_timer.method == "GL_TIME_ELAPSED"
        self.backend = backend_name() or "?"
        self.refresh_hz = refresh_hz  # rebuild rate without input; <= 0: every frame
        self.cpu_ms = 0.0  # the last frame: a rebuild or a replay
        self.build_ms = 0.0  # the last rebuild: new_frame + widgets + imgui.render (no GL)
        self.render_ms = 0.0  # the last rebuild: upload + draw calls (submission only)
        self.replay_ms = 0.0  # the last replay-only frame
        self.gpu_ms = 0.0
        self.builds = 0
        self._dirty = SETTLE_FRAMES  # frames still to rebuild because of recent input
        self._target: tuple[int, int, int, int] | None = None
        import ctypes

        from OpenGL import GL
        from OpenGL.raw.GL.VERSION import GL_1_0

        self._get_ints = GL_1_0.glGetIntegerv  # raw: ~1 µs instead of ~12 µs wrapped
        self._vp = (ctypes.c_int * 4)()
        self._GL_VIEWPORT = GL.GL_VIEWPORT
        self.frames = 0
        self._last_t: float | None = None
        self._keys = _key_map(imgui)
        self._mods: set[str] = set()
        ev = viewer.events
        self._connections = [
            (ev.mouse_move, self._on_mouse_move),
            (ev.mouse_press, self._on_mouse_press),
            (ev.mouse_release, self._on_mouse_release),
            (ev.mouse_wheel, self._on_wheel),
            (ev.key_press, self._on_key_press),
            (ev.key_release, self._on_key_release),
        ]
        for emitter, cb in self._connections:
            emitter.connect(cb, position="first")
        self._capture_mouse = lambda: self.enabled and self._io_quiet().want_capture_mouse
        self._capture_keyboard = lambda: self.enabled and self._io_quiet().want_capture_keyboard
        viewer.capture_mouse.append(self._capture_mouse)
        viewer.capture_keyboard.append(self._capture_keyboard)

    # --- set-up ----------------------------------------------------------------------------------
    def _load_fonts(self, io, px: float) -> dict:
        fonts = {}
        for key, rel in (
            ("ui", "Roboto/Roboto-Regular.ttf"),
            ("bold", "Roboto/Roboto-Bold.ttf"),
            ("mono", "Inconsolata-Medium.ttf"),
        ):
            path = _font_dir() / rel
            try:
                fonts[key] = io.fonts.add_font_from_file_ttf(str(path), px)
            except Exception as e:  # a trimmed install: ImGui's built-in font still works
                log.info("font %s not loaded (%s); using ImGui's default", path, e)
                fonts[key] = None
        if fonts.get("ui") is not None:
            io.font_default = fonts["ui"]
        return fonts

    def _style(self) -> None:
        imgui = self.imgui
        imgui.style_colors_dark()
        s = imgui.get_style()
        s.window_rounding = 6.0
        s.frame_rounding = 4.0
        s.grab_rounding = 3.0
        s.popup_rounding = 4.0
        s.scrollbar_rounding = 6.0
        s.window_border_size = 1.0
        s.frame_padding = (6.0, 3.0)
        s.item_spacing = (8.0, 5.0)
        s.window_padding = (10.0, 8.0)
        C = imgui.Col_
        colors = {
            C.window_bg: (0.07, 0.08, 0.10, 0.90),
            C.child_bg: (0.0, 0.0, 0.0, 0.0),
            C.popup_bg: (0.09, 0.10, 0.12, 0.97),
            C.border: (0.30, 0.34, 0.40, 0.45),
            C.frame_bg: (0.16, 0.18, 0.22, 0.90),
            C.frame_bg_hovered: (0.22, 0.26, 0.32, 1.0),
            C.frame_bg_active: (0.26, 0.31, 0.38, 1.0),
            C.title_bg: (0.09, 0.10, 0.13, 1.0),
            C.title_bg_active: (0.12, 0.15, 0.20, 1.0),
            C.header: (0.20, 0.30, 0.42, 0.70),
            C.header_hovered: (0.26, 0.40, 0.56, 0.85),
            C.header_active: (0.30, 0.46, 0.64, 1.0),
            C.button: (0.20, 0.30, 0.42, 0.80),
            C.button_hovered: (0.27, 0.42, 0.58, 1.0),
            C.button_active: (0.32, 0.50, 0.70, 1.0),
            C.check_mark: (1.0, 0.67, 0.25, 1.0),
            C.slider_grab: (1.0, 0.60, 0.20, 0.85),
            C.slider_grab_active: (1.0, 0.70, 0.30, 1.0),
            C.plot_histogram: (1.0, 0.60, 0.20, 1.0),
            C.separator: (0.30, 0.34, 0.40, 0.5),
        }
        for idx, col in colors.items():
            s.set_color_(idx, imgui.ImVec4(*col))

    def _io(self):
        """ImGui's io with this bridge's context current; called by every input handler (marks the UI
        for a rebuild at the next few frames)."""
        self._dirty = SETTLE_FRAMES
        self.imgui.set_current_context(self.ctx)
        return self.imgui.get_io()

    def _io_quiet(self):
        self.imgui.set_current_context(self.ctx)
        return self.imgui.get_io()

    # --- input (vispy events -> ImGui) -----------------------------------------------------------
    def _pos(self, event) -> tuple[float, float]:
        x, y = event.pos[:2]
        return float(x), float(y)

    def _on_mouse_move(self, event) -> None:
        self._io().add_mouse_pos_event(*self._pos(event))

    def _on_mouse_press(self, event) -> None:
        io = self._io()
        io.add_mouse_pos_event(*self._pos(event))
        if event.button in _BUTTONS:
            io.add_mouse_button_event(_BUTTONS[event.button], True)

    def _on_mouse_release(self, event) -> None:
        io = self._io()
        io.add_mouse_pos_event(*self._pos(event))
        if event.button in _BUTTONS:
            io.add_mouse_button_event(_BUTTONS[event.button], False)

    def _on_wheel(self, event) -> None:
        dx, dy = (float(v) for v in event.delta[:2])
        self._io().add_mouse_wheel_event(dx, dy)

    def _sync_mods(self, io, event) -> None:
        mods = {m.name for m in (event.modifiers or ()) if m is not None}
        K = self.imgui.Key
        for name, key in (
            ("Control", K.mod_ctrl),
            ("Shift", K.mod_shift),
            ("Alt", K.mod_alt),
            ("Meta", K.mod_super),
        ):
            io.add_key_event(key, name in mods)
        self._mods = mods

    def _imgui_key(self, event):
        key = event.key
        if key is None:
            return None
        from vispy.util import keys

        name = "Space" if key == keys.SPACE else key.name
        return self._keys.get(name.upper() if len(name) == 1 else name)

    def _on_key_press(self, event) -> None:
        io = self._io()
        self._sync_mods(io, event)
        k = self._imgui_key(event)
        if k is not None:
            io.add_key_event(k, True)
        text = getattr(event, "text", "") or ""
        if text and all(ord(c) >= 32 and ord(c) != 127 for c in text):
            io.add_input_characters_utf8(text)

    def _on_key_release(self, event) -> None:
        io = self._io()
        k = self._imgui_key(event)
        if k is not None:
            io.add_key_event(k, False)
        self._sync_mods(io, event)

    # --- a frame ---------------------------------------------------------------------------------
    def frame(self, build: Callable[[], None], force: bool = False) -> bool:
        """Draw the UI over the viewer's current framebuffer; returns True when it was rebuilt.

        The widgets (`build()`, ImGui's new_frame/render, the upload) are rebuilt when input arrived
        since the last build, when 1/refresh_hz passed, when the target size changed, or with `force`;
        every other frame replays the last draw lists (no ImGui work, a few GL calls).
        """
        if not self.enabled:
            return False
        imgui, implot = self.imgui, self.implot
        t0 = time.perf_counter()
        w, h = self.viewer.size
        w, h = max(int(w), 1), max(int(h), 1)
        self._get_ints(self._GL_VIEWPORT, self._vp)
        fw, fh = int(self._vp[2]) or w, int(self._vp[3]) or h
        target = (w, h, fw, fh)
        rebuild = bool(
            force
            or self._dirty
            or self.refresh_hz <= 0
            or self._last_t is None
            or target != self._target
            or t0 - self._last_t >= 1.0 / self.refresh_hz
        )
        if rebuild:
            imgui.set_current_context(self.ctx)
            implot.set_current_context(self.plot_ctx)
            io = imgui.get_io()
            io.display_size = (float(w), float(h))
            io.display_framebuffer_scale = (fw / w, fh / h)
            io.delta_time = max(t0 - self._last_t, 1e-4) if self._last_t is not None else 1.0 / 60.0
            self._last_t = t0
            self._dirty = max(self._dirty - 1, 0)
            self._target = target
            imgui.new_frame()
            try:
                build()
            finally:
                imgui.render()
            draw_data = imgui.get_draw_data()
        else:
            draw_data = None
        t1 = time.perf_counter()
        if self.gpu_timed:
            self.gpu_timer.begin()
        self.renderer.render(draw_data)
        if self.gpu_timed:
            self.gpu_timer.end()
            self.gpu_ms = self.gpu_timer.ms
        t2 = time.perf_counter()
        if rebuild:
            self.build_ms = (t1 - t0) * 1e3
            self.render_ms = (t2 - t1) * 1e3
            self.builds += 1
        else:
            self.replay_ms = (t2 - t0) * 1e3
        self.cpu_ms = (t2 - t0) * 1e3
        self.frames += 1
        return rebuild

    @property
    def want_capture_mouse(self) -> bool:
        return bool(self._capture_mouse())

    @property
    def want_capture_keyboard(self) -> bool:
        return bool(self._capture_keyboard())

    def close(self) -> None:
        """Disconnect from the viewer and free the GL objects (call with its context current)."""
        if self.ctx is None:
            return
        for emitter, cb in self._connections:
            with contextlib.suppress(Exception):  # the canvas may already be gone
                emitter.disconnect(cb)
        for lst, f in (
            (self.viewer.capture_mouse, self._capture_mouse),
            (self.viewer.capture_keyboard, self._capture_keyboard),
        ):
            if f in lst:
                lst.remove(f)
        imgui = self.imgui
        try:
            if not getattr(self.viewer, "_closed", False):
                self.viewer.set_current()
                imgui.set_current_context(self.ctx)
                self.renderer.shutdown()
        except Exception as e:  # noqa: BLE001 - best effort at exit
            log.debug("ImGui renderer shutdown: %s", e)
        self.implot.destroy_context(self.plot_ctx)
        imgui.destroy_context(self.ctx)
        self.ctx = None


def detach_panel(viewer, draw, toggle, keys_are_ui) -> None:
    """Undo what a panel attached to `viewer`: its overlay `draw`, its Tab key `toggle` and its keyboard
    capture `keys_are_ui` (each only if it is still the panel's own)."""
    if draw in viewer.overlays:
        viewer.overlays.remove(draw)
    if viewer.key_actions.get("Tab") == toggle:
        del viewer.key_actions["Tab"]
    if keys_are_ui in viewer.capture_keyboard:
        viewer.capture_keyboard.remove(keys_are_ui)
