"""The splat's CPU twin in numba: the same integer buffer, histogram and image as kernels/splat.cu from the
same positions, bit for bit (app/render/splat.py's contract). CI tests the contract on it; on a GPU machine
tests/test_splat_gpu.py compares the CUDA buffers with it.

    frame = splat_image(pos4, view, light, params, comp=None, values=None)
    frame.accum   uint64 (H, W, 3)   the exact sum of L * w per pixel channel
    frame.hist    uint32 (HIST_BINS,) the lit pixels' brightest channel, 16 bins per octave
    frame.image   uint8 (H, W, 3)    tone-mapped, top row first (as the sprites' recorded frames)

Serial over bodies: integer sums are order-independent, but numba's prange over bodies would race on
`accum[...] +=`, and per-thread copies of a frame cost more than the loop (30 ns a body on one core of a
2-core development machine: 1M bodies of a galaxy in 32 ms, their 1280x720 frame in 42 ms with its
histogram and tone map). Every float is float32 with fastmath=False: no FMA contraction, no
reassociation, every constant a float32 (a Python float would promote the expression to float64), and
the helpers are inlined into their caller, so they compile with its flags. numba's cache sees edits to
this file only: after changing app/render/splat.py or splat_light.py's constants, touch this file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import njit

from app.render.splat import (
    EXPOSURE_SHIFT,
    HIST_BINS,
    HIST_SUB_BITS,
    TONE_SIZE,
    Exposure,
    SplatParams,
    SplatView,
    frame_exposure,
    tone_lut,
)
from app.render.splat_bloom import Bloom, bloom_of
from app.render.splat_light import COMPONENTS, LEVELS, VALUE_ARRAY, VALUE_MASS, BodyLight

_HALF = np.float32(0.5)
_SUB = np.float32(256.0)
_FLT_MAX = np.float32(3.4028234663852886e38)
_BIAS = 512 - 128  # +2 px keeps X positive for the shifts; -128 (half a pixel): origin on pixel centres


@njit(cache=True, fastmath=False, inline="always")
def _clip_row(m, r, x, y, z):
    """((m[r,0] x + m[r,1] y) + m[r,2] z) + m[r,3], float32, each operation rounded."""
    return ((m[4 * r] * x + m[4 * r + 1] * y) + m[4 * r + 2] * z) + m[4 * r + 3]


@njit(cache=True, fastmath=False, inline="always")
def project(m, x, y, z, w_min, width, height):
    """(drawn, X, Y): the body's centre in 1/256 px plus the bias (step 2 of the contract)."""
    cw = _clip_row(m, 3, x, y, z)
    if not (cw > w_min and cw <= _FLT_MAX):
        return False, 0, 0
    nx = _clip_row(m, 0, x, y, z) / cw
    ny = _clip_row(m, 1, x, y, z) / cw
    px = (nx * _HALF + _HALF) * np.float32(width)
    py = (_HALF - ny * _HALF) * np.float32(height)
    if not (px >= -1 and px <= width + 1 and py >= -1 and py <= height + 1):
        return False, 0, 0
    return True, math.floor(px * _SUB) + _BIAS, math.floor(py * _SUB) + _BIAS


@njit(cache=True, fastmath=False, inline="always")
def level(thresholds, v):
    """max{i : T[i] <= v}, T[0] = -inf, by an 8-step binary search (NaN: 0)."""
    i = 0
    step = 128
    while step > 0:
        if thresholds[i + step] <= v:
            i += step
        step >>= 1
    return i


@njit(cache=True, fastmath=False, inline="always")
def _add(accum, row, col, weight, l0, l1, l2):
    if weight > 0 and 0 <= row < accum.shape[0] and 0 <= col < accum.shape[1]:
        w = np.uint64(weight)
        accum[row, col, 0] += l0 * w
        accum[row, col, 1] += l1 * w
        accum[row, col, 2] += l2 * w


