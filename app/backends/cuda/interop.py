"""CUDA–GL interop: the renderer's vertex buffers registered with CUDA, mapped only inside `with`.

The position VBO (float4 [x, y, z, m]) is read *and* written by the kernels, so both buffers are
registered with map flags NONE (WRITE_DISCARD would allow the driver to hand the kernels garbage).
`GLBuffers.mapped()` always unmaps, also when a launch inside it raises (NVIDIA Warp's pattern);
nothing may draw while the buffers are mapped. Registration must be redone whenever the renderer
reallocates a buffer (a new N): `CudaBackend.attach_gl_buffers` does that.

Needs the GL context current on the calling thread when registering (and, to be safe, when mapping).
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MappedPointers:
    pos: int  # device pointer of the float4 position VBO
    pos_bytes: int
    speed: int  # device pointer of the float speed VBO
    speed_bytes: int


class GLBuffers:
    """Two registered GL buffers (positions, speeds) of one CUDA context."""

    def __init__(self, cuda_gl, position_vbo: int, speed_vbo: int):
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

    @contextmanager
    def mapped(self):
        """Yield MappedPointers; both buffers are unmapped on exit, whatever happened inside."""
        if self.is_mapped:
            raise RuntimeError("GL buffers are already mapped (nested mapped() is not allowed)")
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
        ptrs = MappedPointers(int(pos_ptr), int(pos_bytes), int(speed_ptr), int(speed_bytes))
        try:
            yield ptrs
        except BaseException:
            self._unmap(mappings, quiet=True)  # the original error is the one worth seeing
            raise
        else:
            self._unmap(mappings, quiet=False)

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
        for res in (getattr(self, "_speed", None), getattr(self, "_pos", None)):
            if res is None:
                continue
            try:
                res.unregister()
            except Exception as e:  # already invalid (context or GL buffer gone)
                log.debug("unregister failed: %s", e)
        self._pos = self._speed = None


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
