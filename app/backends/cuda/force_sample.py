"""The live force error's two halves on a GPU (`Backend.force_error_sample`, app/engine/force_error.py), for
one GPU (backend.py) and for the GPUs of `--gpus` (multi.py) alike:

- `gather_rows`: K rows of a float4 device buffer (the cached accelerations) copied to the host;
- `exact_rows`: the all-pairs accelerations of K bodies due to all N, by the `shared` kernel (fp32 sums,
  ~1e-6 relative: three orders below a tree's error), on the device that holds the positions.

The rows are gathered on the device by CuPy (which the approximate records need anyway), on the legacy
stream of the device's primary context: behind every piece of work queued there (a step, an exchange's
copies), with no host wait beyond the read-back itself. The caller's state is only read.
"""

from __future__ import annotations

import numpy as np

from app.backends.cuda.tree import cupy_module
from app.engine.forces import ForceEvaluator, Span


def _unowned(cp, ptr: int, nbytes: int, owner):
    """A CuPy memory pointer onto device memory pycuda owns (the state, the VBO while mapped)."""
    return cp.cuda.MemoryPointer(cp.cuda.UnownedMemory(int(ptr), int(nbytes), owner), 0)


def _float4_rows(cp, ptr: int, n: int, owner):
    return cp.ndarray((n, 4), cp.float32, _unowned(cp, ptr, 16 * n, owner))


def gather_rows(device, ptr: int, n: int, rows: np.ndarray) -> np.ndarray:
    """Float32 (K, 4): the rows `rows` of the n float4 rows at `ptr` on `device` (a CudaDevice)."""
    cp = cupy_module()
    with device.scope, cp.cuda.Device(device.ordinal):
        return _float4_rows(cp, ptr, n, device)[cp.asarray(np.asarray(rows, dtype=np.int64))].get()


def exact_rows(device, evaluator: ForceEvaluator, pos: int, n: int, rows: np.ndarray) -> np.ndarray:
    """Float64 (K, 3): the accelerations of the bodies `rows` of the n float4 positions at `pos` due to
    all n, by `evaluator` (the record with the role "exact", `shared`, on `device`, with the run's
    physics). The K targets are copied in front of a copy of the sources, so that one launch over
    (targets, sources) spans computes them."""
    cp = cupy_module()
    rows = np.asarray(rows, dtype=np.int64)
    k = int(rows.size)
    with device.scope, cp.cuda.Device(device.ordinal):
        state = _float4_rows(cp, pos, n, device)
        both = cp.empty((k + n, 4), cp.float32)
        both[:k] = state[cp.asarray(rows)]
        both[k:] = state
        out = cp.zeros((k + n, 4), cp.float32)
        cp.cuda.get_current_stream().synchronize()  # the copies before the pycuda launch
        evaluator.evaluate(both.data.ptr, out.data.ptr, Span(0, k), Span(k, n))
        device.drv.Context.synchronize()
        return out[:k, :3].get().astype(np.float64)
