"""MPI ranks through mpi4py: every rank owns a contiguous share of the bodies, splits the forces as the
kernel's record says (app/parallel/decomposition.py), exchanges what that split moves, and steps through the
one Stepper over the multi-device StateOps.

    mpiexec -n 3 nbody-live simulate plummer --n 65536 --steps 1000 --out run.npz

A rank is one device of app/parallel/multidevice.py whose exchange is MPI: `RankRun` gives MultiDeviceOps this
rank's device alone, the ranks' shares as its layout, and an exchange: `MpiExchange` through host memory
(Allgatherv of share rows or key ranges, Reduce_scatter of partial accelerations), or for GPU ranks that
share a node the device-to-device `IpcExchange` of app/backends/cuda/ipc.py. Shares are in index order;
a tree's domains are key ranges of its own sorted order. Every rank takes the same steps in the same
order, so the state each rank holds after an exchange is bitwise the state one process would hold (a pair
split: within the rounding of another summation order).

Without mpiexec (no launcher variables in the environment) nothing here is imported and a run behaves
as one process always did. The launcher is detected from its variables, not by importing mpi4py, so a
missing mpi4py under mpiexec is one clear message.

Faults: `fail_together` turns an exception on any rank into one line naming the rank and the cause,
then aborts the whole job (MPI_Abort), so no rank is left waiting in a collective; a rank that dies
outright is ended by the launcher, which takes the others down. `agree` checks at start that every
rank runs the same version with the same arguments. Every `check_every` steps each rank checks its share
for non-finite bodies (its device's check, as each device of `--gpus` does) and the ranks agree on the
first bad body with one small allreduce, so every rank raises the same NonFiniteState, naming the body
and the rank that holds it, at the same step.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from functools import partial

import numpy as np

from app.core.errors import ConfigError, NonFiniteState, UserError
from app.engine.forces import Span
from app.engine.integrator import CHECK_EVERY, Stepper
from app.engine.timing import StepTimings
from app.model.bodies import Bodies
from app.model.physics import Physics, diagnostics
from app.parallel.decomposition import TARGETS, Decomposition, agreed_ranges
from app.parallel.decomposition import of as decomposition_of
from app.parallel.device_state import DeviceState
from app.parallel.multidevice import MultiDeviceOps, SingleDriver, in_load_order, split

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
        raise UserError(
            f"started by mpiexec with {launched_ranks()} ranks but mpi4py cannot be imported "
            f"({e}): pip install 'nbody-live[mpi]' (make test installs it)"
        ) from e
    return MPI.COMM_WORLD


def job_facts() -> dict:
    """What every rank of one job must share: the program's version and its arguments."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        ours = version("nbody-live")
    except PackageNotFoundError:
        ours = "unknown"
    return {"version": ours, "argv": sys.argv[1:]}


def any_rank(comm, signum):
    """The first signal any rank caught (all ranks must stop at the same step), or None."""
    if comm is None:
        return signum
    return comm.allreduce(signum or 0, op=_mpi_op("MAX")) or None


def _mpi_op(name: str):
    from mpi4py import MPI

    return getattr(MPI, name)


def summary() -> str:
    """One line for `info`: the MPI this process would use, and how ranks exchange positions."""
    import shutil

    try:
        import mpi4py
        from mpi4py import MPI
    except ImportError:
        return "not installed (pip install 'nbody-live[mpi]'; make test installs it)"
    library = " ".join(MPI.Get_library_version().split()[:3])
    launcher = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")
    query = getattr(MPI, "Query_cuda_support", None)
    aware = (
        "CUDA-aware: yes (GPU ranks on one node exchange through CUDA IPC; across nodes through host "
        "memory: device pointers to MPI are not built)"
        if query and query()
        else "CUDA-aware: not reported by this MPI; GPU ranks on one node exchange device to device "
        "through CUDA IPC, across nodes through host memory"
    )
    return f"mpi4py {mpi4py.__version__}, {library}, mpiexec {launcher or 'not found'}; {aware}"


