"""Recording: deterministic videos, PNG sequences and stills of a Viewer, headless or from a window.

Pieces (each usable alone):
    readback.PboCapture   an offscreen RGBA8 framebuffer of the recording size + a ring of PBOs
    encoder.VideoEncoder  H.264/yuv420p mp4 through PyAV on a worker thread (bounded queue)
    encoder.PngSequenceWriter  the same for frame_000000.png, ...
    camera_path           static / orbit / keyframed cameras as functions of video time

`Recorder` is the API for anyone who produces frames (the headless `record` command, and the live
viewer's Record button):

    rec = Recorder((1920, 1080), fps=60, crf=20, hud=False, block=True)
    rec.start("out/clip.mp4")        # hidden temporary file beside the target; RuntimeFault if unwritable
    rec.capture(viewer)              # draw the viewer into the recorder's own framebuffer, read back async
    rec.add_frame(img)               # ...or hand over an (H, W, 3|4) uint8 image, top row first
    result = rec.stop()              # drain, finalise the mp4, rename it into place -> RecordResult
    rec.abort()                      # or: throw the partial file away

With `block=False` (the live viewer) a full encoder queue drops the frame instead of waiting, and the
readback never waits for the GPU unless all ring buffers are busy (`result.dropped` counts drops).

`record_scene` is the deterministic headless loop: frame i shows the simulation after i * steps_per_frame
steps, seen by the camera path at t = i / fps; wall time never enters. `render_still` renders frame
round(T * fps) of that same sequence to a PNG. Both install SIGINT/SIGTERM handlers while they run: the
first signal stops after the current frame and finalises what was recorded (`result.interrupted` holds
the signal); a second one abandons the recording (KeyboardInterrupt; the partial file is deleted).

Output is written under a hidden `.NAME.*.part` name and `os.replace()`d into place only when complete:
a failure (unwritable directory, full disk) never leaves a file that looks finished.

`record(viewer, out_path, frames, ...)` is the v1 function: advance, `viewer.render_to_array`, encode.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from app.core.errors import ConfigError, RuntimeFault
from app.core.outputs import check_output, discard, partial_file
from app.render.encoder import FrameInfo, PngSequenceWriter, VideoEncoder, write_png

log = logging.getLogger(__name__)


@dataclass
class RecordResult:
    path: Path | None  # the video, or the PNG directory / still
    still: Path | None
    frames: int
    size: tuple[int, int]  # (width, height)
    seconds: float  # wall time spent recording (setup excluded)
    interrupted: int | None = None  # the signal that stopped the recording early, if any
    dropped: int = 0  # frames dropped because the encoder was behind (block=False only)
    timings: dict = field(default_factory=dict)  # medians in ms: step, draw, readback, encode

    @property
    def fps(self) -> float:
        """Frames per wall second."""
        return self.frames / self.seconds if self.seconds > 0 else 0.0

    def summary_line(self) -> str:
        t = self.timings
        parts = [f"{k} {t[k]:.2f} ms" for k in ("step", "draw", "readback") if k in t]
        if "encode" in t:
            parts.append(f"encode {t['encode']:.2f} ms (worker thread)")
        w, h = self.size
        return (
            f"{self.frames} frames {w}x{h} in {self.seconds:.2f} s wall: {self.fps:.1f} frames per wall "
            f"second"
            + (f"; median per frame: {', '.join(parts)}" if parts else "")
            + (f"; {self.dropped} dropped" if self.dropped else "")
        )


def even_size(size) -> tuple[int, int]:
    w, h = (int(s) for s in size)
    return max(w - w % 2, 2), max(h - h % 2, 2)


def _median(values) -> float | None:
    values = list(values)
    return statistics.median(values) if values else None


# --------------------------------------------------------------------------------------------------
# files


def _os_message(e: BaseException) -> str:
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        return "the disk is full (No space left on device)"
    if isinstance(e, OSError):
        return e.strerror or str(e)
    return f"{type(e).__name__}: {e}"


def prepare_frames_dir(directory: Path) -> Path:
    """Create `directory` if needed and check that files can be created in it (one-line RuntimeFault)."""
    directory = Path(directory).expanduser().resolve()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RuntimeFault(f"cannot write frames to {directory}: {e.strerror or e}") from e
    if not directory.is_dir():
        raise RuntimeFault(f"cannot write frames to {directory}: it is not a directory")
    check_output(directory / "frame_probe", "frames to")
    return directory


# --------------------------------------------------------------------------------------------------
# signals


class InterruptGuard:
    """SIGINT/SIGTERM while recording: the first sets `signum` (stop after this frame and finalise) and
    calls `on_signal(signum)` (the live viewer: quit at the next tick, which finalises its recording), a
    second raises KeyboardInterrupt (abandon). Installed only on the main thread; restored on exit."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, on_signal=None, doing: str = "stopping after this frame and finalising the file"):
        self.signum: int | None = None
        self.on_signal = on_signal
        self.doing = doing
        self._previous: dict = {}

    def _handler(self, signum, frame) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt(f"{signal.Signals(signum).name} again: recording abandoned")
        self.signum = signum
        log.warning("%s: %s (again to abandon it)", signal.Signals(signum).name, self.doing)
        if self.on_signal is not None:
            self.on_signal(signum)

    def __enter__(self) -> InterruptGuard:
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self._previous[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous.clear()

    @property
    def stop(self) -> bool:
        return self.signum is not None


def exit_status(interrupted) -> int:
    """The shell's convention for a run a signal stopped (130 for SIGINT, 143 for SIGTERM), else 0; the
    recorder and the live viewer both finalise their file first."""
    if interrupted in (signal.SIGINT, signal.SIGTERM):
        return 128 + int(interrupted)
    return 0


# --------------------------------------------------------------------------------------------------
# sinks


class _Sink:
    """Shared by Recorder (mp4) and PngSequence: capture through a PBO ring into a worker queue."""

    def __init__(
        self,
        size,
        fps: float = 30.0,
        hud: bool = False,
        queue_size: int = 8,
        block: bool = True,
        ring: int = 3,
    ):
        self.size = (int(size[0]), int(size[1]))
        self.fps = float(fps)
        if not self.fps > 0:
            raise ConfigError(f"record: fps must be > 0 (got {fps})")
        self.hud = bool(hud)
        self.queue_size = int(queue_size)
        self.block = bool(block)
        self.ring = int(ring)
        self.path: Path | None = None
        self._worker = None
        self._capture = None
        self._next_index = 0
        self._t0 = 0.0

    @property
    def recording(self) -> bool:
        return self._worker is not None

    @property
    def captured(self) -> int:
        """Frames drawn by `capture` or handed to `add_frame` so far (some may still be in flight)."""
        return max(self._capture.captured if self._capture else 0, self._next_index)

    @property
    def frames(self) -> int:
        """Frames handed to the worker so far."""
        return self._next_index - (self._worker.dropped if self._worker else 0)

    @property
    def queued(self) -> int:
        """Frames handed to the worker and not yet taken by it (0 when not recording)."""
        return self._worker.queued() if self._worker is not None else 0

    @property
    def queue_full(self) -> bool:
        """Whether the worker's queue is full now: the next frame handed over waits (block=True) or is
        dropped (block=False). False when not recording."""
        return self._worker is not None and self._worker.full()

    @property
    def dropped(self) -> int:
        """Frames dropped at the hand-over so far (block=False, the queue full); 0 when not recording."""
        return self._worker.dropped if self._worker is not None else 0

    def _info(self, info: FrameInfo | None) -> FrameInfo:
        if info is None:
            info = FrameInfo(index=self._next_index, t=self._next_index / self.fps)
        self._next_index = max(self._next_index, info.index) + 1
        return info

    def add_frame(self, img: np.ndarray, info: FrameInfo | None = None) -> bool:
        """Queue an (H, W, 3|4) uint8 image, top row first; the worker may draw on it. False: dropped."""
        if self._worker is None:
            raise RuntimeError("add_frame() before start()")
        img = np.asarray(img)
        if img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] not in (3, 4):
            raise ValueError(f"expected an (H, W, 3|4) uint8 image, got {img.dtype} {img.shape}")
        try:
            return self._worker.put(img, self._info(info), block=self.block)
        except OSError as e:
            self._fail(e)

    def capture(self, viewer, info: FrameInfo | None = None, draw=None) -> int:
        """Draw `viewer` (without its overlays) into the recorder's framebuffer and queue the frames whose
        readback finished; returns how many were queued. `draw((w, h))` replaces the viewer's draw."""
        if self._worker is None:
            raise RuntimeError("capture() before start()")
        if self._capture is None:
            from app.render.readback import PboCapture

            self._capture = PboCapture(viewer, self.size, self.ring)
        if info is None:
            sim_time = viewer.backend.time
            info = FrameInfo(
                index=self._capture.captured,
                t=self._capture.captured / self.fps,
                scene=getattr(viewer.scene, "name", ""),
                kernel=viewer.stats.kernel,
                n=viewer.stats.n,
                sim_time=sim_time if isinstance(sim_time, float) else None,
            )
        draw = draw or (lambda size: viewer.draw_scene(size, overlays=False))
        ready = self._capture.capture(draw, info, wait=self.block)
        for img, meta in ready:
            self.add_frame(img, meta)
        return len(ready)

    def _drain(self) -> None:
        if self._capture is not None:
            for img, meta in self._capture.drain():
                self.add_frame(img, meta)

    def _release_gl(self) -> None:
        if self._capture is not None:
            self._capture.close()
            self._capture = None

    def timings(self) -> dict:
        out = {}
        if self._capture is not None and self._capture.readback_ms:
            out["readback"] = _median(self._capture.readback_ms)
        if self._worker is not None and self._worker.work_ms:
            out["encode"] = _median(self._worker.work_ms)
        return out

    def _close_worker(self):
        """The common half of stop(): drain the readback and the queue, close the worker (on a write
        error: clean up and raise RuntimeFault). Returns (the closed worker, its timings)."""
        if self._worker is None:
            raise RuntimeError("stop() before start()")
        try:
            self._drain()
            worker = self._worker
            worker.close()
        except OSError as e:
            self._fail(e)
        except BaseException:
            self.abort()
            raise
        timings = self.timings()
        self._release_gl()
        self._worker = None
        return worker, timings

    def _fail(self, e: BaseException):
        path = self.path
        self.abort()
        raise RuntimeFault(
            f"recording {path} failed: {_os_message(e)}; the partial output was removed"
        ) from e


