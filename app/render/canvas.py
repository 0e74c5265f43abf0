"""The Viewer: a vispy `app.Canvas` (gloo, not SceneCanvas) that steps a Backend and draws its bodies.

    viewer = Viewer(scene, backend)          # a glfw window, or headless EGL when there is no display
    viewer.run(frames=None)                  # interactive loop; Escape or closing the window returns 0
    img = viewer.render_to_array()           # (H, W, 3) uint8 from the viewer's own framebuffer

Per frame: `advance()` (backend.step + buffer sync, then `viewer.after_advance`), then `on_draw`
(particles, then every callable in `viewer.overlays`, e.g. the ImGui panel). Timings land in
`viewer.stats` (an app.render.frames.FrameStats).

Keys (`viewer.key_actions`, name -> callable; the panel's controller adds and replaces entries):
Space pause/resume, F fit the bodies, C reset the camera to the scene's, [ and ] previous/next kernel,
R reset (the controller reloads the scene's bodies; the bare viewer resets the camera), Tab (the panel
hides itself), V (the controller starts / stops a recording), Escape quit.
Mouse: left-drag rotates (with inertia), right/middle-drag or Shift+left-drag pans, wheel zooms.
Callables in `viewer.capture_mouse` / `viewer.capture_keyboard` returning True (ImGui's
want_capture_mouse / want_capture_keyboard) block the camera / the key actions. Callables in
`viewer.view_covers` return the rectangle an overlay covers (logical pixels, or None while hidden): frames
drawn with the overlays centre the scene in the part left free, and F fits into it (app.render.view_area).
The bodies' components (`backend.components`, app.model.components) go to the renderer when the buffers are
filled; F and C fit the bodies that are drawn (hidden components left out). An overlay that wants
the input connects to `viewer.events` (mouse_press, mouse_move, key_press, ...) like any vispy handler.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from vispy import app, gloo
from vispy.util import keys

from app.core.errors import NonFiniteState, RuntimeFault
from app.render import gl_setup, view_area
from app.render.camera import OrbitCamera, gl_matrix
from app.render.frames import DrawTimer, FrameStats
from app.render.particles import ParticleRenderer
from app.render.splat_style import SplatStyle

log = logging.getLogger(__name__)

SPEED_SCALE_EVERY = 30  # frames between host-side percentile updates of the colour scale
TITLE_EVERY_S = 0.5


def bodies_extent(pos4: np.ndarray) -> tuple[float, np.ndarray]:
    """(radius holding 90% of the bodies around the centre of mass, centre of mass) of [x, y, z, m] rows."""
    pos = np.asarray(pos4[:, :3], dtype=np.float64)
    m = np.asarray(pos4[:, 3], dtype=np.float64)
    if len(pos) == 0:
        return 1.0, np.zeros(3)
    com = np.average(pos, axis=0, weights=m if m.sum() > 0 else None)
    r = np.linalg.norm(pos - com, axis=1)
    ext = float(np.quantile(r, 0.9)) if len(pos) > 1 else float(r[0])
    return (ext if np.isfinite(ext) and ext > 0 else 1.0), com


class Viewer(app.Canvas):
    """The window (glfw) or offscreen surface (EGL) that steps `backend` and draws its bodies.

    `headless` None: EGL when there is no display or NBODY_HEADLESS=1 (see gl_setup.configure).
    Change render settings at run time with `viewer.renderer.apply_settings(scene.render)`.
    """

    def __init__(
        self,
        scene,
        backend,
        size=(1280, 720),
        headless: bool | None = None,
        title: str = "NBody Live",
        vsync: bool = False,
        show: bool = True,
    ):
        self.kind = gl_setup.configure(headless)
        self.headless = self.kind == "egl"
        self.scene = scene
        self.backend = backend
        self.base_title = title
        app.Canvas.__init__(
            self,
            size=tuple(int(s) for s in size),
            title=title,
            vsync=vsync,
            keys=None,
            show=False,
            resizable=not self.headless,
        )
        self.set_current()
        self.overlays: list[Callable[[Viewer], None]] = []
        self.capture_mouse: list[Callable[[], bool]] = []
        self.capture_keyboard: list[Callable[[], bool]] = []
        self.view_covers: list[Callable[[], tuple[float, float, float, float] | None]] = []
        # run at the end of every advance(), after the buffers were filled (paused too): what writes the
        # buffers beside the backend (the force error's colours, app/ui/compare_actions.py)
        self.after_advance: list[Callable[[], None]] = []
        self.key_actions: dict[str, Callable[[], object]] = {
            "Escape": self.request_quit,
            "Space": self.toggle_pause,
            "F": self.fit,
            "C": self.reset_camera,
            "R": self.reset_camera,
            "[": lambda: self.cycle_kernel(-1),
            "]": lambda: self.cycle_kernel(+1),
        }
        self.screenshot_overlays = False  # the exit screenshot includes the overlays (the panel)
        self.stats = FrameStats()
        self.paused = False
        self.interop = False
        self.screenshot_on_exit: str | Path | None = None
        self.screenshot_error = ""  # why the exit screenshot could not be written
        self.quit_requested = False
        self.drawing_frame = False  # True while on_draw draws a frame for the screen (not a screenshot)
        self.renderer = ParticleRenderer(scene.render, canvas=self)
        self.splat = SplatStyle(self)  # render.style: splat frames where asked and possible
        self.draw_timer = DrawTimer()
        self.stats.draw_timer = self.draw_timer.method
        self._fbo: Any = None  # vispy gloo objects: no stubs
        self._fbo_size: tuple[int, int] | None = None
        self._frame_limit: int | None = None
        self._timer: Any = None  # vispy's app.Timer while run() loops
        self._last_draw_t: float | None = None
        self._last_tick_t: float | None = None
        self._title_t = 0.0
        self._fps_ema = 0.0
        self._mouse_last: np.ndarray | None = None
        self._mouse_mode: str | None = None
        self._host_frame = 0
        self._components = False
        self.sync_buffers()
        self.camera = OrbitCamera()
        self.reset_camera()
        if show and not self.headless:
            self.show()

    # --- buffers & simulation ------------------------------------------------------------
    def sync_buffers(self, force: bool = False) -> None:
        """(Re)allocate the VBOs for backend.n bodies, fill them, and offer their GL names to the backend.

        The initial state is uploaded *before* `attach_gl_buffers`: after a CUDA backend registered the
        buffers the renderer never re-specifies them (that would invalidate the registration).
        """
        n = int(self.backend.n)
        if n != self.renderer.n or force:
            self.release_gl_buffers()  # the VBOs are about to be replaced: none may stay mapped
        if self.renderer.allocate(n) or force:
            pos4, speeds = self.backend.host_render_arrays()  # once: frame 0, mean mass, speed scale
            self._initial_pos4 = np.asarray(pos4)
            self.renderer.upload(pos4, speeds)
            self.renderer.update_speed_scale(speeds)
            self.interop = bool(self.backend.attach_gl_buffers(*self.renderer.gl_names()))
            self._host_frame = 0
            self._components = False  # (not any Components: set below)
        comp = self.backend.components
        if comp is not self._components:
            self._components = comp
            if comp is not None and comp.n != n:
                log.warning("the bodies' %d component indices do not match N = %d: drawn as one", comp.n, n)
                comp = None
            self.renderer.set_components(comp)
        self.stats.n = n
        self.stats.data_path = self.backend.data_path

    def release_gl_buffers(self) -> None:
        """Unmap the backend's interop buffers if splat frames held them mapped (GLBuffers.hold)."""
        self.splat.release(self.backend)

    def _upload_host(self) -> None:
        t0 = time.perf_counter()
        pos4, speeds = self.backend.host_render_arrays()
        self.renderer.upload(pos4, speeds)
        self._host_frame += 1
        if self._host_frame % SPEED_SCALE_EVERY == 0:
            self.renderer.update_speed_scale(speeds)
        self.stats.upload_ms = (time.perf_counter() - t0) * 1e3

    def advance(self) -> None:
        """One frame of simulation (run_steps; none while paused), then the `after_advance` callables. In
        parts so that a recording can step on another thread while this one reads back (step_ahead.py)."""
        t0 = time.perf_counter()
        self.end_advance(self.run_steps() if self.begin_advance() else None, t0)

    def begin_advance(self) -> bool:
        """The GL thread's part before a frame's steps: the buffers in sync; False while paused."""
        self.set_current()
        self.sync_buffers()
        if self.paused:
            self.backend.idle()
        return not self.paused

    def run_steps(self):
        """The frame's steps (scene.run.steps_per_frame; or that many 1/frames_per_step parts of a step where
        the backend draws inside steps: block steps), no GL (any thread): their StepTimings, or the
        NonFiniteState they raised (returned, for end_advance on the GL thread)."""
        run = self.scene.run
        steps, per_step = max(int(run.steps_per_frame), 1), max(int(run.frames_per_step), 1)
        try:
            if per_step > 1 and self.backend.draws_within_steps:
                return self.backend.step_parts(steps, per_step)
            return self.backend.step(steps)
        except NonFiniteState as e:
            return e

    def end_advance(self, outcome, t0: float) -> None:
        """The GL thread's part after the steps begun at `t0` (outcome: run_steps'; None while paused)."""
        if isinstance(outcome, NonFiniteState):
            # Keep the window alive on the last good frame: pause and say which body went bad.
            self.paused = self.stats.paused = True
            self.stats.extra["message"] = str(outcome)
            log.warning("paused: %s", outcome)
        elif outcome is not None:
            self.stats.step = outcome
            self.stats.kernel = getattr(outcome, "kernel", "") or self.backend.kernel
            self.stats.upload_ms = 0.0  # (the host path's upload times itself)
            if not self.interop:
                self._upload_host()
        self.stats.step_host_ms = (time.perf_counter() - t0) * 1e3
        for hook in list(self.after_advance):
            hook()

    def toggle_pause(self) -> None:
        self.paused = not self.paused
        self.stats.paused = self.paused

    def cycle_kernel(self, step: int) -> str:
        """Switch to the previous (-1) / next (+1) available kernel of the backend; returns its name."""
        cls = type(self.backend)
        names = [r.name for r in cls.kernels() if cls.kernel_why_not(r.name) is None]
        if not names:
            return self.backend.kernel
        cur = self.backend.kernel
        i = names.index(cur) if cur in names else -step
        self.backend.set_kernel(names[(i + step) % len(names)])
        return self.backend.kernel

    # --- camera --------------------------------------------------------------------------
    def _current_pos4(self) -> np.ndarray:
        """The bodies as drawn now: hidden components left out (all of them when every one is hidden)."""
        try:
            pos4 = np.asarray(self.backend.host_render_arrays()[0])
        except Exception:  # a backend that cannot read back right now: use the initial state
            pos4 = self._initial_pos4
        shown = self.renderer.visible_mask()
        return pos4[shown] if shown is not None and shown.shape == (len(pos4),) and shown.any() else pos4

    def free_span(self, width: int | None = None) -> tuple[float, float]:
        """The stretch [x0, x1] of a `width`-pixel frame (default the window's) that no overlay covers."""
        lw = max(float(self.size[0]), 1.0)
        pixels = float(self.physical_size[0] if width is None else width)
        x0, x1 = view_area.free_span(lw, (cover() for cover in self.view_covers))
        return x0 / lw * pixels, x1 / lw * pixels

    def _fit_aspect(self) -> float:
        """The aspect ratio of the free part of the window, which a fit fills."""
        x0, x1 = self.free_span()
        return (x1 - x0) / max(self.physical_size[1], 1)

    def reset_camera(self) -> None:
        """The scene's camera settings; unset distance/target are fitted to the current bodies."""
        ext, com = bodies_extent(self._current_pos4())
        self.camera = OrbitCamera.from_settings(self.scene.camera, ext, com, aspect=self._fit_aspect())

    def fit(self) -> None:
        """Keep the viewing angles; centre the bodies and fit their 90% radius into the free view."""
        ext, com = bodies_extent(self._current_pos4())
        self.camera.fit(ext, com, aspect=self._fit_aspect())

    def lens_shift(self, width: int | None = None) -> float:
        """The projection's NDC x shift that centres the scene in the free part (0 when nothing covers)."""
        width = int(self.physical_size[0] if width is None else width)
        return view_area.lens_shift(self.free_span(width), width)

    def projection(self, size: tuple[int, int], overlays: bool = True) -> np.ndarray:
        """The projection of a frame of `size`: with `overlays` the scene is centred in the free part."""
        w, h = int(size[0]), int(size[1])
        return self.camera.projection_matrix(w / max(h, 1), self.lens_shift(w) if overlays else 0.0)

    # --- drawing -------------------------------------------------------------------------
    def draw_scene(self, size: tuple[int, int], overlays: bool = True) -> None:
        """Particles (timed), then overlays, onto the active framebuffer of `size` (w, h) pixels. With
        overlays the scene is centred in the part of the frame they leave free."""
        ctx = self.context
        ctx.flush_commands()
        self.draw_timer.begin()
        t0 = time.perf_counter()
        splat = self.draw_particles(size, shifted=overlays)
        ctx.flush_commands()
        self.stats.draw_host_ms = (time.perf_counter() - t0) * 1e3
        self.draw_timer.end()
        # a splat frame's CUDA (or twin) work runs inside the bracket, and the host waits for it there, so
        # GL's timer spans it; where a timer misses it, the splat's own time (splat_style.py) is the floor
        self.stats.draw_ms = max(self.draw_timer.ms, self.splat.last_ms) if splat else self.draw_timer.ms
        self.stats.style = "splat" if splat else "sprites"
        if overlays and self.overlays:
            for overlay in list(self.overlays):
                overlay(self)
            # overlays may call GL directly: make vispy re-issue glUseProgram on its next draw
            ctx.shared.parser.env.pop("current_program", None)

    def draw_particles(self, size: tuple[int, int], shifted: bool = False) -> bool:
        """Only the bodies (untimed) onto the active framebuffer; `shifted`: centred in the free part. True
        when they were drawn as a splat frame (render.style, app/render/splat_style.py), else sprites."""
        w, h = int(size[0]), int(size[1])
        if self.splat.draw(self, (w, h), shifted):
            return True
        self.release_gl_buffers()  # (held mapped by splat frames: GL draws them now)
        view = gl_matrix(self.camera.view_matrix())
        proj = gl_matrix(self.projection((w, h), shifted))
        self.renderer.draw(view, proj, (w, h), pixel_ratio=self.pixel_scale)
        return False

    def on_draw(self, event) -> None:
        now = time.perf_counter()
        if self._last_draw_t is not None:
            dt = now - self._last_draw_t
            self.stats.frame_ms = dt * 1e3
            fps = 1.0 / dt if dt > 0 else 0.0
            self._fps_ema = fps if self._fps_ema == 0 else 0.9 * self._fps_ema + 0.1 * fps
            self.stats.fps = self._fps_ema
        self._last_draw_t = now
        self.drawing_frame = True
        try:
            self.draw_scene(self.physical_size, overlays=True)
        finally:
            self.drawing_frame = False
        self.stats.frame += 1
        if now - self._title_t > TITLE_EVERY_S:
            self._title_t = now
            self.update_title()

    def status_line(self) -> str:
        s = self.stats
        kernel = s.kernel or self.backend.kernel
        paused = " | paused" if self.paused else ""
        if self.paused and s.extra.get("message"):
            paused += f": {s.extra['message']}"
        rec = s.extra.get("recording")  # the live recording's indicator, set by the controller
        head = f"{rec} | " if rec else ""
        return f"{head}{s.fps:5.1f} FPS | {kernel} | N={s.n:,} | {s.data_path}{paused}"

    def update_title(self) -> None:
        if not self.headless:
            self.title = f"{self.base_title} - {self.status_line()}"

    def step_and_render(self) -> None:
        """Advance one frame and draw it to the canvas surface (window back buffer, or EGL pbuffer)."""
        self.advance()
        self.set_current()
        self.events.draw(region=None)

    def _ensure_fbo(self, size: tuple[int, int]):
        w, h = int(size[0]), int(size[1])
        if self._fbo_size != (w, h):
            if self._fbo is not None:
                self._fbo.delete()
            color = gloo.Texture2D(shape=(h, w, 4), format="rgba", internalformat="rgba8")
            depth = gloo.RenderBuffer((h, w), format="depth")
            self._fbo = gloo.FrameBuffer(color=color, depth=depth)
            self._fbo_size = (w, h)
        return self._fbo

    def render_to_array(self, size: tuple[int, int] | None = None, overlays: bool = False) -> np.ndarray:
        """Draw the current state into the viewer's own framebuffer; (H, W, 3) uint8, top row first."""
        self.set_current()
        w, h = (int(s) for s in (size or self.physical_size))
        fbo = self._ensure_fbo((w, h))
        with fbo:
            self.draw_scene((w, h), overlays=overlays)
            img = fbo.read(alpha=False)
        return np.ascontiguousarray(img[:, :, :3])

    def save_png(self, path: str | Path, size: tuple[int, int] | None = None, overlays: bool = False) -> Path:
        from app.render.encoder import write_png

        return write_png(self.render_to_array(size, overlays=overlays), Path(path), what="screenshot")

    # --- interactive loop -------------------------------------------------------------
    def run(self, frames: int | None = None) -> int:
        """Step and draw until Escape, the window closes, or `frames` frames were drawn; returns 0.

        Runs its own event loop (vispy's `app.run()` would wait for every canvas of the process, or, on
        EGL, stop at once when any canvas was ever closed).
        """
        self._frame_limit = None if frames is None else int(frames)
        self._frames_at_start = self.stats.frame
        self._last_tick_t = None
        self.quit_requested = False
        if not self.headless:
            self.show()
        self._timer = app.Timer(interval=0.0, connect=self._on_timer, start=True, app=self.app)
        try:
            while not self._closed:
                self.app.process_events()
        finally:
            self._timer.stop()
            self._timer = None
        return 0

    def request_quit(self) -> None:
        """Close at the next timer tick (closing inside a glfw input callback crashes glfw)."""
        self.quit_requested = True

    def _on_timer(self, event) -> None:
        if self._closed:
            return
        done = self._frame_limit is not None and self.stats.frame - self._frames_at_start >= self._frame_limit
        if done or self.quit_requested:
            self.close()
            return
        now = time.perf_counter()
        if self._last_tick_t is not None:
            self.camera.update(now - self._last_tick_t)
        self._last_tick_t = now
        self.advance()
        self.update()

    def on_close(self, event) -> None:
        if self.screenshot_on_exit:
            try:
                self.save_png(self.screenshot_on_exit, overlays=self.screenshot_overlays)
            except Exception as e:  # noqa: BLE001 - the close goes on; the caller reports it (run: exit 1)
                self.screenshot_error = str(e)
        if self._timer is not None:
            self._timer.stop()
        self.splat.close()

    # --- input ---------------------------------------------------------------------------
    def on_key_press(self, event) -> None:
        if any(f() for f in self.capture_keyboard):
            return
        key = event.key
        name = "" if key is None else "Space" if key == keys.SPACE else key.name  # glfw names it " "
        action = self.key_actions.get(name.upper() if len(name) == 1 else name)
        if action is not None:
            action()

    def _blocked(self) -> bool:
        return any(f() for f in self.capture_mouse)

    def on_mouse_press(self, event) -> None:
        if self._blocked():
            self._mouse_mode = None
            return
        shift = keys.SHIFT in (event.modifiers or ())
        self._mouse_mode = "pan" if (event.button in (2, 3) or shift) else "rotate"
        self._mouse_last = np.asarray(event.pos, dtype=float)
        self.camera.spin[:] = 0.0

    def on_mouse_move(self, event) -> None:
        if self._mouse_mode is None or not event.is_dragging or self._mouse_last is None:
            return
        pos = np.asarray(event.pos, dtype=float)
        dx, dy = pos - self._mouse_last
        self._mouse_last = pos
        if self._mouse_mode == "rotate":
            self.camera.drag(dx, dy, time.perf_counter())
        else:
            self.camera.pan(dx, dy, self.size[1])
        self.update()

    def on_mouse_release(self, event) -> None:
        if self._mouse_mode == "rotate":
            self.camera.release(time.perf_counter())
        self._mouse_mode = None
        self._mouse_last = None

    def on_mouse_wheel(self, event) -> None:
        if self._blocked():
            return
        self.camera.zoom(float(event.delta[1]))
        self.update()

    def on_resize(self, event) -> None:
        self.set_current()
        gloo.set_viewport(0, 0, *event.physical_size)


def open_viewer(scene, backend, size, headless: bool, **kwargs) -> Viewer:
    """The Viewer; a window is tried a few times (a loaded X server closes some new connections, see
    gl_setup.CONNECT_ATTEMPTS), then given up in one line (glfw's "Could not init glfw" spans several)."""
    attempts = 1 if headless else gl_setup.CONNECT_ATTEMPTS
    for _ in range(attempts - 1):  # the tries before the last
        try:
            return Viewer(scene, backend, size=size, headless=headless, **kwargs)
        except OSError as e:
            log.debug("opening the window failed (%s); trying again", e)
            time.sleep(gl_setup.CONNECT_PAUSE_S)
    try:
        return Viewer(scene, backend, size=size, headless=headless, **kwargs)
    except OSError as e:
        if headless:
            raise
        raise RuntimeFault(f"cannot open a window: {' '.join(str(e).split())}") from e
