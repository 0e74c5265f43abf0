"""kernels/splat.cu against its numba twin (app/render/splat_cpu.py), gpu-marked: from the same float32 rows
the CUDA buffer (uint64 per pixel channel), its histogram and the tone-mapped image are the twin's bit for
bit, for a seeded Plummer-like cloud of 100k bodies and a collision-like pair of galaxies, in each way a
body's light is found (no value, a value per body, the mass in pos.w; with and without components), with
non-finite and off-frame rows among them; and two launches give the same bytes (the atomics' order does
not show). The launches are written here, small and plain (pycuda's prepared calls, as
app/backends/cuda/nonfinite.py makes them); the viewer's own wrapper is the next step of issue 24."""

from __future__ import annotations

import numpy as np
import pytest
from test_splat import camera, galaxy, plummer

from app.model import components as comps
from app.render import splat
from app.render.splat import SplatParams, SplatView, frame_exposure, tone_lut
from app.render.splat_cpu import splat_image
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
    device.drv.memcpy_htod(ptr, array)
    return ptr


def gpu_splat(device, pos4, view: SplatView, light, params: SplatParams, comp=None, values=None):
    """(accum uint64 (H, W, 3), hist uint32, image uint8 (H, W, 4)) from the kernels: clear (memset),
    accumulate, histogram, the exposure on the host from the GPU's histogram, tone map."""
    drv = device.drv
    n = len(pos4)
    w, h = params.width, params.height
    pixels = w * h
    fn = {s: device.function(splat.SOURCE, s, types) for s, types in splat.KERNELS.items()}
    with device.scope:
        pos = upload(device, "pos", np.asarray(pos4, np.float32))
        comp_ptr = 0 if comp is None else upload(device, "comp", np.asarray(comp, np.uint8))
        values_ptr = 0 if values is None else upload(device, "values", np.asarray(values, np.float32))
        table = upload(device, "light", light.table.astype(np.uint32))
        thresholds = upload(device, "thresholds", light.thresholds.astype(np.float32))
        rows = upload(device, "view", view.rows())
        accum = device.scratch("splat-test-accum", 8 * 3 * pixels)
        hist = device.scratch("splat-test-hist", 4 * splat.HIST_BINS)
        image = device.scratch("splat-test-image", 4 * pixels)
        drv.memset_d32(accum, 0, 2 * 3 * pixels)
        drv.memset_d32(hist, 0, splat.HIST_BINS)
        block = (splat.BLOCK, 1, 1)
        if n:
            fn["splat_accumulate"].prepared_call(
                (-(-n // splat.BLOCK), 1),
                block,
                accum,
                pos,
                comp_ptr,
                values_ptr,
                table,
                thresholds,
                rows,
                n,
                w,
                h,
                float(np.float32(view.w_min)),
                light.value_kind,
            )
        fn["splat_histogram"].prepared_call(
            (min(-(-pixels // splat.BLOCK), 1024), 1), block, hist, accum, pixels
        )
        host_hist = np.empty(splat.HIST_BINS, np.uint32)
        drv.memcpy_dtoh(host_hist, hist)
        e = frame_exposure(params, host_hist, light.unit, n)
        lut = upload(device, "lut", tone_lut(params.tone_map, params.background))
        fn["splat_tonemap"].prepared_call(
            (-(-pixels // splat.BLOCK), 1), block, image, accum, lut, pixels, e.scale, e.saturation, e.shift
        )
        host_accum = np.empty((h, w, 3), np.uint64)
        host_image = np.empty((h, w, 4), np.uint8)
        drv.memcpy_dtoh(host_accum, accum)
        drv.memcpy_dtoh(host_image, image)
    return host_accum, host_hist, host_image


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
}


@pytest.mark.parametrize("case", CASES)
def test_the_gpu_frame_is_the_twin_s_bit_for_bit(device, case):
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
    accum, hist, image = gpu_splat(device, pos, view, light, params, comp=comp, values=values)
    assert twin.accum.any()
    assert np.array_equal(accum, twin.accum), f"{int((accum != twin.accum).sum())} channel values differ"
    assert np.array_equal(hist, twin.hist)
    assert np.array_equal(image[..., :3], twin.image) and (image[..., 3] == 255).all()
    again = gpu_splat(device, pos, view, light, params, comp=comp, values=values)
    assert all(np.array_equal(a, b) for a, b in zip(again, (accum, hist, image), strict=True))
