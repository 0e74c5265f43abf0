"""A distributed GPU job for tests/test_mpi.py, run as
`mpiexec -n R python tests/mpi_gpu_job.py OUT KERNEL N [--steps S] [--nan-at K]`: every rank takes the GPU
of its local rank (ranks beyond the node's GPUs share them), evaluates the accelerations of N bench bodies
split as KERNEL's record says (app/parallel/decomposition.py), takes S leapfrog steps (0 unless given), and
rank 0 saves the accelerations and the positions to OUT (npz).

With --nan-at K the job instead takes 2 × check_every euler-damped steps and rank 1 puts a NaN into the
velocity of the body in the middle of its share before step K, on its GPU (as tests/mpi_job.py does on CPU
ranks): the ranks' agreed check, the GPU kernel of cuda/nonfinite.py on each rank's share, must end the
job with rank 1's line naming the body."""

from __future__ import annotations

import sys

import numpy as np
from mpi_job import middle_of_share
from test_multidevice_nonfinite import poison

from app.backends import backend_class
from app.backends.distributed import RankRun, agree, device_maker, fail_together, world
from app.engine.integrator import CHECK_EVERY
from app.model.physics import Physics
from app.tools.bench import bench_bodies

PHYSICS = Physics(softening=0.01, dt=1e-3)
EULER = Physics(softening=0.01, dt=1e-3, integrator="euler-damped", damping=0.999)


def main(out: str, kernel: str, n: int, nan_at: int | None, steps: int = 0) -> None:
    comm = world()
    with fail_together(comm):
        agree(comm, {"argv": sys.argv[1:]})
        kernel, make = device_maker(comm, backend_class("cuda"), kernel)
        run = RankRun(comm, make)
        if nan_at is None:
            run.load(bench_bodies(n), PHYSICS, kernel)
            acc = run.accelerations()
            run.step(steps)
            pos = run.gathered("pos")[:, :3]
            if comm.rank == 0:
                np.savez(out, acc=acc, pos=pos)
        else:
            run.load(bench_bodies(n), EULER, kernel)
            for step in range(2 * CHECK_EVERY):
                if comm.rank == 1 and step == nan_at:
                    poison(run.device, middle_of_share(run.device.share))
                run.step(1)
        run.close()


if __name__ == "__main__":
    args = sys.argv[1:]
    nan_at = int(args[args.index("--nan-at") + 1]) if "--nan-at" in args else None
    steps = int(args[args.index("--steps") + 1]) if "--steps" in args else 0
    main(args[0], args[1], int(args[2]), nan_at, steps)
