"""The GL half of the `splat` draw style: an RGBA8 texture the size of the frame and one quad that shows it
(shaders/splat_quad.*). The CUDA half (app/render/splat_cuda.py) writes the tone-mapped image in device
memory; `show_device` copies it into the texture through CUDA-GL interop (the texture registered with
CUDA once per size, mapped for the copy only), with no host round trip. `show_host` uploads an image from
the host instead: the path when the texture cannot be registered (said once in the log), and the way the
numba twin's image reaches the screen in the CPU tests. The panel and other overlays draw over the quad.

A resize makes a new texture (and registration) of the new size and drops the old one: GL memory follows
the window, and the CUDA buffers are the splatter's, grown only (tests/test_splat_gpu.py).
"""

from __future__ import annotations

import logging

import numpy as np
from vispy import gloo

from app.render.gl_setup import gl_name
from app.render.shaders import build_program

log = logging.getLogger(__name__)

GL_TEXTURE_2D = 0x0DE1
CORNERS = np.array([[-1.0, -1.0], [1.0, -1.0], [-1.0, 1.0], [1.0, 1.0]], np.float32)


class SplatLayer:
    """The frame texture and its quad; create it with the GL context current."""

    def __init__(self, canvas=None):
        self._canvas = canvas or gloo.get_current_canvas()
        self.program = build_program("splat_quad.vert", "splat_quad.frag", canvas=self._canvas)
        self._corners = gloo.VertexBuffer(CORNERS)
        self.program["a_corner"] = self._corners
        self.texture: gloo.Texture2D | None = None
        self.size: tuple[int, int] | None = None
        self._registered = None  # pycuda.gl.RegisteredImage of the texture, made on the first device copy
        self._device = None  # whose context registered it
        self.interop_failed: str | None = None  # why the texture could not be registered (host copies then)

    def _ensure(self, width: int, height: int) -> None:
        if self.size == (width, height):
            return
        self._unregister()
        if self.texture is not None:
            self.texture.delete()
        self.texture = gloo.Texture2D(
            shape=(height, width, 4), format="rgba", internalformat="rgba8", interpolation="nearest"
        )
        self.program["u_frame"] = self.texture
        self.size = (width, height)

    # --- filling ---------------------------------------------------------------------------------
    def show_host(self, image: np.ndarray) -> None:
        """An (H, W, 4) uint8 image, top row first, into the texture."""
        h, w = image.shape[:2]
        self._ensure(w, h)
        assert self.texture is not None
        self.texture.set_data(np.ascontiguousarray(image, np.uint8))

    def show_device(self, device, image_ptr: int, width: int, height: int, stream=None) -> bool:
        """The RGBA8 image at device pointer `image_ptr` (on `device`, app.backends.cuda.device.CudaDevice)
        into the texture by a device-to-array copy queued on `stream` (the splatter's: behind the frame's
        kernels; the host does not wait, and the unmap orders GL's draw of the texture after the copy);
        False when the texture cannot be registered with CUDA (`interop_failed` says why; the caller copies
        through the host)."""
        self._ensure(width, height)
        if self.interop_failed is not None:
            return False
        with device.scope:
            if self._registered is None:
                try:
                    import pycuda.gl as cuda_gl

                    flags = cuda_gl.graphics_map_flags.WRITE_DISCARD
                    name = gl_name(self._canvas, self.texture)
                    self._registered = cuda_gl.RegisteredImage(name, GL_TEXTURE_2D, flags)
                    self._device = device
                except Exception as e:
                    self.interop_failed = f"registering the splat's GL texture with CUDA failed: {e}"
                    log.warning("%s: its frames go device -> host -> GL", self.interop_failed)
                    return False
            mapping = self._registered.map(stream)
            try:
                copy = device.drv.Memcpy2D()
                copy.set_src_device(image_ptr)
                copy.set_dst_array(mapping.array(0, 0))
                copy.width_in_bytes = copy.src_pitch = 4 * width
                copy.height = height
                if stream is None:
                    copy(aligned=True)
                else:
                    copy(stream)
            finally:
                mapping.unmap(stream)
        return True

    # --- drawing ---------------------------------------------------------------------------------
    def draw(self, size: tuple[int, int]) -> None:
        """The frame over the whole viewport of `size` (no blending: it holds the background)."""
        gloo.set_viewport(0, 0, int(size[0]), int(size[1]))
        gloo.set_state(None, blend=False, depth_test=False, cull_face=False)
        self.program.draw("triangle_strip")

    def _unregister(self) -> None:
        if self._registered is not None and self._device is not None:
            try:
                with self._device.scope:
                    self._registered.unregister()
            except Exception as e:  # the context is gone: nothing left to release
                log.debug("unregistering the splat texture failed: %s", e)
            self._registered = None

    def delete(self) -> None:
        self._unregister()
        for obj in (self.texture, self._corners):
            if obj is not None:
                obj.delete()
        self.texture = None
        self.size = None
