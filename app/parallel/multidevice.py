"""Several devices, one simulation: the multi-device driver over the force seam, for any force method.

Each device holds a full copy of the positions and a share of the bodies. How the force evaluation is
split is the record's decomposition (app/parallel/decomposition.py), which the driver runs without asking
which method it is: `targets` (each device its share of the targets against all sources, then its share's
positions to every copy), `pairs` (each device a slice of the Newton-3 pair tiles into partial
accelerations of every body, reduce-scattered onto the shares) and `domains` (each device the whole tree
from all positions and the walk of its key range, the key-ordered results all-gathered; every device then
integrates every body, so no positions move).

    run = MultiDeviceRun(cpu_devices, k=3, driver="threads")   # or GPUs: any factory of DeviceStates
    run.load(bodies, physics, "cpu-fp64")
    run.step(100)                                               # the one Integrator over MultiDeviceOps
    run.rebalance()                                             # shares follow each device's speed

Two drivers, as in the CUDA Handbook's multi-GPU chapter: `ThreadsDriver` runs each device's work on a
host thread of its own (the thread-per-GPU design; a device is always served by the same thread, as
CUDA contexts are per thread), `SingleDriver` issues every device's work from the calling thread (the
single-thread design: on GPUs the work is asynchronous). A failure on one device stops the step on all
and is raised as a DeviceFault naming the device.

Nothing waits on a device while stepping. A phase (kick-drift, force, kick) only queues each device's
work; the order between devices is kept on the devices themselves: before a device reads rows another
device wrote (the exchange, the render copies), it queues a wait for a mark the writer queued after
writing them (`queue_after`: CUDA events and cuStreamWaitEvent on GPUs, nothing on synchronous CPU
devices). The host waits only where it must: the threads driver hands each phase to the device threads
without waiting for them and waits for them to have *queued* their work once per step before the
exchange (the exchange's marks must exist before other devices wait on them; never with one device), and
once at the end of each `step()` call (`MultiDeviceRun.step`: faults and the force work come back then).
Times come from each device's own clock (`device.timer`: CUDA events on GPUs), read without waiting
while the viewer draws (`take_times(lagged=True)`, the previous frame's numbers, as on one GPU).
Every `check_every` steps each device queues the non-finite check of its share (as one GPU checks all
its rows); `first_nonfinite` reads the devices' finished checks without waiting, and the backend raises
the NonFiniteState of one GPU naming the body and its device (app/backends/multi.py).

Over K CPU "devices" (app/backends/cpu_multi.py) the same driver runs in CI, where the shares' results
are checked bitwise against one device.
"""

from __future__ import annotations

import inspect
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from app.core.errors import ConfigError, RuntimeFault
from app.engine.forces import ForceWork, Span, drain
from app.engine.integrator import CHECK_EVERY, Stepper
from app.model.bodies import Bodies
from app.model.config import DRIVERS, parse_device_count  # (the settings' names; re-exported)
from app.model.physics import Physics
from app.parallel.decomposition import TARGETS, cut_spans
from app.parallel.decomposition import of as decomposition_of

POLL_S = 2e-5  # the single driver's sleep while no device's phase is ready (a tree phase is ~0.1-30 ms)
SMOOTHING = 0.5  # weight of the newest speed measurement when shares are re-balanced
# Python hands the GIL to a waiting thread only when the holder blocks or after the switch interval (5 ms
# by default). A device thread issuing a tree build (dozens of small launches and CuPy calls, none of
# which lets go of the GIL) then keeps the other device threads from issuing theirs for up to 5 ms at a
# time, and two GPUs take turns instead of working together. With several device threads the interval
# is lowered to this, process-wide.
SWITCH_INTERVAL_S = 2e-4


class DeviceFault(RuntimeFault):
    """A failure on one device of a multi-device step; the message names the device."""

    def __init__(self, index: int, name: str, cause: BaseException):
        self.index, self.device_name, self.cause = index, name, cause
        super().__init__(f"device {index} ({name}): {type(cause).__name__}: {cause}")


