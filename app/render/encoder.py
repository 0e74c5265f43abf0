"""Frame sinks on worker threads: H.264 (PyAV/libx264) or a PNG sequence, fed through a bounded queue.

The GL thread hands over finished (H, W, 3|4) uint8 images, top row first; the workers draw the HUD
(Pillow), convert to yuv420p (swscale), encode and mux. PyAV releases the GIL in swscale, x264 and the
muxer, and Pillow in zlib, so the GL thread keeps drawing meanwhile. A full queue blocks the producer
(headless recording: nothing is ever dropped) or, with `block=False`, drops the frame and counts it
(the live viewer: the view keeps its frame rate).

An exception on a worker (a full disk, an encoder error) is kept and raised on the producer's thread at
its next `put` or at `close`, as the original exception.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

from app.core.errors import ConfigError

X264_PRESETS = (
    "ultrafast",
    "superfast",
    "veryfast",
    "faster",
    "fast",
    "medium",
    "slow",
    "slower",
    "veryslow",
)
_STOP = object()


@dataclass(frozen=True)
class FrameInfo:
    """What the HUD writes on a frame (everything known when it was drawn)."""

    index: int  # frame number in the recording
    t: float  # seconds of video, index / fps
    scene: str = ""
    kernel: str = ""
    n: int = 0
    steps: int | None = None  # simulation steps since the start (None: unknown)
    sim_time: float | None = None  # steps * dt

    def hud_lines(self) -> list[str]:
        first = " | ".join(s for s in (self.scene, self.kernel, f"N = {self.n:,}" if self.n else "") if s)
        second = [
            f"t = {self.sim_time:.3f}" if self.sim_time is not None else "",
            f"step {self.steps:,}" if self.steps is not None else "",
            f"frame {self.index} ({self.t:.2f} s)",
        ]
        return [line for line in (first, " | ".join(s for s in second if s)) if line]


class Hud:
    """Text in the top-left corner over a darkened box; Pillow's bundled font, sized to the frame."""

    def __init__(self, height: int):
        from PIL import ImageFont

        self.px = max(10, int(round(height / 45)))
        try:
            self.font = ImageFont.load_default(size=self.px)
        except (TypeError, OSError):  # Pillow without FreeType: the fixed bitmap font
            self.font = ImageFont.load_default()
        self.margin = max(4, self.px // 2)

    def draw(self, img: np.ndarray, lines: list[str]) -> None:
        """Write `lines` onto `img` (H, W, 3|4) in place."""
        from PIL import Image, ImageDraw

        if not lines:
            return
        h, w = img.shape[:2]
        m, step = self.margin, int(self.px * 1.3)
        probe = ImageDraw.Draw(Image.new("L", (1, 1)))
        text_w = max(int(probe.textlength(line, font=self.font)) for line in lines)
        x1, y1 = min(w, 2 * m + text_w + m), min(h, 2 * m + step * len(lines))
        region = img[:y1, :x1]
        region[..., :3] //= 3  # a darkened box keeps the text legible on bright cores
        tile = Image.fromarray(np.ascontiguousarray(region))
        d = ImageDraw.Draw(tile)
        fill = (235, 235, 235, 255) if img.shape[2] == 4 else (235, 235, 235)
        for k, line in enumerate(lines):
            d.text((m + m // 2, m + k * step), line, font=self.font, fill=fill)
        region[...] = np.asarray(tile)


class _Worker:
    """Consumer thread(s) of a bounded queue; `_process(img, info)` and `_finish()` in subclasses."""

    def __init__(self, queue_size: int = 8, workers: int = 1, name: str = "frames"):
        self._q: queue.Queue = queue.Queue(maxsize=max(int(queue_size), 1))
        self.error: BaseException | None = None
        self.frames = 0  # frames processed
        self.dropped = 0
        self.work_ms: list[float] = []
        self.peak_queue = 0
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True)
            for i in range(max(int(workers), 1))
        ]
        self._closed = False

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is _STOP:
                self._q.task_done()
                return
            try:
                if self.error is None:
                    t0 = time.perf_counter()
                    self._process(*item)
                    ms = (time.perf_counter() - t0) * 1e3
                    with self._lock:
                        self.work_ms.append(ms)
                        self.frames += 1
            except BaseException as e:  # noqa: BLE001 - handed to the producer thread
                with self._lock:
                    if self.error is None:
                        self.error = e
            finally:
                self._q.task_done()

    def raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    def queued(self) -> int:
        """Frames in the queue, not yet taken by a worker thread."""
        return self._q.qsize()

    def full(self) -> bool:
        """Whether the queue is full: a frame put now waits (`block`) or is dropped."""
        return self._q.full()

    def put(self, img: np.ndarray, info: FrameInfo, block: bool = True) -> bool:
        """Queue a frame; False when dropped (`block=False` and the queue is full)."""
        self.raise_error()
        if block:
            while True:  # short timeouts keep Ctrl-C and worker errors responsive
                try:
                    self._q.put((img, info), timeout=0.1)
                    break
                except queue.Full:
                    self.raise_error()
        else:
            try:
                self._q.put_nowait((img, info))
            except queue.Full:
                self.dropped += 1
                return False
        self.peak_queue = max(self.peak_queue, self._q.qsize())
        return True

    def _join(self) -> None:
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._q.put(_STOP)
        for t in self._threads:
            t.join()

    def close(self) -> None:
        """Process what is queued, stop the threads, finish; raises a worker's error."""
        self._join()
        self.raise_error()
        self._finish()

    def abort(self) -> None:
        """Stop without finishing: pending frames are discarded, errors swallowed."""
        if not self._closed:
            with contextlib.suppress(queue.Empty):
                while True:
                    self._q.get_nowait()
                    self._q.task_done()
            self.error = self.error or RuntimeError("aborted")
            self._join()
        self._abort()

    def _process(self, img: np.ndarray, info: FrameInfo) -> None:
        raise NotImplementedError

    def _finish(self) -> None:
        pass

    def _abort(self) -> None:
        pass


def pyav():
    """The `av` module (PyAV: FFmpeg's libx264 and the mp4 muxer), or a ConfigError in one line saying how
    to install it: a machine without it must not end a recording in a traceback."""
    try:
        import av
    except ImportError as e:
        raise ConfigError(
            f"writing H.264 video needs PyAV (the `av` package), which does not import here ({e}); "
            "`make` installs it (pip install av), or write PNG frames with --frames-dir"
        ) from None
    return av


class VideoEncoder(_Worker):
    """H.264 in an mp4 at `path` (the caller's temporary name), one encoding thread (x264 has its own)."""

    def __init__(
        self,
        path: Path,
        size: tuple[int, int],
        fps: float,
        crf: int = 20,
        preset: str = "fast",
        threads: int = 0,
        hud: bool = False,
        queue_size: int = 8,
    ):
        self.av = av = pyav()
        super().__init__(queue_size, workers=1, name="encoder")
        self.path = Path(path)
        self.size = (int(size[0]), int(size[1]))
        self.rate = Fraction(str(fps)).limit_denominator(1001)
        self.hud = Hud(self.size[1]) if hud else None
        self.last_frame: np.ndarray | None = None
        self.container = av.open(str(self.path), mode="w", format="mp4", options={"movflags": "+faststart"})
        try:
            stream = self.container.add_stream("libx264", rate=self.rate)
            stream.width, stream.height = self.size
            stream.pix_fmt = "yuv420p"
            self.time_base = 1 / self.rate
            stream.time_base = self.time_base
            stream.options = {"crf": str(int(crf)), "preset": preset, "threads": str(int(threads))}
            cc = stream.codec_context
            cc.color_primaries, cc.color_trc, cc.colorspace, cc.color_range = 1, 1, 1, 1  # BT.709, tv
            self.stream = stream
        except BaseException:
            self.container.close()
            raise
        self._pts = 0
        self.start()

    def _mux(self, packets) -> None:
        for packet in packets:
            self.container.mux(packet)

    def _process(self, img: np.ndarray, info: FrameInfo) -> None:
        av = self.av
        if self.hud is not None:
            self.hud.draw(img, info.hud_lines())
        if img.shape[:2] != (self.size[1], self.size[0]):
            raise ValueError(
                f"frame of {img.shape[1]}x{img.shape[0]} in a {self.size[0]}x{self.size[1]} recording"
            )
        img = np.ascontiguousarray(img)
        fmt = "rgba" if img.shape[2] == 4 else "rgb24"
        frame = av.VideoFrame.from_numpy_buffer(img, format=fmt)
        frame = frame.reformat(format="yuv420p", dst_colorspace="itu709", dst_color_range=1)
        frame.pts = info.index if info.index >= self._pts else self._pts
        frame.time_base = self.time_base  # not stream.time_base: the muxer changes that (e.g. 1/15360)
        self._pts = frame.pts + 1
        self._mux(self.stream.encode(frame))
        self.last_frame = img

    def _finish(self) -> None:
        try:
            self._mux(self.stream.encode(None))
        finally:
            self.container.close()

    def _abort(self) -> None:
        with contextlib.suppress(Exception):
            self.container.close()


class PngSequenceWriter(_Worker):
    """frame_000000.png, ... in `directory`, each written under a hidden name and renamed when complete."""

    def __init__(
        self,
        directory: Path,
        hud: bool = False,
        height: int = 720,
        queue_size: int = 8,
        workers: int | None = None,
        compress_level: int = 3,
        prefix: str = "frame_",
    ):
        workers = workers or max(1, min(4, os.cpu_count() or 1))
        super().__init__(queue_size, workers=workers, name="png")
        self.directory = Path(directory)
        self.hud = Hud(height) if hud else None
        self.compress_level = int(compress_level)
        self.prefix = prefix
        self.written: list[Path] = []
        self.start()

    def name_for(self, index: int) -> Path:
        return self.directory / f"{self.prefix}{index:06d}.png"

    def _process(self, img: np.ndarray, info: FrameInfo) -> None:
        if self.hud is not None:
            self.hud.draw(img, info.hud_lines())
        write_png(img, self.name_for(info.index), self.compress_level)
        with self._lock:
            self.written.append(self.name_for(info.index))


def write_png(img: np.ndarray, path: Path, compress_level: int = 3, what: str = "frame") -> Path:
    """An RGB PNG written atomically (app.core.outputs): complete under `path`, or not there at all."""
    from PIL import Image

    from app.core.outputs import atomic_write

    with atomic_write(path, "wb", what) as f:
        Image.fromarray(np.ascontiguousarray(img[..., :3])).save(
            f, format="PNG", compress_level=compress_level
        )
    return Path(path)
