"""The particle pass: soft point sprites tone-mapped as they are blended, straight onto the target.

The look is additive light x summed over sprites, shown as 1 - exp(-x) over the background colour b:
    b + (1 - b)(1 - exp(-sum x_i)) = 1 - (1 - b) prod_i (1 - s_i),   s_i = 1 - exp(-x_i)
The right-hand side is "screen" blending, glBlendFunc(ONE_MINUS_DST_COLOR, ONE): dst += s (1 - dst),
starting from a target cleared to b. So each sprite writes s_i and no HDR buffer, clear or full-screen
tone-map pass is needed. Measured on the H200 at N = 65,536 (1280x720): the draw went from 0.645 ms
(RGBA16F accumulate + clear + tone-map) to 0.504 ms; the images differ by at most 4/255 (mean 0.04/255),
the rounding of the 8-bit target between blends.

Two vertex buffers per frame: positions float4 [x, y, z, m] (the backends' layout) and speeds float.
A CUDA backend may write both itself (`gl_names()` gives their GL names, for `attach_gl_buffers`); the
host path uploads `host_render_arrays()` with `upload()`. A third, static buffer holds each body's
component (app.model.components), uploaded once by `set_components`; the per-component colour and gain
(brightness, 0 when hidden) are two uniform tables, so showing, hiding or recolouring a component is a
uniform change, never a buffer upload, and gravity never sees it.

At large N two settings trade detail for draw time: `render.min_sprite` (the smallest sprite drawn, px;
smaller ones are dimmed to the same light) and `render.draw_limit` (at most that many bodies drawn: every
k-th through a cached index buffer, with k times the light). On GH100 the pass is bound by the number of
points rather than the fill (docs/tree.md: 1 px sprites saved 14% at 1M, every 2nd body halved it at 8M).

Colour by speed goes through a 256-entry colormap, normalised by a robust speed scale: on the host path
`update_speed_scale(speeds)` takes a running 95th percentile (the viewer calls it every ~30 frames); a
GPU path sets it with `set_speed_scale(value)`. Colour by force error (`error`, `error-ab`) reads the same
buffer as positions on the colormap already, 0..1 (app/engine/error_colours.py, the legend's log scale):
`upload_values(values)` on the host path, or a backend's device copy into the buffer (interop).
"""

from __future__ import annotations

import logging

import numpy as np
from vispy import gloo

from app.core.errors import ConfigError
from app.model import components as comps
from app.render.colormaps import CMAP_LOW, colormap_texture_data
from app.render.gl_setup import gl_name
from app.render.shaders import build_program
from app.scene import RenderSettings

log = logging.getLogger(__name__)

COLOR_BY = {
    "speed": 0.0,
    "mass": 1.0,
    "none": 2.0,
    "component": 3.0,
    "component-speed": 4.0,
    "component-mass": 5.0,
    # the force error (app/engine/error_colours.py): the speed buffer holds each body's place on the legend's
    # log scale, 0..1, written by whoever computed it (the panel's Compare section), not its speed
    "error": 6.0,
    "error-ab": 6.0,
}
ERROR_VIEWS = ("error", "error-ab")
INTENSITY = 1.1  # peak light of one sprite at brightness 1 (1 - exp(-1.1) = 67%)
# Above DENSITY_REF_N bodies each sprite gives sqrt(REF / N) of the light, so dense cores do not burn out.
# It is done by shrinking the sprite's area (diameter by (REF / N)^(1/4)) rather than dimming it: the same
# light, crisper dense scenes, and half the fill at N = 65k, which matters on GH100 (H100/H200), whose few
# graphics units made the 65k-body sprite pass 0.55 ms at full size.
DENSITY_REF_N = 16384
DENSITY_MIN_GAIN = 0.12
SPEED_PERCENTILE = 95.0
SPEED_SAMPLE = 65536  # bodies sampled for the percentile (cost stays flat at large N)