class DeviceState(Protocol):
    """One device's part of a multi-device run (a full position copy, its share of everything else).
    Work may be queued (a GPU's): each method returns once its work is queued, in the device's order."""

    name: str
    share: Span
    index: int  # its place among the run's devices, and every device's share (set by MultiDeviceOps)
    shares: list[Span]
    domain_cuts: list[int]  # domains: the key ranges' bounds after its last force_domain (K + 1 of them)
    timer: object  # the device's clock: HostTimer or EventTimer (`with timer.time(category): ...`)

    integrate_all: bool  # the run's decomposition integrates every row on every device (domains)

    def force(self) -> ForceWork: ...  # targets: acc[share] = F(pos[share]; pos[all]), timed as "force"
    # pairs: acc[all] = the partial sums of this device's slice of the pair tiles
    # (app/parallel/decomposition.py)
    def force_pairs(self) -> ForceWork: ...
    # domains: the whole tree, the walk of this device's key range into 'sacc' (key order); sets domain_cuts
    def force_domain(self) -> ForceWork: ...
    def force_domain_phases(self): ...  # force_domain as a generator of phases (SingleDriver takes turns)
    def set_physics(self, physics: Physics) -> None: ...  # new force parameters, in place
    # domains: after the exchange the device moves its whole state into the last tree's key order
    # (acc = sacc; pos, vel, speed and ids permuted alike), as Bonsai keeps its bodies
    def take_key_order(self) -> None: ...

    ids: np.ndarray  # the body (load order) in each state row (on a GPU: a host copy of its device array)

    def timed(self, category: str): ...  # a context: work queued inside it timed on the device's clock
    def kick_drift(self, half_dt: float, dt: float) -> None: ...  # on the share, timed as "integrate"
    def kick(self, half_dt: float) -> None: ...
    def euler_damped(self, dt: float, damping: float) -> None: ...
    def launch_check(self) -> None: ...  # queue the non-finite check of the share's rows
    def check_result(self, wait: bool) -> int: ...  # its first bad body (state index) once finished, or -1
    def mark(self, tag: str): ...  # a marker after the work queued so far (None where work is synchronous)
    def wait_for(self, marker) -> None: ...  # later work starts after `marker` (no host wait)
    def take_times(self, lagged: bool) -> dict[str, float] | None: ...  # ms per category since last taken
    def forget_times(self) -> None: ...  # drop measurements not yet taken (the shares changed)
    def synchronize(self) -> None: ...  # host wait for queued work (reading back, closing: never per step)
    def rows(self, field: str, span: Span): ...  # a host copy of rows of 'pos', 'vel', 'acc', 'speed', 'sacc'
    def set_rows(self, field: str, span: Span, values) -> None: ...
    # the live force error (MultiDeviceRun.force_error_sample), after the device's queued work:
    def rows_at(self, field: str, rows: np.ndarray): ...  # a host copy of the rows `rows` (state indices)
    def exact_rows(self, rows: np.ndarray) -> np.ndarray: ...  # float64 (K, 3) all-pairs over its copy


# --- splitting and balancing (pure) --------------------------------------------------------------------
def split(n: int, weights: Sequence[float]) -> list[Span]:
    """Contiguous shares of [0, n) in proportion to `weights` (largest remainders; they cover n exactly)."""
    if not weights or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"weights must be >= 0 with a positive sum, not {list(weights)}")
    total = float(sum(weights))
    exact = [n * w / total for w in weights]
    counts = [int(x) for x in exact]
    for i in sorted(range(len(weights)), key=lambda i: exact[i] - counts[i], reverse=True)[: n - sum(counts)]:
        counts[i] += 1
    spans, start = [], 0
    for count in counts:
        spans.append(Span(start, count))
        start += count
    return spans


def resolve_device_count(request, available: int, what: str = "GPUs") -> int:
    """How many devices a request means here: "all" is every one; more than exist is a ConfigError
    (exit 2) saying how many there are."""
    request = parse_device_count(request)
    if request == "all":
        return available
    if request > available:
        raise ConfigError(
            f"--gpus {request}: this machine has {available} {what}; ask for at most "
            f"{available} (or --gpus all)"
        )
    return request


