"""The `cuda` backend package: pycuda + kernels/*.cu, CUDA–GL interop, CUDA-event timings.

Importable without pycuda (and without a GPU): pycuda is imported on first use, and
`BACKEND.why_not()` says what is missing. Modules:

    context.py       pycuda import, device facts per ordinal, the primary-context scope
    compile.py       nvcc → cubin, disk cache, ptxas resource report (no pycuda needed)
    device.py        CudaDevice: one GPU's context, facts, kernels, scratch, streams, event timer
    policies.py      launch policies: entry names, launch geometry, nvcc options, tuning candidates
    registry.py      the CUDA kernel records (each its own descriptor, with its policy)
    evaluator.py     CudaEvaluator: one record on one device over spans of targets and sources
    state_ops.py     the integrator's element-wise updates on device arrays (fp32, fp64)
    state.py         GpuState: one GPU's state (every GPU of a run: one GPU's, --gpus K's, MPI ranks')
    nonfinite.py     NonFiniteCheck: the non-finite check over rows (all of one GPU's, a share of --gpus)
    interop.py       CUDA-registered GL buffers, mapped only inside `with`
    diagnostics.py   energies and momenta reduced on the device
    tuning_cache.py  the cache `best` reads; tune.py fills it (`nbody-live tune`)
    multi.py         CudaShareDevice: one GPU of a run; the peer exchange; the GPU device kind
    multi_interop.py the renderer's VBOs filled on the run's first GPU after each step
    backend.py       CudaBackend: one GPU, the K = 1 run
    errors.py        NonFiniteState, KernelCompileError
"""

from app.backends.cuda.backend import CudaBackend
from app.backends.cuda.errors import KernelCompileError, NonFiniteState

BACKEND = CudaBackend

__all__ = ["BACKEND", "CudaBackend", "KernelCompileError", "NonFiniteState"]
