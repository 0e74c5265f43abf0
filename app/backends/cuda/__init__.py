"""The `cuda` backend package: pycuda + kernels/*.cu, CUDA–GL interop, CUDA-event timings.

Importable without pycuda (and without a GPU): pycuda is imported on first use, and
`BACKEND.why_not()` says what is missing. Modules:

    context.py   pycuda import, device facts, the primary-context scope
    compile.py   nvcc → cubin, disk cache, ptxas resource report (no pycuda needed)
    registry.py  the CUDA kernel records
    interop.py   CUDA-registered GL buffers, mapped only inside `with`
    timers.py    CUDA event pairs
    backend.py   CudaBackend
    errors.py    NonFiniteState, KernelCompileError
"""

from app.backends.cuda.backend import CudaBackend
from app.backends.cuda.errors import KernelCompileError, NonFiniteState

BACKEND = CudaBackend

__all__ = ["BACKEND", "CudaBackend", "KernelCompileError", "NonFiniteState"]
