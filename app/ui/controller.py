"""What the panel does to the viewer and its backend, with no ImGui in it (the panel only calls these).

    ctl = Controller(viewer, frame_log)      # frame_log: the run's FrameLog (one is attached if None)
    ctl.switch_kernel("cpu-fp64")            # the next step uses it; the state is left bitwise as it is
    ctl.set_value("physics.dt", "0.002")     # validated by app.scene.set_value, the CLI's own rules
    ctl.set_value("initial.n", "8192")       # new bodies from the scene, backend.load, new VBOs
    ctl.reset(); ctl.single_step(); ctl.load_preset("disk"); ctl.start_benchmark()
    ctl.toggle_recording()                   # V: out/recording-<time>.mp4 of what the viewer draws

Every action returns None on success or a one-line message saying why nothing changed (also kept in
`ctl.message`). `on_frame()` runs once per drawn frame (the panel's overlay calls it, shown or hidden):
it ingests the newest FrameLog record into the history rings and the per-kernel logs, marks kernel and
N switches, ticks the energy monitor and runs one kernel of a pending benchmark.

Live recording (`start_recording` / `stop_recording`, key V): a `Recorder` with `block=False` fed from
the viewer's own frame. While recording, an overlay placed before every other one copies the frame the
viewer has just drawn on its window (the particles only: the panel is drawn after it) into the recorder's
framebuffer with one `glBlitFramebuffer`, no second particle pass, and starts its asynchronous PBO
readback; frames whose readback is done go to the encoder thread, and when its queue is full the frame
is dropped and counted instead of waiting, so the view keeps its frame rate. The CPU time of that per
frame is `viewer.stats.record_ms` (and the FrameLog's `record_ms`). The mp4 has the `record` command's
encoder settings: a fixed rate (60 fps) sampled by wall time, so the clip plays at the speed the user
saw: frame k is the first frame drawn at or after t = k / fps (frames drawn faster than that are not
sampled; a dropped frame leaves its slot to the previous one), x264 CRF 20, preset fast. Stop
(V again, or closing the viewer: the close event comes while the GL context still lives) drains the
readback and the encoder and renames the hidden temporary file into place. A failure (unwritable
directory, full disk, an encoder error) stops the recording, removes the partial file and leaves its
one-line reason in `ctl.record_error` and `ctl.message`; the viewer goes on.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

from app.backends import all_kernel_records, backend_class
from app.errors import ConfigError, RuntimeFault
from app.render.encoder import FrameInfo
from app.render.recorder import Recorder, RecordResult, even_size
from app.timing import FLOPS_PER_INTERACTION, FrameLog, FrameRecord, History, StepTimings
from app.ui.energy import EnergyMonitor

log = logging.getLogger(__name__)

HISTORY_S = 10.0  # what the history plots show
HISTORY_CAP = 16384  # frames kept in the rings (10 s at up to ~1600 FPS)
PER_KERNEL_CAP = 8192  # frames kept per (kernel, N) for the median table
MEDIAN_EVERY_S = 1.0  # how often the median table is recomputed while it is on screen
LIVE_WINDOW = 15  # frames the live numbers are the median of
ENERGY_RESET_KEYS = {"physics.G", "physics.softening", "physics.model", "physics.repulsion"}
HISTORY_FIELDS = ("frame_ms", "force_ms", "integrate_ms", "mapunmap_ms", "draw_ms", "upload_ms", "record_ms",
                  "panel_ms", "energy_ms", "python_ms", "interactions_per_s")
RECORD_FPS = 60.0  # the live recording's video rate, sampled from the drawn frames by wall time
RECORD_CRF = 20  # x264 quality and preset: `nbody-live record`'s defaults
RECORD_PRESET = "fast"


@dataclass
class Marker:
    t: float  # FrameLog clock
    label: str


@dataclass
class BenchResult:
    """One kernel of a panel benchmark: the timed steps' StepTimings (their interactions as the force
    evaluator counted them), or why it failed."""

    kernel: str
    n: int
    steps: int
    timings: StepTimings | None = None
    wall_ms: float = 0.0
    error: str = ""

    @property
    def interactions_per_s(self) -> float:
        return self.timings.interactions_per_s if self.timings is not None else 0.0

    @property
    def pair_equivalent_per_s(self) -> float:
        """The "equivalent all-pairs" rate (N_targets x N_sources per evaluation over the same time)."""
        return self.timings.pair_equivalent_per_s if self.timings is not None else 0.0


@dataclass
class Benchmark:
    """Each available kernel, fresh backend instance, on a copy of one state; one kernel per frame."""

    steps: int
    n: int
    pending: list[str] = field(default_factory=list)
    results: list[BenchResult] = field(default_factory=list)
    total: int = 0
    state: object = None  # the Bodies every kernel starts from
    physics: object = None

    @property
    def running(self) -> bool:
        return bool(self.pending)

    @property
    def progress(self) -> float:
        return len(self.results) / self.total if self.total else 1.0


def _encoder_threads() -> int:
    """x264 threads for a live recording: all cores but two, which stay with the render loop (its Python
    thread and the GL/CUDA driver's)."""
    try:
        cores = len(os.sched_getaffinity(0))  # the cores this process may use (containers, taskset)
    except (AttributeError, OSError):
        cores = os.cpu_count() or 2
    return max(1, min(16, cores - 2))


class LiveRecorder(Recorder):
    """The Recorder of the live viewer: never blocks (`block=False`), skips the capture of a frame the
    encoder could not take anyway (its queue is full), and counts both kinds of drop."""

    def __init__(self, size, fps: float = RECORD_FPS, crf: int = RECORD_CRF, preset: str = RECORD_PRESET,
                 queue_size: int = 8, ring: int = 3, threads: int | None = None):
        super().__init__(size, fps, crf=crf, preset=preset, hud=False, queue_size=queue_size, block=False,
                         ring=ring, threads=_encoder_threads() if threads is None else threads)
        self.skipped = 0  # frames not captured because the encoder's queue was full

    def encoder_full(self) -> bool:
        """True when the encoder's queue is full: a frame captured now would most likely be dropped, so the
        blit, readback and copy are not worth their time on the render thread."""
        q = getattr(self._worker, "_q", None)
        return q is not None and q.full()

    @property
    def dropped(self) -> int:
        """Frames dropped so far because the encoder was behind (skipped or dropped at the hand-over)."""
        return (self._worker.dropped if self._worker is not None else 0) + self.skipped

    def stop(self) -> RecordResult:
        res = super().stop()
        res.dropped += self.skipped
        return res


@dataclass
class LiveRecording:
    """The recording in progress: its recorder, file, start time and what was drawn into it."""

    recorder: LiveRecorder
    path: Path
    t0: float  # perf_counter at start
    drawn: int = 0  # frames the viewer drew while recording
    offered: int = 0  # video frames handed to the recorder (captured, or dropped when it was full)
    record_ms: list[float] = field(default_factory=list)  # capture CPU time of each frame captured

    def due(self, fps: float) -> bool:
        """Whether wall time has reached the next video frame: the clip plays at the speed the user saw,
        and the encoder sees at most `fps` frames a second however fast the view draws."""
        return self.elapsed * fps >= self.offered

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    @property
    def dropped(self) -> int:
        return self.recorder.dropped

    def indicator(self) -> str:
        """What the window title shows while recording."""
        t = self.elapsed
        dropped = f" · {self.dropped} dropped" if self.dropped else ""
        return f"● REC {int(t // 60)}:{t % 60:04.1f} · {self.drawn} frames{dropped}"


def _blit_from(viewer, screen: int, src_size: tuple[int, int]):
    """A `Recorder.capture` draw callback: copy the frame already drawn on framebuffer `screen` (the window)
    into the recorder's framebuffer (bound when it is called). Same size: a 1:1 copy (an odd window loses
    its top row / right column to the even video size). Another size (the window was resized while
    recording): scaled to fit, aspect kept, black bars."""
    from OpenGL import GL

    sw, sh = int(src_size[0]), int(src_size[1])

    def draw(size) -> None:
        w, h = int(size[0]), int(size[1])
        viewer.context.flush_commands()  # vispy's queued bind of the recorder's framebuffer
        dst = int(GL.glGetIntegerv(GL.GL_DRAW_FRAMEBUFFER_BINDING))
        scissor = GL.glIsEnabled(GL.GL_SCISSOR_TEST)
        if scissor:
            GL.glDisable(GL.GL_SCISSOR_TEST)
        GL.glBindFramebuffer(GL.GL_READ_FRAMEBUFFER, screen)
        try:
            if (w, h) == (sw, sh) or (w, h) == even_size((sw, sh)):
                GL.glBlitFramebuffer(0, 0, w, h, 0, 0, w, h, GL.GL_COLOR_BUFFER_BIT, GL.GL_NEAREST)
            else:
                scale = min(w / sw, h / sh)
                bw, bh = max(int(round(sw * scale)), 1), max(int(round(sh * scale)), 1)
                x0, y0 = (w - bw) // 2, (h - bh) // 2
                GL.glClearBufferfv(GL.GL_COLOR, 0, (0.0, 0.0, 0.0, 1.0))
                GL.glBlitFramebuffer(0, 0, sw, sh, x0, y0, x0 + bw, y0 + bh, GL.GL_COLOR_BUFFER_BIT,
                                     GL.GL_LINEAR)
        finally:
            GL.glBindFramebuffer(GL.GL_READ_FRAMEBUFFER, dst)
            if scissor:
                GL.glEnable(GL.GL_SCISSOR_TEST)

    return draw


class Controller:
    def __init__(self, viewer, frame_log: FrameLog | None = None, energy_every: int = 30):
        self.viewer = viewer
        self.log = frame_log if frame_log is not None else FrameLog().attach(viewer)
        self.records = all_kernel_records()
        self._why_not: dict[str, str | None] = {}
        self.refresh_availability()
        self.history = History(HISTORY_FIELDS, HISTORY_CAP)
        self.markers: list[Marker] = []
        self.per_kernel: dict[tuple[str, int], FrameLog] = {}
        self.medians: dict[tuple[str, int], dict] = {}
        self._stale: set[tuple[str, int]] = set()
        self._medians_t = 0.0
        self.energy = EnergyMonitor(every=energy_every)
        self.bench: Benchmark | None = None
        self.bench_steps = 10
        self.message = ""
        self.panel_ms = 0.0  # set by the panel: its own cost in the last frame (CPU)
        self.energy_ms = 0.0  # the energy monitor's part of the last frame (a host read-back every k frames)
        self.bench_ms = 0.0  # a benchmark kernel run in the last frame
        self._live: dict | None = None
        self._live_t = 0.0
        self._live_count = -1
        self._last_frame: int | None = None
        self._last_kernel: str | None = None
        self._last_n: int | None = None
        self._skip_frames: set[int] = set()  # frames whose time includes a benchmark run
        self._single_step: tuple[int, int] | None = None  # (frame at request, saved steps_per_frame)
        self.record_dir = Path("out")  # where V / the Record button writes recording-<time>.mp4
        self.record_fps = RECORD_FPS
        self.recording: LiveRecording | None = None
        self.recordings: list[RecordResult] = []  # finished ones, oldest first
        self.record_error = ""  # why the last recording could not start or was stopped
        viewer.key_actions.update({"R": self.reset, "[": lambda: self.cycle_kernel(-1),
                                   "]": lambda: self.cycle_kernel(+1), "V": self.toggle_recording})
        # closing the window (or Escape) finalises a recording: the close event comes before the GL
        # context goes, and the readback still needs it
        viewer.events.close.connect(self._on_viewer_close)

    # --- what there is ---------------------------------------------------------------------------
    @property
    def backend(self):
        return self.viewer.backend

    @property
    def scene(self):
        return self.viewer.scene

    def refresh_availability(self) -> None:
        """Ask every backend why each of its kernels cannot run (may compile CUDA sources, memoised)."""
        for rec in self.records:
            try:
                self._why_not[rec.name] = backend_class(rec.backend).kernel_why_not(rec.name)
            except Exception as e:  # noqa: BLE001 - a broken backend greys its kernels, nothing more
                self._why_not[rec.name] = f"{type(e).__name__}: {e}"

    def why_not(self, name: str) -> str | None:
        """None when `name` can run now (its backend, its compile, N within its max_n), else why not."""
        reason = self._why_not.get(name, f"{name!r} is not in the registry")
        if reason:
            return reason
        rec = self.record(name)
        if rec.max_n is not None and self.backend.n > rec.max_n:
            return f"N = {self.backend.n:,} exceeds this kernel's limit of {rec.max_n:,}"
        return None

    def record(self, name: str):
        for rec in self.records:
            if rec.name == name:
                return rec
        raise ConfigError(f"unknown kernel {name!r}")

    def available(self) -> list[str]:
        return [r.name for r in self.records if self.why_not(r.name) is None]

    def _fail(self, msg: str) -> str:
        self.message = msg
        log.warning("%s", msg)
        return msg

    def _ok(self, msg: str) -> None:
        self.message = msg
        log.info("%s", msg)

    # --- kernels ---------------------------------------------------------------------------------
    def switch_kernel(self, name: str) -> str | None:
        """Use `name` from the next step on. Same backend: set_kernel (state untouched). Another backend:
        a fresh instance loaded with `state()` (float64 copy: fp32 values round-trip exactly)."""
        backend = self.backend
        if name == backend.kernel:
            return None
        reason = self.why_not(name)
        if reason:
            return self._fail(f"kernel {name} is unavailable: {reason}")
        rec = self.record(name)
        old = self.record(backend.kernel) if any(r.name == backend.kernel for r in self.records) else None
        try:
            if rec.backend == backend.name:
                backend.set_kernel(name)
            else:
                self._switch_backend(rec)
        except Exception as e:  # noqa: BLE001 - a compile error etc.: keep the current kernel
            self._why_not[name] = f"{type(e).__name__}: {e}"
            return self._fail(f"switching to {name} failed: {e}")
        note = ""
        if old is not None and old.precision == "fp64" and rec.precision == "fp32":
            note = " (fp64 state rounded to fp32 there)"
        self._ok(f"kernel: {name} from the next step{note}")
        return None

    def _switch_backend(self, rec) -> None:
        old = self.backend
        state = old.state()
        new = backend_class(rec.backend)()
        try:
            new.load(state, old.physics, rec.name)
        except Exception:
            new.close()
            raise
        self.viewer.set_current()
        old.close()  # releases its GL registration before the new backend attaches the buffers
        self.viewer.backend = new
        self.viewer.sync_buffers(force=True)
        log.info("backend %s -> %s (%s)", old.name, new.name, new.data_path)

    def cycle_kernel(self, step: int) -> str | None:
        names = self.available()
        if not names:
            return self._fail("no kernel is available")
        cur = self.backend.kernel
        i = names.index(cur) if cur in names else (-1 if step > 0 else 0)
        return self.switch_kernel(names[(i + step) % len(names)])

    # --- parameters ------------------------------------------------------------------------------
    def current_value(self, key: str):
        section, name = key.split(".", 1)
        if section == "physics":
            return getattr(self.backend.physics, name)
        if section == "initial" and name == "n":
            return self.backend.n
        return getattr(getattr(self.scene, section), name)

    def set_value(self, key: str, value) -> str | None:
        """Validate `key = value` exactly as a scene file / `--set` would, then apply it live.

        A rejected value changes nothing (the previous value stays in effect)."""
        from app.scene import set_value

        trial = copy.deepcopy(self.scene)
        try:
            set_value(trial, key, value)
        except ConfigError as e:
            return self._fail(str(e))
        section = key.split(".", 1)[0]
        try:
            if key == "initial.n":
                return self._set_n(trial)
            if section == "physics":
                self.backend.set_physics(trial.physics)
                if key in ENERGY_RESET_KEYS:
                    self.energy.rebase()
            elif section == "render":
                self.viewer.renderer.apply_settings(trial.render)
            elif section not in ("run", "camera"):
                return self._fail(f"{key} cannot be changed while running")
        except Exception as e:  # noqa: BLE001 - the backend's own checks
            return self._fail(f"{key}: {e}")
        set_value(self.scene, key, value)
        self._ok(f"{key} = {self.current_value(key)}")
        return None

    def _set_n(self, trial) -> str | None:
        from app.scene import make_bodies

        if trial.initial.file:
            return self._fail("N is fixed by the snapshot file the bodies come from")
        n = trial.initial.n
        if n == self.backend.n:
            self.scene.initial.n = n
            return None
        bodies = make_bodies(trial)
        self._load(bodies)
        self.scene.initial.n = n
        self._ok(f"N = {n:,}: buffers re-allocated")
        return None

    def _load(self, bodies, physics=None) -> None:
        """New bodies into the running backend; new VBOs when N changed (re-registered with CUDA)."""
        self.viewer.set_current()
        b = self.backend
        b.load(bodies, physics or b.physics, b.kernel)
        self.viewer.sync_buffers(force=True)
        self.energy.rebase()

    def reset(self) -> str | None:
        """The scene's initial bodies again (same seed, current N, current kernel), camera reset."""
        from app.scene import make_bodies

        try:
            self._load(make_bodies(self.scene), self.scene.physics)
        except Exception as e:  # noqa: BLE001
            return self._fail(f"reset failed: {e}")
        self.viewer.reset_camera()
        self._ok("reset to the scene's initial bodies")
        return None

    def load_preset(self, name: str) -> str | None:
        """A preset's bodies, physics, camera and render settings; N, backend and kernel are kept."""
        from app.scene import load_scene, make_bodies

        cur = self.scene
        try:
            new = load_scene(name, {"initial.n": cur.initial.n})
            new.run.backend, new.run.kernel = cur.run.backend, self.backend.kernel
            bodies = make_bodies(new)
            self.backend.set_physics(new.physics)
            self.viewer.scene = new
            self.viewer.renderer.apply_settings(new.render)
            self._load(bodies, new.physics)
        except Exception as e:  # noqa: BLE001
            self.viewer.scene = cur
            return self._fail(f"preset {name}: {e}")
        self.viewer.reset_camera()
        self._ok(f"scene {name} (N = {bodies.n:,})")
        return None

    # --- running ---------------------------------------------------------------------------------
    def toggle_pause(self) -> None:
        self.viewer.toggle_pause()

    def single_step(self) -> None:
        """Advance by exactly one integrator step at the next frame, then stay paused."""
        if self._single_step is not None:
            return
        v = self.viewer
        self._single_step = (v.stats.frame, int(self.scene.run.steps_per_frame))
        self.scene.run.steps_per_frame = 1
        if v.paused:
            v.toggle_pause()

    def _finish_single_step(self) -> None:
        if self._single_step is None:
            return
        requested, spf = self._single_step
        if self.viewer.stats.frame > requested:  # the frame after the request stepped once
            self.scene.run.steps_per_frame = spf
            if not self.viewer.paused:
                self.viewer.toggle_pause()
            self._single_step = None

    # --- benchmark -------------------------------------------------------------------------------
    def start_benchmark(self, steps: int | None = None) -> str | None:
        names = self.available()
        if not names:
            return self._fail("no kernel is available to benchmark")
        steps = int(steps or self.bench_steps)
        if steps < 1:
            return self._fail("benchmark steps must be at least 1")
        self.bench_steps = steps
        self.bench = Benchmark(steps=steps, n=self.backend.n, pending=list(names), total=len(names),
                               state=self.backend.state(), physics=self.backend.physics)
        self._ok(f"benchmark: {len(names)} kernels x {steps} steps at N = {self.backend.n:,}")
        return None

    def bench_tick(self) -> BenchResult | None:
        """Run the next pending kernel of the benchmark (one per frame keeps the window alive)."""
        bench = self.bench
        if bench is None or not bench.pending:
            return None
        name = bench.pending.pop(0)
        rec = self.record(name)
        res = BenchResult(kernel=name, n=bench.n, steps=bench.steps)
        t0 = time.perf_counter()
        b = None
        try:
            b = backend_class(rec.backend)()
            b.load(bench.state.copy(), bench.physics, name)
            b.step(1)  # warm-up: compiles, first launches
            res.timings = b.step(bench.steps)
        except Exception as e:  # noqa: BLE001 - one kernel failing does not stop the others
            res.error = f"{type(e).__name__}: {e}"
        finally:
            if b is not None:
                b.close()
        res.wall_ms = (time.perf_counter() - t0) * 1e3
        bench.results.append(res)
        self._skip_frames.add(self.viewer.stats.frame + 1)  # that frame's time includes the benchmark
        if not bench.pending:
            self._ok("benchmark done: " + ", ".join(
                f"{r.kernel} {r.interactions_per_s / 1e9:.2f} G/s" for r in bench.results if not r.error))
        return res

    # --- live recording --------------------------------------------------------------------------
    def next_recording_path(self) -> Path:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = self.record_dir / f"recording-{stamp}.mp4"
        i = 1
        while path.exists():
            path = self.record_dir / f"recording-{stamp}-{i}.mp4"
            i += 1
        return path

    def toggle_recording(self) -> str | None:
        return self.stop_recording() if self.recording is not None else self.start_recording()

    def start_recording(self, path: str | Path | None = None) -> str | None:
        """Record what the viewer draws (particles, no panel) at its window size into `path` (default:
        record_dir/recording-<time>.mp4). A target that cannot be written is a message, nothing else."""
        if self.recording is not None:
            return None
        v = self.viewer
        w, h = v.physical_size
        if w < 2 or h < 2:
            return self._record_fail(f"cannot record a {w}x{h} window")
        if path is None:
            with contextlib.suppress(OSError):  # an unwritable place is reported by the recorder
                self.record_dir.mkdir(parents=True, exist_ok=True)
            path = self.next_recording_path()
        v.set_current()
        rec = LiveRecorder(even_size((w, h)), self.record_fps)
        try:
            rec.start(path)
        except (RuntimeFault, OSError) as e:
            return self._record_fail(str(e))
        self.recording = LiveRecording(rec, rec.path, time.perf_counter())
        self.record_error = ""
        v.overlays.insert(0, self._record_overlay)  # before the FrameLog and the panel: particles only
        v.stats.extra["recording"] = self.recording.indicator()
        v.update_title()
        self._ok(f"recording {rec.path} ({rec.size[0]}x{rec.size[1]}, {self.record_fps:g} fps)")
        return None

    def _record_fail(self, msg: str) -> str:
        self.record_error = msg
        return self._fail(msg)

    def _end_recording(self) -> LiveRecording | None:
        r, self.recording = self.recording, None
        v = self.viewer
        if self._record_overlay in v.overlays:
            v.overlays.remove(self._record_overlay)
        v.stats.record_ms = 0.0
        v.stats.extra.pop("recording", None)
        return r

    def stop_recording(self) -> str | None:
        """Finalise the file (drain the readback and the encoder, rename it into place)."""
        r = self._end_recording()
        if r is None:
            return None
        v = self.viewer
        with contextlib.suppress(Exception):
            v.set_current()
        try:
            res = r.recorder.stop()
        except Exception as e:  # noqa: BLE001 - a full disk at the end, an encoder error: say it, go on
            with contextlib.suppress(Exception):
                r.recorder.abort()
            v.update_title()
            return self._record_fail(str(e) if isinstance(e, RuntimeFault) else
                                     f"recording {r.path} failed: {type(e).__name__}: {e}")
        self.recordings.append(res)
        v.update_title()
        self._ok(recording_line(res, r.drawn))
        return None

    def _record_overlay(self, viewer) -> None:
        """Per drawn frame while recording: copy the window's frame into the recorder (see the module doc)."""
        r = self.recording
        if r is None or not viewer.drawing_frame:  # not a screenshot's or a test's extra render
            return
        t0 = time.perf_counter()
        rec = r.recorder
        r.drawn += 1
        if not r.due(rec.fps):  # drawn faster than the video's frame rate: this one is not sampled
            viewer.stats.record_ms = 0.0
            viewer.stats.extra["recording"] = r.indicator()
            return
        index = r.offered  # the clip's frame k is the first frame drawn at or after t = k / fps
        r.offered += 1
        try:
            captured = not rec.encoder_full()
            if not captured:
                rec.skipped += 1
            else:
                from OpenGL import GL

                viewer.context.flush_commands()  # the particle pass is issued; the window's framebuffer bound
                screen = int(GL.glGetIntegerv(GL.GL_DRAW_FRAMEBUFFER_BINDING))
                info = FrameInfo(index=index, t=index / rec.fps, scene=viewer.scene.name,
                                 kernel=viewer.stats.kernel, n=viewer.stats.n)
                rec.capture(viewer, info, _blit_from(viewer, screen, viewer.physical_size))
        except Exception as e:  # noqa: BLE001 - a full disk, an encoder or GL error: stop, keep the viewer
            self._end_recording()
            with contextlib.suppress(Exception):
                r.recorder.abort()  # (a RuntimeFault from the recorder has aborted already)
            viewer.update_title()
            self._record_fail(str(e) if isinstance(e, RuntimeFault) else
                              f"recording {r.path} failed: {type(e).__name__}: {e}; the partial file was "
                              "removed")
            return
        ms = (time.perf_counter() - t0) * 1e3
        viewer.stats.record_ms = ms
        if captured:
            r.record_ms.append(ms)
        viewer.stats.extra["recording"] = r.indicator()

    def _on_viewer_close(self, event=None) -> None:
        if self.recording is not None:
            self.stop_recording()

    # --- per frame -------------------------------------------------------------------------------
    def on_frame(self) -> None:
        """Ingest the newest frame record, then energy, benchmark and single-step bookkeeping."""
        recs = self.log.records
        if recs:
            rec = recs[-1]
            if rec.frame != self._last_frame:
                self._last_frame = rec.frame
                self._ingest(rec)
        self._finish_single_step()
        t0 = time.perf_counter()
        if not self.viewer.paused or self.energy.latest is None:
            self.energy.tick(self.backend)
        t1 = time.perf_counter()
        self.bench_tick()
        self.energy_ms = (t1 - t0) * 1e3
        self.bench_ms = (time.perf_counter() - t1) * 1e3

    def _ingest(self, rec: FrameRecord) -> None:
        if rec.kernel and rec.kernel != self._last_kernel:
            self.markers.append(Marker(rec.t, rec.kernel))
            self._last_kernel = rec.kernel
        elif rec.n != self._last_n and self._last_n is not None:
            self.markers.append(Marker(rec.t, f"N={rec.n:,}"))
        self._last_n = rec.n
        if len(self.markers) > 256:
            del self.markers[:-256]
        if rec.frame <= 2 or rec.frame in self._skip_frames:
            self._skip_frames.discard(rec.frame)
            return  # start-up frames (compiles, first uploads) and benchmark frames are not the run's
        # panel_ms / energy_ms still hold the previous overlay's: the one inside this record's frame time
        measured = (rec.force_ms + rec.integrate_ms + rec.map_ms + rec.unmap_ms + rec.draw_ms + rec.upload_ms
                    + rec.record_ms + self.panel_ms + self.energy_ms)
        python_ms = max(rec.frame_ms - measured, 0.0) if rec.frame_ms > 0 else 0.0
        self.history.push(rec.t, frame_ms=rec.frame_ms, force_ms=rec.force_ms, integrate_ms=rec.integrate_ms,
                          mapunmap_ms=rec.map_ms + rec.unmap_ms, draw_ms=rec.draw_ms, upload_ms=rec.upload_ms,
                          record_ms=rec.record_ms,
                          panel_ms=self.panel_ms, energy_ms=self.energy_ms, python_ms=python_ms,
                          interactions_per_s=rec.interactions_per_s)
        if rec.steps > 0 and rec.frame_ms > 0:
            key = (rec.kernel, rec.n)
            self.per_kernel.setdefault(key, FrameLog(capacity=PER_KERNEL_CAP)).records.append(rec)
            self._stale.add(key)

    def update_medians(self, max_age_s: float = 0.0) -> dict[tuple[str, int], dict]:
        """Per-(kernel, N) medians via FrameLog.medians (the first 3 frames of each are warm-up), for the
        (kernel, N) pairs that got frames since the last update; at most every `max_age_s` seconds.
        The panel asks while its table is on screen; nothing is computed otherwise."""
        now = time.perf_counter()
        if now - self._medians_t >= max_age_s:
            self._medians_t = now
            for key in list(self._stale):
                self.medians[key] = self.per_kernel[key].medians(skip=3)
            self._stale.clear()
        return self.medians

    def live(self, max_age_s: float = 0.1) -> dict[str, float]:
        """The live numbers: medians of the last LIVE_WINDOW frames (steadier than one frame), recomputed
        at most every `max_age_s` (readable, and cheap at any frame rate)."""
        now = time.perf_counter()
        fresh = now - self._live_t < max_age_s or self._live_count == self.history.count
        if self._live is not None and fresh:
            return self._live
        out = self.history.recent_medians(LIVE_WINDOW)
        out["gflops"] = out["interactions_per_s"] * FLOPS_PER_INTERACTION * 1e-9
        out["fps"] = self.viewer.stats.fps
        self._live, self._live_t, self._live_count = out, now, self.history.count
        return out

    def close(self) -> None:
        """Finalise a recording still running (the viewer's GL context must still exist), stop the energy
        monitor."""
        if self.recording is not None:
            if self.viewer._closed:  # too late to read back the last frames: keep what was encoded
                self._end_recording().recorder.abort()
                self._record_fail("the viewer closed before the recording could be finalised")
            elif self.stop_recording() is None:  # an exit that skipped the close event (Ctrl-C)
                log.warning("%s (finalised at exit)", self.message)
        with contextlib.suppress(Exception):
            self.viewer.events.close.disconnect(self._on_viewer_close)
        self.energy.close()


def recording_line(res: RecordResult, drawn: int | None = None) -> str:
    """`wrote out/recording-<time>.mp4: 612 frames (3 dropped of 615 drawn), 1920x1080`."""
    drawn = drawn if drawn is not None else res.frames + res.dropped
    dropped = f" ({res.dropped} dropped of {drawn} drawn)" if res.dropped else ""
    return f"wrote {res.path}: {res.frames} frames{dropped}, {res.size[0]}x{res.size[1]}"


def measure_record_cost(viewer, controller: Controller, frames: int = 400, warmup: int = 20) -> dict:
    """Frame time without and with a live recording: `warmup` frames, `frames` frames not recording, then
    `frames` frames recording (the first two after the start are dropped: their time spans the start),
    driving `viewer.step_and_render()` like the interactive loop. Medians and means of the viewer's own
    frame_ms, and the capture's own CPU time per frame (record_ms)."""
    for _ in range(warmup):
        viewer.step_and_render()
    off, on, rec_ms = [], [], []
    for _ in range(frames):
        viewer.step_and_render()
        off.append(viewer.stats.frame_ms)
    err = controller.start_recording()
    if err:
        raise RuntimeFault(err)
    r = controller.recording
    for i in range(frames):
        viewer.step_and_render()
        if i >= 2:
            on.append(viewer.stats.frame_ms)
            rec_ms.append(viewer.stats.record_ms)
        if controller.recording is None:
            raise RuntimeFault(controller.record_error or "the recording stopped")
    drawn, skipped, captured_ms = r.drawn, r.recorder.skipped, list(r.record_ms[2:])
    t0 = time.perf_counter()
    err = controller.stop_recording()
    stop_ms = (time.perf_counter() - t0) * 1e3
    if err:
        raise RuntimeFault(err)
    res = controller.recordings[-1]

    def med(x):
        return statistics.median(x) if x else 0.0

    def mean(x):
        return statistics.fmean(x) if x else 0.0

    out = {"frames": frames, "off_ms": med(off), "on_ms": med(on), "off_mean_ms": mean(off),
           "on_mean_ms": mean(on), "record_ms": med(rec_ms), "record_mean_ms": mean(rec_ms),
           "record_p95_ms": sorted(rec_ms)[int(0.95 * (len(rec_ms) - 1))] if rec_ms else 0.0,
           "captured_ms": med(captured_ms), "captured_mean_ms": mean(captured_ms),
           "captured": len(captured_ms), "drawn": drawn, "encoded": res.frames, "dropped": res.dropped,
           "skipped": skipped, "size": res.size,
           "fps": controller.record_fps, "path": res.path, "stop_ms": stop_ms, "timings": dict(res.timings)}
    out["delta_ms"] = out["on_ms"] - out["off_ms"]
    out["delta_mean_ms"] = out["on_mean_ms"] - out["off_mean_ms"]
    return out


def record_cost_line(m: dict, device: str = "") -> str:
    w, h = m["size"]
    return (f"record cost over {m['frames']}+{m['frames']} frames{' on ' + device if device else ''}: frame "
            f"median {m['off_ms']:.2f} ms not recording vs {m['on_ms']:.2f} ms recording "
            f"({m['delta_ms']:+.2f} ms/frame; mean {m['off_mean_ms']:.2f} vs {m['on_mean_ms']:.2f}, "
            f"{m['delta_mean_ms']:+.2f}); record_ms median {m['record_ms']:.2f} ms over all frames "
            f"(mean {m['record_mean_ms']:.2f}, p95 {m['record_p95_ms']:.2f}), {m['captured_ms']:.2f} ms "
            f"median over the frames captured (mean {m['captured_mean_ms']:.2f}); {w}x{h} at {m['fps']:g} "
            f"fps: {m['drawn']} frames drawn while recording, {m['encoded']} encoded, {m['dropped']} dropped "
            f"({m['skipped']} not captured: encoder queue full); stop (finalise) {m['stop_ms']:.0f} ms; "
            f"{m['path']}")
