"""MPI ranks through mpi4py: every rank owns a contiguous share of the bodies, exchanges positions with
Allgatherv after each update, and runs the one integrator over the multi-device StateOps.

    mpiexec -n 3 nbody-live simulate plummer --n 65536 --steps 1000 --out run.npz

A rank is one device of app/multidevice.py whose exchange is MPI: `RankRun` gives MultiDeviceOps this
rank's device alone and an `MpiExchange` that all-gathers every rank's share rows. Shares are in index
order for all-pairs (a tree code would order them along its space-filling curve). Every rank takes the
same steps in the same order, so the state each rank holds after an exchange is bitwise the state one
process would hold.

Without mpiexec (no launcher variables in the environment) nothing here is imported and a run behaves
as one process always did. The launcher is detected from its variables, not by importing mpi4py, so a
missing mpi4py under mpiexec is one clear message.

Faults: `fail_together` turns an exception on any rank into one line naming the rank and the cause,
then aborts the whole job (MPI_Abort), so no rank is left waiting in a collective; a rank that dies
outright is ended by the launcher, which takes the others down. `agree` checks at start that every
rank runs the same version with the same arguments.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager

import numpy as np

from app.errors import UserError
from app.forces import ForceWork, Span
from app.integrator import Integrator
from app.multidevice import MultiDeviceOps, SingleDriver, split
from app.physics import Physics

# Rank-count variables set by the common launchers: MPICH/Hydra and Intel MPI, Open MPI, PMIx (srun).
SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE")
ABORT_CODE = 1


def launched_ranks() -> int:
    """How many ranks the launcher started (1 when there is no launcher)."""
    for name in SIZE_VARIABLES:
        value = os.environ.get(name)
        if value and value.isdigit():
            return int(value)
    return 1


def world():
    """MPI.COMM_WORLD when started by mpiexec with more than one rank, else None (one process)."""
    if launched_ranks() <= 1:
        return None
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise UserError(f"started by mpiexec with {launched_ranks()} ranks but mpi4py cannot be imported "
                        f"({e}): pip install 'nbody-live[mpi]' (make test installs it)") from e
    return MPI.COMM_WORLD


def library_version() -> str:
    from mpi4py import MPI

    return MPI.Get_library_version().splitlines()[0].strip()


@contextmanager
def fail_together(comm):
    """On an exception in this rank: one line naming the rank and the cause, then end every rank."""
    try:
        yield
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 - reported and the job aborted
        print(f"nbody-live: rank {comm.rank} of {comm.size}: {type(e).__name__}: {e}", file=sys.stderr,
              flush=True)
        comm.Abort(getattr(e, "exit_code", ABORT_CODE))


def agree(comm, facts: dict) -> None:
    """Raise UserError on every rank unless every rank reports the same `facts` (version, arguments)."""
    every = comm.allgather(facts)
    for rank, other in enumerate(every):
        if other != every[0]:
            keys = sorted(k for k in set(other) | set(every[0]) if other.get(k) != every[0].get(k))
            raise UserError(f"rank {rank} differs from rank 0 in {', '.join(keys)}: {other} vs {every[0]} "
                            "(every rank must run the same nbody-live with the same arguments)")


class MpiExchange:
    """The share rows of every rank all-gathered into every rank's copy (Allgatherv)."""

    name = "mpi"

    def __init__(self, comm, shares: list[Span]):
        self.comm, self.shares = comm, shares
        self.n = sum(s.count for s in shares)

    def gather(self, devices, field: str) -> None:
        (device,) = devices
        local = np.ascontiguousarray(device.rows(field, device.share))
        width = int(np.prod(local.shape[1:], dtype=int))
        full = np.empty((self.n, *local.shape[1:]), dtype=local.dtype)
        counts = [s.count * width for s in self.shares]
        starts = [s.start * width for s in self.shares]
        self.comm.Allgatherv(local, [full, counts, starts, _mpi_type(local.dtype)])
        device.set_rows(field, Span.all(self.n), full)


def _mpi_type(dtype):
    from mpi4py import MPI

    return {np.dtype(np.float64): MPI.DOUBLE, np.dtype(np.float32): MPI.FLOAT}[np.dtype(dtype)]


class RankRun:
    """This rank's part of a distributed run: its device (one share), the MPI exchange, the integrator."""

    def __init__(self, comm, make_device):
        """`make_device(rank, bodies, physics, kernel, share)` builds this rank's DeviceState."""
        self.comm, self.make_device = comm, make_device
        self.integrator = Integrator()
        self.physics = Physics()
        self.device = self.ops = None

    def load(self, bodies, physics: Physics, kernel: str) -> None:
        self.physics = physics
        shares = split(bodies.n, [1.0] * self.comm.size)
        self.device = self.make_device(self.comm.rank, bodies, physics, kernel, shares[self.comm.rank])
        self.ops = MultiDeviceOps([self.device], SingleDriver([self.device]), MpiExchange(self.comm, shares))
        self.integrator.invalidate()

    def step(self, steps: int = 1) -> ForceWork:
        """Advance; returns this rank's work (sum it over ranks for the job's)."""
        return self.integrator.step(self.ops, self.physics, steps)

    def gathered(self, field: str) -> np.ndarray:
        """The whole of `field` on every rank."""
        self.ops.exchange.gather([self.device], field)
        return self.device.rows(field, Span.all(self.ops.exchange.n)).copy()

    def accelerations(self) -> np.ndarray:
        self.ops.force()
        self.integrator.acc_valid = True
        return self.gathered("acc")[:, :3].astype(np.float64)