@njit(cache=True, fastmath=False)
def accumulate(accum, pos4, comp, values, table, thresholds, m, w_min, value_kind):
    """Every body's light into `accum` (H, W, 3) uint64; `comp` (N,) uint8 or empty (all component 0),
    `values` (N,) float32 or empty (read when value_kind is VALUE_ARRAY)."""
    height, width = accum.shape[0], accum.shape[1]
    for i in range(pos4.shape[0]):
        k = 0 if comp.shape[0] == 0 else min(np.int64(comp[i]), COMPONENTS - 1)
        lev = 0
        if value_kind == VALUE_ARRAY:
            lev = level(thresholds, values[i])
        elif value_kind == VALUE_MASS:
            lev = level(thresholds, pos4[i, 3])
        l0 = np.uint64(table[k, lev, 0])
        l1 = np.uint64(table[k, lev, 1])
        l2 = np.uint64(table[k, lev, 2])
        if l0 == 0 and l1 == 0 and l2 == 0:
            continue  # hidden (or black): nothing to add, no atomics on the GPU either
        drawn, x, y = project(m, pos4[i, 0], pos4[i, 1], pos4[i, 2], w_min, width, height)
        if not drawn:
            continue
        col, row = (x >> 8) - 2, (y >> 8) - 2
        fx, fy = x & 255, y & 255
        _add(accum, row, col, (256 - fx) * (256 - fy), l0, l1, l2)
        _add(accum, row, col + 1, fx * (256 - fy), l0, l1, l2)
        _add(accum, row + 1, col, (256 - fx) * fy, l0, l1, l2)
        _add(accum, row + 1, col + 1, fx * fy, l0, l1, l2)


@njit(cache=True, inline="always")
def _bin(v):
    """16 * (the leading bit's place) + the 4 bits below it, of v > 0 (uint64)."""
    e = 63
    while (v >> np.uint64(e)) == 0:
        e -= 1
    sub = v >> np.uint64(e - HIST_SUB_BITS) if e >= HIST_SUB_BITS else v << np.uint64(HIST_SUB_BITS - e)
    return (e << HIST_SUB_BITS) + np.int64(sub & np.uint64((1 << HIST_SUB_BITS) - 1))


@njit(cache=True)
def histogram(accum, hist):
    """Count each lit pixel's brightest channel into `hist` (HIST_BINS,) uint32."""
    for r in range(accum.shape[0]):
        for c in range(accum.shape[1]):
            v = max(accum[r, c, 0], accum[r, c, 1], accum[r, c, 2])
            if v > 0:
                hist[_bin(v)] += 1


@njit(cache=True, inline="always")
def _tone_index(value, scale, saturation, shift):
    """min(((min(A, saturation) >> shift) * scale) >> 48, 4095): step 5's index (kernels/splat.cu
    tone_index); uint64 throughout."""
    return min(
        ((min(value, saturation) >> shift) * scale) >> np.uint64(EXPOSURE_SHIFT), np.uint64(TONE_SIZE - 1)
    )


@njit(cache=True)
def tonemap(accum, lut, scale, saturation, shift, image):
    """image[r, c, ch] = lut[ch, the channel's `_tone_index`] (step 5)."""
    for r in range(accum.shape[0]):
        for c in range(accum.shape[1]):
            for ch in range(3):
                image[r, c, ch] = lut[ch, _tone_index(accum[r, c, ch], scale, saturation, shift)]


@njit(cache=True)
def tone_indices(accum, scale, saturation, shift, index):
    """index[r, c, ch] = the channel's `_tone_index`, kept for the bloom (app/render/splat_bloom.py)."""
    for r in range(accum.shape[0]):
        for c in range(accum.shape[1]):
            for ch in range(3):
                index[r, c, ch] = _tone_index(accum[r, c, ch], scale, saturation, shift)


@njit(cache=True)
def glow_pass(src, taps, total, along_rows, out):
    """out = (sum_k w_k src[.. + k ..]) // W along rows (c + k) or columns (r + k), 0 outside the frame
    (app/render/splat_bloom.py); int64 sums."""
    reach = (taps.shape[0] - 1) // 2
    h, w = src.shape[0], src.shape[1]
    for r in range(h):
        for c in range(w):
            for ch in range(3):
                acc = np.int64(0)
                for j in range(taps.shape[0]):
                    rr, cc = (r, c + j - reach) if along_rows else (r + j - reach, c)
                    if 0 <= rr < h and 0 <= cc < w:
                        acc += np.int64(taps[j]) * np.int64(src[rr, cc, ch])
                out[r, c, ch] = acc // total


