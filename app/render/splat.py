"""The `splat` draw style's specification: its parameters, the arithmetic contract its CUDA kernels
(kernels/splat.cu) and its numba twin (app/render/splat_cpu.py) both follow, and the host-side tables
(tone map, exposure) they share. The viewer draws it through app/render/splat_style.py (docs/rendering.md).

Each body adds light to the pixels around its projected centre in a frame-sized integer buffer; the buffer
is tone-mapped into one image. Recordings promise byte-identical files, and a gpu test compares the CUDA
image with the twin's pixel for pixel, so every step is exact and portable:

1. Projection, float32, every operation rounded on its own (no fused multiply-add: kernels/splat.cu
   writes __fmul_rn/__fadd_rn/__fdiv_rn and is compiled with -fmad=false and without --use_fast_math;
   numba compiles the twin with fastmath=False). M is `SplatView.view_proj`, float32, row-major, for
   column vectors; for rows r = 0 (x), 1 (y), 3 (w), in this order:
       clip_r = ((M[r,0] * x + M[r,1] * y) + M[r,2] * z) + M[r,3]
   A body is skipped unless w > `w_min` and w is finite (behind the camera, NaN, overflow). Then
       nx = clip_x / w,  ny = clip_y / w                       (IEEE division)
       px = (nx * 0.5 + 0.5) * W,  py = (0.5 - ny * 0.5) * H   (float32; W, H converted exactly)
   image coordinates as in app/render/camera.py: x right, y down from the top row, pixel centres at +0.5.
   A body is skipped unless -1 <= px <= W + 1 and -1 <= py <= H + 1 (NaN fails the test too).
2. Footprint, fixed point: X = floor(px * 256) - 128 + 512 (px * 256 is exact; the -128 puts the origin
   on pixel centres, the +512 keeps the number positive so the shifts below are plain ones): the first
   column is (X >> 8) - 2 and fx = X & 255, the same for rows. Bilinear weights, integers summing to
   WEIGHT_ONE = 65536 exactly:
       w00 = (256 - fx)(256 - fy)   w10 = fx (256 - fy)   w01 = (256 - fx) fy   w11 = fx fy
   for (column, row), (column + 1, row), (column, row + 1), (column + 1, row + 1); a pixel outside the
   frame is dropped, as is a zero weight. A sub-pixel footprint: a slowly moving body slides its light
   between pixels in 1/256 px steps instead of jumping a whole pixel (no shimmer).
3. Light, integers: a body's light per channel L (uint32) is a host-built table's row
   `BodyLight.table[component, level]` (app/render/splat_light.py: colour x brightness x show/hide, the
   colormap by speed or mass); `level` in 0..255 comes from the body's float32 value (speed, the force
   error's position, or its mass, pos.w) by comparisons only: the number of the table's 255 thresholds
   at or below the value (a binary search of 8 steps; NaN gives 0). No log2 or division runs per body.
4. Accumulation: accum[row, column, c] += L_c * w as unsigned 64-bit integer atomics (integer sums do not
   depend on the order: the buffer is the same bit for bit whatever the threads' schedule). No shift, no
   rounding: the buffer is the exact sum of L * w. The bound: a pixel channel gets at most one weight
   per body, so it holds at most N * max(L) * 65536; the table's unit is chosen (`light_cap`) so that
   this is below 2^64 for the N it is built for (at N = 2^24 = 16M bodies, max(L) <= 2^24 - 1).
5. Tone map, integers and a table: the LUT index of a channel value A is
       i = min(((min(A, saturation) >> shift) * scale) >> 48, 4095)
   and the output byte `tone_lut(...)[c, i]`, a table computed once per setting in float64 (4096 entries
   of x in [0, X_MAX), see `tone_curve`), so no exp() runs on the device. `scale` (E), `saturation` and
   `shift` are `Exposure`'s; the product stays below 2^64 whatever A (`exposure_for`). The background b
   is in the table: b + (1 - b) f(x), as the sprites' screen blending gives.
6. Automatic exposure, integers: a histogram of the lit pixels' brightest channel, HIST_BINS bins of 16 per
   octave (the leading bit's place and the 4 bits below it, `hist_bin`), counted with integer atomics;
   the bin of the `auto_percentile` weighted by light (`percentile_value`: the pixels dimmer than it hold
   that share of the light) sets the exposure so that its value maps to x = `auto_level` (`frame_exposure`
   here for the twin; kernels/splat.cu splat_exposure on the GPU, the same float64 operations in the same
   order, so the same exposure bit for bit). Both sides compute the same histogram. Weighted by light,
   not by pixel count: a count percentile of the lit pixels moves with N, because 8x the bodies light
   more of the sparse outskirts with faint pixels (a test galaxy: 40% of the frame lit at 125k bodies,
   65% at 1M) and push the 99.5th percentile to a lower rank among the bright ones; exposed by it the
   1M frame came out 28-33% brighter than the 125k one, by the light-weighted median 2-4%.

Light per body ∝ (n_ref / N)^gamma with gamma = 1 (`SplatParams.gamma`), applied in the exposure (a
body's integer light keeps its 16 bits of precision at any N): with a footprint of one pixel's area at any
N, the frame's total light, hence its mean brightness, is then the same at 1M and 16M bodies; only the
detail changes (less shot noise). gamma = 1/2, the sprites' density gain, would make 16M four times
brighter overall than 1M: the burnt-out collisions of issue 24. Below n_ref bodies the light per body stays
that of n_ref (a sparse scene is dimmer, not each body brighter). Automatic exposure normalises by the
percentile, so N drops out there.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from app.core.errors import ConfigError
from app.model.config import TONE_MAPS  # (one list: the scene key render.tone_map)

SOURCE = "splat.cu"  # kernels/; compiled with its own options (app/backends/cuda/compile.py FILE_OPTIONS)
# entry -> prepare string (P pointer, i int, f float, Q unsigned 64-bit); tests read the PTX against them
KERNELS = {
    "splat_accumulate": "PPPPPPPiiifi",
    "splat_count": "PPPPPPPPiiifiii",
    "splat_offsets": "PPPPii",
    "splat_scatter": "PPPii",
    "splat_tiles": "PPPPPPiiiii",
    "splat_histogram": "PPi",
    "splat_exposure": "PPiddd",  # one block of HIST_BINS threads: frame_exposure on the device
    "splat_tonemap": "PPPiP",
    "splat_indices": "PPiP",  # the bloom's (app/render/splat_bloom.py)
    "splat_glow": "PPPiQiiii",  # (Q: the long long total, positive, packed as 64 bits)
    "splat_tonemap_glow": "PPPPii",
}
BLOCK = 256
OFFSETS_BLOCK = 1024  # splat_offsets: one block, 4 tiles a thread
TILE = 32  # the binned accumulation's tiles, pixels a side (kernels/splat.cu SPLAT_TILE)
MAX_TILES = 4000  # its shared counters (SPLAT_MAX_TILES): 2,074 tiles at 1920x1080, 3,726 at 2560x1440
MAX_CHUNK = 16384  # the most records per block of splat_tiles (SPLAT_MAX_CHUNK: its split sums' bound)
PER_THREAD = 8  # bodies a thread holds per round of splat_scatter (SPLAT_PER_THREAD)

SUB = 256  # fixed-point steps per pixel (8 fractional bits)
WEIGHT_ONE = SUB * SUB  # the four bilinear weights always sum to this
LEVELS = 256  # colour levels per component (the colormap's entries)
TONE_SIZE = 4096  # entries of the tone-map table
X_MAX = 8.0  # the table covers x in [0, X_MAX): 1 - exp(-8) rounds to 255, ACES's fit is 1 from 7.24
EXPOSURE_SHIFT = 48  # i = (A * E) >> 48: E carries 48 fractional bits
MAX_EXPOSURE_SCALE = 1 << 62  # with saturation, A * E < 2^60 + 2^62 < 2^64
MIN_EXPOSURE_BITS = 24  # E keeps at least this many bits (a shift of A makes room: `exposure_for`)
HIST_SUB_BITS = 4  # histogram bins per octave: 2^4
HIST_BINS = 64 << HIST_SUB_BITS  # 64 octaves of a 64-bit value
U64 = (1 << 64) - 1


@dataclass(frozen=True)
class SplatParams:
    """How a frame is exposed and tone-mapped (the light itself: app/render/splat_light.py)."""

    width: int
    height: int
    exposure: float | None = None  # x of one body's full light at N <= n_ref; None: automatic
    auto_percentile: float = 50.0  # automatic exposure: the lit pixels' light-weighted percentile ...
    auto_level: float = 2.0  # ... gets x = auto_level (1 - exp(-2) = 86%); 3.1x brighter is white
    tone_map: str = "exp"  # exp: 1 - exp(-x), as the sprites; aces: Narkowicz's fit of ACES
    n_ref: int = 16384  # up to this many bodies each gets the full light (the sprites' DENSITY_REF_N)
    gamma: float = 1.0  # light per body ∝ (n_ref / N)^gamma above n_ref (the module docstring says why)
    background: tuple[float, float, float] = (0.0, 0.0, 0.0)
    bloom: float = 0.0  # the glow's strength, 0: off (app/render/splat_bloom.py)
    bloom_threshold: float = 4.0  # ... of the parts brighter than this x
    bloom_radius: float = 6.0  # ... spread over a Gaussian of this sigma, pixels

    def __post_init__(self):
        if min(int(self.width), int(self.height)) <= 0 or self.width * self.height * 3 >= 2**31:
            raise ConfigError(f"splat: a {self.width}x{self.height} frame is not drawable")
        if self.tone_map not in TONE_MAPS:
            raise ConfigError(f"splat: tone map {self.tone_map!r}; choose from {', '.join(TONE_MAPS)}")
        if self.exposure is not None and not (math.isfinite(self.exposure) and self.exposure > 0):
            raise ConfigError(f"splat: exposure {self.exposure!r} must be a positive number (or automatic)")
        if not 0 < self.auto_percentile <= 100 or not self.auto_level > 0:
            raise ConfigError("splat: auto_percentile in (0, 100] and auto_level > 0")


@dataclass(frozen=True)
class SplatView:
    """The projection: `view_proj` float32 (4, 4) for column vectors (P @ V), and the w below which a
    body is behind the camera (the near plane's distance)."""

    view_proj: np.ndarray
    w_min: float

    def __post_init__(self):
        m = np.asarray(self.view_proj)
        if m.shape != (4, 4) or not np.isfinite(m).all():
            raise ValueError(f"splat: view_proj must be a finite 4x4 matrix, not shape {m.shape}")
        if not (math.isfinite(self.w_min) and self.w_min > 0):  # also: w > w_min > 0, no division by 0
            raise ValueError(f"splat: w_min {self.w_min!r} must be a positive number (the near plane)")

    @classmethod
    def of(cls, camera, size: tuple[int, int], shift: float = 0.0) -> SplatView:
        """From an app.render.camera.OrbitCamera for a `size` = (width, height) frame (as the sprites')."""
        w, h = size
        m = camera.projection_matrix(w / max(h, 1), shift) @ camera.view_matrix()
        return cls(np.ascontiguousarray(m, np.float32), float(np.float32(camera.near)))

    def rows(self) -> np.ndarray:
        """The 16 floats the kernels read, row-major."""
        return np.ascontiguousarray(self.view_proj, np.float32).reshape(16)


def tile_grid(width: int, height: int) -> tuple[int, int]:
    """(tiles across, tiles in all) of the binned accumulation: a body's tile holds its first footprint
    column plus 2 (the bias), 0 .. width + 3, and the same for rows."""
    across = -(-(int(width) + 4) // TILE)
    return across, across * -(-(int(height) + 4) // TILE)


# --- the tone map ----------------------------------------------------------------------------------------
def tone_curve(name: str, x: np.ndarray) -> np.ndarray:
    """f(x) in [0, 1], float64, non-decreasing. exp: 1 - exp(-x), never 1 (the sprites' curve). aces:
    Narkowicz's fit of the ACES filmic curve (2015), x (2.51 x + 0.03) / (x (2.43 x + 0.59) + 0.14), a toe
    and a shoulder, taken to 1 (not past it) from x = 7.24 on."""
    x = np.asarray(x, np.float64)
    if name == "exp":
        return -np.expm1(-x)
    if name == "aces":
        return np.minimum(x * (2.51 * x + 0.03) / (x * (2.43 * x + 0.59) + 0.14), 1.0)
    raise ConfigError(f"splat: tone map {name!r}; choose from {', '.join(TONE_MAPS)}")


def tone_x() -> np.ndarray:
    """The x each table entry stands for: the middle of its 1/TONE_SIZE of [0, X_MAX)."""
    return (np.arange(TONE_SIZE) + 0.5) * (X_MAX / TONE_SIZE)


def tone_lut(name: str, background=(0.0, 0.0, 0.0)) -> np.ndarray:
    """(3, TONE_SIZE) uint8: per channel round(255 (b + (1 - b) f(x))), the bytes the image gets."""
    f = tone_curve(name, tone_x())
    b = np.clip(np.asarray(background, np.float64).reshape(3, 1), 0.0, 1.0)
    return np.rint(255.0 * (b + (1.0 - b) * f[None, :])).astype(np.uint8)


# --- the exposure ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Exposure:
    """LUT index i = min(((min(A, saturation) >> shift) * scale) >> EXPOSURE_SHIFT, TONE_SIZE - 1);
    `x_per_unit` is the x one unit of the buffer stands for (scale / 2^shift is it in fixed point)."""

    scale: int
    saturation: int
    shift: int
    x_per_unit: float


def exposure_for(x_per_unit: float) -> Exposure:
    """The integer exposure of `x_per_unit`: E = round(x_per_unit * TONE_SIZE / X_MAX * 2^(48 + shift)),
    with the least shift (0..63) that keeps 2^24 <= E (25 significant bits: a dim frame's large values,
    whose small exposure would otherwise round to a few units, drop their low bits instead, well below one
    table step), and E <= 2^62. saturation = ceil(4095 * 2^48 / E) << shift (the least A that reaches the
    last entry), at most 2^64 - 1, so (min(A, saturation) >> shift) * E stays below 2^64 whatever A: below
    4095 * 2^48 + E unclamped; clamped only from shift 28 on, where (A >> shift) * E < 2^36 * 2^25."""
    steps = float(x_per_unit) * (TONE_SIZE / X_MAX) * float(1 << EXPOSURE_SHIFT)
    if not (math.isfinite(steps) and steps > 0):
        steps = 1.0
    shift = 0
    while steps * 2.0**shift < 2.0**MIN_EXPOSURE_BITS and shift < 63:
        shift += 1
    scale = int(min(max(round(steps * 2.0**shift), 1), MAX_EXPOSURE_SCALE))
    last = (TONE_SIZE - 1) << EXPOSURE_SHIFT
    return Exposure(scale, min(-(-last // scale) << shift, U64), shift, float(x_per_unit))


def reference_accum(params: SplatParams, unit: float, n: int) -> float:
    """The buffer value of one body's full light (L = unit, weight 65536) at N bodies: what x = exposure
    stands for; grows as (N / n_ref)^gamma above n_ref, i.e. each body's light falls as (n_ref / N)^gamma."""
    return unit * WEIGHT_ONE * max(1.0, n / params.n_ref) ** params.gamma


def manual_x_per_unit(params: SplatParams, unit: float, n: int) -> float:
    """The x one unit of the buffer stands for under the manual `params.exposure` at N bodies."""
    if params.exposure is None:
        raise ValueError("manual exposure: the params ask for automatic exposure")
    return params.exposure / reference_accum(params, unit, n)


def manual_exposure(params: SplatParams, unit: float, n: int) -> Exposure:
    return exposure_for(manual_x_per_unit(params, unit, n))


def hist_bin(value: int) -> int:
    """The histogram bin of a positive channel value (the kernels' and the twin's rule, here in Python for
    the tests): 16 * (the leading bit's place) + the 4 bits below it."""
    e = int(value).bit_length() - 1
    sub = (value >> (e - HIST_SUB_BITS)) if e >= HIST_SUB_BITS else (value << (HIST_SUB_BITS - e))
    return (e << HIST_SUB_BITS) + (sub & ((1 << HIST_SUB_BITS) - 1))


def bin_value(b: int) -> float:
    """The value a bin stands for: its lower edge plus half its width (exact below 16, where bins are)."""
    e, sub = divmod(int(b), 1 << HIST_SUB_BITS)
    half = 0.5 if e >= HIST_SUB_BITS else 0.0
    return 2.0**e * (1.0 + (sub + half) / (1 << HIST_SUB_BITS))


def percentile_value(hist: np.ndarray, percentile: float) -> float | None:
    """The light-weighted percentile of the lit pixels: the value of the first bin (from the dim end) at
    which the pixels' cumulative light, count * bin value, reaches `percentile`% of their total; None when
    nothing is lit."""
    counts = np.asarray(hist, np.float64)
    if not counts.any():
        return None
    light = np.cumsum(counts * _bin_values(counts.size))
    b = int(np.searchsorted(light, percentile / 100.0 * light[-1]))
    return bin_value(min(b, counts.size - 1))


@functools.cache
def _bin_values(bins: int) -> np.ndarray:
    """bin_value of bins 0 .. bins - 1, made once: the viewer takes a percentile every frame, and a thousand
    Python calls cost 0.4 ms of it."""
    values = np.array([bin_value(b) for b in range(bins)])
    values.flags.writeable = False
    return values


def auto_exposure(params: SplatParams, hist: np.ndarray) -> Exposure:
    """The exposure that gives the `auto_percentile` of the lit pixels x = `auto_level` (nothing lit: any
    exposure draws black; one that maps a body's whole light to x = 1)."""
    value = percentile_value(hist, params.auto_percentile)
    return exposure_for(params.auto_level / value if value else 1.0 / WEIGHT_ONE)


def frame_exposure(params: SplatParams, hist: np.ndarray, unit: float, n: int) -> Exposure:
    """The frame's exposure: manual (`params.exposure`, scaled with N) or automatic (from `hist`)."""
    if params.exposure is None:
        return auto_exposure(params, hist)
    return manual_exposure(params, unit, n)