class Recorder(_Sink):
    """Frames in, a finished H.264 mp4 out (see the module docstring)."""

    def __init__(
        self,
        size,
        fps: float = 30.0,
        crf: int = 20,
        preset: str = "fast",
        threads: int = 0,
        hud: bool = False,
        queue_size: int = 8,
        block: bool = True,
        ring: int = 3,
    ):
        size = even_size(size)  # yuv420p needs even sizes
        super().__init__(size, fps, hud, queue_size, block, ring)
        if not 0 <= int(crf) <= 51:
            raise ConfigError(f"record: quality (x264 CRF) must be in [0, 51] (got {crf})")
        self.crf, self.preset, self.threads = int(crf), preset, int(threads)
        self._tmp: Path | None = None
        self.last_frame: np.ndarray | None = None

    def start(self, path) -> Recorder:
        """Open a hidden temporary mp4 beside `path` and start the encoder thread."""
        if self._worker is not None:
            raise RuntimeError("the recorder is already recording")
        self.path = check_output(Path(path).expanduser().resolve(), "video")
        self._tmp = partial_file(self.path, "video")
        try:
            self._worker = VideoEncoder(
                self._tmp, self.size, self.fps, self.crf, self.preset, self.threads, self.hud, self.queue_size
            )
        except OSError as e:
            discard(self._tmp)
            self._tmp = None
            raise RuntimeFault(f"cannot write video {self.path}: {_os_message(e)}") from e
        self._next_index = 0
        self.last_frame = None
        self._t0 = time.perf_counter()
        return self

    def stop(self) -> RecordResult:
        """Drain the readback and the queue, finalise the mp4 and rename it into place."""
        worker, timings = self._close_worker()
        frames, dropped = worker.frames, worker.dropped
        self.last_frame = worker.last_frame
        if frames == 0:
            discard(self._tmp)
            self._tmp = None
            raise RuntimeFault(f"no frames were recorded; {self.path} was not written")
        try:
            os.replace(self._tmp, self.path)
        except OSError as e:
            discard(self._tmp)
            raise RuntimeFault(f"cannot finish {self.path}: {e.strerror or e}") from e
        finally:
            self._tmp = None
        return RecordResult(
            self.path,
            None,
            frames,
            self.size,
            time.perf_counter() - self._t0,
            dropped=dropped,
            timings=timings,
        )

    def abort(self) -> None:
        """Stop and delete the partial file."""
        if self._worker is not None:
            self._worker.abort()
            self._worker = None
        with contextlib.suppress(Exception):
            self._release_gl()
        discard(self._tmp)
        self._tmp = None


