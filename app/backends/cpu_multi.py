"""K CPU "devices" for the multi-device driver (app/parallel/multidevice.py): the CPU backend split into
shares.

Each CpuDevice owns full-size host arrays (its own copy of the positions, as a GPU would) and the
numba kernels of the CPU backend: its record's evaluator for the forces of its share against all
sources, and the element-wise updates on its share's rows. This is the CI twin of the multi-GPU run:
the splitting, both drivers, the exchange and the re-balancing are tested here without a GPU, and
accelerations and fp64 trajectories from K shares are bitwise those of one device (every row is summed
by the same kernel over the same sources in the same order, whoever computes it).
"""

from __future__ import annotations

import os
from functools import partial
from typing import Any

import numpy as np

from app.backends.cpu_forces import DEFAULT_KERNEL, CpuOps, cpu_name, cpu_record, exact_rows, first_nonfinite
from app.core.errors import ConfigError
from app.engine.clocks import HostTimer
from app.engine.forces import ForceWork, Span, drain
from app.model.bodies import Bodies, speeds
from app.model.physics import Physics
from app.parallel.decomposition import share_cuts
from app.parallel.multidevice import HostExchange

MAX_CPU_DEVICES = 8  # `--backend cpu --gpus all` (see CpuDevices.count)
_DTYPES = {"fp32": np.float32, "fp64": np.float64}


