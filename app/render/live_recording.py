"""Live recording: what the viewer draws, recorded while it runs (the panel's Record button, key V).

    rec = ViewRecorder(viewer, report)       # report(message, failed): where its one-line messages go
    rec.start()                              # directory/recording-<time>.mp4 at the window size
    rec.stop()                               # finalise; rec.recordings[-1] is the RecordResult
    rec.close()                              # at exit: finalise a recording still running

A `Recorder` with `block=False` fed from the viewer's own frame. While recording, an overlay placed
before every other one copies the frame the viewer has just drawn on its window (the particles only: the
panel is drawn after it) into the recorder's framebuffer with one `glBlitFramebuffer`, no second particle
pass (while the panel shows, the window's scene is moved aside into the part it leaves free, so the
particles are drawn again, centred: recordings look the same with or without the panel), and starts its
asynchronous PBO readback; frames whose readback is done go to the encoder thread,
and when its queue is full the frame is dropped and counted instead of waiting, so the view keeps its
frame rate. The CPU time of that per frame is `viewer.stats.record_ms` (and the FrameLog's `record_ms`).
The mp4 has the `record` command's encoder settings: a 60 fps time base sampled by wall time, so the
clip plays at the speed the user saw: frame k is the first frame drawn at or after t = k / fps (frames
drawn faster than that are not sampled; a view drawn slower leaves gaps in the frames' times, so each
frame lasts as long as it was on screen; a dropped frame leaves its slot to the previous one), x264 CRF
20, preset fast. Stop (V again, or closing the viewer: the close event comes while the GL context still
lives) drains the readback and the encoder and renames the hidden temporary file into place. A failure
(unwritable directory, full disk, an encoder error) stops the recording, removes the partial file and
leaves its one-line reason in `rec.error` (and reports it); the viewer goes on.

`measure_record_cost` (`nbody-live run --record-cost`) measures what recording costs per frame.
"""

from __future__ import annotations

import contextlib
import logging
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from app.core.errors import ConfigError, RuntimeFault
from app.render.encoder import FrameInfo
from app.render.recorder import Recorder, RecordResult, even_size

log = logging.getLogger(__name__)

RECORD_FPS = 60.0  # the live recording's video rate, sampled from the drawn frames by wall time
RECORD_CRF = 20  # x264 quality and preset: `nbody-live record`'s defaults
RECORD_PRESET = "fast"


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

    def __init__(
        self,
        size,
        fps: float = RECORD_FPS,
        crf: int = RECORD_CRF,
        preset: str = RECORD_PRESET,
        queue_size: int = 8,
        ring: int = 3,
        threads: int | None = None,
    ):
        super().__init__(
            size,
            fps,
            crf=crf,
            preset=preset,
            hud=False,
            queue_size=queue_size,
            block=False,
            ring=ring,
            threads=_encoder_threads() if threads is None else threads,
        )
        self.skipped = 0  # frames not captured because the encoder's queue was full

    @property
    def dropped(self) -> int:
        """Frames dropped so far because the encoder was behind (skipped or dropped at the hand-over)."""
        return super().dropped + self.skipped

    def stop(self) -> RecordResult:
        res = super().stop()
        res.dropped += self.skipped
        return res


@dataclass
class LiveRecording:
    """The recording in progress: its recorder, file, start time and what was drawn into it."""

    recorder: LiveRecorder
    path: Path
    t0: float  # clock() at start
    clock: Callable[[], float] = time.perf_counter  # seconds; the ViewRecorder's (a test's own)
    drawn: int = 0  # frames the viewer drew while recording
    offered: int = 0  # video frames handed to the recorder (captured, or dropped when it was full)
    next_slot: int = 0  # the next video frame time due (t = next_slot / fps): past a slow view's gaps
    record_ms: list[float] = field(default_factory=list)  # capture CPU time of each frame captured

    def due(self, fps: float) -> bool:
        """Whether wall time has reached the next video frame: the clip plays at the speed the user saw,
        and the encoder sees at most `fps` frames a second however fast the view draws."""
        return self.elapsed * fps >= self.next_slot

    @property
    def elapsed(self) -> float:
        return self.clock() - self.t0

    @property
    def dropped(self) -> int:
        return self.recorder.dropped

    def indicator(self) -> str:
        """What the window title shows while recording."""
        t = self.elapsed
        dropped = f" · {self.dropped} dropped" if self.dropped else ""
        return f"● REC {int(t // 60)}:{t % 60:04.1f} · {self.drawn} frames{dropped}"


def blit_from(viewer, screen: int, src_size: tuple[int, int]):
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
                GL.glBlitFramebuffer(
                    0, 0, sw, sh, x0, y0, x0 + bw, y0 + bh, GL.GL_COLOR_BUFFER_BIT, GL.GL_LINEAR
                )
        finally:
            GL.glBindFramebuffer(GL.GL_READ_FRAMEBUFFER, dst)
            if scissor:
                GL.glEnable(GL.GL_SCISSOR_TEST)

    return draw


