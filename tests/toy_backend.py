"""A backend that lives in tests/: issue 26's proof that a new backend is one module plus one line,

    register_backend("toy", "toy_backend")        # app/core/backend_table.py; tests/ on sys.path

after which every command, the panel, `--gpus K` and MPI ranks take `--backend toy`. It reuses the CPU
backend's machinery (numba, the CPU "devices" of `device_kind`) with a kernel of its own: `toy-fp32`,
float32 all-pairs without fastmath (the sums in a fixed order, IEEE), parallel over targets. Nothing in
app/ names it.
"""

from __future__ import annotations

import numpy as np

from app.backends.cpu import CPUBackend
from app.backends.cpu_forces import NumbaAllPairs
from app.engine.forces import KernelRecord

TOY = KernelRecord(
    name="toy-fp32",
    doc="float32 all-pairs without fastmath (IEEE sums in a fixed order), numba parallel",
    backend="toy",
    precision="fp32",
    source="app/backends/cpu_kernels.py",
    entry="accel_float32_*",
    origin="tests/toy_backend.py: a backend defined outside the package (issue 26)",
    tuned=False,
    policy=NumbaAllPairs(np.float32, fastmath=False),
    roles=frozenset({"default", "exact"}),
)


class ToyBackend(CPUBackend):
    name = "toy"
    default_kernel = TOY.name

    @classmethod
    def kernels(cls) -> list[KernelRecord]:
        return [TOY]


BACKEND = ToyBackend
