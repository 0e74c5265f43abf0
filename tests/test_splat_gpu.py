"""kernels/splat.cu against its numba twin (app/render/splat_cpu.py), gpu-marked: from the same float32 rows
the CUDA buffer (uint64 per pixel channel), its histogram and the tone-mapped image are the twin's bit for
bit, for a seeded Plummer-like cloud of 100k bodies and a collision-like pair of galaxies, in each way a
body's light is found (no value, a value per body, the mass in pos.w; with and without components), with
non-finite and off-frame rows among them; and two launches give the same bytes (the atomics' order does
not show). The launches are the viewer's own (app/render/splat_cuda.py); a window resized 100 times
keeps the device memory of its largest frame."""

from __future__ import annotations

import time

import numpy as np
import pytest
from test_splat import camera, galaxy, plummer

from app.model import components as comps
from app.render import splat
from app.render.splat import SplatParams, SplatView
from app.render.splat_cpu import splat_image
from app.render.splat_cuda import CudaSplatter
from app.render.splat_light import body_light
from app.scene import RenderSettings

pytestmark = pytest.mark.gpu  # (skipped where CUDA cannot run: tests/conftest.py)


@pytest.fixture(scope="module")
def device():
    from app.backends.cuda.device import CudaDevice

    dev = CudaDevice(0)
    yield dev
    dev.close()


def upload(device, key: str, array: np.ndarray) -> int:
    """A device copy of `array` in the scratch buffer `key` (its address)."""
    array = np.ascontiguousarray(array)
    ptr = device.scratch(f"splat-test-{key}", array.nbytes)
    with device.scope:
        device.drv.memcpy_htod(ptr, array)
    return ptr


def gpu_splat(
    device, pos4, view: SplatView, light, params: SplatParams, comp=None, values=None, method="auto"
):
    """(accum uint64 (H, W, 3), hist uint32, image uint8 (H, W, 4)) through the viewer's host wrapper."""
    splatter = CudaSplatter(device)
    pos = upload(device, "pos", np.asarray(pos4, np.float32))
    comp_ptr = 0 if comp is None else upload(device, "comp", np.asarray(comp, np.uint8))
    values_ptr = 0 if values is None else upload(device, "values", np.asarray(values, np.float32))
    frame = splatter.draw(
        pos, len(pos4), view, light, params, comp=comp_ptr, values=values_ptr, method=method
    )
    return splatter.read_accum(frame), frame.hist, splatter.read_image(frame)


def with_bad_rows(pos4: np.ndarray, cam) -> np.ndarray:
    """`pos4` with NaN, inf, behind-the-camera and far-off rows mixed in."""
    bad = np.array(
        [
            [np.nan, 0, 0, 1],
            [0, 0, np.inf, 1],
            [1e38, 1e38, 1e38, 1],
            [*(cam.eye + 2.0 * cam.direction), 1],
            [*(cam.eye - 0.5 * cam.direction + 80.0 * cam.basis()[0]), 1],
        ],
        np.float32,
    )
    k = len(pos4) // 2
    return np.r_[pos4[:k], bad, pos4[k:]].astype(np.float32)