def balanced_weights(
    previous: Sequence[float], shares: Sequence[Span], times_ms: Sequence[float], smoothing: float = SMOOTHING
) -> list[float]:
    """New share weights from each device's measured speed (its bodies per ms of force evaluation),
    blended with the previous weights so that one noisy frame does not swing the split. Unchanged while
    any device has no measurement (an empty share, an untimed step)."""
    if any(t <= 0 or s.count <= 0 for s, t in zip(shares, times_ms, strict=True)):
        return list(previous)
    speeds = [s.count / t for s, t in zip(shares, times_ms, strict=True)]
    total_prev, total_speed = float(sum(previous)), sum(speeds)
    return [
        (1 - smoothing) * p / total_prev + smoothing * v / total_speed
        for p, v in zip(previous, speeds, strict=True)
    ]


# --- drivers -------------------------------------------------------------------------------------------
class ThreadsDriver:
    """One host thread per device, always the same one for a device (its context stays current there).
    `submit` hands each device its task and returns; the device threads work through their tasks in
    order. `finish` is the only host wait: for every task submitted so far to have run (on GPUs: to
    have been queued). After a failure a device thread skips its remaining tasks until `finish`."""

    name = "threads"

    def __init__(self, devices: Sequence[DeviceState]):
        self._pools = [
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"device{i}") for i in range(len(devices))
        ]
        if len(devices) > 1:  # see SWITCH_INTERVAL_S
            sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
        self.devices = list(devices)
        self._futures: list = []
        self._failures: list[BaseException | None] = [None] * len(self.devices)
        self.waits = 0  # host waits for the device threads so far (tests count them per step)

    def submit(self, tasks: Sequence[Callable]) -> None:
        for i, (pool, task) in enumerate(zip(self._pools, tasks, strict=True)):
            self._futures.append(pool.submit(self._run, i, task))

    def _run(self, i: int, task: Callable) -> None:
        if self._failures[i] is not None:  # the device failed earlier in this step: its state is not valid
            return
        try:
            drain_task(task)
        except BaseException as e:  # noqa: BLE001 - raised by finish(), naming the device
            self._failures[i] = e

    def finish(self) -> None:
        """Wait until every submitted task has run; DeviceFault for the first device that failed."""
        if not self._futures:
            return
        futures, self._futures = self._futures, []
        self.waits += 1
        for future in futures:  # all of them: no device is left mid-step
            future.result()
        _raise_first(self.devices, self._failures)

    def close(self) -> None:
        for pool in self._pools:
            pool.shutdown(wait=True)


class SingleDriver:
    """The calling thread issues every device's work in turn (queued on GPUs: nothing waits here).

    A task given in phases (a generator: `force_domain_phases`, the tree's evaluation) yields where it is
    about to wait for its device, with a `ready()` test of the work it queued (None: nothing to wait for).
    The thread takes a phase of whichever device is ready, in device order, and sleeps POLL_S when none
    is: so one host thread queues every GPU's launches without the threads driver's turns on the GIL, and
    a GPU held up (GPU 0 drawing the last frame) does not hold up the others' phases. A blocking wait on
    each device in turn did: the viewer at 8M on two H100s took a GPU's whole step (docs/multi-gpu.md)."""

    name = "single"
    waits = 0  # the calling thread never waits for a device thread

    def __init__(self, devices: Sequence[DeviceState]):
        self.devices = list(devices)

    def submit(self, tasks: Sequence[Callable]) -> None:
        running = []  # [device index, phases, ready test of the phase it yielded]
        for i, task in enumerate(tasks):
            try:
                result = task()
            except BaseException as e:
                self._raise_fault(i, e)
            if inspect.isgenerator(result):
                running.append([i, result, None])
        while running:
            moved = False
            for entry in list(running):
                i, phases, ready = entry
                try:
                    if ready is not None and not ready():
                        continue
                    entry[2] = next(phases)
                except StopIteration:
                    running.remove(entry)
                except BaseException as e:
                    self._raise_fault(i, e)
                moved = True
            if not moved:
                time.sleep(POLL_S)

    def _raise_fault(self, i: int, error: BaseException) -> None:
        """A failed task: a DeviceFault naming the device among several; one device's own error as it is
        (the single-GPU backend's errors stay those of its kernels)."""
        if len(self.devices) == 1:
            raise error
        raise DeviceFault(i, self.devices[i].name, error) from error

    def finish(self) -> None:
        """Every task ran when it was submitted (a failure was raised then)."""

    def close(self) -> None:
        pass


