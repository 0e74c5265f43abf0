"""The splat's light per body as integers (step 3 of app/render/splat.py's contract): the host builds once
per setting a table of each component's colour at each of 256 levels, and the 255 float32 thresholds that
put a body's value (speed, force-error position or mass) on a level by comparisons alone.

The colours are the sprites' (shaders/particles.vert), from the same settings and components:
    speed, mass, error(-ab)        the colormap at mix(CMAP_LOW, 1, t), t the level's place in [0, 1]
    none                           the colormap at t = 0.75 (one level)
    component                      the component's colour (one level)
    component-speed / -mass        the component's colour times mix(0.25, 1.25, t)
each times render.brightness and the component's gain (its brightness; 0 when hidden: such a body is
skipped, adding nothing). t is the sprites' too: speed / scale, the error's own 0..1, and
0.5 + 0.25 log2(m / mean m) for mass, each clamped to [0, 1]; level i stands for t = i / 255 and the
thresholds sit half-way between levels.

Light units: L = round(light * unit), uint32. `unit` is 2^16 (16 bits per channel at brightness 1) unless
that could overflow the 64-bit buffer: a pixel channel holds at most N * max(L) * 65536, so `light_cap(N)`
= floor((2^64 - 1) / (N * 65536)) bounds max(L), and the unit halves until it does (from N = 2^24 on with
brightness 256, from 2^32 bodies at brightness 1). The exposure divides by the unit again.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.model import components as comps
from app.model.config import COLOR_BY
from app.render.colormaps import CMAP_LOW, colormap
from app.render.splat import LEVELS, U64, WEIGHT_ONE
from app.scene import RenderSettings

COMPONENTS = comps.MAX_COMPONENTS  # the table's rows (a body's component index is clamped to the last)
VALUE_NONE, VALUE_ARRAY, VALUE_MASS = 0, 1, 2  # where a body's level comes from (the kernels' value_kind)
UNIT = float(1 << 16)  # light units of brightness 1 (halved while the cap requires)
NONE_T = 0.75  # the colormap place of color_by = none (the sprites')


@dataclass(frozen=True)
class BodyLight:
    """What the accumulation reads: `table` uint32 (COMPONENTS, LEVELS, 3), `thresholds` float32 (LEVELS,)
    (entry 0 unused: -inf), where the value comes from (`value_kind`), the `unit` and the body count
    `bodies` the bound holds for."""

    table: np.ndarray
    thresholds: np.ndarray
    value_kind: int
    unit: float
    bodies: int


def light_cap(n: int) -> int:
    """The largest per-channel light with which N bodies cannot overflow one 64-bit pixel channel."""
    return min(U64 // (max(int(n), 1) * WEIGHT_ONE), (1 << 32) - 1)


def value_kind(color_by: str) -> int:
    if color_by not in COLOR_BY:
        raise ValueError(f"render.color_by: {color_by!r} is not one of {', '.join(COLOR_BY)}")
    if color_by in ("none", "component"):
        return VALUE_NONE
    return VALUE_MASS if color_by.endswith("mass") else VALUE_ARRAY


def thresholds(color_by: str, speed_scale: float = 1.0, mean_mass: float = 1.0) -> np.ndarray:
    """(LEVELS,) float32 non-decreasing: a value v is on level max{i : T[i] <= v} (T[0] = -inf)."""
    edges = (np.arange(LEVELS) - 0.5) / (LEVELS - 1)  # the t between level i - 1 and level i
    kind = value_kind(color_by)
    if kind == VALUE_MASS:
        t = mean_mass * np.exp2((edges - 0.5) * 4.0)  # t = 0.5 + 0.25 log2(m / mean), solved for m
    elif color_by in ("error", "error-ab"):
        t = edges
    else:
        t = edges * speed_scale
    out = t.astype(np.float32)
    out[0] = -np.inf
    return out


def sample(cmap: np.ndarray, place: np.ndarray) -> np.ndarray:
    """A (256, 3) colormap at `place` in [0, 1] as the sprites' linear-filtered texture samples it."""
    u = np.clip(np.asarray(place, np.float64) * cmap.shape[0] - 0.5, 0.0, cmap.shape[0] - 1.0)
    i0 = np.floor(u).astype(int)
    i1 = np.minimum(i0 + 1, cmap.shape[0] - 1)
    f = (u - i0)[..., None]
    c = cmap.astype(np.float64)
    return c[i0] * (1.0 - f) + c[i1] * f


def level_colours(color_by: str, colormap_name: str, drawn: list[comps.Drawn]) -> np.ndarray:
    """(COMPONENTS, LEVELS, 3) float64: each component's colour at each level, before brightness."""
    t = np.arange(LEVELS) / (LEVELS - 1)
    low = 0.0 if colormap_name == "white" else CMAP_LOW
    out = np.zeros((COMPONENTS, LEVELS, 3))
    if not color_by.startswith("component"):
        place = np.full(LEVELS, NONE_T) if color_by == "none" else t
        out[:] = sample(colormap(colormap_name), low + (1.0 - low) * place)
        return out
    shade = np.ones(LEVELS) if color_by == "component" else 0.25 + t  # mix(0.25, 1.25, t)
    for k, d in enumerate(drawn[:COMPONENTS]):
        out[k] = shade[:, None] * np.asarray(d.color, np.float64)[None, :]
    return out


def gains(drawn: list[comps.Drawn]) -> np.ndarray:
    """(COMPONENTS,) each component's light factor: brightness, 0 when hidden (rows past the list: 0)."""
    table = comps.StyleTable.of(drawn)
    out = np.zeros(COMPONENTS)
    out[: len(drawn)] = table.gain[: len(drawn)]
    return out


def body_light(
    settings: RenderSettings,
    drawn: list[comps.Drawn],
    n: int,
    speed_scale: float = 1.0,
    mean_mass: float = 1.0,
) -> BodyLight:
    """The light table of `settings` (color_by, colormap, brightness) for `drawn` (app.model.components
    .drawn: the components' styles, or one part without components) and N = `n` bodies."""
    kind = value_kind(settings.color_by)
    light = level_colours(settings.color_by, settings.colormap, drawn)
    light *= float(settings.brightness) * gains(drawn)[:, None, None]
    cap, unit, top = light_cap(n), UNIT, float(light.max(initial=0.0))
    while unit > 1e-30 and round(top * unit) > cap:
        unit /= 2.0
    table = np.minimum(np.rint(light * unit), cap).astype(np.uint32)
    return BodyLight(table, thresholds(settings.color_by, speed_scale, mean_mass), kind, unit, int(n))


def levels_of(values: np.ndarray, thresholds_: np.ndarray) -> np.ndarray:
    """The level of each value (numpy, for tests and host paths): the count of thresholds 1..255 at or
    below it, 0 for NaN."""
    v = np.asarray(values, np.float32)
    out = np.searchsorted(thresholds_[1:], v, side="right")
    return np.where(np.isnan(v), 0, out).astype(np.int64)
