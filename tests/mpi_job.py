"""A distributed job for tests/test_mpi.py, run as `mpiexec -n R python tests/mpi_job.py OUT [--fail-at K]`:
accelerations and a 100-step leapfrog trajectory through RankRun (--kernel NAME: cpu-fp64 unless given;
cpu-tree splits by domains, cpu-n3l by pairs); rank 0 saves them to OUT (npz).
With --fail-at K rank 1 raises at step K; with --die-at K it kills itself (SIGKILL) there. With --nan-at K
rank 1 puts a NaN into the velocity of the body in the middle of its share before step K; with --euler
the job steps with the euler-damped integrator, whose step evaluates the force before it moves the body,
so that at the check after that step the injected body alone is bad (a leapfrog spreads it to every body
within the step: tests/test_multidevice_nonfinite.py). With --adaptive (cpu-tree) the tree refits between
builds under the adaptive rule (rebuild_every 16, rebuild_rule adaptive: the ranks sum their interaction
counts each step) and rank 0 saves each step's evaluations since the build, checked equal on every rank."""

from __future__ import annotations

import os
import signal
import sys

import numpy as np
from test_multidevice_nonfinite import EULER, LEAPFROG, poison

from app.backends.cpu_multi import CpuDevice
from app.backends.distributed import RankRun, agree, fail_together, world
from app.engine import refit_cadence
from app.engine.forces import Span
from app.model.bodies import Bodies
from app.model.physics import Physics

N, STEPS = 301, 100


def cloud() -> Bodies:
    rng = np.random.default_rng(3)
    return Bodies.from_arrays(
        rng.normal(size=(N, 3)), rng.normal(scale=0.5, size=(N, 3)), rng.uniform(0.5, 1.5, N) / N
    )


def middle_of_share(share: Span) -> int:
    """The body a --nan-at job poisons (tests/test_mpi.py names it in the report it expects)."""
    return share.start + share.count // 2


ADAPTIVE = {"rebuild_every": 16, "rebuild_rule": "adaptive", "leaf": 8, "theta": 1.0, "opening": "cube"}
# the bodies cross their cells within a few steps, so that the refit stops paying and the rule builds early
FAST = Physics(softening=0.05, dt=0.05)
# b as a fixed fraction of a walk: for 301 bodies the model's fixed cost of a GPU's launches never pays
ADAPTIVE_BUILD_COST = 0.15


def main(
    out: str,
    fail_at: int | None,
    die_at: int | None,
    nan_at: int | None,
    euler: bool,
    kernel: str = "cpu-fp64",
    adaptive: bool = False,
) -> None:
    comm = world()
    with fail_together(comm):
        agree(comm, {"argv": sys.argv[1:]})
        run = RankRun(
            comm, lambda rank, bodies, physics, kernel, share: CpuDevice(rank, kernel, physics, bodies, share)
        )
        run.load(cloud(), FAST if adaptive else EULER if euler else LEAPFROG, kernel)
        if adaptive:
            refit_cadence.BUILD_COST = ADAPTIVE_BUILD_COST
            run.set_tunables(ADAPTIVE)
        acc = run.accelerations()
        since = []
        for step in range(STEPS):
            if comm.rank == 1 and step == fail_at:
                raise RuntimeError(f"injected failure at step {step}")
            if comm.rank == 1 and step == die_at:
                os.kill(os.getpid(), signal.SIGKILL)
            if comm.rank == 1 and step == nan_at:
                poison(run.device, middle_of_share(run.device.share))
            run.step(1)
            if adaptive:
                since.append(run.device.evaluator.since_build)
        pos, vel = run.gathered("pos")[:, :3], run.gathered("vel")[:, :3]
        # the rows' bodies where the state is kept in key order (a domain split), the same on every rank
        ids = run.ids if run.ids is not None else np.arange(0)
        same = comm.allgather(ids.tobytes())
        cadences = comm.allgather(since)
        if comm.rank == 0:
            np.savez(
                out,
                acc=acc,
                pos=pos,
                vel=vel,
                ids=ids,
                ids_agree=all(x == same[0] for x in same),
                since=np.asarray(since),
                since_agree=all(c == cadences[0] for c in cadences),
            )


if __name__ == "__main__":
    args = sys.argv[1:]
    flag = {"--fail-at": None, "--die-at": None, "--nan-at": None}
    for key in flag:
        if key in args:
            flag[key] = int(args[args.index(key) + 1])
    kernel = args[args.index("--kernel") + 1] if "--kernel" in args else "cpu-fp64"
    main(
        args[0],
        flag["--fail-at"],
        flag["--die-at"],
        flag["--nan-at"],
        "--euler" in args,
        kernel,
        "--adaptive" in args,
    )
