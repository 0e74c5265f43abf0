"""The scene that tells a long float32 running sum from partial sums (kernels/common.cuh, "Two-level
accumulation"), shared by the CPU and the GPU tests.

Source 0 is a heavy core (m = 1) at the origin; then `n_targets` massless-ish bodies at r = 0.5 from it
(|a| ≈ 4, half an ulp ≈ 2.4e-7); then a cluster of `n_far` bodies of total mass 0.5 at distance ≈ 10
(each term ≈ 1.5e-7; the whole pull ≈ 5e-3, 1.2e-3 of |a|). Summed in source order in one float32
accumulator, every cluster term is below half an ulp of the running sum and rounds away: max relative
error 8.4e-4 (the CPU kernel without fastmath, and a CPU emulation of the GPU arithmetic), eight times
the fp32 budget. In partial sums of 1,024 sources: 2.6e-5, the cluster terms lost being the 1,007 that
share the first partial sum with the core.
"""

from __future__ import annotations

import numpy as np

TARGETS = slice(1, 17)  # the bodies next to the core: the rows to judge


def far_cluster(n_far: int = 32768, n_targets: int = 16, seed: int = 0) -> np.ndarray:
    """(1 + n_targets + n_far, 4) float32 rows [x, y, z, m] in that order (the order is the point)."""
    rng = np.random.default_rng(seed)
    core = np.array([[0.0, 0.0, 0.0, 1.0]])
    u = rng.normal(size=(n_targets, 3))
    u /= np.linalg.norm(u, axis=1)[:, None]
    near = np.column_stack([0.5 * u, np.full(n_targets, 1e-9)])
    c = rng.normal(size=(n_far, 3))
    c *= (rng.uniform(0.0, 1.0, n_far) ** (1 / 3) / np.linalg.norm(c, axis=1))[:, None]  # a unit ball
    far = np.column_stack([c + [10.0, 3.0, 0.0], np.full(n_far, 0.5 / n_far)])
    return np.concatenate([core, near, far]).astype(np.float32)
