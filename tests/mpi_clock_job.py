"""`mpiexec -n 2 python tests/mpi_clock_job.py RANK ARGS...`: `nbody-live ARGS...` with rank RANK's
clock running 1,000 times fast where bench reads it (app.tools.bench_row), as a rank on a machine whose
clock disagrees with rank 0's would; for tests/test_mpi.py (bench's --max-seconds must be decided by rank 0
alone)."""

from __future__ import annotations

import sys
import time
import types

from mpi4py import MPI

from app.cli import main
from app.tools import bench_row

if MPI.COMM_WORLD.rank == int(sys.argv[1]):
    begun = time.perf_counter()
    bench_row.time = types.SimpleNamespace(perf_counter=lambda: begun + 1000 * (time.perf_counter() - begun))

sys.exit(main(sys.argv[2:]))