def _log_report(message: str, failed: bool) -> None:
    (log.warning if failed else log.info)("%s", message)


class ViewRecorder:
    """Starts, feeds and stops the live recordings of one viewer (see the module doc).

    Every action returns None on success or a one-line reason; success and failure lines, also those of
    a recording that fails while frames are drawn, go to `report(message, failed)`.
    """

    def __init__(
        self,
        viewer,
        report: Callable[[str, bool], None] = _log_report,
        directory: str | Path = "out",
        fps: float = RECORD_FPS,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.viewer = viewer
        self.report = report
        self.directory = Path(directory)  # where recording-<time>.mp4 goes
        self.fps = fps
        self.clock = clock  # the wall clock that samples the drawn frames (tests set their own)
        self.recording: LiveRecording | None = None
        self.recordings: list[RecordResult] = []  # finished ones, oldest first
        self.error = ""  # why the last recording could not start or was stopped
        # closing the window (or Escape) finalises a recording: the close event comes before the GL
        # context goes, and the readback still needs it
        viewer.events.close.connect(self._on_viewer_close)

    def next_path(self) -> Path:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = self.directory / f"recording-{stamp}.mp4"
        i = 1
        while path.exists():
            path = self.directory / f"recording-{stamp}-{i}.mp4"
            i += 1
        return path

    def toggle(self) -> str | None:
        return self.stop() if self.recording is not None else self.start()

    def start(self, path: str | Path | None = None) -> str | None:
        """Record what the viewer draws (particles, no panel) at its window size into `path` (default:
        directory/recording-<time>.mp4). A target that cannot be written is a message, nothing else."""
        if self.recording is not None:
            return None
        v = self.viewer
        w, h = v.physical_size
        if w < 2 or h < 2:
            return self._fail(f"cannot record a {w}x{h} window")
        if path is None:
            with contextlib.suppress(OSError):  # an unwritable place is reported by the recorder
                self.directory.mkdir(parents=True, exist_ok=True)
            path = self.next_path()
        v.set_current()
        rec = LiveRecorder(even_size((w, h)), self.fps)
        try:
            rec.start(path)
        except (RuntimeFault, ConfigError, OSError) as e:  # ConfigError: no PyAV here
            return self._fail(str(e))
        assert rec.path is not None  # start() names the file it writes
        self.recording = LiveRecording(rec, rec.path, self.clock(), self.clock)
        self.error = ""
        v.overlays.insert(0, self._overlay)  # before the FrameLog and the panel: particles only
        v.stats.extra["recording"] = self.recording.indicator()
        v.update_title()
        self.report(f"recording {rec.path} ({rec.size[0]}x{rec.size[1]}, {self.fps:g} fps)", False)
        return None

    def stop(self) -> str | None:
        """Finalise the file (drain the readback and the encoder, rename it into place)."""
        r = self._end()
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
            return self._fail(
                str(e)
                if isinstance(e, RuntimeFault)
                else f"recording {r.path} failed: {type(e).__name__}: {e}"
            )
        self.recordings.append(res)
        v.update_title()
        self.report(recording_line(res, r.drawn), False)
        return None

    def close(self) -> None:
        """Finalise a recording still running (the viewer's GL context must still exist); unhook."""
        if self.recording is not None:
            if self.viewer._closed:  # too late to read back the last frames: keep what was encoded
                self.recording.recorder.abort()
                self._end()
                self._fail("the viewer closed before the recording could be finalised")
            elif self.stop() is None:  # an exit that skipped the close event (Ctrl-C)
                log.warning("%s (finalised at exit)", recording_line(self.recordings[-1]))
        with contextlib.suppress(Exception):
            self.viewer.events.close.disconnect(self._on_viewer_close)

    def _fail(self, msg: str) -> str:
        self.error = msg
        self.report(msg, True)
        return msg

    def _end(self) -> LiveRecording | None:
        r, self.recording = self.recording, None
        v = self.viewer
        if self._overlay in v.overlays:
            v.overlays.remove(self._overlay)
        v.stats.record_ms = 0.0
        v.stats.extra.pop("recording", None)
        return r

    def _overlay(self, viewer) -> None:
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
        # the clip's frame k is the first frame drawn at or after t = k / fps, and it lasts until the next
        # one sampled: a view drawn slower than `fps` leaves gaps in the frames' times (their pts), which the
        # mp4 plays as the longer frames the user saw, so the clip lasts the wall time it recorded
        index = max(r.next_slot, int(r.elapsed * rec.fps))
        r.next_slot = index + 1
        r.offered += 1
        try:
            # a frame the encoder cannot take now would be dropped at the hand-over anyway: the blit,
            # readback and copy are not worth their time on the render thread
            captured = not rec.queue_full
            if not captured:
                rec.skipped += 1
            else:
                from OpenGL import GL

                viewer.context.flush_commands()  # the particle pass is issued; the window's framebuffer bound
                screen = int(GL.glGetIntegerv(GL.GL_DRAW_FRAMEBUFFER_BINDING))
                info = FrameInfo(
                    index=index,
                    t=index / rec.fps,
                    scene=viewer.scene.name,
                    kernel=viewer.stats.kernel,
                    n=viewer.stats.n,
                )
                # the window's frame is the recording's unless the panel moved the scene aside (a lens
                # shift, app.render.view_area): then the particles are drawn again, centred
                shifted = viewer.lens_shift() != 0.0
                draw = viewer.draw_particles if shifted else blit_from(viewer, screen, viewer.physical_size)
                rec.capture(viewer, info, draw)
        except Exception as e:  # noqa: BLE001 - a full disk, an encoder or GL error: stop, keep the viewer
            self._end()
            with contextlib.suppress(Exception):
                r.recorder.abort()  # (a RuntimeFault from the recorder has aborted already)
            viewer.update_title()
            self._fail(
                str(e)
                if isinstance(e, RuntimeFault)
                else f"recording {r.path} failed: {type(e).__name__}: {e}; the partial file was removed"
            )
            return
        ms = (time.perf_counter() - t0) * 1e3
        viewer.stats.record_ms = ms
        if captured:
            r.record_ms.append(ms)
        viewer.stats.extra["recording"] = r.indicator()

    def _on_viewer_close(self, event=None) -> None:
        if self.recording is not None:
            self.stop()


def recording_line(res: RecordResult, drawn: int | None = None) -> str:
    """`wrote out/recording-<time>.mp4: 612 frames (3 dropped of 615 drawn), 1920x1080`."""
    drawn = drawn if drawn is not None else res.frames + res.dropped
    dropped = f" ({res.dropped} dropped of {drawn} drawn)" if res.dropped else ""
    return f"wrote {res.path}: {res.frames} frames{dropped}, {res.size[0]}x{res.size[1]}"


def measure_record_cost(viewer, recorder: ViewRecorder, frames: int = 400, warmup: int = 20) -> dict:
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
    err = recorder.start()
    if err:
        raise RuntimeFault(err)
    r = recorder.recording
    assert r is not None  # started without an error
    for i in range(frames):
        viewer.step_and_render()
        if i >= 2:
            on.append(viewer.stats.frame_ms)
            rec_ms.append(viewer.stats.record_ms)
        if recorder.recording is None:
            raise RuntimeFault(recorder.error or "the recording stopped")
    drawn, skipped, captured_ms = r.drawn, r.recorder.skipped, list(r.record_ms[2:])
    t0 = time.perf_counter()
    err = recorder.stop()
    stop_ms = (time.perf_counter() - t0) * 1e3
    if err:
        raise RuntimeFault(err)
    res = recorder.recordings[-1]

    def med(x):
        return statistics.median(x) if x else 0.0

    def mean(x):
        return statistics.fmean(x) if x else 0.0

    out = {
        "frames": frames,
        "off_ms": med(off),
        "on_ms": med(on),
        "off_mean_ms": mean(off),
        "on_mean_ms": mean(on),
        "record_ms": med(rec_ms),
        "record_mean_ms": mean(rec_ms),
        "record_p95_ms": sorted(rec_ms)[int(0.95 * (len(rec_ms) - 1))] if rec_ms else 0.0,
        "captured_ms": med(captured_ms),
        "captured_mean_ms": mean(captured_ms),
        "captured": len(captured_ms),
        "drawn": drawn,
        "encoded": res.frames,
        "dropped": res.dropped,
        "skipped": skipped,
        "size": res.size,
        "fps": recorder.fps,
        "path": res.path,
        "stop_ms": stop_ms,
        "timings": dict(res.timings),
    }
    out["delta_ms"] = out["on_ms"] - out["off_ms"]
    out["delta_mean_ms"] = out["on_mean_ms"] - out["off_mean_ms"]
    return out


def record_cost_line(m: dict, device: str = "") -> str:
    w, h = m["size"]
    return (
        f"record cost over {m['frames']}+{m['frames']} frames{' on ' + device if device else ''}: frame "
        f"median {m['off_ms']:.2f} ms not recording vs {m['on_ms']:.2f} ms recording "
        f"({m['delta_ms']:+.2f} ms/frame; mean {m['off_mean_ms']:.2f} vs {m['on_mean_ms']:.2f}, "
        f"{m['delta_mean_ms']:+.2f}); record_ms median {m['record_ms']:.2f} ms over all frames "
        f"(mean {m['record_mean_ms']:.2f}, p95 {m['record_p95_ms']:.2f}), {m['captured_ms']:.2f} ms "
        f"median over the frames captured (mean {m['captured_mean_ms']:.2f}); {w}x{h} at {m['fps']:g} "
        f"fps: {m['drawn']} frames drawn while recording, {m['encoded']} encoded, {m['dropped']} dropped "
        f"({m['skipped']} not captured: encoder queue full); stop (finalise) {m['stop_ms']:.0f} ms; "
        f"{m['path']}"
    )