def pair(n: int, seed: int) -> np.ndarray:
    """A collision-like pair: two galaxies overlapping at an angle, the dense scene that burnt out."""
    a, b = galaxy(n // 2, seed), galaxy(n - n // 2, seed + 7)
    c, s = np.cos(0.9), np.sin(0.9)
    turn = np.array([[1, 0, 0], [0, c, -s], [0, s, c]], np.float32)
    b[:, :3] = b[:, :3] @ turn.T + np.float32([1.2, 0.4, 0.0])
    return np.r_[a, b]


CASES = {
    "cloud-component-speed": (lambda: plummer(100_000, 1), "component-speed", dict(), (640, 360)),
    "cloud-mass-aces": (
        lambda: plummer(100_000, 2),
        "mass",
        dict(tone_map="aces", background=(0.05, 0.0, 0.1)),
        (641, 361),
    ),
    "pair-none-auto": (lambda: pair(400_000, 3), "none", dict(), (1280, 720)),
    "pair-speed-manual": (lambda: pair(400_000, 4), "speed", dict(exposure=6.0), (1280, 720)),
    # the bloom (app/render/splat_bloom.py): wide and narrow glows, one at a low threshold, one at a frame
    # edge's worth of radius (taps past the border)
    "pair-speed-bloom": (lambda: pair(400_000, 5), "speed", dict(bloom=1.5, bloom_radius=8.0), (1280, 720)),
    "cloud-mass-bloom-low": (
        lambda: plummer(100_000, 6),
        "mass",
        dict(bloom=4.0, bloom_threshold=0.5, bloom_radius=1.5, tone_map="aces"),
        (641, 361),
    ),
}


@pytest.mark.parametrize("method", ["binned", "direct"])
@pytest.mark.parametrize("case", CASES)
def test_the_gpu_frame_is_the_twin_s_bit_for_bit(device, case, method):
    make, color_by, extra, size = CASES[case]
    cam = camera(elevation=35.0, distance=14.0 if case.startswith("pair") else 8.0)
    pos = with_bad_rows(make(), cam)
    n = len(pos)
    rng = np.random.default_rng(5)
    comp = rng.integers(0, 3, n).astype(np.uint8) if color_by.startswith("component") else None
    speeds = rng.gamma(2.0, 0.3, n).astype(np.float32)
    parts = None if comp is None else comps.Components(("bulge", "disk", "halo"), comp)
    drawn = comps.drawn(parts, {"halo": comps.Style(visible=False)} if parts else {})
    light = body_light(
        RenderSettings(color_by=color_by), drawn, n, speed_scale=0.6, mean_mass=float(pos[:, 3].mean())
    )
    view = SplatView.of(cam, size)
    params = SplatParams(*size, **extra)
    twin = splat_image(pos, view, light, params, comp=comp, values=speeds)
    values = speeds if light.value_kind == 1 else None
    accum, hist, image = gpu_splat(device, pos, view, light, params, comp=comp, values=values, method=method)
    assert twin.accum.any()
    assert np.array_equal(accum, twin.accum), f"{int((accum != twin.accum).sum())} channel values differ"
    assert np.array_equal(hist, twin.hist)
    assert np.array_equal(image[..., :3], twin.image) and (image[..., 3] == 255).all()
    again = gpu_splat(device, pos, view, light, params, comp=comp, values=values, method=method)
    assert all(np.array_equal(a, b) for a, b in zip(again, (accum, hist, image), strict=True))


def test_a_hundred_resizes_keep_the_memory_of_the_largest_frame(device):
    pos = plummer(200_000, 9)
    cam = camera()
    light = body_light(RenderSettings(color_by="none"), comps.drawn(None, {}), len(pos))
    splatter = CudaSplatter(device)
    ptr = upload(device, "pos", pos)
    largest = (1920, 1080)
    splatter.draw(ptr, len(pos), SplatView.of(cam, largest), light, SplatParams(*largest))
    free_before, _ = device.mem_get_info()
    rng = np.random.default_rng(3)
    for w, h in zip(rng.integers(64, 1921, 100), rng.integers(64, 1081, 100), strict=True):
        size = (int(w), int(h))
        frame = splatter.draw(ptr, len(pos), SplatView.of(cam, size), light, SplatParams(*size))
        assert frame.hist.any(), size
    free_after, _ = device.mem_get_info()
    assert free_after >= free_before, f"{(free_before - free_after) / 2**20:.1f} MiB more after 100 resizes"
    image = splatter.read_image(frame)
    assert image.shape == (size[1], size[0], 4) and image[..., :3].any()


def test_a_crowded_tile_corner_split_over_chunks_adds_up_as_the_twin(device):
    """200k bodies within a pixel of the corner where four tiles meet: each tile's records fill several
    chunks of splat_tiles (the splatter's chunk), and every footprint crosses a tile edge; with a 1,000-body
    sprinkle over the frame and bodies on its border rows and columns."""
    cam = camera()
    size = (640, 360)
    corner = (splat.TILE * 6 - 2, splat.TILE * 4 - 2)  # the pixel whose column + 2 starts tile (6, 4)
    rng = np.random.default_rng(11)
    px = corner[0] + 0.5 + rng.uniform(-1.0, 1.0, (200_000, 2)) * [1.0, 1.0]
    edges = np.r_[np.c_[rng.uniform(-1, size[0] + 1, 500), np.full(500, -0.9)],
                  np.c_[np.full(500, size[0] + 0.9), rng.uniform(-1, size[1] + 1, 500)]]  # fmt: skip
    sprinkle = rng.uniform(0, 1, (1_000, 2)) * size
    targets = np.r_[px + [0.0, corner[1] - corner[0]], edges, sprinkle]
    right, up = cam.basis()
    per_px = 2.0 * cam.distance * np.tan(np.radians(cam.fov) / 2.0) / size[1]
    xyz = cam.target + ((targets[:, :1] - size[0] / 2) * right - (targets[:, 1:] - size[1] / 2) * up) * per_px
    pos = np.c_[xyz, np.ones(len(xyz))].astype(np.float32)
    light = body_light(RenderSettings(color_by="none"), comps.drawn(None, {}), len(pos))
    view, params = SplatView.of(cam, size), SplatParams(*size)
    twin = splat_image(pos, view, light, params)
    assert twin.accum[corner[1] : corner[1] + 2, corner[0] : corner[0] + 2].min() > 0
    for method in ("binned", "direct"):
        accum, hist, image = gpu_splat(device, pos, view, light, params, method=method)
        assert np.array_equal(accum, twin.accum), method
        assert np.array_equal(image[..., :3], twin.image), method


def exposure_cases() -> list[tuple[np.ndarray, SplatParams, float, int]]:
    """(hist, params, unit, n): histograms as frames make them (a few dozen lit bins, counts up to a full
    1080p frame), the edges (nothing lit, one bin, the first and the last bin, every bin at 2^32 - 1), each
    percentile and level, and manual exposures from tiny to huge at small and large N."""
    rng = np.random.default_rng(17)
    bins = splat.HIST_BINS
    hists = [np.zeros(bins, np.uint32)]
    for b in (0, 1, 15, 16, 17, 300, 700, bins - 1):
        h = np.zeros(bins, np.uint32)
        h[b] = rng.integers(1, 2_000_000)
        hists.append(h)
    for _ in range(12):
        h = np.zeros(bins, np.uint32)
        lit = rng.integers(200, 900)
        span = rng.integers(8, 120)
        h[lit : lit + span] = rng.integers(0, 2_073_600 // span, span)
        hists.append(h)
    hists.append(np.full(bins, 2**32 - 1, np.uint32))
    hists.append(rng.integers(0, 2**32, bins, dtype=np.uint64).astype(np.uint32))
    autos = [
        SplatParams(8, 8),
        SplatParams(8, 8, auto_percentile=100.0, auto_level=0.3),
        SplatParams(8, 8, auto_percentile=1e-6, auto_level=7.9),
        SplatParams(8, 8, auto_percentile=99.5, auto_level=2.0),
        SplatParams(8, 8, auto_percentile=37.5, auto_level=1e-3),
    ]
    cases = [(h, p, 1.0, 1_000_000) for h in hists for p in autos]
    for exposure in (1e-9, 0.05, 1.0, 3.3, 1000.0, 1e12):
        for unit, n in ((1.0, 1_000), (0.37, 16_777_216), (3e-5, 80_000)):
            cases.append((hists[0], SplatParams(8, 8, exposure=exposure), unit, n))
    return cases


def test_the_device_exposure_is_frame_exposure_s_bit_for_bit(device):
    """splat_exposure (float64 on the GPU, one thread's running sum) against splat.py frame_exposure (numpy)
    for every case: the same scale, saturation, shift and x, bit for bit."""
    splatter = CudaSplatter(device)
    for i, (hist, params, unit, n) in enumerate(exposure_cases()):
        want = splat.frame_exposure(params, hist, unit, n)
        got = splatter.device_exposure(hist, params, unit, n)
        assert got == want, f"case {i}: {got} != {want}"


def test_draw_queues_the_frame_behind_the_step_and_returns_without_waiting(device):
    """With a 0.5 s kernel on the default stream (the step's force, in the viewer), draw returns at once;
    the frame's figures wait for it and are those of a frame drawn alone."""
    from pycuda.compiler import SourceModule

    pos = plummer(100_000, 3)
    cam = camera()
    light = body_light(RenderSettings(color_by="none"), comps.drawn(None, {}), len(pos))
    size = (640, 360)
    view, params = SplatView.of(cam, size), SplatParams(*size)
    splatter = CudaSplatter(device)
    ptr = upload(device, "pos", pos)
    alone = splatter.draw(ptr, len(pos), view, light, params)  # (allocates: that waits for the device)
    alone_exposure, alone_image = alone.exposure, splatter.read_image(alone)
    with device.scope:
        spin = SourceModule(
            'extern "C" __global__ void spin(unsigned long long ns) {'
            ' unsigned long long t0, t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));'
            ' do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns); }',
            no_extern_c=True,
        ).get_function("spin")
        spin(np.uint64(500_000_000), block=(1, 1, 1), grid=(1, 1))  # 0.5 s on the legacy default stream
        t0 = time.perf_counter()
        frame = splatter.draw(ptr, len(pos), view, light, params)
        queued_s = time.perf_counter() - t0
        behind = not frame.ready()
    assert queued_s < 0.1 and behind, (
        f"draw took {queued_s * 1e3:.1f} ms; ready before the spin ended: {not behind}"
    )
    assert frame.exposure == alone_exposure and frame.ready()
    assert np.array_equal(splatter.read_image(frame), alone_image)
    with pytest.raises(RuntimeError, match="overwritten"):
        stale = splatter.draw(ptr, len(pos), view, light, params)
        splatter.draw(ptr, len(pos), view, light, params)
        stale.exposure  # noqa: B018