class PngSequence(_Sink):
    """Frames in, DIR/frame_000000.png ... out (each PNG renamed into place when complete)."""

    def __init__(
        self,
        size,
        fps: float = 30.0,
        hud: bool = False,
        queue_size: int = 8,
        block: bool = True,
        ring: int = 3,
        workers: int | None = None,
    ):
        super().__init__(size, fps, hud, queue_size, block, ring)
        self.workers = workers

    def start(self, directory) -> PngSequence:
        if self._worker is not None:
            raise RuntimeError("already recording")
        self.path = prepare_frames_dir(directory)
        self._worker = PngSequenceWriter(self.path, self.hud, self.size[1], self.queue_size, self.workers)
        self._next_index = 0
        self._t0 = time.perf_counter()
        return self

    def stop(self) -> RecordResult:
        worker, timings = self._close_worker()
        numbers = (p.stem[len(worker.prefix) :] for p in self.path.glob(f"{worker.prefix}*.png"))
        stale = sum(1 for s in numbers if s.isdigit() and int(s) >= self._next_index)
        if stale:
            log.warning(
                "%d older frame PNGs numbered from %d on were left in %s", stale, self._next_index, self.path
            )
        return RecordResult(
            self.path,
            None,
            worker.frames,
            self.size,
            time.perf_counter() - self._t0,
            dropped=worker.dropped,
            timings=timings,
        )

    def abort(self) -> None:
        """Stop; PNGs already written stay (each is complete)."""
        if self._worker is not None:
            self._worker.abort()
            self._worker = None
        with contextlib.suppress(Exception):
            self._release_gl()