def as_job(command, args) -> int:
    """`command(args, comm)` with comm None without mpiexec; under mpiexec on every rank, after checking
    that every rank runs the same version and arguments, an error on any rank ending every rank."""
    comm = world()
    if comm is None:
        return command(args, None)
    with fail_together(comm):
        agree(comm, job_facts())
        return command(args, comm)


ABORT_DRAIN_S = 0.5  # seconds between the rank's last line and MPI_Abort


@contextmanager
def fail_together(comm):
    """On an exception in this rank: one line naming the rank and the cause, then end every rank.

    A fault every rank raised together (the ranks' agreed non-finite check) carries in `rank` the rank it
    is about: that rank alone prints the line, and the others wait longer before they abort, so that its
    line goes out first and the job says it once."""
    try:
        yield
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 - reported and the job aborted
        about = getattr(e, "rank", None)
        speaks = not isinstance(about, int) or about == comm.rank
        if speaks:
            print(
                f"nbody-live: rank {comm.rank} of {comm.size}: {type(e).__name__}: {e}",
                file=sys.stderr,
                flush=True,
            )
        # MPICH's launcher forwards each rank's stderr through its proxy, and an abort can tear the job
        # down before the proxy has passed the line on (tests/test_mpi.py saw an empty stderr once in a
        # full suite): a moment for it to drain, well inside the 10 s a failing job may take to end
        time.sleep(ABORT_DRAIN_S if speaks else 2 * ABORT_DRAIN_S)
        comm.Abort(getattr(e, "exit_code", ABORT_CODE))


def agree(comm, facts: dict) -> None:
    """Raise UserError on every rank unless every rank reports the same `facts` (version, arguments)."""
    every = comm.allgather(facts)
    for rank, other in enumerate(every):
        if other != every[0]:
            keys = sorted(k for k in set(other) | set(every[0]) if other.get(k) != every[0].get(k))
            raise UserError(
                f"rank {rank} differs from rank 0 in {', '.join(keys)}: {other} vs {every[0]} "
                "(every rank must run the same nbody-live with the same arguments)"
            )


class MpiExchange:
    """The share rows of every rank all-gathered into every rank's copy (Allgatherv); `ms` sums the time
    spent in it (waiting for slower ranks included), which RankRun.step reports as the exchange."""

    name = "mpi"

    def __init__(self, comm, shares: list[Span]):
        self.comm, self.shares = comm, shares
        self.n = sum(s.count for s in shares)
        self.ms = 0.0

    def _layout(self, local: np.ndarray, spans: list[Span] | None = None):
        """(a whole-field buffer, the receive description) for rows like `local` laid out as `spans`
        (default: the shares)."""
        spans = self.shares if spans is None else spans
        width = int(np.prod(local.shape[1:], dtype=int))
        full = np.empty((self.n, *local.shape[1:]), dtype=local.dtype)
        counts = [s.count * width for s in spans]
        starts = [s.start * width for s in spans]
        return full, [full, counts, starts, _mpi_type(local.dtype)]

    @staticmethod
    def moves_rows(devices) -> bool:
        """Always: the other ranks hold the other shares."""
        return True

    def gather(self, devices, field: str) -> None:
        (device,) = devices
        t = time.perf_counter()
        local = np.ascontiguousarray(device.rows(field, device.share))
        full, receive = self._layout(local)
        self.comm.Allgatherv(local, receive)
        device.set_rows(field, Span.all(self.n), full)
        self.ms += (time.perf_counter() - t) * 1e3

    def reduce_scatter(self, devices, field: str) -> None:
        """pairs: every rank's partial rows of `field` (all N) summed onto each rank's share
        (Reduce_scatter; the order of the sum is MPI's)."""
        (device,) = devices
        t = time.perf_counter()
        partial = np.ascontiguousarray(device.rows(field, Span.all(self.n)))
        width = int(np.prod(partial.shape[1:], dtype=int))
        mine = np.empty((device.share.count, *partial.shape[1:]), dtype=partial.dtype)
        self.comm.Reduce_scatter(partial, mine, [s.count * width for s in self.shares], op=_mpi_op("SUM"))
        device.set_rows(field, device.share, mine)
        self.ms += (time.perf_counter() - t) * 1e3

    def gather_sorted(self, devices) -> None:
        """domains: every rank's key range of 'sacc' all-gathered into every rank's (Allgatherv). The
        ranks' key ranges come from the same tree; they are checked to agree (one small allgather)."""
        (device,) = devices
        t = time.perf_counter()
        ranges = agreed_ranges(self.comm, device)
        local = np.ascontiguousarray(device.rows("sacc", ranges[self.comm.rank]))
        full, receive = self._layout(local, ranges)
        self.comm.Allgatherv(local, receive)
        device.set_rows("sacc", Span.all(self.n), full)
        self.ms += (time.perf_counter() - t) * 1e3

    def gather_to_root(self, device, field: str) -> np.ndarray | None:
        """The whole of `field` on rank 0 (Gatherv of every share; None on the other ranks)."""
        local = np.ascontiguousarray(device.rows(field, device.share))
        full, receive = self._layout(local)
        self.comm.Gatherv(local, receive if self.comm.rank == 0 else None, root=0)
        return full if self.comm.rank == 0 else None


