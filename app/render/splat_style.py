"""Which draw style a frame gets (`render.style`), and the viewer's `splat` frames: the CUDA splatter on the
render GPU reading the same interop vertex buffers the sprites draw from, its image shown by the GL layer.

    style = SplatStyle(canvas)
    drawn = style.draw(viewer, size, shifted)   # False: draw sprites instead (style.why says why)

`render.style`: sprites; splat; auto, splat from `render.splat_from` bodies where a backend fills the
renderer's buffers on a GPU (CUDA-GL interop: `backend.gl_buffers`). Without one (the CPU backend, a copy
through the host) auto draws sprites and one log line says why; an explicit splat is drawn there by the
numba twin (app/render/splat_cpu.py) from the host path's arrays: the same image, bit for bit, at CPU speed
(about 30 ns a body and 20 ns a pixel on one core; a 1080p frame alone is ~40 ms). A splat that fails (a
kernel that does not build, a CUDA fault) is said once and the viewer goes on with sprites. Several GPUs
draw through the run's first ("GPU 0"), whose buffers hold every body after each step
(app/backends/cuda/multi_interop.py).

Per frame, on that GPU: the vertex buffers mapped, the splatter run on them (positions, and the per-body
float the colormap reads: the speeds or the force error's places), the buffers unmapped, the image copied
into the layer's texture (all of it queued on the splatter's stream, then waited for once), one quad
drawn. The light table (app/render/splat_light.py) is rebuilt when a setting, N or the colour scales
change; the components' indices go to the GPU once per set of components.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from app.render.splat import SplatParams, SplatView, reference_accum
from app.render.splat_light import body_light

log = logging.getLogger(__name__)


def wanted(settings, n: int) -> bool:
    """Whether `render.style` asks for splat at N bodies."""
    return settings.style == "splat" or (settings.style == "auto" and n >= int(settings.splat_from))


def params_of(settings, size: tuple[int, int]) -> SplatParams:
    exposure = float(settings.exposure)
    return SplatParams(
        int(size[0]),
        int(size[1]),
        exposure=exposure if exposure > 0 else None,
        tone_map=settings.tone_map,
        background=(
            float(settings.background[0]),
            float(settings.background[1]),
            float(settings.background[2]),
        ),
        bloom=float(settings.bloom),
        bloom_threshold=float(settings.bloom_threshold),
        bloom_radius=float(settings.bloom_radius),
    )


class SplatStyle:
    """The viewer's splat frames (one per viewer)."""

    def __init__(self, canvas):
        self._canvas = canvas
        self.layer = None  # app.render.splat_layer.SplatLayer, made on the first splat frame
        self.splatter = None  # app.render.splat_cuda.CudaSplatter on the render GPU
        self.why: str | None = None  # why the last frame was sprites though splat was asked, or None
        self.failed: str | None = None  # a splat that broke: sprites for the rest of the run
        self.last_ms = 0.0  # the last splat frame's own time: CUDA events on a GPU, wall time on the twin
        self.last_exposure: float | None = None  # the last splat frame's x per buffer unit
        self.manual_equivalent: float | None = None  # render.exposure that gives the last frame's exposure
        self._said: set[str] = set()
        self._light_key: tuple | None = None
        self._light = None
        self._comp_of = None  # the Components whose indices are on the GPU
        self._comp_ptr = 0
        # a failed frame is raised instead of drawn as sprites: set by record_scene while the next frame's
        # steps run beside this one, whose copies into the buffers wait for its reads (step_ahead.py)
        self.strict = False

    # --- the choice ------------------------------------------------------------------------------
    def _say(self, why: str, explicit: bool) -> None:
        if why not in self._said:
            self._said.add(why)
            (log.warning if explicit else log.info)("render.style: %s", why)

    # --- a frame ---------------------------------------------------------------------------------
    def draw(self, viewer, size: tuple[int, int], shifted: bool) -> bool:
        """The splat frame of `viewer`'s bodies onto the active framebuffer of `size`; False (nothing
        drawn) when sprites are to be drawn instead (`why` says why, when splat was asked)."""
        settings, backend = viewer.renderer.settings, viewer.backend
        n = int(backend.n)
        self.why = None
        if not wanted(settings, n):
            return False
        gpu = backend.gl_buffers is not None
        if self.failed:
            self.why = self.failed
        elif not gpu and settings.style == "auto":
            self.why = (
                f"sprites: auto draws splat where a GPU fills the GL buffers (this run: {backend.data_path})"
            )
            self._say(self.why, explicit=False)
        if self.why is not None:
            return False
        w, h = int(size[0]), int(size[1])
        view = SplatView.of(
            viewer.camera, (w, h), viewer.lens_shift(w) if shifted else 0.0
        )  # viewer.projection's
        light = self._light_for(viewer.renderer, n)
        try:
            if gpu:
                self._gpu_frame(viewer, backend, n, view, light, (w, h))
            else:
                self._say(f"splat on the CPU twin ({backend.data_path}): the same image, at CPU speed", True)
                self._twin_frame(viewer.renderer, view, light, (w, h))
        except Exception as e:  # a build or a launch that fails: the run goes on with sprites
            if self.strict:  # the next steps run beside this frame: GL may not draw their buffers now
                raise
            self.failed = self.why = f"sprites from now on: the splat frame failed ({type(e).__name__}: {e})"
            log.exception("render.style: %s", self.failed)
            return False
        self._layer().draw((w, h))
        return True

    def _gpu_frame(self, viewer, backend, n: int, view, light, size: tuple[int, int]) -> None:
        """The frame by the CUDA splatter on the render GPU, from the mapped vertex buffers."""
        splatter = self._splatter(backend.render_ordinal)
        renderer = viewer.renderer
        params = params_of(renderer.settings, size)
        comp = self._components(splatter.device, renderer.components, n)
        # the buffers are registered in the render GPU's primary context, which the splatter's device shares;
        # held mapped while frames are splat (GL never draws them then: GLBuffers.hold says why), released
        # by the viewer before a sprites frame
        with splatter.device.scope:
            backend.gl_buffers.hold()
        # (a reader: the next write waits for the end of these reads, GLBuffers.mapped)
        with splatter.device.scope, backend.gl_buffers.mapped_for(n, reader=splatter.stream) as mapped:
            frame = splatter.draw(mapped.pos, n, view, light, params, comp=comp, values=mapped.speed)
        layer = self._layer()
        if not layer.show_device(splatter.device, frame.image, *size, stream=splatter.stream):
            layer.show_host(splatter.read_image(frame))
        # Wait for the frame here, inside the particle pass's GL timer. Not waiting (the panel a frame late)
        # bought nothing in an A/B on one H100 at 1M with the tree (13.7 against 12.3-13.5 ms a frame): the
        # tree's step already waits for its walk on the host, so no GPU work was left to overlap, and GL's
        # timer then spanned the force's tail (docs/rendering.md, "Where the 1M frame's time goes"). In a
        # recording the next frame's steps run meanwhile (step_ahead.py), and the frame queues behind theirs.
        self._took(frame.gpu_ms, frame.exposure, light, params, n)

    def _twin_frame(self, renderer, view, light, size: tuple[int, int]) -> None:
        """The frame by the numba twin from the host path's last upload (positions, speeds or values)."""
        from app.render.splat_cpu import splat_image

        t0 = time.perf_counter()
        pos4, values = renderer.host_pos4, renderer.host_values
        if pos4 is None:
            raise RuntimeError("no bodies uploaded from the host yet")
        comp = renderer.components.index if renderer.components is not None else None
        params = params_of(renderer.settings, size)
        frame = splat_image(pos4, view, light, params, comp=comp, values=values)
        image = np.dstack([frame.image, np.full(frame.image.shape[:2], 255, np.uint8)])
        self._layer().show_host(image)
        self._took((time.perf_counter() - t0) * 1e3, frame.exposure, light, params, len(pos4))

    def _took(self, ms: float, exposure, light, params, n: int) -> None:
        self.last_ms, self.last_exposure = ms, exposure.x_per_unit
        self.manual_equivalent = exposure.x_per_unit * reference_accum(params, light.unit, n)

    def _splatter(self, ordinal: int):
        if self.splatter is None or self.splatter.device.ordinal != int(ordinal):
            from app.backends.cuda.device import CudaDevice
            from app.render.splat_cuda import CudaSplatter

            self.splatter = CudaSplatter(CudaDevice(int(ordinal)))
            self._comp_of = None
        return self.splatter

    def _layer(self):
        if self.layer is None:
            from app.render.splat_layer import SplatLayer

            self.layer = SplatLayer(self._canvas)
        return self.layer

    def _light_for(self, renderer, n: int):
        s = renderer.settings
        key = (
            s.color_by,
            s.colormap,
            s.brightness,
            tuple(renderer.drawn),
            n,
            renderer.speed_scale,
            renderer.mean_mass,
        )
        if key != self._light_key:
            self._light = body_light(s, renderer.drawn, n, renderer.speed_scale, renderer.mean_mass)
            self._light_key = key
        return self._light

    def _components(self, device, components, n: int) -> int:
        """The device pointer of the bodies' component indices (uint8), 0 when there are none."""
        if components is None or components.n != n:
            return 0
        if components is not self._comp_of:
            index = np.ascontiguousarray(np.minimum(components.index, 255), np.uint8)
            self._comp_ptr = device.scratch("splat-components", index.nbytes)
            with device.scope:
                device.drv.memcpy_htod(self._comp_ptr, index)
            self._comp_of = components
        return self._comp_ptr

    @staticmethod
    def held_buffers(backend):
        """The backend's interop buffers while splat frames hold them mapped (GLBuffers.hold), else None."""
        gl = backend.gl_buffers
        return gl if gl is not None and getattr(gl, "held", False) else None  # (a stand-in may not hold)

    def release(self, backend) -> None:
        """Unmap the backend's interop buffers if splat frames held them mapped, in the splatter's context
        (the one they are registered in); nothing otherwise."""
        gl = self.held_buffers(backend)
        if gl is None:
            return
        if self.splatter is None:
            gl.release()
            return
        with self.splatter.device.scope:
            gl.release()

    def close(self) -> None:
        if self.layer is not None:
            self.layer.delete()
            self.layer = None
        if self.splatter is not None:
            self.splatter.device.close()
            self.splatter = None
