"""Frames in, a finished file out: the recording sinks of app.render.recorder.

`Recorder` (an H.264 mp4 through encoder.VideoEncoder) and `PngSequence` (DIR/frame_000000.png, ... through
encoder.PngSequenceWriter) share `FrameSink`: a frame drawn with `capture(viewer)` goes through a ring of
PBOs (readback.PboCapture) into the worker's bounded queue, an image handed over with `add_frame` straight
into it; `stop()` drains both and returns a `RecordResult`, `abort()` throws the partial output away. The
mp4 is written under a hidden `.NAME.*.part` name and `os.replace()`d into place only when complete.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import numpy as np

from app.core.errors import ConfigError, RuntimeFault
from app.core.outputs import check_output, discard, partial_file
from app.render.encoder import FrameInfo, PngSequenceWriter, VideoEncoder, pyav

if TYPE_CHECKING:
    from app.render.readback import PboCapture

log = logging.getLogger(__name__)


@dataclass
class RecordResult:
    path: Path | None  # the video, or the PNG directory / still
    still: Path | None
    frames: int
    size: tuple[int, int]  # (width, height)
    seconds: float  # wall time spent recording (setup excluded)
    interrupted: int | str | None = None  # the signal that stopped the recording early ("window": closed)
    dropped: int = 0  # frames dropped because the encoder was behind (block=False only)
    timings: dict = field(default_factory=dict)  # medians in ms: step, draw, readback, encode
    steps_ahead: int = 0  # frames whose steps ran on a worker thread beside the readback (step_ahead.py)
    steps_beside_draw: int = 0  # of them, those begun before the frame before them was drawn (splat)

    @property
    def fps(self) -> float:
        """Frames per wall second."""
        return self.frames / self.seconds if self.seconds > 0 else 0.0

    def summary_line(self) -> str:
        t = self.timings
        parts = [f"{k} {t[k]:.2f} ms" for k in ("step", "draw", "readback") if k in t]
        if self.steps_ahead and "step" in t:
            beside = "the splat frame's draw and readback" if self.steps_beside_draw else "the readback"
            parts[0] += f" (on a worker thread, beside {beside})"
            if self.steps_beside_draw and "draw" in t:  # its kernels queue on the GPU behind the steps'
                parts[1] += " (its wait behind the steps included)"
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


def median(values) -> float | None:
    values = list(values)
    return statistics.median(values) if values else None


def os_message(e: BaseException) -> str:
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        return "the disk is full (No space left on device)"
    if isinstance(e, OSError):
        return e.strerror or str(e)
    return f"{type(e).__name__}: {e}"


def prepare_frames_dir(directory: Path) -> Path:
    """Create `directory` if needed and check that files can be created in it (one-line RuntimeFault)."""
    directory = Path(directory).expanduser().resolve()
    try:
        if directory.exists() and not directory.is_dir():  # mkdir would say "File exists"
            raise RuntimeFault(f"cannot write frames to {directory}: it is not a directory")
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RuntimeFault(f"cannot write frames to {directory}: {e.strerror or e}") from e
    check_output(directory / "frame_probe", "frames to")
    return directory


class FrameSink:
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
        self._worker: VideoEncoder | PngSequenceWriter | None = None
        self._capture: PboCapture | None = None
        self._next_index = 0
        self._t0 = 0.0

    # what each sink does its own way (a hidden .part mp4 renamed into place; PNGs each complete)
    def start(self, path) -> FrameSink:
        raise NotImplementedError

    def stop(self) -> RecordResult:
        raise NotImplementedError

    def abort(self) -> None:
        """Stop the worker and let go of the GL read-back; what was written stays (a sink with a partial
        file deletes it)."""
        if self._worker is not None:
            self._worker.abort()
            self._worker = None
        with contextlib.suppress(Exception):
            self._release_gl()

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
        out: dict[str, float | None] = {}
        if self._capture is not None and self._capture.readback_ms:
            out["readback"] = median(self._capture.readback_ms)
        if self._worker is not None and self._worker.work_ms:
            out["encode"] = median(self._worker.work_ms)
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

    def _fail(self, e: BaseException) -> NoReturn:
        path = self.path
        self.abort()
        raise RuntimeFault(f"recording {path} failed: {os_message(e)}; the partial output was removed") from e


class Recorder(FrameSink):
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
        pyav()  # a machine without PyAV: one line, before a temporary is made
        self._tmp = partial_file(self.path, "video")
        try:
            self._worker = VideoEncoder(
                self._tmp, self.size, self.fps, self.crf, self.preset, self.threads, self.hud, self.queue_size
            )
        except OSError as e:
            discard(self._tmp)
            self._tmp = None
            raise RuntimeFault(f"cannot write video {self.path}: {os_message(e)}") from e
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
        assert self._tmp is not None and self.path is not None  # set by start()
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
        super().abort()
        discard(self._tmp)
        self._tmp = None


class PngSequence(FrameSink):
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
        assert self.path is not None  # set by start()
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
