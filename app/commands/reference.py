"""The float64 reference accelerations of chosen target bodies against all N, on the fastest engine
this machine has: the GPU's `fp64` record, else numba's `cpu-fp64`, else numpy (app.physics).

Both kernels take contiguous spans, so the targets are gathered in front of the sources: the array
[pos[rows]; pos] is evaluated for targets [0, K) against sources [K, K + N). A target meets its own
copy among the sources at d = 0, which contributes exactly zero (softened) or is skipped (ε = 0), as
in a plain all-pairs evaluation.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from app.forces import Span
from app.physics import Physics, accelerations

ROWS_PER_UPDATE = 1024  # targets per evaluation, so that a progress bar moves


# The engines, fastest first, and the record each runs (a kernel is never judged against itself).
ENGINES = {"cuda": "fp64", "cpu": "cpu-fp64", "numpy": None}


def reference_engine(judged: str | None = None) -> str:
    """'cuda', 'cpu' (numba) or 'numpy': where `reference_accelerations` will run for the record
    named `judged`, which must not be the engine's own."""
    from app.backends import backend_class

    for name, record in ENGINES.items():
        if record != judged and (record is None or backend_class(name).available()):
            return name
    raise AssertionError("numpy is always an engine")


def reference_accelerations(pos: np.ndarray, mass: np.ndarray, physics: Physics, rows: np.ndarray,
                            engine: str, progress: Callable[[int], None] | None = None) -> np.ndarray:
    """(len(rows), 3) float64 accelerations of bodies `rows` by all N bodies."""
    if engine == "numpy":
        return accelerations(pos, mass, physics, targets=rows, progress=progress)
    k, n = rows.size, pos.shape[0]
    stacked = np.empty((k + n, 4))
    stacked[:k, :3], stacked[:k, 3] = pos[rows], mass[rows]
    stacked[k:, :3], stacked[k:, 3] = pos, mass
    run = _on_cuda if engine == "cuda" else _on_numba
    return run(stacked, k, physics, progress or (lambda _rows: None))


def _chunks(k: int):
    for start in range(0, k, ROWS_PER_UPDATE):
        yield Span(start, min(ROWS_PER_UPDATE, k - start))


def _on_numba(stacked, k, physics, progress) -> np.ndarray:
    from app.backends.cpu import CPUBackend

    record = CPUBackend.record("cpu-fp64")
    evaluator = record.policy.evaluator(record, physics)
    acc = np.zeros((k, 3))
    sources = Span(k, stacked.shape[0] - k)
    for targets in _chunks(k):
        evaluator.evaluate(stacked, acc, targets, sources)
        progress(targets.count)
    return acc


def _on_cuda(stacked, k, physics, progress) -> np.ndarray:
    from app.backends.cuda import CudaBackend

    backend = CudaBackend()
    try:
        device = backend.device
        evaluator = backend.evaluator("fp64")
        evaluator.set_physics(physics)
        row = stacked.strides[0]  # 32 bytes: the fp64 record's dvec4 rows
        with device.scope:
            pos = device.scratch("reference-pos", stacked.nbytes)
            acc = device.scratch("reference-acc", row * k)
            device.drv.memcpy_htod(pos, stacked)
            sources = Span(k, stacked.shape[0] - k)
            for targets in _chunks(k):
                evaluator.evaluate(pos, acc, targets, sources)
                device.drv.Context.synchronize()
                progress(targets.count)
            out = np.empty((k, 4))
            device.drv.memcpy_dtoh(out, acc)
    finally:
        backend.close()
    return out[:, :3].copy()
