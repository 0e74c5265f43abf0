"""A distributed GPU job for tests/test_mpi.py, run as
`mpiexec -n R python tests/mpi_gpu_job.py OUT KERNEL N`: every rank takes the GPU of its local rank (ranks
beyond the node's GPUs share them), evaluates the accelerations of its share of N bench bodies with
KERNEL, and rank 0 saves all of them to OUT (npz)."""

from __future__ import annotations

import sys

import numpy as np

from app.backends import backend_class
from app.bench import bench_bodies
from app.distributed import RankRun, agree, device_maker, fail_together, world
from app.physics import Physics

PHYSICS = Physics(softening=0.01, dt=1e-3)


def main(out: str, kernel: str, n: int) -> None:
    comm = world()
    with fail_together(comm):
        agree(comm, {"argv": sys.argv[1:]})
        kernel, make = device_maker(comm, backend_class("cuda"), kernel)
        run = RankRun(comm, make)
        run.load(bench_bodies(n), PHYSICS, kernel)
        acc = run.accelerations()
        if comm.rank == 0:
            np.savez(out, acc=acc)
        run.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
