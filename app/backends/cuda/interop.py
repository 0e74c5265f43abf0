"""CUDA–GL interop: the renderer's vertex buffers registered with CUDA, mapped only inside `with`.

The position VBO (float4 [x, y, z, m]) and the speed VBO are written on the GPU after each step (the
run's copies, multi_interop.py); both are registered with map flags NONE.
`GLBuffers.mapped()` always unmaps, also when a launch inside it raises (NVIDIA Warp's pattern);
nothing may draw while the buffers are mapped. `hold()` keeps them mapped across frames, for the splat
style, which never draws them with GL: `mapped()` then hands out the held pointers with no map or unmap,
and `release()` (before GL draws them again, or they are reallocated) unmaps. Registration must be
redone whenever the renderer reallocates a buffer (a new N): the backend's `attach_gl_buffers` does that.

Held buffers have one reader, the splat frame, and their writer may come from another thread: a
recording begins the next frame's steps on a worker thread before it draws this frame
(app/render/step_ahead.py). The reader names its stream (`mapped(reader=stream)`) and an event marks the
end of its reads there; every other use of the held buffers is a writer (the steps' copies) and waits
on the host for the last marked read, and first, after `expect_read()`, for the read that is due to be
marked at all (`cancel_read()` lets it go without one). In a recording the writer comes some 10 ms
after the read, which is long done: a wait of microseconds.

One implementation for every CUDA backend: `register_gl_buffers` (whether interop can work here, and the
registration), `GLBuffers.mapped_for(n)` (mapped, with room for n bodies) and `fall_back` (the one
warning when it cannot) serve every run on GPUs, one GPU's included (app/backends/cuda/multi_interop.py
copies each step's state into them on the run's first GPU).
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from app.backends.cuda.context import gl_module_or_reason
from app.core.errors import RuntimeFault

log = logging.getLogger(__name__)
# how long a writer of held buffers waits for a read that is due (expect_read): a frame's draw takes
# milliseconds (0.84 ms at 16M bodies); this is the backstop against a draw that never came
READ_DUE_WITHIN_S = 120.0


@dataclass(frozen=True)
class MappedPointers:
    pos: int  # device pointer of the float4 position VBO
    pos_bytes: int
    speed: int  # device pointer of the float speed VBO
    speed_bytes: int


class GLBuffers:
    """Two registered GL buffers (positions, speeds) of one CUDA context."""

    def __init__(self, cuda_gl, position_vbo: int, speed_vbo: int, new_event=None):
        """`new_event`: makes the read event (default: a pycuda Event without timing, made on the first
        read, in the reader's context: the one the buffers are registered in)."""
        flags = cuda_gl.graphics_map_flags.NONE
        self.position_vbo = int(position_vbo)
        self.speed_vbo = int(speed_vbo)
        self._pos = cuda_gl.RegisteredBuffer(self.position_vbo, flags)
        try:
            self._speed = cuda_gl.RegisteredBuffer(self.speed_vbo, flags)
        except Exception:
            self._pos.unregister()
            raise
        self.is_mapped = False
        self.last_map_ms = 0.0
        self.last_unmap_ms = 0.0
        self._held: tuple[list, MappedPointers] | None = None  # (mappings, pointers) while held
        self._new_event = new_event or _untimed_event
        self._read_event: Any = None  # marks the end of the last held read on the reader's stream
        self._read_pending = False  # a held read was marked and no writer has waited for it yet
        self._read_marked = threading.Event()  # cleared while a read is due (expect_read)
        self._read_marked.set()

    @property
    def held(self) -> bool:
        return self._held is not None

    def hold(self) -> None:
        """Map both buffers until `release()`; `mapped()` meanwhile yields these pointers. Why: each map
        orders CUDA's later work after GL's earlier work, and the splat's frame on one H100 at 1M waited
        2.4 ms on that map in one frame of ten or more (GL's work of the frame before; docs/rendering.md),
        where GL never reads these buffers in that style."""
        if self._held is not None:
            return
        if self.is_mapped:
            raise RuntimeError("GL buffers are mapped inside mapped(): hold() them outside it")
        mappings, ptrs = self._map()
        self._held = (mappings, ptrs)

    def release(self) -> None:
        """Unmap held buffers (nothing if not held): before GL draws them or they are reallocated; after
        the last held read."""
        if self._held is not None:
            self.cancel_read()  # (a read due now will not come: GL gets the buffers back)
            self._wait_for_reads()
            mappings, _ = self._held
            self._held = None
            self._unmap(mappings, quiet=False)

    def _map(self) -> tuple[list, MappedPointers]:
        t0 = time.perf_counter()
        mappings = []
        try:
            for res in (self._pos, self._speed):
                mappings.append(res.map())
            pos_ptr, pos_bytes = mappings[0].device_ptr_and_size()
            speed_ptr, speed_bytes = mappings[1].device_ptr_and_size()
        except BaseException:
            self._unmap(mappings, quiet=True)
            raise
        self.is_mapped = True
        self.last_map_ms = (time.perf_counter() - t0) * 1e3
        return mappings, MappedPointers(int(pos_ptr), int(pos_bytes), int(speed_ptr), int(speed_bytes))

    @contextmanager
    def mapped(self, reader=None):
        """Yield MappedPointers; both buffers are unmapped on exit, whatever happened inside (held
        buffers stay mapped: their pointers, no map or unmap).

        Held, `reader` (a pycuda Stream) says that the user only reads them, on that stream: its end
        there is marked on exit. Any other held use is a writer and first waits for the last marked read
        (the module docstring). Not held, the unmap orders what comes after the reader's work."""
        if self._held is not None:
            if reader is None:
                self._wait_for_reads()
            self.last_map_ms = self.last_unmap_ms = 0.0
            try:
                yield self._held[1]
            finally:
                if reader is not None:  # (also when a launch failed: what it queued may run)
                    self._mark_read(reader)
            return
        if self.is_mapped:
            raise RuntimeError("GL buffers are already mapped (nested mapped() is not allowed)")
        mappings, ptrs = self._map()
        try:
            yield ptrs
        except BaseException:
            self._unmap(mappings, quiet=True)  # the original error is the one worth seeing
            raise
        else:
            self._unmap(mappings, quiet=False)

    def expect_read(self) -> None:
        """A read of the held buffers is due before the next write: writers wait until it is marked (or
        `cancel_read()`). Call it on the reader's thread before a writer can start on another."""
        self._read_marked.clear()

    def cancel_read(self) -> None:
        """The read that was due will not come (the frame was not drawn): writers go on."""
        self._read_marked.set()

    def _mark_read(self, stream) -> None:
        if self._read_event is None:
            self._read_event = self._new_event()
        self._read_event.record(stream)
        self._read_pending = True
        self._read_marked.set()

    def _wait_for_reads(self) -> None:
        if not self._read_marked.wait(READ_DUE_WITHIN_S):
            raise RuntimeFault(
                f"the frame due to read the GL buffers did not read them within {READ_DUE_WITHIN_S:g} s: "
                "the steps' copies into them cannot wait longer"
            )
        if self._read_pending:
            self._read_event.synchronize()
            self._read_pending = False

    @contextmanager
    def mapped_for(self, n: int, reader=None):
        """`mapped(reader)`, checking that the buffers hold n bodies (RuntimeFault saying what to do if
        not)."""
        with self.mapped(reader) as m:
            if m.pos_bytes < 16 * n or m.speed_bytes < 4 * n:
                raise RuntimeFault(
                    f"the GL buffers hold {m.pos_bytes // 16} positions / "
                    f"{m.speed_bytes // 4} speeds but N = {n}: resize them and call "
                    "attach_gl_buffers again"
                )
            yield m

    def capacity(self) -> int:
        """How many bodies the buffers can hold."""
        with self.mapped() as m:
            return min(m.pos_bytes // 16, m.speed_bytes // 4)

    def _unmap(self, mappings, quiet: bool) -> None:
        t0 = time.perf_counter()
        first_error = None
        for m in reversed(mappings):
            try:
                m.unmap()
            except Exception as e:  # keep unmapping the others
                first_error = first_error or e
                log.warning("unmapping a CUDA-registered GL buffer failed: %s", e)
        self.is_mapped = False
        self.last_unmap_ms = (time.perf_counter() - t0) * 1e3
        if first_error is not None and not quiet:
            raise first_error

    def unregister(self) -> None:
        try:
            self.release()
        except Exception as e:  # the context or the GL buffers are gone already
            log.debug("releasing held GL buffers failed: %s", e)
        for res in (getattr(self, "_speed", None), getattr(self, "_pos", None)):
            if res is None:
                continue
            try:
                res.unregister()
            except Exception as e:  # already invalid (context or GL buffer gone)
                log.debug("unregister failed: %s", e)
        self._pos = self._speed = None


def _untimed_event():
    from app.backends.cuda.context import driver

    drv = driver()
    return drv.Event(drv.event_flags.DISABLE_TIMING)


def register_gl_buffers(position_vbo: int, speed_vbo: int) -> tuple[GLBuffers | None, str | None]:
    """(GLBuffers, None), or (None, why interop cannot work here). The CUDA context that is to use the
    buffers and the GL context that owns them must both be current."""
    cuda_gl, reason = gl_module_or_reason()
    if cuda_gl is None:
        return None, reason
    renderer = gl_renderer_string()
    if renderer_cannot_interop(renderer):
        return None, f"the GL context renders with {renderer}, not on the NVIDIA GPU"
    try:
        return GLBuffers(cuda_gl, position_vbo, speed_vbo), None
    except Exception as e:
        return None, f"registering GL buffers {position_vbo}, {speed_vbo} failed: {e}"


def fall_back(reason: str) -> bool:
    """Say once why the renderer copies through the host instead; False, for attach_gl_buffers to return."""
    log.warning("CUDA-GL interop unavailable (%s): falling back to device→host→GL copies", reason)
    return False


def gl_renderer_string() -> str | None:
    """GL_RENDERER of the current GL context via PyOpenGL, or None when that cannot be asked."""
    try:
        from OpenGL import GL

        value = GL.glGetString(GL.GL_RENDERER)
    except Exception:
        return None
    if not value:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def renderer_cannot_interop(renderer: str | None) -> bool:
    """Software GL (Mesa llvmpipe/softpipe, Xvfb) cannot share buffers with CUDA."""
    if not renderer:
        return False
    low = renderer.lower()
    software = ("llvmpipe", "softpipe", "software", "mesa", "swrast")
    return "nvidia" not in low and any(s in low for s in software)