def _mpi_type(dtype):
    from mpi4py import MPI

    return {np.dtype(np.float64): MPI.DOUBLE, np.dtype(np.float32): MPI.FLOAT}[np.dtype(dtype)]


class RankRun:
    """This rank's part of a distributed run: its device (one share), the MPI exchange, the integrator.
    `step` and `state` are collective: every rank calls them at the same points. Every `check_every`
    steps (0: never) the ranks check their shares for non-finite bodies together (`_check_finite`)."""

    check_every = CHECK_EVERY
    timesteps = "shared"  # as a Backend's: MPI ranks step shared time steps (block steps refuse mpiexec)
    reduces_diagnostics = True  # as a Backend's: rank 0 sums the float64 diagnostics (`diagnostics`)

    def __init__(self, comm, make_device):
        """`make_device(rank, bodies, physics, kernel, share)` builds this rank's DeviceState."""
        self.comm, self.make_device = comm, make_device
        self.stepper = Stepper()  # the integrator and the checks' cadence, as a multi-device run's
        self.physics = Physics()
        self.decomposition: Decomposition = TARGETS  # the running record's (set by load)
        self.device: DeviceState | None = None  # this rank's, once loaded
        self.ops: MultiDeviceOps | None = None
        self.kernel, self.n = "", 0
        self.components = None

    def _device(self) -> DeviceState:
        assert self.device is not None, "load() before stepping or reading the state"
        return self.device

    def _ops(self) -> MultiDeviceOps:
        assert self.ops is not None, "load() before stepping or reading the state"
        return self.ops

    def load(self, bodies: Bodies, physics: Physics, kernel: str) -> None:
        self.physics, self.kernel, self.n = physics, kernel, bodies.n
        self._mass, self._ids, self._t0 = bodies.mass.copy(), bodies.ids, float(bodies.time)
        self.components = bodies.components  # drawing only: the state (snapshots) carries them
        shares = split(bodies.n, [1.0] * self.comm.size)
        self.close()  # a reload (another kernel, new physics or bodies) replaces the device
        self.device = self.make_device(self.comm.rank, bodies, physics, kernel, shares[self.comm.rank])
        # the record's own split (app/parallel/decomposition.py): this rank is one device among the ranks'
        # shares
        self.decomposition = decomposition_of(self.device.evaluator.record)
        self.device.integrate_all = self.decomposition.integrate_all
        # a device that can reach the other ranks' devices directly says so (GPUs on one node: CUDA IPC);
        # else rows go through host memory and MPI
        host = MpiExchange(self.comm, shares)
        direct = getattr(self.device, "rank_exchange", None)
        exchange = (direct(self.comm, shares, host) if direct is not None else None) or host
        self.ops = MultiDeviceOps(
            [self.device],
            SingleDriver([self.device]),
            exchange,
            self.decomposition,
            layout=(shares, self.comm.rank),
            rank_sum=self._rank_sum,
        )
        self.stepper.restart()

    def _rank_sum(self, count: int) -> int:
        """A count summed over the ranks (every rank calls it at the same point of the same step)."""
        return int(self.comm.allreduce(int(count), op=_mpi_op("SUM")))

    @property
    def ids(self) -> np.ndarray | None:
        """The body (load order) in each state row (MultiDeviceOps.ids: a domain split keeps the tree's key
        order on every rank, CPU or GPU, the same rows on each); None while rows are bodies."""
        return self.ops.ids if self.ops is not None else None

    @property
    def integrator(self):
        return self.stepper.integrator

    @property
    def _steps(self) -> int:
        """Steps since load (or since the time was last re-based): the time and the checks' cadence."""
        return self.stepper.steps

    def step(self, steps: int = 1) -> StepTimings:
        """Advance; the timings and work are this rank's (its share of the forces, its device's own clock:
        CUDA events on a GPU); the position exchange is `extra["exchange_ms"]`, not part of integrate_ms."""
        exchange = self._ops().exchange
        before = exchange.ms
        self.stepper.advance(self._ops(), self.physics, steps, self.check_every, self._check_finite)
        work = self._ops().finish()
        times = self._ops().take_times()
        exchanged = exchange.ms - before
        return StepTimings(
            kernel=self.kernel,
            steps=steps,
            n=self.n,
            force_ms=times["force"][0],
            integrate_ms=times["integrate"][0],
            interactions=work.interactions,
            pair_equivalent=work.pair_equivalent,
            force_evals=work.evaluations,
            body_cell=work.body_cell,
            extra={"exchange_ms": exchanged},
        )

    def _check_finite(self) -> None:
        """Each rank checks its share (its device's check: numpy on CPU devices, the GPU kernel of
        cuda/nonfinite.py) and the ranks agree on the first bad body (an allreduce of its index, N for
        none): every rank raises the same NonFiniteState, naming the body and the rank that holds it, or
        none does. The check's answer is waited for: the exchange reads this device's rows every step
        anyway, so this adds one small kernel and one small allreduce every `check_every` steps."""
        self._ops().launch_checks()
        mine = self._device().check_result(wait=True)
        first = self.comm.allreduce(mine if mine >= 0 else self.n, op=_mpi_op("MIN"))
        if first < self.n:
            owner = next(r for r, s in enumerate(self._ops().exchange.shares) if s.contains(Span(first, 1)))
            body = first if self.ids is None else int(self.ids[first])  # the body that row holds
            raise NonFiniteState(body, step=self._steps, time=self.time, rank=owner)

    def reload(self, physics: Physics, kernel: str) -> bool:
        """Another kernel or physics from the next step, the state kept (collective): a device made again
        from the gathered state (True), or, for dt or the integrator alone, the same device (False). The
        time is re-based only at a dt change, as one process does (Backend._swap_physics), so that it stays
        bitwise that process's time."""
        t0, steps, dt = self._t0, self._steps, self.physics.dt
        if kernel == self.kernel and physics.forces == self.physics.forces:
            # only dt or the integrator: the device keeps its evaluator (a tree keeps refitting its last
            # build, as one process's does: MultiDeviceRun.set_physics, CPUBackend.evaluator)
            old, self.physics = self.physics, physics
            if physics.integrator != old.integrator:
                self.integrator.invalidate()
            if physics.dt != dt:
                self._t0, self.stepper.steps = self.time_at(dt), 0
            return False
        self.load(self.state(), physics, kernel)
        if physics.dt == dt:
            self._t0 = t0
            self.stepper.steps = steps
        return True

    def set_tunables(self, values: dict) -> None:
        """The current kernel's tunables, all of them (its defaults under `values`), from the next step."""
        self._device().evaluator.set_tunables(**self._device().evaluator.record.with_tunables(values))
        self.integrator.invalidate()

    @property
    def time(self) -> float:
        return self.time_at(self.physics.dt)

    def time_at(self, dt: float) -> float:
        """The time after the steps since the last re-base, had they been of `dt`."""
        return self._t0 + self._steps * dt

    def gathered(self, field: str) -> np.ndarray:
        """The whole of `field` on every rank, in load order."""
        self.gathered_on_device(field)
        return in_load_order(self._device().rows(field, Span.all(self.n)).copy(), self.ids)

    def gathered_on_device(self, field: str) -> None:
        """Every share's rows of `field` into this rank's device copy (collective; no host copy where the
        exchange moves rows device to device)."""
        self._ops().exchange.gather([self._device()], field)

    def positions(self) -> np.ndarray:
        """This rank's copy of every position (N, 4) in load order: whole after each step's exchange."""
        return in_load_order(self._device().rows("pos", Span.all(self.n)), self.ids)

    def own_rows(self, field: str) -> np.ndarray:
        """This rank's copy of every row of `field`, in load order (no exchange: whole where the rank
        integrates every body)."""
        return in_load_order(self._device().rows(field, Span.all(self.n)), self.ids)

    def state_on_root(self) -> Bodies | None:
        """The whole state on rank 0 (its own positions, every share's velocities gathered); None on the
        other ranks. Collective; where every rank integrates every body (a domain split) rank 0 holds
        every velocity itself and nothing moves between ranks."""
        if self.decomposition.integrate_all:
            vel = self.own_rows("vel") if self.comm.rank == 0 else None
        else:
            vel = self._ops().exchange.gather_to_root(self._device(), "vel")
        if self.comm.rank != 0:
            return None
        assert vel is not None, "rank 0 holds every velocity: its own rows, or gathered to it"
        pos = self.positions()
        return Bodies(
            pos=pos[:, :3].astype(np.float64),
            vel=vel[:, :3].astype(np.float64),
            mass=self._mass.copy(),
            time=self.time,
            ids=None if self._ids is None else self._ids.copy(),
        )

    def state(self) -> Bodies:
        pos, vel = self.gathered("pos"), self.gathered("vel")
        ids = None if self._ids is None else self._ids.copy()
        return Bodies(
            pos=pos[:, :3].astype(np.float64),
            vel=vel[:, :3].astype(np.float64),
            mass=self._mass.copy(),
            time=self.time,
            ids=ids,
            components=self.components,
        )

    def diagnostics(self):
        """Float64 diagnostics of the whole state, computed by rank 0 (None on the others)."""
        from app.engine.energy import potential_energy

        state = self.state()
        if self.comm.rank != 0:
            return None
        return diagnostics(state, self.physics, potential=partial(potential_energy, parallel=True))

    def accelerations(self) -> np.ndarray:
        self._ops().force()
        self.integrator.acc_valid = True
        return self.gathered("acc")[:, :3].astype(np.float64)

    def close(self) -> None:
        if self.ops is not None:
            close_exchange = getattr(self.ops.exchange, "close", None)  # CUDA IPC's opened handles
            if close_exchange is not None:
                close_exchange()
            self.ops = None
        close = getattr(self.device, "close", None)
        if close is not None:
            close()
        self.device = None


def device_maker(comm, cls, kernel: str | None):
    """(kernel, make_device) for RankRun on backend class `cls`: its device kind's rank devices (CPU: a
    share of the node's cores each; GPUs: one per rank by local rank). Collective."""
    kind = cls.device_kind()
    if kind is None:
        raise ConfigError(f"backend {cls.name!r} has no device form for MPI ranks; run it in one process")
    return kernel or kind.default_kernel, kind.rank_maker(comm)
