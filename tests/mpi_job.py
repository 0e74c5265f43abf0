"""A distributed job for tests/test_mpi.py, run as `mpiexec -n R python tests/mpi_job.py OUT [--fail-at K]`:
accelerations and a 100-step fp64 leapfrog trajectory through RankRun; rank 0 saves them to OUT (npz).
With --fail-at K rank 1 raises at step K; with --die-at K it kills itself (SIGKILL) there."""

from __future__ import annotations

import os
import signal
import sys

import numpy as np

from app.backends.cpu_multi import CpuDevice
from app.bodies import Bodies
from app.distributed import RankRun, agree, fail_together, world
from app.physics import Physics

N, STEPS = 301, 100


def cloud() -> Bodies:
    rng = np.random.default_rng(3)
    return Bodies.from_arrays(rng.normal(size=(N, 3)), rng.normal(scale=0.5, size=(N, 3)),
                              rng.uniform(0.5, 1.5, N) / N)


def main(out: str, fail_at: int | None, die_at: int | None) -> None:
    comm = world()
    with fail_together(comm):
        agree(comm, {"argv": sys.argv[1:]})
        run = RankRun(comm, lambda rank, bodies, physics, kernel, share: CpuDevice(rank, kernel, physics,
                                                                                     bodies, share))
        physics = Physics(softening=0.02, dt=2e-3)
        run.load(cloud(), physics, "cpu-fp64")
        acc = run.accelerations()
        for step in range(STEPS):
            if comm.rank == 1 and step == fail_at:
                raise RuntimeError(f"injected failure at step {step}")
            if comm.rank == 1 and step == die_at:
                os.kill(os.getpid(), signal.SIGKILL)
            run.step(1)
        pos, vel = run.gathered("pos")[:, :3], run.gathered("vel")[:, :3]
        if comm.rank == 0:
            np.savez(out, acc=acc, pos=pos, vel=vel)


if __name__ == "__main__":
    args = sys.argv[1:]
    flag = {"--fail-at": None, "--die-at": None}
    for key in flag:
        if key in args:
            flag[key] = int(args[args.index(key) + 1])
    main(args[0], flag["--fail-at"], flag["--die-at"])