class CpuDevice:
    """One CPU "device": full-size pos / vel / acc / speed arrays, current on its share (pos everywhere).
    `MultiDeviceRun(cpu_devices, k)` runs K of them."""

    def __init__(
        self, index: int, record_name: str, physics: Physics, bodies: Bodies, share: Span, lookup=cpu_record
    ):
        record = lookup(record_name)  # (the backend's records: CpuDevices.lookup)
        dtype = _DTYPES[record.precision]
        self.name = CpuDevices.names(index + 1)[index]
        self.share = share
        self.physics = physics
        self.record = record
        self.evaluator = record.policy.evaluator(record, physics)
        self.pos, self.vel = bodies.pos4(dtype), bodies.vel4(dtype)
        self.acc = np.zeros_like(self.pos)
        self.sacc = np.zeros_like(self.pos)  # domains: accelerations in the tree's key order
        self.speed = speeds(self.vel)
        self.ids = np.arange(bodies.n, dtype=np.int64)  # the body (load order) in each row
        self.everyone = Span.all(bodies.n)
        self.integrate_all = False  # set by the run from its decomposition
        self.index, self.shares = 0, [share]
        self.domain_cuts: list[int] = []
        self.timer = HostTimer()  # perf_counter: a CPU device's work is done when its call returns
        self._ops: CpuOps | None = None  # the updates on the rows it integrates ...
        self._ops_share: Span | None = None  # ... which are these (_share_ops)
        self._found = -1  # what the latest non-finite check found (a body index), until it is read

    def _share_ops(self) -> CpuOps:
        """The updates on the rows it integrates (its share, or every row for a domain split), made again
        only when those change (re-balancing)."""
        span = self.everyone if self.integrate_all else self.share
        if self._ops_share != span:
            rows = span.as_slice()
            self._ops = CpuOps(
                self.evaluator, self.pos[rows], self.vel[rows], self.acc[rows], self.speed[rows]
            )
            self._ops_share = span
        assert self._ops is not None, "made with the span it covers"
        return self._ops

    def set_physics(self, physics: Physics) -> None:
        """New force parameters: the record's evaluator made again with them (the updates hold it), with
        the tunables it had."""
        self.physics = physics
        tunables = self.evaluator.tunables
        self.evaluator = self.record.policy.evaluator(self.record, physics)
        self.evaluator.set_tunables(**tunables)
        self._ops, self._ops_share = None, None

    def timed(self, category: str):
        return self.timer.time(category)

    def force(self) -> ForceWork:
        with self.timer.time("force"):
            return self.evaluator.evaluate(self.pos, self.acc, self.share, self.everyone)

    def force_pairs(self) -> ForceWork:
        """Its slice of the pair tiles: partial accelerations of every row (app/parallel/decomposition.py)."""
        with self.timer.time("force"):
            return self.evaluator.evaluate_pairs(self.pos, self.acc, self.shares, self.index)

    def force_domain(self) -> ForceWork:
        """The whole tree, the walk of its key range into sacc (key order); the aligned cuts kept."""
        return drain(self.force_domain_phases())

    def force_domain_phases(self):
        """`force_domain` in the evaluator's phases (build, walk), each timed as "force"."""
        phases = self.evaluator.domain_phases(
            self.pos, self.sacc, share_cuts(self.shares), self.index, prev=self.acc
        )
        while True:
            with self.timer.time("force"):
                try:
                    next(phases)
                except StopIteration as done:
                    work, self.domain_cuts = done.value
                    return work
            yield

    def take_key_order(self) -> None:
        """After a domain split's exchange: every row moves to its place in the last tree's key order, so
        the accelerations in key order (sacc, whole after the exchange) are the state's as they are.
        In place (the share's updates hold views of these arrays). After a refit (rebuild_every > 1) the
        rows are in the tree's order already: only sacc becomes acc."""
        with self.timer.time("force"):
            if self.evaluator.kept_order:  # a refit: the rows are in its order already
                self.acc[:, :3] = self.sacc[: self.acc.shape[0], :3]
                return
            order = self.evaluator.last_tree.order  # key order -> the row it came from
            for field in (self.pos, self.vel, self.speed, self.ids):
                field[:] = field[order]
            self.acc[:, :3] = self.sacc[: order.shape[0], :3]

    def kick_drift(self, half_dt: float, dt: float) -> None:
        with self.timer.time("integrate"):
            self._share_ops().kick_drift(half_dt, dt)

    def kick(self, half_dt: float) -> None:
        with self.timer.time("integrate"):
            self._share_ops().kick(half_dt)

    def euler_damped(self, dt: float, damping: float) -> None:
        with self.timer.time("integrate"):
            self._share_ops().euler_damped(dt, damping)

    def launch_check(self) -> None:
        """The non-finite check of the share's rows (numpy: the GPU's kernel on the host), done now."""
        rows = self.share.as_slice()
        bad = first_nonfinite(self.pos[rows], self.vel[rows])
        self._found = -1 if bad < 0 else self.share.start + bad

    def check_result(self, wait: bool) -> int:
        """The body the latest check found (-1: none), once: a CPU check is finished when it returns."""
        found, self._found = self._found, -1
        return found

    def mark(self, tag: str):
        """Nothing to mark: the work is done when its call returns."""
        return None

    def wait_for(self, marker) -> None:
        """Nothing to wait for (see mark)."""

    def take_times(self, lagged: bool) -> dict[str, float]:
        return self.timer.collect()

    def forget_times(self) -> None:
        self.timer.discard()

    def synchronize(self) -> None:
        """CPU work is done when its call returns."""

    def rows(self, field: str, span: Span) -> np.ndarray:
        return getattr(self, field)[span.as_slice()]

    def set_rows(self, field: str, span: Span, values) -> None:
        getattr(self, field)[span.as_slice()] = values

    def rows_at(self, field: str, rows: np.ndarray) -> np.ndarray:
        """A host copy of the rows `rows` (state indices) of `field`."""
        return getattr(self, field)[rows]

    def exact_rows(self, rows: np.ndarray) -> np.ndarray:
        """Float64 (K, 3): the all-pairs accelerations of `rows` (state rows) due to every position of this
        device's copy, in its precision (the CPU backend's exact sum, cpu.exact_rows), summed over the
        bodies in load order whatever order the state is in: the reference does not move with the tree."""
        loaded = np.empty_like(self.pos)
        loaded[self.ids] = self.pos
        return exact_rows(loaded, self.ids[rows], self.physics)