class ParticleRenderer:
    """Owns the sprite program, the two body VBOs and the colormap texture.

    Create it with a current GL context (inside a vispy Canvas).
    """

    def __init__(self, settings: RenderSettings | None = None, shader_dir=None, canvas=None):
        self._canvas = canvas or gloo.get_current_canvas()
        self.program = build_program("particles.vert", "particles.frag", shader_dir, self._canvas)
        self.n = 0
        self.pos_vbo: gloo.VertexBuffer | None = None
        self.speed_vbo: gloo.VertexBuffer | None = None
        self.comp_vbo: gloo.VertexBuffer | None = None
        self.components: comps.Components | None = None  # of the bodies in the buffers
        self.drawn: list[comps.Drawn] = comps.drawn(None, {})  # each component's effective style
        self.speed_scale = 1.0
        self.mean_mass = 1.0
        self._cmap_name: str | None = None
        self._cmap_tex: gloo.Texture2D | None = None
        self.settings = settings or RenderSettings()
        self.apply_settings(self.settings)
        self.set_mean_mass(1.0)
        self.set_speed_scale(1.0)
        self._speed_scale_set = False  # the first measured percentile replaces this placeholder
        self._strided: tuple[tuple[int, int], gloo.IndexBuffer] | None = None  # ((N, k), every k-th body)
        # the host path's last upload (positions, and the speeds or values the colormap reads); stale
        # where a backend fills the buffers on the GPU
        self.host_pos4: np.ndarray | None = None
        self.host_values: np.ndarray | None = None

    # --- settings ------------------------------------------------------------------------------
    def apply_settings(self, settings: RenderSettings) -> None:
        if settings.color_by not in COLOR_BY:
            raise ConfigError(f"render.color_by: {settings.color_by!r} is not one of {', '.join(COLOR_BY)}")
        self.settings = settings
        if settings.colormap != self._cmap_name:
            data = colormap_texture_data(settings.colormap)
            if self._cmap_tex is None:
                self._cmap_tex = gloo.Texture2D(
                    data, interpolation="linear", wrapping="clamp_to_edge", internalformat="rgb32f"
                )
            else:
                self._cmap_tex.set_data(data)
            self._cmap_name = settings.colormap
            self.program["u_cmap"] = self._cmap_tex
        p = self.program
        p["u_point_size"] = float(settings.point_size)
        p["u_size_by_mass"] = 1.0 if settings.size_by_mass else 0.0
        p["u_color_by"] = COLOR_BY[settings.color_by]
        p["u_cmap_low"] = 0.0 if settings.colormap == "white" else CMAP_LOW
        p["u_min_sprite"] = float(settings.min_sprite)
        self._set_component_table()
        self._set_brightness()

    def set_components(self, components: comps.Components | None) -> None:
        """The bodies' components (None: all one); `allocate(n)` first. Uploads the index once."""
        if components is not None and components.n != self.n:
            raise ValueError(f"{components.n} component indices for {self.n} bodies")
        self.components = components
        unmatched = comps.check_styles(self.settings.components, components)
        if unmatched and components is not None:
            log.warning(
                "render.components: %s match no component (components: %s)",
                ", ".join(unmatched),
                ", ".join(components.names),
            )
        if self.comp_vbo is not None and self.n:
            index = np.zeros(self.n) if components is None else components.index
            self.comp_vbo.set_data(index.astype(np.float32))
        self._set_component_table()

    def _set_component_table(self) -> None:
        self.drawn = comps.drawn(self.components, self.settings.components)
        table = comps.StyleTable.of(self.drawn)
        # element by element: vispy 0.17 sends a whole uniform array only the first time it is set (later
        # sets of the array go out with count 1, i.e. element 0 alone)
        for i in range(len(table.gain)):
            self.program[f"u_comp_color[{i}]"] = table.color[i]
            self.program[f"u_comp_gain[{i}]"] = float(table.gain[i])

    def visible_mask(self) -> np.ndarray | None:
        """Which bodies are drawn (None: all of them)."""
        return comps.visible_rows(self.components, self.drawn)

    def density_gain(self) -> float:
        """Per-sprite light factor for the body count: 1 up to DENSITY_REF_N, then sqrt(REF / N)."""
        if self.n <= DENSITY_REF_N:
            return 1.0
        return max((DENSITY_REF_N / self.n) ** 0.5, DENSITY_MIN_GAIN)

    def draw_stride(self) -> int:
        """Every k-th body is drawn (render.draw_limit): 1 up to the limit, else ceil(N / limit)."""
        limit = int(self.settings.draw_limit)
        return 1 if limit <= 0 or self.n <= limit else -(-self.n // limit)

    def _set_brightness(self) -> None:
        # a drawn body stands for `stride` bodies: k times the light keeps the image's total light
        self.program["u_brightness"] = float(self.settings.brightness) * INTENSITY * self.draw_stride()
        self.program["u_density_size"] = self.density_gain() ** 0.5

    def _drawn_indices(self) -> gloo.IndexBuffer | None:
        """The index buffer of every k-th body (None when all are drawn), made once per (N, k)."""
        k = self.draw_stride()
        if k == 1:
            self._strided = None
            return None
        if self._strided is None or self._strided[0] != (self.n, k):
            if self._strided is not None:
                self._strided[1].delete()
            self._strided = ((self.n, k), gloo.IndexBuffer(np.arange(0, self.n, k, dtype=np.uint32)))
        return self._strided[1]

    def set_speed_scale(self, value: float) -> None:
        """The speed drawn at the top of the colormap (GPU path: whoever knows the speeds sets it)."""
        value = float(value)
        if not np.isfinite(value) or value <= 0:
            value = 1.0
        self.speed_scale = value
        self._speed_scale_set = True
        self.program["u_inv_speed_scale"] = 1.0 / value

    def update_speed_scale(self, speeds: np.ndarray, smoothing: float = 0.5) -> float:
        """Blend the 95th percentile of `speeds` (a sample of them at large N) into the running scale."""
        s = np.asarray(speeds).reshape(-1)
        if s.size == 0:
            return self.speed_scale
        if s.size > SPEED_SAMPLE:
            s = s[:: s.size // SPEED_SAMPLE]
        p = float(np.percentile(s, SPEED_PERCENTILE))
        if not np.isfinite(p) or p <= 0:
            p = float(np.max(s)) if np.isfinite(s).all() and s.max() > 0 else 1.0
        new = p if not self._speed_scale_set else (1 - smoothing) * self.speed_scale + smoothing * p
        self.set_speed_scale(new)
        return new

    def set_mean_mass(self, mean_mass: float) -> None:
        m = float(mean_mass)
        self.mean_mass = m if np.isfinite(m) and m > 0 else 1.0
        self.program["u_inv_mean_mass"] = 1.0 / self.mean_mass

    # --- buffers -------------------------------------------------------------------------------
    def allocate(self, n: int) -> bool:
        """Make the VBOs hold `n` bodies; True when they were (re)created (their GL names changed)."""
        n = int(n)
        if n == self.n and self.pos_vbo is not None:
            return False
        self.pos_vbo = gloo.VertexBuffer(np.zeros((max(n, 1), 4), dtype=np.float32))
        self.speed_vbo = gloo.VertexBuffer(np.zeros(max(n, 1), dtype=np.float32))
        self.comp_vbo = gloo.VertexBuffer(np.zeros(max(n, 1), dtype=np.float32))
        self.program["a_pos"] = self.pos_vbo
        self.program["a_speed"] = self.speed_vbo
        self.program["a_comp"] = self.comp_vbo
        self.n = n
        self.components = None
        self._set_component_table()
        self._set_brightness()
        return True

    def gl_names(self) -> tuple[int, int]:
        """GL names of (position VBO, speed VBO), for CUDA-GL interop registration.

        Flushes the GLIR queue so the buffers exist in GL with their full size.
        """
        if self.pos_vbo is None or self.speed_vbo is None:
            raise RuntimeError("allocate(n) before asking for the buffers' GL names")
        return gl_name(self._canvas, self.pos_vbo), gl_name(self._canvas, self.speed_vbo)

    def upload(self, pos4: np.ndarray, speeds: np.ndarray) -> None:
        """Host path: copy (N, 4) float32 [x, y, z, m] and (N,) float32 speeds into the VBOs."""
        pos4 = np.ascontiguousarray(pos4, dtype=np.float32).reshape(-1, 4)
        speeds = np.ascontiguousarray(speeds, dtype=np.float32).reshape(-1)
        if speeds.shape[0] != pos4.shape[0]:
            raise ValueError(f"{pos4.shape[0]} positions but {speeds.shape[0]} speeds")
        self.allocate(pos4.shape[0])
        self.host_pos4, self.host_values = (
            pos4,
            speeds,
        )  # what the buffers hold (the splat's CPU twin reads it)
        self.set_mean_mass(float(pos4[:, 3].mean()) if len(pos4) else 1.0)
        assert self.pos_vbo is not None and self.speed_vbo is not None  # allocate() made them
        if len(pos4):
            self.pos_vbo.set_data(pos4)
            self.speed_vbo.set_data(speeds)

    def upload_values(self, values: np.ndarray) -> None:
        """Host path: (N,) float32 into the per-body float the colormap reads (the speed buffer), in place
        of the speeds: the force error's colour positions (render.color_by = error / error-ab)."""
        values = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
        if self.speed_vbo is None or values.shape[0] != self.n:
            raise ValueError(f"{values.shape[0]} values for {self.n} bodies")
        if self.n:
            self.speed_vbo.set_data(values)
        self.host_values = values

    # --- drawing -------------------------------------------------------------------------------
    def draw(self, view: np.ndarray, proj: np.ndarray, size: tuple[int, int], pixel_ratio: float = 1.0):
        """Clear the active framebuffer to the background and draw the bodies seen through `view`/`proj`.

        `size` = (width, height) of that framebuffer in pixels; `pixel_ratio` scales sprite sizes (HiDPI).
        """
        w, h = int(size[0]), int(size[1])
        p = self.program
        p["u_point_size"] = float(self.settings.point_size) * float(pixel_ratio)
        p["u_view"] = view
        p["u_proj"] = proj
        gloo.set_viewport(0, 0, w, h)
        gloo.set_clear_color(tuple(float(c) for c in self.settings.background) + (1.0,))
        gloo.clear(color=True, depth=False)
        if self.n > 0:
            gloo.set_state(
                None,
                blend=True,
                depth_test=False,
                cull_face=False,
                blend_func=("one_minus_dst_color", "one"),
                blend_equation="func_add",
            )
            p.draw("points", indices=self._drawn_indices())
        gloo.set_state(None, blend=False, depth_test=False, cull_face=False)

    def delete(self) -> None:
        for obj in (
            self.pos_vbo,
            self.speed_vbo,
            self.comp_vbo,
            self._cmap_tex,
            self._strided[1] if self._strided else None,
        ):
            if obj is not None:
                obj.delete()
        self._strided = None
        self.pos_vbo = self.speed_vbo = self.comp_vbo = self._cmap_tex = None
        self.n = 0
