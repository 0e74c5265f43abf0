"""256-entry colormaps generated in code (no data files).

inferno, magma, plasma and viridis are Matt Zucker's degree-6 polynomial fits of matplotlib's maps
(CC0, https://www.shadertoy.com/view/WlfXRN); they stay within about 1/255 of the published tables.
"""

from __future__ import annotations

import numpy as np

from app.core.errors import ConfigError

SIZE = 256

# c0..c6 of  c0 + t*(c1 + t*(c2 + ...)), one row per coefficient, columns r, g, b
_POLY = {
    "viridis": [
        (0.2777273272234177, 0.005407344544966578, 0.3340998053353061),
        (0.1050930431085774, 1.404613529898575, 1.384590162594685),
        (-0.3308618287255563, 0.214847559468213, 0.09509516302823659),
        (-4.634230498983486, -5.799100973351585, -19.33244095627987),
        (6.228269936347081, 14.17993336680509, 56.69055260068105),
        (4.776384997670288, -13.74514537774601, -65.35303263337234),
        (-5.435455855934631, 4.645852612178535, 26.3124352495832),
    ],
    "plasma": [
        (0.05873234392399702, 0.02333670892565664, 0.5433401826748754),
        (2.176514634195958, 0.2383834171260182, 0.7539604599784036),
        (-2.689460476458034, -7.455851135738909, 3.110799939717086),
        (6.130348345893603, 42.3461881477227, -28.51885465332158),
        (-11.10743619062271, -82.66631109428045, 60.13984767418263),
        (10.02306557647065, 71.41361770095349, -54.07218655560067),
        (-3.658713842777788, -22.93153465461149, 18.19190778539828),
    ],
    "magma": [
        (-0.002136485053939582, -0.000749655052795221, -0.005386127855323933),
        (0.2516605407371642, 0.6775232436837668, 2.494026599312351),
        (8.353717279216625, -3.577719514958484, 0.3144679030132573),
        (-27.66873308576866, 14.26473078096533, -13.64921318813922),
        (52.17613981234068, -27.94360607168351, 12.94416944238394),
        (-50.76852536473588, 29.04658282127291, 4.23415299384598),
        (18.65570506591883, -11.48977351997711, -5.601961508734096),
    ],
    "inferno": [
        (0.0002189403691192265, 0.001651004631001012, -0.01948089843709184),
        (0.1065134194856116, 0.5639564367884091, 3.932712388889277),
        (11.60249308247187, -3.972853965665698, -15.9423941062914),
        (-41.70399613139459, 17.43639888205313, 44.35414519872813),
        (77.162935699427, -33.40235894210092, -81.80730925738993),
        (-71.31942824499214, 32.62606426397723, 73.20951985803202),
        (25.13112622477341, -12.24266895238567, -23.07032500287172),
    ],
}

NAMES = ("inferno", "viridis", "magma", "plasma", "white")
# where the lowest value sits on a colormap (not "white"): inferno and magma start black, which adds no
# light, so slow bodies take the map from here (the sprites' shader and the splat's light table both)
CMAP_LOW = 0.22


def colormap(name: str, size: int = SIZE) -> np.ndarray:
    """(size, 3) float32 RGB in [0, 1], index 0 = low values."""
    t = np.linspace(0.0, 1.0, size)[:, None]
    if name == "white":
        return np.ones((size, 3), dtype=np.float32)
    if name not in _POLY:
        raise ConfigError(f"render.colormap: unknown colormap {name!r}; choose from {', '.join(NAMES)}")
    c = np.asarray(_POLY[name], dtype=np.float64)
    rgb = np.zeros((size, 3))
    for coeff in c[::-1]:  # Horner
        rgb = rgb * t + coeff
    return np.clip(rgb, 0.0, 1.0).astype(np.float32)


def colormap_texture_data(name: str) -> np.ndarray:
    """(1, 256, 3) float32: the layout of the 256x1 2D texture the particle shader samples."""
    return colormap(name)[None, :, :]