def drain_task(task: Callable) -> None:
    """Run a task whole: a task given in phases (a generator) to its end."""
    result = task()
    if inspect.isgenerator(result):
        drain(result)


def _raise_first(devices: Sequence[DeviceState], failures: list) -> None:
    """Raise a DeviceFault for the first failed device, after clearing the record for the next step."""
    first = next(((i, e) for i, e in enumerate(failures) if e is not None), None)
    failures[:] = [None] * len(failures)
    if first is not None:
        i, e = first
        raise DeviceFault(i, devices[i].name, e) from e


def make_driver(name: str, devices: Sequence[DeviceState]):
    """The driver `name` names ("auto" is resolved before: MultiDeviceRun.driver_for)."""
    if name == "threads":
        return ThreadsDriver(devices)
    if name == "single":
        return SingleDriver(devices)
    raise ValueError(f"unknown multi-device driver {name!r}; choose from {', '.join(DRIVERS)}")


# --- order between devices, kept on the devices ----------------------------------------------------------
def queue_after(waiters: Sequence[DeviceState], devices: Sequence[DeviceState], tag: str) -> None:
    """Every device of `waiters` starts its later work only after all work queued so far on every other
    device of `devices`: each of those queues a mark, each waiter queues a wait for the others' marks.
    No host wait, and nothing at all where no waiter has another device to wait for (one device)."""
    marks = {}
    for waiter in waiters:
        for device in devices:
            if device is not waiter:
                if id(device) not in marks:
                    marks[id(device)] = device.mark(tag)
                waiter.wait_for(marks[id(device)])


# --- exchange ------------------------------------------------------------------------------------------
class HostExchange:
    """Every device's share rows copied to every other device through host memory: the fallback where
    devices cannot reach each other (and CPU "devices", where host memory is all there is)."""

    name = "host"

    @staticmethod
    def moves_rows(devices: Sequence[DeviceState]) -> bool:
        """Whether `gather` has rows to move: not with one device, which holds them all."""
        return len(devices) > 1

    def gather(self, devices: Sequence[DeviceState], field: str) -> None:
        """Host copies wait for the owner's queued work themselves (a host read of a GPU's rows does)."""
        for owner in devices:
            others = [d for d in devices if d is not owner]
            if not others:
                continue
            rows = owner.rows(field, owner.share)
            for other in others:
                with other.timed("exchange"):
                    other.set_rows(field, owner.share, rows)

    def reduce_scatter(self, devices: Sequence[DeviceState], field: str) -> None:
        """pairs: each device's share rows of `field` become the sum of every device's partial rows there,
        its own first, then the others' in device order (every partial is read before any share is
        written: a share's rows on its owner are read by no other device)."""
        if not self.moves_rows(devices):
            return
        sums = []
        for owner in devices:
            total = owner.rows(field, owner.share).copy()
            for other in devices:
                if other is not owner:
                    total += other.rows(field, owner.share)
            sums.append(total)
        for owner, total in zip(devices, sums, strict=True):
            with owner.timed("exchange"):
                owner.set_rows(field, owner.share, total)

    def gather_sorted(self, devices: Sequence[DeviceState]) -> None:
        """domains: every device's key range of 'sacc' copied into every other device's (the ranges are
        `domain_cuts`, which every device computed alike from the same tree)."""
        ranges = domain_spans(devices)
        for owner, span in zip(devices, ranges, strict=True):
            others = [d for d in devices if d is not owner]
            if not others or not span.count:
                continue
            rows = owner.rows("sacc", span)
            for other in others:
                with other.timed("exchange"):
                    other.set_rows("sacc", span, rows)


def domain_spans(devices: Sequence[DeviceState]) -> list[Span]:
    """The key ranges of a domain split, one per device, from the cuts the devices computed (checked to
    agree: a device that built another tree would exchange the wrong rows)."""
    cuts = [list(d.domain_cuts) for d in devices]
    if any(c != cuts[0] for c in cuts[1:]):
        raise RuntimeFault(f"the devices disagree about their key ranges ({cuts}): their trees differ")
    if len(cuts[0]) != len(devices) + 1:
        raise RuntimeFault(f"{len(devices)} devices but {len(cuts[0]) - 1} key ranges ({cuts[0]})")
    return cut_spans(cuts[0])


