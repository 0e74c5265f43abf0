"""Offscreen capture: an RGBA8 framebuffer of the recording size, read back through a ring of PBOs.

    cap = PboCapture(canvas, (1920, 1080), depth=3)
    for i in ...:
        ready = cap.capture(lambda size: viewer.draw_scene(size, overlays=False), meta=i)
        for img, meta in ready: ...          # (H, W, 4) uint8, top row first, `depth - 1` frames late
    for img, meta in cap.drain(): ...
    cap.close()

`capture` draws into the framebuffer, then starts an asynchronous `glReadPixels` into pixel-pack buffer
`i % depth` (the call returns at once: the copy happens on the GPU when the draw is done) and fences it.
Only then does it map the buffer written `depth - 1` captures earlier, whose copy has long finished, so
the CPU does not wait for the GPU and the GPU does not wait for the CPU. The mapped rows are copied out
bottom-up (GL's first row is the bottom one), which flips the image for free.

`poll()` returns the frames whose fence has already signalled without waiting: the live viewer uses it
to take frames only when they are ready.

The framebuffer is a vispy `gloo.FrameBuffer` (vispy tracks which framebuffer is bound; binding our own
behind its back would be undone by its next `deactivate`); the PBOs and fences are PyOpenGL calls on the
same context. The pixel-pack binding is always restored to 0, because vispy's own `read()` uses client
memory.
"""

from __future__ import annotations

import ctypes
import time
from collections import deque
from collections.abc import Callable

import numpy as np

from app.core.errors import RuntimeFault
from app.render.gl_setup import gl_name


