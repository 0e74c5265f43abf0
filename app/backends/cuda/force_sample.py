"""The live force error's two halves on a GPU (`Backend.force_error_sample`, app/engine/force_error.py), for
one GPU (backend.py) and for the GPUs of `--gpus` (multi.py) alike:

- `gather_rows`: K rows of a float4 device buffer (the cached accelerations) copied to the host;
- `exact_rows`: the all-pairs accelerations of K bodies due to all N, on the device that holds the
  positions, by `sample_evaluator`'s kernel (fp32 sums, ~1e-6 relative: three orders below a tree's error).
  That is `multi-thread-per-body` with 32 threads a target, not `shared`'s one: K = 1,024 targets are 4
  blocks of `shared`, 4 SMs of 132 working through all N sources (65 ms at 1M on the H200, a visible
  hitch every time the live force error sampled; frame 51 of bench/results/h200-2026-11-26-run-1048576-
  tree-style_splat-frames.csv), and 128 blocks of it.

The rows are gathered on the device by CuPy (which the approximate records need anyway), on the legacy
stream of the device's primary context: behind every piece of work queued there (a step, an exchange's
copies), with no host wait beyond the read-back itself. The caller's state is only read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from app.backends.cuda.evaluator import make_evaluator
from app.backends.cuda.tree import cupy_module
from app.engine.forces import ForceEvaluator, Span

if TYPE_CHECKING:
    from app.backends.cuda.evaluator import GpuEvaluator

SAMPLE_RECORD = "multi-thread-per-body"
SAMPLE_THREADS = 32  # its q: a warp a target, 1,024 targets x 32 = 128 blocks of 256 threads


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


def sample_evaluator(device, records: dict, physics) -> GpuEvaluator:
    """The evaluator `exact_rows` launches on `device` (a CudaDevice; `records` the backend's by name):
    SAMPLE_RECORD with SAMPLE_THREADS threads sharing each target's sources, with the run's physics."""
    evaluator = make_evaluator(records[SAMPLE_RECORD], device, records)
    evaluator.set_tunables(q=SAMPLE_THREADS, block_size=256)
    evaluator.set_physics(physics)
    return evaluator


def exact_rows(device, evaluator: ForceEvaluator, pos: int, n: int, rows: np.ndarray) -> np.ndarray:
    """Float64 (K, 3): the accelerations of the bodies `rows` of the n float4 positions at `pos` due to
    all n, by `evaluator` (`sample_evaluator`'s, on `device`). The K targets are copied in front of a copy
    of the sources, so that one launch over (targets, sources) spans computes them."""
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
