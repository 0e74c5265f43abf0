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

This module is the two loops (`record_scene`, `record`); the rest lives in its own module and is
re-exported here: record_sinks.py (RecordResult, Recorder, PngSequence), interrupts.py (InterruptGuard,
exit_status), frame_schedule.py (frame_parts, frame_info: where frame i stands), stills.py (render_still).
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path

from app.core.errors import ConfigError, RuntimeFault
from app.core.eta import Eta
from app.core.outputs import check_output
from app.render.encoder import write_png
from app.render.frame_schedule import frame_info, frame_parts
from app.render.interrupts import InterruptGuard, exit_status
from app.render.record_sinks import (
    FrameSink,
    PngSequence,
    Recorder,
    RecordResult,
    even_size,
    median,
    os_message,
    prepare_frames_dir,
)
from app.render.step_ahead import StepAhead
from app.render.stills import render_still

__all__ = [  # what this module defines, and what its importers take from it that the pieces define
    "InterruptGuard",
    "PngSequence",
    "RecordResult",
    "Recorder",
    "even_size",
    "exit_status",
    "frame_info",
    "frame_parts",
    "prepare_frames_dir",
    "record",
    "record_scene",
    "render_still",
]

log = logging.getLogger(__name__)


def record_scene(
    viewer,
    sink: FrameSink,
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
            eta = Eta(frames, "frame", stops="Ctrl-C stops and keeps a playable file of the frames so far")
            with bar, StepAhead(viewer, enabled=not window) as ahead:
                interrupted = _record_frames(
                    viewer, sink, frames, camera, guard, window, (bar, eta), step_ms, draw_ms, ahead
                )
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
    result.steps_ahead, result.steps_beside_draw = ahead.started, ahead.before_draw
    for name, values in (("step", step_ms), ("draw", draw_ms)):
        if values:
            result.timings[name] = median(values[5:] if len(values) > 10 else values)
    return result


def _record_frames(
    viewer,
    sink: FrameSink,
    frames: int,
    camera,
    guard: InterruptGuard,
    window: bool,
    progress: tuple,
    step_ms: list[float],
    draw_ms: list[float],
    ahead: StepAhead,
) -> int | str | None:
    """record_scene's frames, each step and draw time appended to `step_ms` / `draw_ms`, each told to
    `progress` (the bar, and the Eta that says once what a long recording's rest takes); returns what
    stopped them early (the signal, "window" when the window was closed) or None. Headless, the next
    frame's steps run on a worker thread beside this frame's draw and readback (a splat frame's) or its
    readback (the others') where they can (step_ahead.py); with a window, whose events this thread runs
    between frames, one after the other."""
    bar, eta = progress
    for i in range(frames):
        # steps begun on the worker before a signal are this frame's: it is drawn, as the frame whose steps
        # a signal interrupts is when they run here; no steps are begun after one
        if i > 0 and ahead.finish():
            step_ms.append(ahead.last_ms)  # the steps' own time on the worker
        else:
            if guard.stop:
                return guard.signum
            if i > 0:
                ts = time.perf_counter()
                viewer.advance()
                step_ms.append((time.perf_counter() - ts) * 1e3)
        if camera is not None:
            camera.apply(viewer.camera, i / sink.fps)
        info = frame_info(viewer, i, sink.fps)  # (before the next steps begin: they change what it reads)
        more = i + 1 < frames
        begun = more and not guard.stop and ahead.start_before_draw()  # a splat frame made beside them

        def draw(size, after=more and not begun):
            viewer.draw_scene(size, overlays=False)
            if after and not guard.stop:
                ahead.start()  # any other frame's next steps: beside its readback (where they can)

        sink.capture(viewer, info, draw=draw)
        draw_ms.append(viewer.stats.draw_ms)
        bar.update(1)
        eta.update(i + 1)
        if window:
            if viewer._closed:
                log.warning("the window was closed: stopping after %d frames", i + 1)
                return "window"
            viewer.update()
            viewer.app.process_events()
    return None


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
            assert img is not None  # frames >= 1: the loop drew one
            write_png(img, still_path, what="still")
    except OSError as e:
        rec.abort()
        raise RuntimeFault(f"recording {out_path} failed: {os_message(e)}") from e
    except BaseException:
        rec.abort()
        raise
    result.still = still_path
    result.seconds = time.perf_counter() - t0
    return result