# --- what reaches the renderer ------------------------------------------------------------------------
@dataclass(frozen=True)
class RenderCopy:
    """One copy into the renderer's buffers: rows `span` of `field` from device `device`, to the same
    rows of the buffer."""

    device: int
    field: str  # "pos" (float4 rows) or "speed" (float rows)
    span: Span


def render_copies(shares: Sequence[Span]) -> list[RenderCopy]:
    """What fills the renderer's buffers after a step, and from where: every position from device 0
    (after the exchange each device holds them all: one copy, no gather), each share's speeds from the
    device that owns them (a device updates the speeds of its share only). Empty shares copy nothing."""
    n = sum(s.count for s in shares)
    copies = [RenderCopy(0, "pos", Span.all(n))] if n else []
    return copies + [RenderCopy(i, "speed", s) for i, s in enumerate(shares) if s.count]


# --- a state kept in another order than the load order (domains: the tree's key order) ---------------------
def in_load_order(rows: np.ndarray, ids: np.ndarray | None) -> np.ndarray:
    """Values of every state row (axis 0) put in load order: row r holds body ids[r] (None: rows are the
    bodies already)."""
    if ids is None:
        return rows
    out = np.empty_like(rows)
    out[ids] = rows
    return out


def rows_holding(bodies: np.ndarray, ids: np.ndarray | None) -> np.ndarray:
    """The state rows that hold the bodies `bodies` (load order indices)."""
    if ids is None:
        return bodies
    where = np.empty_like(ids)
    where[ids] = np.arange(ids.size, dtype=ids.dtype)
    return where[bodies]


# --- the integrator's StateOps over several devices ----------------------------------------------------
TIMED = ("force", "integrate", "exchange")  # the categories a device's clock measures


