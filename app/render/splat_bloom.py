"""The splat's optional bloom (`render.bloom` > 0): a glow around the frame's brightest parts, the halo a
camera lens or an eye puts around a bright galaxy core (Bonsai's renderer draws galaxies with one), from a
separable blur of the bright part. In integers, like the rest of the frame (app/render/splat.py), so that
the kernels (kernels/splat.cu) and the numba twin (app/render/splat_cpu.py) give the same bytes and a
recording stays byte-identical. A step between the tone map's index and its table (splat.py, step 5):

    i = min(((min(A, saturation) >> shift) * scale) >> 48, 4095)   the tone-map index of a channel
    b = max(i - T, 0)                                               its bright part, T: the threshold's index
    h[r, c] = (sum_k w_k b[r, c + k]) // W                           along the row, k = -K .. K
    v[r, c] = (sum_k w_k h[r + k, c]) // W                           along the column
    i' = min(i + ((G * v) >> 8), 4095)                              the index the table is read at

w_k = round(4096 exp(-k² / 2σ²)) (a Gaussian of σ = `render.bloom_radius` pixels, quantised; K = ceil(3σ),
W = sum of the w_k), pixels outside the frame count as 0, // is floor division, G = round(256 x
`render.bloom`) and T the index of x = `render.bloom_threshold` (the tone curve's input: with the automatic
exposure the lit pixels' light-weighted median sits at x = 2). Sums stay below 2^32 (b <= 4095, W <= 4096 x
193), and are kept in 64 bits anyway. The exposure and its histogram are the frame's without the glow.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from app.core.errors import ConfigError
from app.render.splat import TONE_SIZE, X_MAX

TAP_ONE = 4096  # the centre tap's weight: a Gaussian quantised to 12 bits
GAIN_ONE = 256  # G for a strength of 1 (i' = i + (G v) >> 8)
STRENGTH_MAX = 16.0
RADIUS = (0.5, 32.0)  # σ in pixels: under half a pixel there is nothing to spread; 32 is 193 taps


@dataclass(frozen=True)
class Bloom:
    """The integers of one bloom setting (the module docstring)."""

    gain: int  # G
    threshold: int  # T, a tone-map index
    taps: np.ndarray  # int32 w_-K .. w_K

    @property
    def reach(self) -> int:
        """K: the taps on each side of the centre."""
        return (len(self.taps) - 1) // 2

    @property
    def total(self) -> int:
        """W: the sum of the taps."""
        return int(self.taps.sum())


def gaussian_taps(radius: float) -> np.ndarray:
    """int32 w_k = round(4096 exp(-k² / 2σ²)) for k = -K .. K, K = ceil(3σ): symmetric, all >= 1 for σ
    within RADIUS (the outermost is 4096 e^-4.5 ~ 45)."""
    reach = math.ceil(3.0 * radius)
    k = np.arange(-reach, reach + 1, dtype=np.float64)
    return np.rint(TAP_ONE * np.exp(-(k**2) / (2.0 * radius * radius))).astype(np.int32)


@functools.lru_cache(maxsize=16)
def bloom_of(strength: float, threshold: float, radius: float) -> Bloom | None:
    """The bloom of `render.bloom` = strength, `render.bloom_threshold` = threshold (x) and
    `render.bloom_radius` = radius (σ, pixels); None when strength is 0 (off). ConfigError out of range.
    Made once per setting (every frame asks; its taps are read-only)."""
    if not 0.0 <= strength <= STRENGTH_MAX:
        raise ConfigError(f"splat: bloom {strength!r}: from 0 (off) to {STRENGTH_MAX:g}")
    if not 0.0 <= threshold < X_MAX:
        raise ConfigError(f"splat: bloom threshold {threshold!r}: an x in [0, {X_MAX:g})")
    if not RADIUS[0] <= radius <= RADIUS[1]:
        raise ConfigError(f"splat: bloom radius {radius!r}: {RADIUS[0]:g} to {RADIUS[1]:g} pixels")
    gain = round(GAIN_ONE * strength)
    if gain == 0:
        return None
    index = min(int(threshold * TONE_SIZE / X_MAX), TONE_SIZE - 1)
    taps = gaussian_taps(radius)
    taps.flags.writeable = False
    return Bloom(gain, index, taps)


def reference_glow(index: np.ndarray, bloom: Bloom) -> np.ndarray:
    """v of (H, W, 3) tone-map indices in plain numpy (the tests' reference for both implementations):
    the bright part, the row pass and the column pass, each a floor division by W."""
    b = np.maximum(index.astype(np.int64) - bloom.threshold, 0)
    taps, total, reach = bloom.taps.astype(np.int64), bloom.total, bloom.reach

    def along(a: np.ndarray, axis: int) -> np.ndarray:
        padded = np.pad(a, [(reach, reach) if d == axis else (0, 0) for d in range(3)])
        out = np.zeros_like(a)
        size = a.shape[axis]
        for j, w in enumerate(taps):
            out += w * np.take(padded, np.arange(j, j + size), axis=axis)
        return out // total

    return along(along(b, 1), 0)
