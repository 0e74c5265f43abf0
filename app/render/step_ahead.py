"""The next frame's steps on a worker thread while the GL thread finishes this frame: the overlap of the
headless `record` loop (app/render/recorder.py).

A recorded frame is its steps, its draw, and the readback of the framebuffer with the hand-over to the
encoder. At 1M bodies on one H100 the tree's two steps keep the GPU busy 11.2 of the 11.9 ms the host
waits for them (CUDA events), and the readback and hand-over then take 2.9 ms of host time with the GPU
idle: one after the other, a frame was their sum, 16.1-17.5 ms. Here the next frame's steps start on a
worker thread, and the rest of this frame runs beside them:
- a splat frame begins them as soon as its work is queued on the GPU (`SplatStyle.on_queued`), before the
  host waits for it: the GPU runs the next steps right behind the frame, and the draw's 1.2 ms of host
  time at 1M (launches, the texture copy, the wait) leaves the GPU idle no more;
- any other frame begins them when its draw has returned, beside the readback.

Why it is safe:
- the worker runs `Viewer.run_steps` alone, which touches no GL; the GL thread runs `begin_advance` before
  (the buffers in sync) and `end_advance` after (the host path's upload, the stats, the hooks);
- what the steps write is not read by the frame in flight. On the host path (no interop) they write the
  backend's arrays, and the frame's vertex buffer was uploaded before its draw. Under interop only while
  splat frames hold the buffers mapped (`GLBuffers.hold`): GL never reads them then, and the steps write
  them only in their last copies, which wait for the splat frame's reads (`GLBuffers.mapped(reader=...)`:
  an event on the splat's stream; that stream is also ordered with the default stream the steps queue
  on). Buffers that GL maps for each frame (sprites over CUDA) are not stepped ahead: their map would run
  on the worker thread beside GL's reads of the frame in flight;
- a splat frame that fails after its steps began is raised, not drawn as sprites (GL would read the
  buffers the steps write).

The frames are the same bytes either way: the same steps in the same order, drawn at the same states
(tests/test_step_ahead.py on the CPU and, for splat frames on a GPU, against the frames stepped in turn;
the recordings' sha256 in bench/results/h100-2026-11-27-record-step-ahead.txt and
tests/test_splat_record_gpu.py's identical runs).
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import Future, ThreadPoolExecutor


class StepAhead:
    """One frame's steps at a time on one worker thread (`start` after a draw, `finish` before the next);
    a context manager that waits for steps still running and stops the worker on exit. `enabled` False
    (a window, whose events the GL thread runs between frames): `start` never begins any."""

    def __init__(self, viewer, enabled: bool = True):
        self.viewer = viewer
        self.enabled = enabled
        self._pool: ThreadPoolExecutor | None = None
        self._pending: tuple[float, Future | None] | None = None  # (begun at, the steps; None while paused)
        self.started = 0  # frames whose steps ran on the worker
        self.beside_draw = 0  # of them, those begun while their frame's splat was still on the GPU
        self.last_ms = 0.0  # the last of them: how long the steps took there

    def can_start(self) -> bool:
        """Whether the next steps can run beside the GL thread's work (the module docstring's rules)."""
        if not self.enabled:
            return False
        gl = self.viewer.backend.gl_buffers
        return not self.viewer.interop or (gl is not None and bool(getattr(gl, "held", False)))

    def start(self, beside_draw: bool = False) -> bool:
        """Begin the next frame's steps on the worker, the GL thread's part first; False where they cannot
        overlap (the caller advances as usual) or were begun already. Call it once the frame in flight no
        longer needs the GPU's buffers to stay as they are: after its draw, before its readback, or with
        `beside_draw` from a splat frame once it is queued (SplatStyle.on_queued)."""
        if self._pending is not None or not self.can_start():
            return False
        self.beside_draw += beside_draw
        t0 = time.perf_counter()
        steps = None
        if self.viewer.begin_advance():  # (paused: nothing to run)
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="steps")
            steps = self._pool.submit(self._timed_steps)
        self._pending = (t0, steps)
        return True

    def _timed_steps(self):
        t0 = time.perf_counter()
        try:
            return self.viewer.run_steps()
        finally:
            self.last_ms = (time.perf_counter() - t0) * 1e3

    def finish(self) -> bool:
        """Wait for the steps `start` began and end the advance on the GL thread (the worker's error is
        raised here); False when none was begun."""
        if self._pending is None:
            return False
        t0, steps = self._pending
        self._pending = None
        outcome = steps.result() if steps is not None else None
        self.started += steps is not None
        self.viewer.end_advance(outcome, t0)
        return True

    def __enter__(self) -> StepAhead:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Wait for steps still running (a recording stopped early: not drawn), then stop the worker."""
        if self._pending is not None:
            _, steps = self._pending
            self._pending = None
            if steps is not None:
                with contextlib.suppress(BaseException):  # the recording is ending on its own error or signal
                    steps.result()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