# --------------------------------------------------------------------------------------------------
# the deterministic loop


def frame_parts(run, index: int, draws_within_steps: bool = True) -> tuple[int, int]:
    """(parts, per_step): frame `index` of a simulated run stands `parts` 1/per_step-ths of a step from the
    start (steps_per_frame parts a frame; per_step is run.frames_per_step where the backend draws inside
    steps, block steps: canvas.advance, else 1)."""
    per_step = max(int(run.frames_per_step), 1) if draws_within_steps else 1
    return index * max(int(run.steps_per_frame), 1), per_step


def frame_info(viewer, index: int, fps: float) -> FrameInfo:
    if viewer.backend.replays:  # a series replay: its own time, no steps
        return FrameInfo(
            index=index,
            t=index / fps,
            scene=viewer.scene.name,
            kernel=viewer.backend.kernel,
            n=int(viewer.backend.n),
            steps=None,
            sim_time=viewer.backend.time,
        )
    parts, per_step = frame_parts(viewer.scene.run, index, viewer.backend.draws_within_steps)
    return FrameInfo(
        index=index,
        t=index / fps,
        scene=viewer.scene.name,
        kernel=viewer.stats.kernel or viewer.backend.kernel,
        n=int(viewer.backend.n),
        steps=parts // per_step,
        sim_time=parts / per_step * float(viewer.scene.physics.dt),
    )


def record_scene(
    viewer,
    sink: _Sink,
    out,
    frames: int,
    camera=None,
    progress: bool = True,
    guard: InterruptGuard | None = None,
    window: bool = False,
) -> RecordResult:
    """Record `frames` frames of `viewer` into `sink` (a Recorder or PngSequence; started at `out` here
    unless the caller already started it, e.g. to fail fast on an unwritable path before any setup).

    Frame i: the state after i * steps_per_frame steps (frame 0 is the initial state; with block steps
    drawn inside max steps, i * steps_per_frame / frames_per_step max steps), camera `camera`
    (a camera_path.CameraPath; None: the viewer's camera as it is) at t = i / sink.fps.
    `window`: also show each frame in the viewer's window (closing it stops the recording early).
    """
    from tqdm import tqdm

    frames = int(frames)
    if frames < 1:
        raise ConfigError(f"record: frames must be >= 1 (got {frames})")
    if not sink.recording:
        sink.start(out)
    own_guard = guard is None
    guard = guard or InterruptGuard()
    step_ms: list[float] = []
    draw_ms: list[float] = []
    interrupted = None
    try:
        with guard if own_guard else contextlib.nullcontext():
            t0 = time.perf_counter()
            bar = tqdm(
                total=frames,
                desc=f"recording {Path(out).name}",
                unit="frame",
                disable=not progress,
                leave=False,
                dynamic_ncols=True,
            )
            with bar:
                for i in range(frames):
                    if guard.stop:
                        interrupted = guard.signum
                        break
                    if i > 0:
                        ts = time.perf_counter()
                        viewer.advance()
                        step_ms.append((time.perf_counter() - ts) * 1e3)
                    if camera is not None:
                        camera.apply(viewer.camera, i / sink.fps)
                    sink.capture(viewer, frame_info(viewer, i, sink.fps))
                    draw_ms.append(viewer.stats.draw_ms)
                    bar.update(1)
                    if window:
                        if viewer._closed:
                            log.warning("the window was closed: stopping after %d frames", i + 1)
                            interrupted = "window"
                            break
                        viewer.update()
                        viewer.app.process_events()
            if interrupted is not None and sink.captured == 0:
                sink.abort()
                result = RecordResult(None, None, 0, sink.size, time.perf_counter() - t0)
                result.interrupted = interrupted
                return result
            result = sink.stop()
            result.seconds = time.perf_counter() - t0
    except BaseException:
        sink.abort()
        raise
    result.interrupted = interrupted
    for name, values in (("step", step_ms), ("draw", draw_ms)):
        if values:
            result.timings[name] = _median(values[5:] if len(values) > 10 else values)
    return result