class PboCapture:
    def __init__(self, canvas, size: tuple[int, int], depth: int = 3):
        from vispy import gloo

        self.canvas = canvas
        self.w, self.h = int(size[0]), int(size[1])
        self.depth = max(int(depth), 1)
        self.nbytes = self.w * self.h * 4
        canvas.set_current()
        self.color = gloo.Texture2D(shape=(self.h, self.w, 4), format="rgba", internalformat="rgba8")
        self.depth_buffer = gloo.RenderBuffer((self.h, self.w), format="depth")
        self.fbo = gloo.FrameBuffer(color=self.color, depth=self.depth_buffer)
        self._pbos: list[int] = []
        self._pending: deque = deque()  # (slot, fence, meta)
        self._next = 0
        self.readback_ms: list[float] = []  # main-thread time per captured frame (start + collect)
        self.captured = 0

    @property
    def size(self) -> tuple[int, int]:
        return self.w, self.h

    def _gl(self):
        from OpenGL import GL

        return GL

    def _ensure_pbos(self) -> None:
        if self._pbos:
            return
        GL = self._gl()
        try:
            names = np.atleast_1d(GL.glGenBuffers(self.depth))
            self._pbos = [int(x) for x in names]
            for name in self._pbos:
                GL.glBindBuffer(GL.GL_PIXEL_PACK_BUFFER, name)
                GL.glBufferData(GL.GL_PIXEL_PACK_BUFFER, self.nbytes, None, GL.GL_STREAM_READ)
        except Exception as e:
            raise RuntimeFault(
                f"cannot create pixel-pack buffers of {self.nbytes / 2**20:.1f} MiB for "
                f"{self.w}x{self.h} readback: {e}"
            ) from e
        finally:
            GL.glBindBuffer(GL.GL_PIXEL_PACK_BUFFER, 0)

    def _fbo_handle(self) -> int:
        return gl_name(self.canvas, self.fbo)

    def capture(self, draw: Callable[[tuple[int, int]], None], meta=None, wait: bool = True) -> list:
        """Draw with `draw((w, h))` into the framebuffer and start its readback.

        Returns the finished (image, meta) pairs, oldest first: with `wait` the one `depth - 1` captures
        old (mapping it may wait for the GPU only when it is that far behind); without, only the frames
        already done, and when all `depth` buffers are still busy the oldest is waited for.
        """
        self.canvas.set_current()
        GL = self._gl()
        self._ensure_pbos()
        ctx = self.canvas.context
        with self.fbo:
            draw((self.w, self.h))
            handle = self._fbo_handle()  # flushes the draw commands; this framebuffer is now bound
            t0 = time.perf_counter()
            slot = self._next
            self._next = (self._next + 1) % self.depth
            try:
                GL.glBindFramebuffer(GL.GL_READ_FRAMEBUFFER, handle)
                GL.glReadBuffer(GL.GL_COLOR_ATTACHMENT0)
                GL.glPixelStorei(GL.GL_PACK_ALIGNMENT, 4)
                GL.glBindBuffer(GL.GL_PIXEL_PACK_BUFFER, self._pbos[slot])
                GL.glReadPixels(0, 0, self.w, self.h, GL.GL_RGBA, GL.GL_UNSIGNED_BYTE, ctypes.c_void_p(0))
            finally:
                GL.glBindBuffer(GL.GL_PIXEL_PACK_BUFFER, 0)
            fence = GL.glFenceSync(GL.GL_SYNC_GPU_COMMANDS_COMPLETE, 0)
            GL.glFlush()
            start_ms = (time.perf_counter() - t0) * 1e3
        ctx.flush_commands()  # the framebuffer unbind vispy queued
        self._pending.append((slot, fence, meta))
        self.captured += 1
        t1 = time.perf_counter()
        out = []
        if wait:
            while len(self._pending) > self.depth - 1:
                out.append(self._collect())
        else:
            out = self.poll()
            if len(self._pending) >= self.depth:
                out.append(self._collect())
        collect_ms = (time.perf_counter() - t1) * 1e3
        self.readback_ms.append(start_ms + collect_ms)
        return out

    def _signalled(self, fence) -> bool:
        GL = self._gl()
        r = GL.glClientWaitSync(fence, 0, 0)
        return r in (GL.GL_ALREADY_SIGNALED, GL.GL_CONDITION_SATISFIED)

    def poll(self) -> list:
        """The pending frames that are already done, oldest first, without waiting."""
        self.canvas.set_current()
        out = []
        while self._pending and self._signalled(self._pending[0][1]):
            out.append(self._collect())
        return out

    def _collect(self):
        GL = self._gl()
        slot, fence, meta = self._pending.popleft()
        GL.glDeleteSync(fence)
        GL.glBindBuffer(GL.GL_PIXEL_PACK_BUFFER, self._pbos[slot])
        try:
            ptr = GL.glMapBufferRange(GL.GL_PIXEL_PACK_BUFFER, 0, self.nbytes, GL.GL_MAP_READ_BIT)
            address = ptr if isinstance(ptr, int) else ctypes.cast(ptr, ctypes.c_void_p).value
            if not address:
                raise RuntimeFault(f"glMapBufferRange returned NULL for the {self.w}x{self.h} readback")
            try:
                src = np.ctypeslib.as_array((ctypes.c_ubyte * self.nbytes).from_address(address))
                img = np.empty((self.h, self.w, 4), dtype=np.uint8)
                np.copyto(img, src.reshape(self.h, self.w, 4)[::-1])  # GL rows are bottom-up
            finally:
                GL.glUnmapBuffer(GL.GL_PIXEL_PACK_BUFFER)
        finally:
            GL.glBindBuffer(GL.GL_PIXEL_PACK_BUFFER, 0)
        return img, meta

    def drain(self) -> list:
        """Every pending frame, oldest first (waits for the GPU)."""
        if not self._pending:
            return []
        self.canvas.set_current()
        t0 = time.perf_counter()
        out = [self._collect() for _ in range(len(self._pending))]
        if self.readback_ms:
            self.readback_ms[-1] += (time.perf_counter() - t0) * 1e3
        return out

    def close(self) -> None:
        """Free the buffers (pending frames are dropped)."""
        try:
            self.canvas.set_current()
            GL = self._gl()
            while self._pending:
                GL.glDeleteSync(self._pending.popleft()[1])
            if self._pbos:
                GL.glDeleteBuffers(len(self._pbos), self._pbos)
            self._pbos = []
            for obj in (self.fbo, self.color, self.depth_buffer):
                obj.delete()
            self.canvas.context.flush_commands()
        except Exception:  # closing after the context died: nothing left to free
            self._pbos = []
            self._pending.clear()
