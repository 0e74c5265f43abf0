"""The splat's contract (app/render/splat.py) on its numba twin (app/render/splat_cpu.py), on the CPU: the
projection against the camera's and an independent numpy float32 evaluation of the same expressions, the
bilinear footprint's integer weights, the order-independent 64-bit accumulation against an int64 numpy
sum, skipped bodies (NaN, inf, behind the camera, off the frame, hidden) that add nothing, the light per
body against N, the tone map and exposure's integer arithmetic, and the overflow bound. The CUDA kernels
are held to the twin pixel for pixel by tests/test_splat_gpu.py."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import numpy as np
import pytest

from app.core.errors import ConfigError
from app.core.paths import KERNELS
from app.model import components as comps
from app.model.config import COLOR_BY
from app.render import splat, splat_light
from app.render.camera import OrbitCamera
from app.render.colormaps import CMAP_LOW, colormap
from app.render.splat import SplatParams, SplatView, exposure_for, hist_bin, tone_curve, tone_lut, tone_x
from app.render.splat_cpu import accumulate, histogram, level, splat_image, tonemap
from app.render.splat_light import BodyLight, body_light, light_cap, thresholds
from app.scene import RenderSettings

W, H = 320, 240
# test_render.py's FIXED_CAMERA, the one its GL test of a single body's pixel uses
CAMERA = dict(azimuth=30.0, elevation=20.0, distance=6.0, fov=45.0)
WHITE = RenderSettings(color_by="none", colormap="white")  # every channel the same light
F32 = np.float32
TONE_SIZE = splat.TONE_SIZE


def camera(**kw) -> OrbitCamera:
    return OrbitCamera(**{**CAMERA, **kw})


def white_light(n: int, **render) -> BodyLight:
    settings = RenderSettings(**{"color_by": "none", "colormap": "white", **render})
    return body_light(settings, comps.drawn(None, {}), n)


def frame(pos4, size=(W, H), cam=None, light=None, params=None, **kw):
    pos4 = np.asarray(pos4, np.float32).reshape(-1, 4)
    view = SplatView.of(cam or camera(), size)
    light = light or white_light(max(len(pos4), 1))
    return splat_image(pos4, view, light, params or SplatParams(*size), **kw)


def bodies(xyz) -> np.ndarray:
    xyz = np.asarray(xyz, np.float32).reshape(-1, 3)
    return np.c_[xyz, np.full(len(xyz), 1.0, np.float32)].astype(np.float32)


def plummer(n: int, seed: int, scale: float = 1.0) -> np.ndarray:
    """A seeded Plummer sphere (radii cut at 10 scale radii) as [x, y, z, m] rows."""
    rng = np.random.default_rng(seed)
    u = rng.uniform(1e-3, 1.0, n)
    r = np.minimum(1.0 / np.sqrt(u ** (-2.0 / 3.0) - 1.0), 10.0) * scale
    d = rng.normal(size=(n, 3))
    d /= np.linalg.norm(d, axis=1, keepdims=True)
    return np.c_[d * r[:, None], np.full(n, 1.0 / n)].astype(np.float32)


def galaxy(n: int, seed: int) -> np.ndarray:
    """A seeded exponential disk (scale length 1, thickness 0.08) with a Plummer bulge of a fifth of the
    bodies (scale 0.3): the shape of the collisions that burnt out, without their dynamics."""
    rng = np.random.default_rng(seed)
    nb = n // 5
    r = rng.gamma(2.0, 1.0, n - nb)
    phi = rng.uniform(0.0, 2.0 * np.pi, n - nb)
    disk = np.c_[r * np.cos(phi), r * np.sin(phi), rng.normal(scale=0.08, size=n - nb)]
    out = plummer(nb, seed + 1, scale=0.3)
    return np.r_[np.c_[disk, np.full(n - nb, 1.0 / n)].astype(np.float32), out]


# --- the kernel says what the twin says ----------------------------------------------------------------
def test_the_kernel_file_defines_the_contract_s_constants():
    text = (KERNELS / splat.SOURCE).read_text()
    defines = dict(re.findall(r"^#define (SPLAT_\w+) (\S+)", text, re.M))
    expect = {
        "SPLAT_SUB": splat.SUB,
        "SPLAT_COMPONENTS": splat_light.COMPONENTS,
        "SPLAT_LEVELS": splat.LEVELS,
        "SPLAT_TONE_SIZE": splat.TONE_SIZE,
        "SPLAT_EXPOSURE_SHIFT": splat.EXPOSURE_SHIFT,
        "SPLAT_HIST_SUB_BITS": splat.HIST_SUB_BITS,
        "SPLAT_HIST_BINS": splat.HIST_BINS,
        "SPLAT_VALUE_ARRAY": splat_light.VALUE_ARRAY,
        "SPLAT_VALUE_MASS": splat_light.VALUE_MASS,
        "SPLAT_TILE": splat.TILE,
        "SPLAT_MAX_TILES": splat.MAX_TILES,
        "SPLAT_MAX_CHUNK": splat.MAX_CHUNK,
        "SPLAT_PER_THREAD": splat.PER_THREAD,
    }
    assert {k: int(defines[k]) for k in expect} == expect
    assert (
        float(defines["SPLAT_X_MAX"]) == splat.X_MAX
        and float(defines["SPLAT_WEIGHT_ONE"]) == splat.WEIGHT_ONE
    )
    assert int(defines["SPLAT_MIN_EXPOSURE_BITS"]) == splat.MIN_EXPOSURE_BITS
    scale_bits = re.search(r"^#define SPLAT_MAX_EXPOSURE_SCALE \(1ULL << (\d+)\)", text, re.M)
    assert scale_bits and 1 << int(scale_bits[1]) == splat.MAX_EXPOSURE_SCALE
    assert re.search(r"#define SPLAT_BIAS \(512 - 128\)", text)
    bounds = r"(__launch_bounds__\([\d, ]+\)[^\n]*\s*)?"  # optional, a comment after it
    for entry in splat.KERNELS:
        assert re.search(rf'extern "C" __global__ void {bounds}{entry}\(', text), entry


def test_the_twin_has_no_fused_multiply_add():
    """fastmath=False keeps each float32 product and sum separate (an FMA would round once where the
    kernel rounds twice): the machine code of the accumulation has no FMA instruction."""
    from numba import njit

    fresh = njit(fastmath=False)(accumulate.py_func)  # the cached one's code cannot be inspected
    frame(bodies([[0.0, 0.0, 0.0]]))
    for sig in accumulate.signatures:
        fresh.compile(sig)
    asm = "\n".join(fresh.inspect_asm().values())
    assert "cvttss2si" in asm or "roundss" in asm or "floor" in asm  # (the projection is in it)
    assert not re.search(r"\bv?fn?m(add|sub)\d", asm), "an FMA in the twin's projection"


# --- projection and footprint ----------------------------------------------------------------------------
def test_the_target_lands_on_the_centre_pixel_with_the_whole_weight():
    f = frame(bodies([[0.0, 0.0, 0.0]]), size=(321, 241))
    light = white_light(1)
    one = int(light.table[0, 0, 0]) * splat.WEIGHT_ONE
    lit = np.argwhere(f.accum[..., 0] > 0)
    assert lit.tolist() == [[120, 160]]
    assert f.accum[120, 160].tolist() == [one] * 3
    assert (f.image[120, 160] > 0).all() and f.image.sum() == f.image[120, 160].sum()


def test_a_body_on_a_pixel_corner_splits_equally_between_the_four():
    f = frame(bodies([[0.0, 0.0, 0.0]]))  # an even frame: the target is the corner of four pixels
    quarter = int(white_light(1).table[0, 0, 0]) * splat.WEIGHT_ONE // 4
    assert np.argwhere(f.accum[..., 0] > 0).tolist() == [[119, 159], [119, 160], [120, 159], [120, 160]]
    assert set(f.accum[119:121, 159:161].reshape(-1).tolist()) == {quarter}


def test_axes_go_the_camera_s_way():
    """Eye on +x looking at the origin, z up: +y lands right of the centre, +z above it."""
    cam = camera(azimuth=0.0, elevation=0.0, distance=5.0)
    centre = centroid(frame(bodies([[0, 0, 0]]), cam=cam).accum)
    right = centroid(frame(bodies([[0, 1, 0]]), cam=cam).accum)
    up = centroid(frame(bodies([[0, 0, 1]]), cam=cam).accum)
    assert right[0] > centre[0] + 10 and abs(right[1] - centre[1]) < 1e-3
    assert up[1] < centre[1] - 10 and abs(up[0] - centre[0]) < 1e-3


def centroid(accum: np.ndarray) -> np.ndarray:
    """Light-weighted (x, y) in image coordinates (pixel centres at +0.5)."""
    a = accum[..., 0].astype(np.float64)
    rows, cols = np.mgrid[0 : a.shape[0], 0 : a.shape[1]]
    return np.array([((cols + 0.5) * a).sum(), ((rows + 0.5) * a).sum()]) / a.sum()


@pytest.mark.parametrize("xyz", [(0.0, 0.0, 0.0), (1.2, -0.7, 0.4), (-0.9, 1.1, -0.8)])
def test_a_body_lands_where_the_camera_and_the_sprites_put_it(xyz):
    """test_render.py's GL test asks the brightest pixel within 1.5 px of camera.project; the splat's
    footprint has its light-weighted centre at the projected point, to 1/256 px and float32 rounding."""
    cam = camera()
    f = frame(bodies([xyz]), cam=cam)
    expect = cam.project(np.array(xyz), (W, H))
    row, col = np.unravel_index(int(np.argmax(f.accum[..., 0])), (H, W))
    assert np.hypot(col + 0.5 - expect[0], row + 0.5 - expect[1]) <= 1.5
    assert np.abs(centroid(f.accum) - expect).max() <= 1.5 / splat.SUB
    assert int(f.accum[..., 0].sum()) == int(white_light(1).table[0, 0, 0]) * splat.WEIGHT_ONE


@pytest.mark.parametrize(
    "offset, weights", [((0.25, 0.0), (192 * 256, 64 * 256)), ((0.5, 0.5), (16384,) * 4)]
)
def test_bilinear_weights_are_integers_that_sum_to_65536(offset, weights):
    """A body a quarter pixel right of a pixel centre gives it 3/4 and its right neighbour 1/4; half a
    pixel right and down, a quarter to each of four."""
    pos = pixel_point(camera(), 100.5 + offset[0], 60.5 + offset[1])
    f = frame(bodies([pos]), light=white_light(1, brightness=1.0 / 65536))  # light L = 1: accum = weight
    assert int(f.accum[..., 0].sum()) == splat.WEIGHT_ONE
    assert sorted(f.accum[..., 0][f.accum[..., 0] > 0].tolist(), reverse=True) == list(weights)


def pixel_point(cam: OrbitCamera, px: float, py: float, depth: float = 0.0) -> np.ndarray:
    """A world point at image coordinates (px, py) of a W x H frame, on the plane through the target at
    `depth` along the view axis, found in float64 and nudged until float32 lands on the same 1/256 px."""
    right, up = cam.basis()
    per_px = 2.0 * cam.distance * np.tan(np.radians(cam.fov) / 2.0) / H
    p = cam.target + (px - W / 2) * per_px * right - (py - H / 2) * per_px * up - depth * cam.direction
    for _ in range(8):  # the float32 projection may round a hair below the intended 1/256 px
        got = cam.project(p.astype(np.float32).astype(np.float64), (W, H))
        p = p + ((px - got[0]) * right - (py - got[1]) * up) * per_px
    return p + 1e-3 / splat.SUB * per_px * (right - up)


def test_a_random_cloud_sums_exactly_its_weights():
    """Every body fully inside the frame adds exactly L * 65536 to each channel."""
    pos = plummer(20_000, 3, scale=0.5)
    pos = pos[np.linalg.norm(pos[:, :3], axis=1) < 1.5]  # well inside the frame
    f = frame(pos)
    total = int(white_light(len(pos)).table[0, 0, 0]) * splat.WEIGHT_ONE * len(pos)
    assert [int(f.accum[..., c].sum(dtype=np.uint64)) for c in range(3)] == [total] * 3


# --- the accumulation against an independent evaluation ---------------------------------------------------
def ref_projection(pos4, view: SplatView, width: int, height: int, fixed: bool = False):
    """numpy float32, the contract's expressions in its order; `fixed`: also the 1/256 px (X, Y) of each
    drawn body, relative to pixel centres (floor division, no bias)."""
    m = view.view_proj.astype(np.float32)
    x, y, z = pos4[:, 0], pos4[:, 1], pos4[:, 2]

    def row(r):
        return ((m[r, 0] * x + m[r, 1] * y) + m[r, 2] * z) + m[r, 3]

    with np.errstate(all="ignore"):
        cw = row(3)
        px = (row(0) / cw * F32(0.5) + F32(0.5)) * F32(width)
        py = (F32(0.5) - row(1) / cw * F32(0.5)) * F32(height)
        ok = (cw > F32(view.w_min)) & np.isfinite(cw)
        ok &= (px >= -1) & (px <= width + 1) & (py >= -1) & (py <= height + 1)
    if not fixed:
        return ok
    X = np.floor(px[ok] * F32(256)).astype(np.int64) - 128
    Y = np.floor(py[ok] * F32(256)).astype(np.int64) - 128
    return ok, X, Y


def ref_accum(pos4, view: SplatView, light: BodyLight, width: int, height: int, comp=None, values=None):
    """The buffer by numpy: levels by searchsorted, bilinear weights from floor division, np.add.at on
    int64 (the tests keep the sums below 2^63)."""
    n = len(pos4)
    k = np.zeros(n, np.int64) if comp is None else np.minimum(comp.astype(np.int64), 15)
    src = {0: np.zeros(n, np.float32), 1: values, 2: pos4[:, 3]}[light.value_kind]
    lev = splat_light.levels_of(src, light.thresholds) if light.value_kind else np.zeros(n, np.int64)
    L = light.table[k, lev].astype(np.int64)
    ok, X, Y = ref_projection(pos4, view, width, height, fixed=True)
    L = L[ok]
    c0, fx, r0, fy = X // 256, X % 256, Y // 256, Y % 256
    acc = np.zeros((height, width, 3), np.int64)
    for dc, dr, w in (
        (0, 0, (256 - fx) * (256 - fy)),
        (1, 0, fx * (256 - fy)),
        (0, 1, (256 - fx) * fy),
        (1, 1, fx * fy),
    ):
        c, r = c0 + dc, r0 + dr
        inside = (c >= 0) & (c < width) & (r >= 0) & (r < height)
        np.add.at(acc, (r[inside], c[inside]), L[inside] * w[inside, None])
    return acc


@pytest.mark.parametrize("color_by", ["none", "speed", "component-mass"])
def test_the_twin_s_buffer_is_the_int64_sum_of_weight_times_light(color_by):
    rng = np.random.default_rng(11)
    n = 50_000
    pos = plummer(n, 5, scale=1.5)  # some bodies beyond the frame's edges and its 1 px margin
    comp = rng.integers(0, 3, n).astype(np.uint8)
    speeds = rng.gamma(2.0, 0.3, n).astype(np.float32)
    parts = comps.Components(("bulge", "disk", "halo"), comp)
    drawn = comps.drawn(parts, {"disk": comps.Style(brightness=2.5)})
    light = body_light(RenderSettings(color_by=color_by), drawn, n, speed_scale=0.8, mean_mass=1.0 / n)
    view = SplatView.of(camera(), (W, H))
    f = splat_image(pos, view, light, SplatParams(W, H), comp=comp, values=speeds)
    ref = ref_accum(pos, view, light, W, H, comp=comp, values=speeds)
    assert f.accum.max() < 2**63 and np.array_equal(f.accum.astype(np.int64), ref)
    assert not ref_projection(pos, view, W, H).all()  # (the edge cases were exercised)


def test_the_buffer_agrees_with_a_float64_splat_to_the_fixed_point_step():
    """Against bilinear weights from camera.project in float64: each body's weights move by at most
    1/256 px (the fixed point) plus float32 rounding, so each pixel by at most 2/256 of a body's light
    per body that touches it."""
    pos = plummer(5_000, 8, scale=0.7)
    pos = pos[np.linalg.norm(pos[:, :3], axis=1) < 1.5]  # inside the frame
    cam = camera()
    f = frame(pos, cam=cam)
    one = float(white_light(len(pos)).table[0, 0, 0]) * splat.WEIGHT_ONE
    p = cam.project(pos[:, :3].astype(np.float64), (W, H)) - 0.5
    c0, r0 = np.floor(p[:, 0]).astype(int), np.floor(p[:, 1]).astype(int)
    fx, fy = p[:, 0] - c0, p[:, 1] - r0
    ref = np.zeros((H, W))
    touched = np.zeros((H, W))
    for dc, dr, w in (
        (0, 0, (1 - fx) * (1 - fy)),
        (1, 0, fx * (1 - fy)),
        (0, 1, (1 - fx) * fy),
        (1, 1, fx * fy),
    ):
        np.add.at(ref, (r0 + dr, c0 + dc), w * one)
        np.add.at(touched, (r0 + dr, c0 + dc), 1.0)
    diff = np.abs(f.accum[..., 0].astype(np.float64) - ref)
    assert (diff <= touched * one * 2.0 / splat.SUB).all(), diff.max() / one


def test_the_buffer_does_not_depend_on_the_bodies_order():
    rng = np.random.default_rng(2)
    n = 40_000
    pos = plummer(n, 9)
    comp = rng.integers(0, 2, n).astype(np.uint8)
    speeds = rng.gamma(2.0, 0.3, n).astype(np.float32)
    drawn = comps.drawn(comps.Components(("a", "b"), comp), {})
    light = body_light(RenderSettings(color_by="component-speed"), drawn, n, speed_scale=0.5)
    first = frame(pos, light=light, comp=comp, values=speeds)
    order = rng.permutation(n)
    again = frame(pos[order], light=light, comp=comp[order], values=speeds[order])
    assert np.array_equal(first.accum, again.accum) and np.array_equal(first.image, again.image)
    assert np.array_equal(first.hist, again.hist)


# --- what is not drawn ----------------------------------------------------------------------------------
def test_nonfinite_behind_the_camera_and_off_frame_bodies_add_nothing():
    pos = plummer(5_000, 4)
    base = frame(pos, light=white_light(10_000))
    cam = camera()
    eye = cam.eye.astype(np.float32)
    behind = cam.eye + 2.0 * cam.direction  # the eye looks away from it
    beside = cam.eye - 0.5 * cam.direction + 50.0 * cam.basis()[0]  # far right of the frame
    beyond = pixel_point(cam, -1.5, 100.0)  # 1.5 px left of the frame: further than the 1 px margin
    bad = np.array(
        [
            [np.nan, 0, 0, 1],
            [0, np.nan, 0, 1],
            [0, 0, np.inf, 1],
            [-np.inf, 0, 0, 1],
            [1e38, 1e38, 1e38, 1],  # the clip coordinates overflow to inf
            [*eye, 1],  # at the eye: w = 0
            [*behind, 1],
            [*beside, 1],
            [*beyond, 1],
            [0, 0, 0, np.nan],  # a NaN mass: colour by none does not read it, so it is drawn ...
        ],
        np.float32,
    )
    mixed = np.r_[pos[:2500], bad[:-1], pos[2500:]]
    assert np.array_equal(frame(mixed, light=white_light(10_000)).accum, base.accum)
    nan_mass = frame(np.r_[pos, bad[-1:]], light=white_light(10_000)).accum
    assert nan_mass.sum(dtype=np.uint64) > base.accum.sum(dtype=np.uint64)  # ... like any body


def test_a_body_within_a_pixel_of_the_edge_lights_only_the_pixels_inside():
    cam = camera()
    light = white_light(1, brightness=1.0 / 65536)  # L = 1: the buffer holds the weights
    half_out = frame(bodies([pixel_point(cam, 0.0, 100.5)]), light=light, cam=cam)  # on the left edge
    assert np.argwhere(half_out.accum[..., 0]).tolist() == [[100, 0]]
    assert int(half_out.accum[100, 0, 0]) == splat.WEIGHT_ONE // 2  # the half outside is dropped


def test_hidden_components_add_nothing_and_brightness_scales_the_light():
    n = 4_000
    pos = plummer(n, 6)
    comp = np.repeat(np.array([0, 1], np.uint8), n // 2)
    parts = comps.Components(("bulge", "halo"), comp)
    settings = RenderSettings(color_by="component")

    def accum(styles):
        light = body_light(settings, comps.drawn(parts, styles), n)
        return frame(pos, light=light, comp=comp).accum

    both = accum({})
    no_halo = accum({"halo": comps.Style(visible=False)})
    only_halo = accum({"bulge": comps.Style(visible=False)})
    assert np.array_equal(both, no_halo + only_halo)
    assert np.array_equal(
        frame(pos[: n // 2], light=body_light(settings, comps.drawn(parts, {}), n)).accum, no_halo
    )
    exact = (1.0, 0.5, 0.25)  # colours whose light is exact in the table's units, doubled or not
    once = accum({"halo": comps.Style(visible=False), "bulge": comps.Style(color=exact)})
    double = accum(
        {
            "halo": comps.Style(visible=False, brightness=9.0),
            "bulge": comps.Style(brightness=2.0, color=exact),
        }
    )
    assert once.any() and np.array_equal(double, 2 * once)


# --- colour sources ----------------------------------------------------------------------------------------
def test_levels_are_the_count_of_thresholds_at_or_below_the_value():
    t = thresholds("speed", speed_scale=2.0)
    assert t[0] == -np.inf and (np.diff(t[1:]) > 0).all()
    v = np.r_[np.random.default_rng(0).uniform(-0.5, 2.5, 5000), t[1:], np.nextafter(t[1:], -np.inf)]
    v = np.r_[v, np.nan, np.inf, -np.inf, 0.0].astype(np.float32)
    got = np.array([level(t, x) for x in v])
    assert np.array_equal(got, splat_light.levels_of(v, t))
    assert got[-4:].tolist() == [0, 255, 0, 0]


def test_speed_colours_follow_the_colormap_from_its_low_end():
    """color_by = speed: a standing body gets the colormap at CMAP_LOW, one at the speed scale its top;
    mass: a body of the mean mass sits half-way up (t = 0.5)."""
    light = body_light(RenderSettings(color_by="speed", colormap="viridis"), comps.drawn(None, {}), 1)
    cmap = colormap("viridis").astype(np.float64)
    unit = light.unit
    assert np.abs(light.table[0, 0] / unit - splat_light.sample(cmap, np.array(CMAP_LOW))).max() < 1e-4
    assert np.abs(light.table[0, 255] / unit - cmap[255]).max() < 1e-4
    slow, fast = (
        frame(bodies([[0, 0, 0]]), light=light, values=np.array([v], np.float32)) for v in (0.0, 5.0)
    )
    assert np.array_equal(slow.accum[119, 159] // 16384, light.table[0, 0]) and not np.array_equal(
        slow.accum, fast.accum
    )
    mass = body_light(RenderSettings(color_by="mass"), comps.drawn(None, {}), 1, mean_mass=0.25)
    assert splat_light.levels_of(np.array([0.25], np.float32), mass.thresholds)[0] in (127, 128)


def test_every_colouring_the_sprites_have_builds_a_table():
    parts = comps.Components(("disk", "halo"), np.array([0, 1], np.uint8))
    for color_by in COLOR_BY:
        light = body_light(RenderSettings(color_by=color_by), comps.drawn(parts, {}), 2)
        assert light.table.shape == (16, 256, 3) and light.table[:2].any() and not light.table[2:].any()
        if light.value_kind == splat_light.VALUE_NONE:
            assert (light.table == light.table[:, :1]).all()  # one colour per component


# --- tone map and exposure ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", splat.TONE_MAPS)
def test_the_tone_map_is_monotone_and_reaches_white_only_where_the_curve_rounds_to_it(name):
    lut = tone_lut(name)
    f = tone_curve(name, tone_x())
    assert (np.diff(lut.astype(int), axis=1) >= 0).all() and (lut[:, 0] == 0).all()
    assert ((lut == 255) == (f >= 254.5 / 255)[None, :]).all()
    assert (np.diff(tone_curve(name, np.linspace(0, 50, 20001))) >= 0).all()
    if name == "exp":
        assert (tone_curve(name, np.linspace(0, 30, 1001)) < 1).all()  # no x is clipped to 1
    bg = tone_lut(name, (0.2, 0.0, 0.4))
    assert bg[:, 0].tolist() == [51, 0, 102] and (bg[:, -1] == 255).all()


def test_the_integer_tone_map_is_monotone_in_the_buffer_and_saturates_exactly():
    e = exposure_for(3.7e-9)
    values = np.unique(np.r_[np.geomspace(1, 2**63, 4000).astype(np.uint64), e.saturation - 1, e.saturation])
    accum = np.repeat(values[None, :, None], 3, axis=2).astype(np.uint64)
    out = np.zeros(accum.shape, np.uint8)
    ramp = (np.arange(splat.TONE_SIZE)[None, :].repeat(3, axis=0) // 16).astype(np.uint8)  # index / 16
    tonemap(accum, ramp, np.uint64(e.scale), np.uint64(e.saturation), np.uint64(e.shift), out)
    index_16 = out[0, :, 0].astype(int)
    assert (np.diff(index_16) >= 0).all()
    at = int(np.flatnonzero(values == e.saturation)[0])
    assert index_16[at] == 255 and index_16[at - 1] <= 255  # saturation reaches the last entry (4095 // 16)
    x = values[:at].astype(np.float64) * e.x_per_unit
    assert np.abs(index_16[:at] - np.minimum(x / splat.X_MAX * splat.TONE_SIZE, 4095) // 16).max() <= 1


@pytest.mark.parametrize("x_per_unit", [1e-30, 2.0**-60, 1e-13, 4.5e-10, 1e-3, 1.0, 1e6, 1e30])
def test_the_exposure_never_overflows_and_keeps_its_precision(x_per_unit):
    e = exposure_for(x_per_unit)
    assert 1 <= e.scale <= splat.MAX_EXPOSURE_SCALE and 0 <= e.shift <= 63 and e.saturation <= splat.U64
    assert (e.saturation >> e.shift) * e.scale < 2**64  # the largest product the kernel forms
    want = x_per_unit * splat.TONE_SIZE / splat.X_MAX * 2.0 ** (splat.EXPOSURE_SHIFT + e.shift)
    if 2.0**24 <= want <= splat.MAX_EXPOSURE_SCALE:
        assert abs(e.scale / want - 1) <= 2.0**-24


def test_the_histogram_counts_each_lit_pixel_s_brightest_channel():
    f = frame(
        plummer(30_000, 12),
        light=body_light(RenderSettings(), comps.drawn(None, {}), 30_000),
        values=np.random.default_rng(1).gamma(2, 0.3, 30_000).astype(np.float32),
    )
    brightest = f.accum.max(axis=2)
    lit = brightest[brightest > 0]
    expect = np.bincount([hist_bin(int(v)) for v in lit], minlength=splat.HIST_BINS)
    assert np.array_equal(f.hist, expect)
    assert [hist_bin(v) for v in (1, 2, 3, 16, 17, 31, 2**40 + 2**37)] == [0, 16, 24, 64, 65, 79, 642]
    again = np.zeros(splat.HIST_BINS, np.uint32)
    histogram(f.accum, again)
    assert np.array_equal(again, f.hist)


def test_params_are_checked():
    for bad in (dict(width=0), dict(tone_map="reinhard"), dict(exposure=-1.0), dict(auto_percentile=0.0)):
        with pytest.raises(ConfigError):
            SplatParams(**{"width": 8, "height": 8, **bad})
    for w_min in (0.0, -1.0, np.nan):
        with pytest.raises(ValueError, match="w_min"):
            SplatView(np.eye(4, dtype=np.float32), w_min)
    with pytest.raises(ValueError, match="view_proj"):
        SplatView(np.full((4, 4), np.nan, np.float32), 0.1)


# --- light per body against N, and the overflow bound -----------------------------------------------------
@pytest.mark.parametrize("exposure", [None, 8.0])
def test_the_same_galaxy_at_n_and_8n_is_as_bright_and_not_burnt_out(exposure):
    """Issue 24: brighter in detail, not brighter overall. Mean brightness over the pixels lit in either
    frame within 20%, and, with the default automatic exposure, under 2% of the lit pixels at full white
    (a channel at 255)."""
    cam = camera(elevation=35.0, distance=14.0)
    params = SplatParams(W, H, exposure=exposure)
    out = []
    for n in (125_000, 1_000_000):
        light = body_light(RenderSettings(color_by="none"), comps.drawn(None, {}), n)
        out.append(frame(galaxy(n, 5), cam=cam, light=light, params=params))
    lit = [f.accum.max(axis=2) > 0 for f in out]
    either = lit[0] | lit[1]
    means = [f.image.astype(np.float64).mean(axis=2)[either].mean() for f in out]
    assert 0.8 < means[1] / means[0] < 1.25, means
    assert min(means) > 5.0  # (a frame, not black)
    if exposure is None:
        for f, on in zip(out, lit, strict=True):
            white = (f.image == 255).any(axis=2) & on
            assert white.sum() < 0.02 * on.sum()


def test_the_light_cap_bounds_every_pixel_below_2_to_the_64():
    for n in (1, 1000, 2**20, 2**24, 2**26, 10**9):
        cap = light_cap(n)
        assert n * cap * splat.WEIGHT_ONE <= splat.U64  # no pixel channel can wrap ...
        assert cap == 2**32 - 1 or n * (cap + 1) * splat.WEIGHT_ONE > splat.U64  # ... and no more room
    drawn = comps.drawn(None, {"*": comps.Style(brightness=100.0)})
    hot = body_light(RenderSettings(brightness=100.0, colormap="white", color_by="none"), drawn, 2**24)
    assert hot.unit < splat_light.UNIT and int(hot.table.max()) <= light_cap(2**24)
    assert 2**24 * int(hot.table.max()) * splat.WEIGHT_ONE <= splat.U64
    assert white_light(2**24).unit == splat_light.UNIT  # brightness 1 keeps 16 bits at 16M bodies


def test_the_worst_case_stacked_on_one_pixel_does_not_wrap():
    """2^16 bodies on one pixel centre, each at the most light the cap allows for 2^16 bodies: the pixel
    holds 2^16 * (2^32 - 1) * 2^16 = 2^64 - 2^32, exact, and tone-maps to white."""
    n = 2**16
    cap = light_cap(n)
    table = np.zeros((16, 256, 3), np.uint32)
    table[0, 0] = cap
    light = BodyLight(table, thresholds("none"), splat_light.VALUE_NONE, splat_light.UNIT, n)
    params = SplatParams(321, 241, exposure=1.0)
    f = frame(np.repeat(bodies([[0, 0, 0]]), n, axis=0), size=(321, 241), light=light, params=params)
    assert int(f.accum[120, 160, 0]) == n * cap * splat.WEIGHT_ONE == 2**64 - 2**32
    assert (f.image[120, 160] == 255).all()
    assert np.count_nonzero(f.accum[..., 0]) == 1
    with pytest.raises(ValueError, match="overflow bound"):
        frame(np.repeat(bodies([[0, 0, 0]]), n + 1, axis=0), light=light)


def test_manual_exposure_scales_each_body_s_light_as_n_ref_over_n():
    params = SplatParams(W, H, exposure=1.0)
    unit = splat_light.UNIT
    small = splat.manual_exposure(params, unit, 1000)
    ref = splat.manual_exposure(params, unit, params.n_ref)
    big = splat.manual_exposure(params, unit, 64 * params.n_ref)
    assert small == ref and abs(ref.x_per_unit / big.x_per_unit - 64.0) < 1e-9
    one = float(unit * splat.WEIGHT_ONE)
    assert ref.x_per_unit * one == pytest.approx(1.0)  # exposure 1: one body's full light is x = 1


def test_the_splatter_uploads_its_tables_once_while_their_sources_stay():
    """CudaSplatter._tables (app/render/splat_cuda.py) on a stand-in device that records each upload: the
    light, thresholds and tone-map bytes are the contract's tables, made and sent again only for another
    BodyLight or tone map; the view's 64 bytes go when the camera moved. Each goes on the splatter's
    stream from its own pinned staging buffer (an upload from pageable memory would wait for the GPU)."""
    from types import SimpleNamespace

    from app.render.splat_cuda import CudaSplatter

    sent: list[tuple[int, bytes]] = []
    places: dict[str, int] = {}
    staged: dict[str, np.ndarray] = {}
    stream = object()

    def upload(ptr, data, on):
        assert on is stream and any(np.shares_memory(data, b) for b in staged.values())
        sent.append((ptr, bytes(data)))

    device = SimpleNamespace(
        scratch=lambda key, nbytes: places.setdefault(key, len(places) + 1),
        pinned=lambda key, count, dtype: staged.setdefault(key, np.zeros(count, dtype)),
        drv=SimpleNamespace(memcpy_htod_async=upload),
    )
    splatter = CudaSplatter.__new__(CudaSplatter)  # the tables only: no kernels or events
    splatter.device, splatter.stream = device, stream
    splatter._uploaded, splatter._light, splatter._light_bytes = {}, None, (b"", b"")
    splatter._tone, splatter._lut_bytes = None, b""
    light, params = white_light(1000), SplatParams(W, H)
    view = SplatView.of(camera(), (W, H))
    (tables, lut) = splatter._tables(light, view, params)
    assert [data for _, data in sent] == [
        light.table.astype(np.uint32).tobytes(),
        light.thresholds.astype(np.float32).tobytes(),
        view.rows().tobytes(),
        tone_lut("exp").tobytes(),
    ]
    assert [ptr for ptr, _ in sent] == [*tables, lut]
    sent.clear()
    assert splatter._tables(light, view, params) == (tables, lut) and sent == []  # nothing changed
    splatter._tables(light, SplatView.of(camera(azimuth=31.0), (W, H)), SplatParams(W, H, tone_map="aces"))
    assert [ptr for ptr, _ in sent] == [tables[2], lut]  # the view and the tone map only
    sent.clear()
    splatter._tables(white_light(1000, brightness=2.0), view, params)
    assert [ptr for ptr, _ in sent] == [tables[0], tables[2], lut]  # a brighter table, the same thresholds


# --- the bloom (app/render/splat_bloom.py) --------------------------------------------------------------
def test_bloom_taps_are_a_quantised_symmetric_gaussian():
    from app.render.splat_bloom import RADIUS, TAP_ONE, gaussian_taps

    for radius in (RADIUS[0], 1.0, 6.0, RADIUS[1]):
        taps = gaussian_taps(radius)
        assert len(taps) == 2 * math.ceil(3 * radius) + 1 and taps[len(taps) // 2] == TAP_ONE
        assert np.array_equal(taps, taps[::-1]) and taps.min() >= 1
        assert np.all(np.diff(taps[: len(taps) // 2 + 1]) >= 0)  # rising to the centre
        assert int(taps.sum()) * (TONE_SIZE - 1) < 2**32  # the blur's sums fit 32 bits (kept in 64)


def test_bloom_settings_out_of_range_are_refused_and_zero_is_off():
    from app.render.splat_bloom import bloom_of

    assert bloom_of(0.0, 4.0, 6.0) is None and bloom_of(0.001, 4.0, 6.0) is None  # rounds to gain 0
    b = bloom_of(1.0, 2.0, 6.0)
    assert b is not None and (b.gain, b.threshold) == (256, 1024)
    for args in ((-1.0, 4.0, 6.0), (17.0, 4.0, 6.0), (1.0, 8.0, 6.0), (1.0, 4.0, 0.1), (1.0, 4.0, 40.0)):
        with pytest.raises(ConfigError):
            bloom_of(*args)


@pytest.mark.parametrize("threshold, radius", [(0.0, 0.5), (1.0, 2.0), (4.0, 6.0), (7.9, 32.0)])
def test_the_twin_s_glow_is_the_reference_integer_blur(threshold, radius):
    from app.render.splat_bloom import bloom_of, reference_glow
    from app.render.splat_cpu import glow_pass

    b = bloom_of(1.0, threshold, radius)
    index = np.random.default_rng(7).integers(0, TONE_SIZE, (37, 53, 3))
    index[5:9, 40:44] = TONE_SIZE - 1  # a saturated patch near an edge
    bright = np.maximum(index - b.threshold, 0)
    taps = b.taps.astype(np.int64)
    rows, glow = np.empty_like(bright), np.empty_like(bright)
    glow_pass(bright, taps, np.int64(b.total), True, rows)
    glow_pass(rows, taps, np.int64(b.total), False, glow)
    assert np.array_equal(glow, reference_glow(index, b))
    assert glow.max() <= TONE_SIZE - 1 - b.threshold


def test_a_bloomed_frame_is_the_plain_one_lifted_by_the_glow():
    """The same bodies with and without the bloom: the same exposure and histogram; the image is the table
    read at i + (G v) >> 8 with v the reference glow: pixels only brighten, also those near the bright core
    that have no bright part of their own."""
    from app.render.splat_bloom import bloom_of, reference_glow

    cam, n = camera(elevation=35.0, distance=14.0), 60_000
    light = body_light(RenderSettings(color_by="none"), comps.drawn(None, {}), n)
    pos4 = galaxy(n, 9)
    params = SplatParams(160, 120)
    plain = frame(pos4, size=(160, 120), cam=cam, light=light, params=params)
    glowing = frame(
        pos4, size=(160, 120), cam=cam, light=light, params=replace(params, bloom=2.0, bloom_radius=3.0)
    )
    assert glowing.exposure == plain.exposure and np.array_equal(glowing.hist, plain.hist)
    e = plain.exposure
    a = np.minimum(plain.accum, np.uint64(e.saturation)) >> np.uint64(e.shift)
    index = np.minimum((a * np.uint64(e.scale)) >> np.uint64(splat.EXPOSURE_SHIFT), TONE_SIZE - 1).astype(
        np.int64
    )
    b = bloom_of(2.0, params.bloom_threshold, 3.0)
    lifted = np.minimum(index + ((b.gain * reference_glow(index, b)) >> 8), TONE_SIZE - 1)
    lut = tone_lut(params.tone_map, params.background)
    assert np.array_equal(glowing.image, lut[np.arange(3), lifted])
    assert (glowing.image >= plain.image).all() and (glowing.image > plain.image).any()
    dim = index.max(axis=2) < b.threshold  # pixels with no bright part of their own ...
    assert (glowing.image > plain.image).any(axis=2)[dim].any()  # ... that the glow reaches