class MultiDeviceOps:
    """app.engine.integrator's StateOps for K devices: each step's work split by the devices' shares.

    Each phase only hands the devices their work (`driver.submit`); the force evaluations' work comes
    back from `finish()`, after the driver waited once for every device (the integrator sums what
    `force()` returns: nothing here)."""

    def __init__(
        self,
        devices: Sequence[DeviceState],
        driver,
        exchange,
        decomposition=TARGETS,
        layout: tuple[list[Span], int] | None = None,
        key_ordered: bool = False,
        rank_sum: Callable[[int], int] | None = None,
    ):
        """`layout`: (every participant's share, the first of these devices' index among them) where the
        devices are part of a larger run (an MPI rank's one device among the ranks' shares); None: these
        devices are all of it. `key_ordered`: the state is in a tree's key order already (one device that
        ran a domain split before a kernel switch: MultiDeviceRun.use_kernel). `rank_sum`: with a layout,
        the sum of a count over every participant (an MPI allreduce; Domains.force's whole evaluation)."""
        self.devices, self.driver, self.exchange = list(devices), driver, exchange
        self.rank_sum = rank_sum
        self.decomposition = decomposition
        self.layout = layout
        # domains: the devices move their state into the tree's key order at each evaluation
        self.key_order = decomposition.sorts_state or key_ordered
        self._tell_shares()
        self.exchange_count = 0
        self._work = [ForceWork() for _ in self.devices]
        self._times = {category: [0.0] * len(self.devices) for category in TIMED}

    @property
    def ids(self) -> np.ndarray | None:
        """The body (load order) in each state row while the state is in key order; None while rows are
        bodies. Every device permutes alike (the same tree from the same positions: also every rank), so
        the first device's copy is every device's."""
        return self.devices[0].ids if self.key_order else None

    def _tell_shares(self) -> None:
        """Every device learns its index and every device's share: a pair slice or a key range is
        cut in proportion to the shares (app/parallel/decomposition.py)."""
        shares, first = self.layout or ([d.share for d in self.devices], 0)
        for i, device in enumerate(self.devices):
            device.index, device.shares = first + i, list(shares)

    def finish(self) -> ForceWork:
        """Wait for the devices' queued phases (DeviceFault naming a failed one); the force work done
        since the last call."""
        try:
            self.driver.finish()
        finally:
            work, self._work = self._work, [ForceWork() for _ in self.devices]
        total = ForceWork()
        for part in work:
            total += part
        return total

    def finish_quietly(self) -> None:
        """After a failure: let every device thread run out its tasks (they skip them), drop the work."""
        with suppress(DeviceFault):
            self.finish()

    def take_times(self, lagged: bool = False) -> dict[str, list[float]]:
        """Each device's ms per category ("force", "integrate", "exchange") of its latest measured
        `step()` call: that call's own (waiting for its last event), or with `lagged` the newest
        earlier one the device has finished, without waiting (a device with none finished yet keeps
        its previous numbers). What a backend reports: per-device bars, bench's scaling, re-balancing."""
        for i, device in enumerate(self.devices):
            times = device.take_times(lagged)
            if times is not None:
                for category in TIMED:
                    self._times[category][i] = float(times.get(category, 0.0))
        return {category: list(values) for category, values in self._times.items()}

    def add_work(self, i: int, work: ForceWork) -> None:
        self._work[i] += work  # each device thread adds to its own slot only

    def submit(self, task) -> None:
        """Hand every device `task(i, device)` (queued on its thread with the threads driver)."""
        self.driver.submit([lambda i=i, d=d: task(i, d) for i, d in enumerate(self.devices)])

    def force(self) -> ForceWork:
        """a(x) on the rows each device integrates, split as the record's decomposition says."""
        self.decomposition.force(self)
        return ForceWork()  # the work is counted in finish()

    def kick_drift(self, half_dt: float, dt: float) -> None:
        self.driver.submit([lambda d=d: d.kick_drift(half_dt, dt) for d in self.devices])
        self._exchange_positions()

    def kick(self, half_dt: float) -> None:
        self.driver.submit([lambda d=d: d.kick(half_dt) for d in self.devices])

    def euler_damped(self, dt: float, damping: float) -> None:
        self.driver.submit([lambda d=d: d.euler_damped(dt, damping) for d in self.devices])
        self._exchange_positions()

    def launch_checks(self) -> None:
        """Each device queues the non-finite check of its share (after its work queued so far)."""
        self.driver.submit([d.launch_check for d in self.devices])

    def _exchange_positions(self) -> None:
        if self.decomposition.exchanges_positions and self.exchange.moves_rows(self.devices):
            # (else one GPU, or every device drifted every body itself: nothing to wait for or to copy)
            self.driver.finish()  # the threads queued their updates: the exchange's marks come after them
            self.exchange.gather(self.devices, "pos")
        self.exchange_count += 1

    def force_times_ms(self) -> list[float]:
        """Each device's force ms as last taken (0 for a device not measured since its share changed)."""
        return list(self._times["force"])

    def reshare(self, spans: Sequence[Span]) -> None:
        """Give the devices new shares: every row of every field is made whole on every device first,
        so that a row changing hands keeps its velocity and its cached acceleration. Measurements of
        the old shares are dropped (re-balancing must not read them as the new shares' speed)."""
        self.driver.finish()
        if not self.decomposition.integrate_all:  # (else every device holds every row already)
            for field in ("vel", "acc", "speed"):
                self.exchange.gather(self.devices, field)
        for device, span in zip(self.devices, spans, strict=True):
            device.share = span
            device.forget_times()
        self._tell_shares()
        self._times = {category: [0.0] * len(self.devices) for category in TIMED}


# --- a run -------------------------------------------------------------------------------------------------
DeviceFactory = Callable[[Bodies, Physics, str, list[Span]], list[DeviceState]]


