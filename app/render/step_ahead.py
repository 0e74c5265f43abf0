"""The next frame's steps on a worker thread while the GL thread draws and reads back this frame: the
overlap of the headless `record` loop (app/render/recorder.py).

A recorded frame is its steps, its draw, and the readback of the framebuffer with the hand-over to the
encoder. At 1M bodies on one H100 the tree's two steps keep the GPU busy 11.2 of the 11.9 ms the host
waits for them (CUDA events); the draw (1.2 ms of host time, the GPU idle but for the splat's 0.2 ms) and
the readback and hand-over (2.9 ms) came after them: one after the other, a frame was their sum,
16.1-17.5 ms. Here the next frame's steps start on a worker thread, and this frame is made beside them:
- `start_before_draw`: where the frame is a splat frame of the interop buffers held mapped (every frame
  after the first of a splat recording), the steps begin before it is drawn, and the frame's kernels queue
  on the GPU behind the steps' first ones. The GL thread's whole frame, from the draw to the hand-over,
  runs while the steps do;
- `start`: any other frame (the first, sprites, the host path) begins them after its draw, beside the
  readback.

Why it is safe:
- the worker runs `Viewer.run_steps` alone, which touches no GL; the GL thread runs `begin_advance` before
  (the buffers in sync) and `end_advance` after (the host path's upload, the stats, the hooks), and takes
  the frame's host-side figures (its FrameInfo) before the steps begin;
- what the steps write is not read by the frame in flight. On the host path (no interop) they write the
  backend's arrays, and the frame's vertex buffer was uploaded before its draw (started after the draw
  only: the CPU twin's splat reads the uploaded arrays, which may be the backend's own). Under interop
  only while splat frames hold the buffers mapped (`GLBuffers.hold`): GL never reads them then, and the
  steps write them only in their last copies. Those wait on the host for the frame's read
  (`GLBuffers.expect_read`, then an event on the splat's stream marks the read's end), and a splat frame
  that fails meanwhile is raised instead of drawn as sprites (`SplatStyle.strict`): GL must not draw
  buffers the worker writes. Buffers that GL maps for each frame (sprites over CUDA) are not stepped
  ahead at all: their map would run on the worker thread beside GL's reads of the frame in flight.

The frames are the same bytes either way: the same steps in the same order, drawn at the same states
(tests/test_step_ahead.py: on the CPU, and on a GPU against the frames stepped in turn; the recordings'
sha256 in bench/results and tests/test_splat_record_gpu.py's identical runs).
"""

from __future__ import annotations

import contextlib
import time
from concurrent.futures import Future, ThreadPoolExecutor

from app.render.splat_style import SplatStyle


class StepAhead:
    """One frame's steps at a time on one worker thread (`start_before_draw` or `start`, then `finish`
    before the next frame); a context manager that waits for steps still running and stops the worker on
    exit. `enabled` False (a window, whose events the GL thread runs between frames): none are begun."""

    def __init__(self, viewer, enabled: bool = True):
        self.viewer = viewer
        self.enabled = enabled
        self._pool: ThreadPoolExecutor | None = None
        self._pending: tuple[float, Future | None] | None = None  # (begun at, the steps; None while paused)
        self._read_due = None  # the GLBuffers whose read the steps' copies wait for (start_before_draw)
        self.started = 0  # frames whose steps ran on the worker
        self.before_draw = 0  # of them, those begun before the frame before them was drawn
        self.last_ms = 0.0  # the last of them: how long the steps took there

    def _held_buffers(self):
        """The interop buffers, where splat frames hold them mapped (GLBuffers.hold); else None."""
        return SplatStyle.held_buffers(self.viewer.backend) if self.viewer.interop else None

    def can_start(self) -> bool:
        """Whether the next steps can run beside the readback (the module docstring's rules)."""
        return self.enabled and (not self.viewer.interop or self._held_buffers() is not None)

    def start_before_draw(self) -> bool:
        """Begin the next frame's steps before this frame is drawn, where it is a splat frame of held
        buffers: their copies into the buffers wait for its read (GLBuffers.expect_read), and a splat
        frame that fails meanwhile is raised, not drawn as sprites (SplatStyle.strict). False where they
        cannot (`start` after the draw then). Call it after the frame's host-side figures are taken."""
        gl = self._held_buffers()
        if self._pending is not None or not self.enabled or gl is None:
            return False
        gl.expect_read()
        self._read_due, self.viewer.splat.strict = gl, True
        self.before_draw += 1
        return self._begin()

    def start(self) -> bool:
        """Begin the next frame's steps on the worker after this frame's draw, before its readback; False
        where they cannot overlap (the caller advances as usual) or were begun already."""
        if self._pending is not None or not self.can_start():
            return False
        return self._begin()

    def _begin(self) -> bool:
        t0 = time.perf_counter()
        steps = None
        if self.viewer.begin_advance():  # the GL thread's part (paused: nothing to run)
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

    def _no_read_due(self) -> None:
        if self._read_due is not None:
            self._read_due.cancel_read()  # (marked already where the frame was drawn)
            self._read_due, self.viewer.splat.strict = None, False

    def finish(self) -> bool:
        """Wait for the steps begun and end the advance on the GL thread (the worker's error is raised
        here); False when none was begun."""
        if self._pending is None:
            return False
        t0, steps = self._pending
        self._pending = None
        try:
            outcome = steps.result() if steps is not None else None
        finally:
            self._no_read_due()
        self.started += steps is not None
        self.viewer.end_advance(outcome, t0)
        return True

    def __enter__(self) -> StepAhead:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Wait for steps still running (a recording stopped early, its frame perhaps not drawn: the read
        their copies wait for is called off first), then stop the worker."""
        if self._pending is not None:
            _, steps = self._pending
            self._pending = None
            self._no_read_due()  # (the frame may never be drawn: the steps' copies go on without its read)
            if steps is not None:
                with contextlib.suppress(BaseException):  # the recording is ending on its own error or signal
                    steps.result()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
