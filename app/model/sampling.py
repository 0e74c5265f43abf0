"""Random draws the initial-condition generators share (app/model/ics.py, app/model/galaxy.py)."""

from __future__ import annotations

import numpy as np


def isotropic(rng: np.random.Generator, n: int) -> np.ndarray:
    """Unit vectors uniform on the sphere (uniform cos θ and φ: no normalisation of near-zero vectors)."""
    cos_t = rng.uniform(-1.0, 1.0, n)
    phi = rng.uniform(0.0, 2.0 * np.pi, n)
    sin_t = np.sqrt(1.0 - cos_t * cos_t)
    return np.column_stack([sin_t * np.cos(phi), sin_t * np.sin(phi), cos_t])