@njit(cache=True)
def tonemap_glow(index, glow, gain, lut, image):
    """image = lut[ch, min(i + ((G v) >> 8), 4095)] (the bloom's last line)."""
    for r in range(index.shape[0]):
        for c in range(index.shape[1]):
            for ch in range(3):
                i = np.int64(index[r, c, ch]) + ((np.int64(gain) * np.int64(glow[r, c, ch])) >> 8)
                image[r, c, ch] = lut[ch, min(i, TONE_SIZE - 1)]


def bloomed_image(accum: np.ndarray, e: Exposure, lut: np.ndarray, bloom: Bloom) -> np.ndarray:
    """The image of `accum` with `bloom` (app/render/splat_bloom.py's steps) under exposure `e`."""
    shape = accum.shape
    index = np.empty(shape, np.int64)
    tone_indices(accum, np.uint64(e.scale), np.uint64(e.saturation), np.uint64(e.shift), index)
    bright = np.maximum(index - bloom.threshold, 0)
    taps = np.ascontiguousarray(bloom.taps, np.int64)
    rows, glow = np.empty(shape, np.int64), np.empty(shape, np.int64)
    glow_pass(bright, taps, np.int64(bloom.total), True, rows)
    glow_pass(rows, taps, np.int64(bloom.total), False, glow)
    image = np.empty(shape, np.uint8)
    tonemap_glow(index, glow, bloom.gain, lut, image)
    return image


@dataclass(frozen=True)
class SplatFrame:
    accum: np.ndarray
    hist: np.ndarray
    exposure: Exposure
    image: np.ndarray


def _optional(a, n: int, dtype, what: str) -> np.ndarray:
    if a is None:
        return np.zeros(0, dtype)
    out = np.ascontiguousarray(a, dtype).reshape(-1)
    if out.shape[0] != n:
        raise ValueError(f"splat: {out.shape[0]} {what} for {n} bodies")
    return out


def splat_image(
    pos4: np.ndarray,
    view: SplatView,
    light: BodyLight,
    params: SplatParams,
    comp: np.ndarray | None = None,
    values: np.ndarray | None = None,
) -> SplatFrame:
    """The twin's frame of (N, 4) float32 [x, y, z, m] rows seen through `view`, lit by `light`
    (app.render.splat_light.body_light), exposed and tone-mapped by `params`. `comp`: each body's
    component (uint8; None: all 0); `values`: the float32 the levels read when colouring by speed or error."""
    pos4 = np.ascontiguousarray(pos4, np.float32).reshape(-1, 4)
    n = pos4.shape[0]
    if n > light.bodies:
        raise ValueError(
            f"splat: light table built for {light.bodies:,} bodies, {n:,} given (overflow bound)"
        )
    comp_ = _optional(comp, n, np.uint8, "component indices")
    values_ = _optional(values, n, np.float32, "values")
    if light.value_kind == VALUE_ARRAY and values_.shape[0] != n:
        raise ValueError("splat: this colouring reads a value per body; pass values")
    accum = np.zeros((params.height, params.width, 3), np.uint64)
    table = np.ascontiguousarray(light.table, np.uint32).reshape(COMPONENTS, LEVELS, 3)
    m = view.rows()
    accumulate(
        accum, pos4, comp_, values_, table, light.thresholds, m, np.float32(view.w_min), light.value_kind
    )
    hist = np.zeros(HIST_BINS, np.uint32)
    histogram(accum, hist)
    exposure = frame_exposure(params, hist, light.unit, n)
    lut = tone_lut(params.tone_map, params.background)
    e = exposure
    bloom = bloom_of(params.bloom, params.bloom_threshold, params.bloom_radius)
    if bloom is not None:
        return SplatFrame(accum, hist, exposure, bloomed_image(accum, e, lut, bloom))
    image = np.empty((params.height, params.width, 3), np.uint8)
    tonemap(accum, lut, np.uint64(e.scale), np.uint64(e.saturation), np.uint64(e.shift), image)
    return SplatFrame(accum, hist, exposure, image)