def render_still(
    viewer,
    path,
    t: float,
    fps: float,
    camera=None,
    hud: bool = False,
    progress: bool = True,
    guard: InterruptGuard | None = None,
) -> RecordResult:
    """Frame round(t * fps) of the `record_scene` sequence (same steps, camera, HUD) as a PNG at `path`."""
    from tqdm import tqdm

    from app.render.encoder import Hud
    from app.render.readback import PboCapture

    if not (t >= 0 and np.isfinite(t)):
        raise ConfigError(f"--still {t}: the time must be a number of seconds >= 0")
    path = check_output(Path(path).expanduser().resolve(), "still")  # before the minutes of stepping
    index = int(round(float(t) * fps))
    capture = None
    own_guard = guard is None
    guard = guard or InterruptGuard()
    try:
        with guard if own_guard else contextlib.nullcontext():
            t0 = time.perf_counter()
            for _ in tqdm(
                range(index),
                desc=f"advancing to frame {index}",
                unit="frame",
                leave=False,
                disable=not progress or index == 0,
            ):
                if guard.stop:
                    r = RecordResult(None, None, 0, viewer.physical_size, time.perf_counter() - t0)
                    r.interrupted = guard.signum
                    return r
                viewer.advance()
            if camera is not None:
                camera.apply(viewer.camera, index / fps)
            capture = PboCapture(viewer, tuple(int(s) for s in viewer.physical_size), depth=1)
            info = frame_info(viewer, index, fps)
            [(img, _)] = capture.capture(lambda size: viewer.draw_scene(size, overlays=False), info)
            if hud:
                Hud(img.shape[0]).draw(img, info.hud_lines())
            write_png(img, path, what="still")
            size = capture.size
    finally:
        if capture is not None:
            capture.close()
    return RecordResult(path, path, 1, size, time.perf_counter() - t0)


# --------------------------------------------------------------------------------------------------
# v1


def record(
    viewer,
    out_path,
    frames: int,
    fps: float = 30,
    still_path=None,
    progress: bool = True,
    step: bool = True,
    crf: int = 18,
    preset: str = "fast",
) -> RecordResult:
    """Render `frames` frames (advancing the simulation before each when `step`) into `out_path` (mp4)
    with `viewer.render_to_array`, at the viewer's size rounded down to even numbers.

    `still_path`: also write the last frame as a PNG there. Raises RuntimeFault for an unwritable target.
    """
    from tqdm import tqdm

    frames = int(frames)
    if frames < 1:
        raise ConfigError(f"record: frames must be >= 1 (got {frames})")
    if not fps or fps <= 0:
        raise ConfigError(f"record: fps must be > 0 (got {fps})")
    out_path = Path(out_path).expanduser().resolve()
    still_path = Path(still_path).expanduser().resolve() if still_path is not None else None
    w, h = even_size(viewer.physical_size)
    t0 = time.perf_counter()
    rec = Recorder((w, h), fps, crf=crf, preset=preset)
    rec.start(out_path)
    try:
        if still_path is not None:
            check_output(still_path, "still")
        img = None
        for _ in tqdm(
            range(frames), desc=f"recording {out_path.name}", unit="frame", disable=not progress, leave=False
        ):
            if step:
                viewer.advance()
            img = viewer.render_to_array((w, h))
            rec.add_frame(img)
        result = rec.stop()
        if still_path is not None:
            write_png(img, still_path, what="still")
    except OSError as e:
        rec.abort()
        raise RuntimeFault(f"recording {out_path} failed: {_os_message(e)}") from e
    except BaseException:
        rec.abort()
        raise
    result.still = still_path
    result.seconds = time.perf_counter() - t0
    return result
