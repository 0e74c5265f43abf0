"""The float64 reference accelerations of chosen target bodies against all N, on the fastest engine
this machine has: a backend's record in the role "reference" (the GPU's `fp64`, else numba's `cpu-fp64`:
`Backend.reference_rows`), else numpy (app.model.physics).

Both kernels take contiguous spans, so the targets are gathered in front of the sources: the array
[pos[rows]; pos] is evaluated for targets [0, K) against sources [K, K + N). A target meets its own
copy among the sources at d = 0, which contributes exactly zero (softened) or is skipped (ε = 0), as
in a plain all-pairs evaluation.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from app.core.errors import ConfigError
from app.engine.forces import with_role
from app.model.physics import Physics, accelerations


def reference_engine(judged: str | None = None) -> str:
    """Where `reference_accelerations` will run for the record named `judged`, which must not be the
    engine's own record: the name of the first available backend (preference order: the GPU first) whose
    record in the role "reference" is not `judged`, else "numpy"."""
    from app.backends import backend_classes

    for name, cls in backend_classes().items():
        if not cls.available():
            continue
        try:
            if with_role(cls.kernels(), "reference").name != judged:
                return name
        except ConfigError:  # no float64 reference on that backend
            continue
    return "numpy"


def reference_accelerations(
    pos: np.ndarray,
    mass: np.ndarray,
    physics: Physics,
    rows: np.ndarray,
    engine: str,
    progress: Callable[[int], None] | None = None,
) -> np.ndarray:
    """(len(rows), 3) float64 accelerations of bodies `rows` by all N bodies."""
    if engine == "numpy":
        return accelerations(pos, mass, physics, targets=rows, progress=progress)
    from app.backends import backend_class

    k, n = rows.size, pos.shape[0]
    stacked = np.empty((k + n, 4))
    stacked[:k, :3], stacked[:k, 3] = pos[rows], mass[rows]
    stacked[k:, :3], stacked[k:, 3] = pos, mass
    backend = backend_class(engine)()
    try:
        return backend.reference_rows(stacked, k, physics, progress or (lambda _rows: None))
    finally:
        backend.close()