class MultiDeviceRun:
    """A simulation over K devices made by `make_devices(bodies, physics, kernel, shares)`: load, step
    (the shared Integrator), re-balance, read back. `make_exchange(devices)` picks the exchange. Every
    `check_every` steps (0: never) each device checks its share for non-finite bodies."""

    check_every = CHECK_EVERY

    def __init__(
        self,
        make_devices: DeviceFactory,
        k: int,
        driver: str = "auto",
        weights=None,
        make_exchange: Callable[[list], object] = lambda devices: HostExchange(),
    ):
        if k < 1:
            raise ValueError(f"devices: {k} must be >= 1")
        if driver not in DRIVERS:
            raise ValueError(f"unknown multi-device driver {driver!r}; choose from {', '.join(DRIVERS)}")
        self.make_devices, self.make_exchange = make_devices, make_exchange
        self.k, self.driver_name = int(k), driver
        self.weights = list(weights) if weights is not None else [1.0] * self.k
        self.devices: list = []
        self.ops: MultiDeviceOps | None = None
        self.decomposition = TARGETS  # the running record's (set by load)
        self.stepper = Stepper()  # the integrator and the non-finite checks' cadence (engine/integrator.py)
        self.physics = Physics()

    @property
    def integrator(self):
        return self.stepper.integrator

    @property
    def steps_done(self) -> int:
        """Steps since load: the non-finite checks' cadence counts them."""
        return self.stepper.steps

    def load(self, bodies: Bodies, physics: Physics, kernel: str) -> None:
        self.close()
        self.physics = physics
        self.devices = self.make_devices(bodies, physics, kernel, split(bodies.n, self.weights))
        self._set_decomposition(
            decomposition_of(getattr(getattr(self.devices[0], "evaluator", None), "record", None))
        )
        self.stepper.restart()

    # --- the state in key order (domains): rows are not bodies -------------------------------------------
    @property
    def ids(self) -> np.ndarray | None:
        """The body (load order) in each state row (MultiDeviceOps.ids); None while rows are bodies."""
        return self.ops.ids if self.ops is not None else None

    def in_body_order(self, rows: np.ndarray) -> np.ndarray:
        """An array of every state row's values (axis 0) in body (load) order."""
        return in_load_order(rows, self.ids)

    def state_rows(self, bodies: np.ndarray) -> np.ndarray:
        """The state rows that hold the bodies `bodies` (load order indices)."""
        return rows_holding(bodies, self.ids)

    def driver_for(self, decomposition) -> str:
        """The driver that runs `decomposition`: the one asked for, or with `auto` the decomposition's (the
        calling thread for one device: a device thread would only add a hand-over per phase)."""
        if self.driver_name != "auto":
            return self.driver_name
        return "single" if self.k == 1 else decomposition.driver

    def use_kernel(self, kernel: str, mass: np.ndarray) -> None:
        """Run another kernel on the same state, in place (one device: the single-GPU backend's kernel
        switch; several devices load again instead, as their shares of the rows may differ by method).
        The device compiles first, so a failure leaves the current kernel; `mass`: float64, load order
        (a switch to fp64 promotes the state). The rows stay where they are: after a domain split they
        stay in its key order, and `ids` keep naming the bodies."""
        if self.k != 1:
            raise ValueError("use_kernel: several devices load the state again for another kernel")
        device = self.devices[0]
        ids = self.ids
        device.use_record(kernel, mass if ids is None else mass[ids])
        self._set_decomposition(decomposition_of(device.evaluator.record), key_ordered=ids is not None)

    def _set_decomposition(self, decomposition, key_ordered: bool = False) -> None:
        """The record's decomposition, and the driver and ops that run it over these devices."""
        exchange = self.ops.exchange if self.ops is not None else self.make_exchange(self.devices)
        if self.ops is not None:
            self.ops.driver.close()
        self.decomposition = decomposition
        for device in self.devices:
            device.integrate_all = decomposition.integrate_all
        driver = make_driver(self.driver_for(decomposition), self.devices)
        self.ops = MultiDeviceOps(self.devices, driver, exchange, decomposition, key_ordered=key_ordered)
        self.integrator.invalidate()

    def set_physics(self, physics: Physics) -> None:
        """New physics for the same state: the devices' evaluators take the force parameters in place; the
        cached a(x) is dropped when they or the integrator change."""
        old, self.physics = self.physics, physics
        if physics.forces != old.forces:
            for device in self.devices:
                device.set_physics(physics)
            self.integrator.invalidate()
        elif physics.integrator != old.integrator:
            self.integrator.invalidate()

    @property
    def render_whole(self) -> bool:
        """The first device holds every body's current rows (a domain split, every body on it, or one
        device), so that the renderer's buffers are filled from it alone, through `ids` once its rows
        are not bodies (GpuRenderTarget.publish)."""
        return self.decomposition.integrate_all or self.k == 1

    def step(self, steps: int = 1) -> ForceWork:
        """Advance `steps` steps, each device queueing its non-finite check every `check_every` of them
        (read by `first_nonfinite`); returns the force work once every device has taken (queued) its part.
        A DeviceFault leaves the cached acceleration invalid."""
        try:
            self.stepper.advance(self.ops, self.physics, steps, self.check_every, self.ops.launch_checks)
            return self.ops.finish()
        except BaseException:
            self.integrator.invalidate()
            self.ops.finish_quietly()
            raise

    def first_nonfinite(self, wait: bool = False) -> tuple[int, int] | None:
        """(device, body) of the first non-finite body the devices' finished checks found, else None;
        after `step` (the devices have queued their checks). Each device's answer is read once, without a
        host wait: a GPU's comes a `step()` call or two after its check ran, as on one GPU. With `wait`
        the newest checks' answers, waiting for them (where the caller waits for the step anyway)."""
        found = [device.check_result(wait) for device in self.devices]  # every device: each is read once
        first = next(((i, row) for i, row in enumerate(found) if row >= 0), None)
        if first is None or self.ids is None:
            return first
        return first[0], int(self.ids[first[1]])  # the body in that row

    def accelerations(self) -> np.ndarray:
        """a(x), float64 (N, 3), in body (load) order: the integrator's cached one (evaluated now, and
        cached, if it is not current), as one backend's; an evaluation again would differ under the tree's
        relative opening test, which reads the last accelerations."""
        if not self.integrator.acc_valid:
            self._evaluate_forces()
        return self.in_body_order(self.gathered("acc")[:, :3].astype(np.float64))

    def _evaluate_forces(self) -> None:
        """a(x) of the current positions, each device its share's rows: the integrator's cache from now on."""
        self.ops.force()
        self.ops.finish()
        self.integrator.acc_valid = True

    def force_error_sample(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(approx, exact), float64 (K, 3), for the bodies `rows` (load order indices, any order) at the
        current positions: approx = each one's acceleration as the device owning its row computed it (the
        integrator's cached a(x); evaluated now, and cached, if it is not current), exact = device 0's
        all-pairs sum over every position of its copy (whole after each exchange). Between `step()` calls:
        the devices have finished (queued, on GPUs) their steps, and a GPU's reads come after its queued
        work."""
        rows = np.asarray(rows, dtype=np.int64)
        n = sum(d.share.count for d in self.devices)
        if rows.size and (rows.min() < 0 or rows.max() >= n):
            raise IndexError(f"force error sample: rows must lie in [0, {n}), not {rows.min()}..{rows.max()}")
        if not self.integrator.acc_valid:
            self._evaluate_forces()
        rows = self.state_rows(rows)  # after the evaluation: it may re-sort the state
        approx = np.empty((rows.size, 3))
        for device in self.devices:
            mine = (rows >= device.share.start) & (rows < device.share.stop)
            if mine.any():
                approx[mine] = np.asarray(device.rows_at("acc", rows[mine]))[:, :3]
        return approx, self.devices[0].exact_rows(rows)

    def rebalance(self) -> list[Span]:
        """Shares from each device's last measured force time (balanced_weights), rows moved to match."""
        shares = [d.share for d in self.devices]
        self.weights = balanced_weights(self.weights, shares, self.ops.force_times_ms())
        spans = split(sum(s.count for s in shares), self.weights)
        self.ops.reshare(spans)
        return spans

    def gathered(self, field: str) -> np.ndarray:
        """The whole of `field` on the host in state-row order, each row from the device that owns it
        (`in_body_order` puts it in load order)."""
        return np.concatenate([d.rows(field, d.share) for d in self.devices])

    def close(self) -> None:
        if self.ops is not None:
            self.ops.driver.close()
            close_exchange = getattr(self.ops.exchange, "close", None)  # e.g. NCCL's communicators
            if close_exchange is not None:
                close_exchange()
            self.ops = None
        for device in self.devices:
            close = getattr(device, "close", None)
            if close is not None:
                close()
        self.devices = []