def cpu_devices(
    bodies: Bodies, physics: Physics, kernel: str, shares: list[Span], lookup=cpu_record
) -> list[CpuDevice]:
    """A MultiDeviceRun factory: one CpuDevice per share (`lookup`: record name -> the backend's record)."""
    return [CpuDevice(i, kernel, physics, bodies, share, lookup) for i, share in enumerate(shares)]


def share_cores(comm) -> int:
    """Numba threads for this rank: the node's cores divided among the ranks on it (each rank would
    otherwise start a thread per core, and R ranks on one node would fight over them: 3 ranks on 2 cores
    took 20 ms a force evaluation of 512 bodies instead of 0.1 ms). NUMBA_NUM_THREADS, when set, wins."""
    import os

    import numba
    from mpi4py import MPI

    on_node = comm.Split_type(MPI.COMM_TYPE_SHARED).size  # collective: every rank calls it
    if "NUMBA_NUM_THREADS" not in os.environ:
        config: Any = numba.config  # (it sets its NUMBA_* names through globals(): no type knows them)
        numba.set_num_threads(max(1, config.NUMBA_NUM_THREADS // on_node))
    return numba.get_num_threads()


class CpuDevices:
    """`--backend cpu --gpus K`: K CPU "devices" (the CI twin of K GPUs), for app/backends/multi.py and
    MPI ranks. `lookup` (record name -> record) and `default_kernel` are the backend's: any backend whose
    records have host evaluators (`record.policy.evaluator(record, physics)`, as cpu_forces.py's) splits
    over these devices by returning `CpuDevices(its lookup, its default)` from `device_kind`."""

    what = "CPU devices"

    def __init__(self, lookup=cpu_record, default_kernel: str = DEFAULT_KERNEL):
        self.lookup, self.default_kernel = lookup, default_kernel

    @staticmethod
    def count() -> int:
        """A fixed number, not the core count: CPU devices are shares of one host (each share's numba
        kernel runs parallel over every core anyway), there to exercise the driver, also on a CI machine
        with two cores."""
        return MAX_CPU_DEVICES

    @staticmethod
    def all_count() -> int:
        """`--gpus all` on the CPU: one device a core (at most MAX_CPU_DEVICES), which is what "all" says;
        an explicit K up to MAX_CPU_DEVICES still runs on fewer cores (the CI's two)."""
        return max(1, min(os.cpu_count() or 1, MAX_CPU_DEVICES))

    @staticmethod
    def names(k: int) -> list[str]:
        return [f"cpu{i}" for i in range(k)]

    @staticmethod
    def rank_device_name() -> str:
        """What each MPI rank's device is: a share of its node's cores."""
        return cpu_name()

    def rank_maker(self, comm):
        """make_device(rank, bodies, physics, kernel, share) for this MPI rank (app/backends/distributed.py's
        RankRun): a CpuDevice on a share of its node's cores. Collective (share_cores)."""
        share_cores(comm)

        def make(rank, bodies, physics, kernel, share):
            return CpuDevice(rank, kernel, physics, bodies, share, self.lookup)

        return make

    @staticmethod
    def why_not(record) -> str | None:
        return None

    @staticmethod
    def check_exchange(name: str) -> None:
        if name not in ("auto", "host"):
            raise ConfigError(
                f"--exchange {name}: CPU devices share host memory; use --exchange host "
                "(or auto), or --backend cuda for peer copies and NCCL"
            )

    def factory(self, k: int):
        return partial(cpu_devices, lookup=self.lookup)

    @staticmethod
    def exchange(name: str):
        return lambda devices: HostExchange()

    @staticmethod
    def gl_target(
        position_vbo: int, speed_vbo: int, devices: list, n: int, whole: bool = False, ordinal: int = 0
    ):
        """No interop on the host: the renderer uploads `host_render_arrays()` each frame."""
        return None
