"""Several devices, one simulation: the multi-device driver over the force seam, for any force method.

Each device holds a full copy of the positions, evaluates the accelerations of its share of the targets
against all sources (`ForceEvaluator.evaluate(pos, acc, share, everyone)`), updates its share's
velocities and positions, and then the new positions are exchanged so that every copy is whole again.
The driver never asks which force method runs: all-pairs records and a tree (every device building the
whole tree from all positions and walking its own groups) go through it alike.

    run = MultiDeviceRun(cpu_devices, k=3, driver="threads")   # or GPUs: any factory of DeviceStates
    run.load(bodies, physics, "cpu-fp64")
    run.step(100)                                               # the one Integrator over MultiDeviceOps
    run.rebalance()                                             # shares follow each device's speed

Two drivers, as in the CUDA Handbook's multi-GPU chapter: `ThreadsDriver` runs each device's work on a
host thread of its own (the thread-per-GPU design; a device is always served by the same thread, as
CUDA contexts are per thread), `SingleDriver` issues every device's work from the calling thread and
then waits for each (the single-thread design: on GPUs the work is asynchronous). A failure on one
device stops the step on all and is raised as a DeviceFault naming the device.

Over K CPU "devices" (app/backends/cpu_multi.py) the same driver runs in CI, where the shares' results
are checked bitwise against one device.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from app.bodies import Bodies
from app.errors import ConfigError, RuntimeFault
from app.forces import ForceWork, Span
from app.integrator import Integrator
from app.physics import Physics

DRIVERS = ("threads", "single")
EXCHANGES = ("auto", "peer", "nccl", "host")  # auto: peer copies where every pair can, else host
SMOOTHING = 0.5  # weight of the newest speed measurement when shares are re-balanced


class DeviceFault(RuntimeFault):
    """A failure on one device of a multi-device step; the message names the device."""

    def __init__(self, index: int, name: str, cause: BaseException):
        self.index, self.device_name, self.cause = index, name, cause
        super().__init__(f"device {index} ({name}): {type(cause).__name__}: {cause}")


class DeviceState(Protocol):
    """One device's part of a multi-device run (a full position copy, its share of everything else)."""

    name: str
    share: Span
    last_force_ms: float  # the device's own clock for its last force evaluation

    def force(self) -> ForceWork: ...  # acc[share] = F(pos[share]; pos[all])
    def kick_drift(self, half_dt: float, dt: float) -> None: ...  # on the share
    def kick(self, half_dt: float) -> None: ...
    def euler_damped(self, dt: float, damping: float) -> None: ...
    def synchronize(self) -> None: ...  # wait for queued work (a no-op where work is synchronous)
    def rows(self, field: str, span: Span): ...  # a host copy of rows of 'pos', 'vel', 'acc' or 'speed'
    def set_rows(self, field: str, span: Span, values) -> None: ...


# --- splitting and balancing (pure) --------------------------------------------------------------------
def split(n: int, weights: Sequence[float]) -> list[Span]:
    """Contiguous shares of [0, n) in proportion to `weights` (largest remainders; they cover n exactly)."""
    if not weights or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"weights must be >= 0 with a positive sum, not {list(weights)}")
    total = float(sum(weights))
    exact = [n * w / total for w in weights]
    counts = [int(x) for x in exact]
    for i in sorted(range(len(weights)), key=lambda i: exact[i] - counts[i], reverse=True)[:n - sum(counts)]:
        counts[i] += 1
    spans, start = [], 0
    for count in counts:
        spans.append(Span(start, count))
        start += count
    return spans


def parse_device_count(text, key: str = "--gpus") -> int | str:
    """A `--gpus` / run.gpus value: a whole number >= 1, or "all"; ConfigError naming `key` and the forms."""
    value = str(text).strip().lower()
    if value == "all":
        return "all"
    if value.isdigit() and int(value) >= 1 and not isinstance(text, bool):
        return int(value)
    raise ConfigError(f"{key} = {text!r}: expected a number of devices >= 1, or all (e.g. --gpus 2)")


def resolve_device_count(request, available: int, what: str = "GPUs") -> int:
    """How many devices a request means here: "all" is every one; more than exist is a ConfigError
    (exit 2) saying how many there are."""
    request = parse_device_count(request)
    if request == "all":
        return available
    if request > available:
        raise ConfigError(f"--gpus {request}: this machine has {available} {what}; ask for at most "
                          f"{available} (or --gpus all)")
    return request


def balanced_weights(previous: Sequence[float], shares: Sequence[Span], times_ms: Sequence[float],
                     smoothing: float = SMOOTHING) -> list[float]:
    """New share weights from each device's measured speed (its bodies per ms of force evaluation),
    blended with the previous weights so that one noisy frame does not swing the split. Unchanged while
    any device has no measurement (an empty share, an untimed step)."""
    if any(t <= 0 or s.count <= 0 for s, t in zip(shares, times_ms, strict=True)):
        return list(previous)
    speeds = [s.count / t for s, t in zip(shares, times_ms, strict=True)]
    total_prev, total_speed = float(sum(previous)), sum(speeds)
    return [(1 - smoothing) * p / total_prev + smoothing * v / total_speed
            for p, v in zip(previous, speeds, strict=True)]


# --- drivers -------------------------------------------------------------------------------------------
class ThreadsDriver:
    """One host thread per device, always the same one for a device (its context stays current there)."""

    name = "threads"

    def __init__(self, devices: Sequence[DeviceState]):
        self._pools = [ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"device{i}")
                       for i in range(len(devices))]
        self.devices = list(devices)

    def run(self, tasks: Sequence[Callable]) -> list:
        """Each device's task, then its `synchronize`, on its own thread: work queued asynchronously (a
        GPU's) is finished before the next phase reads it, and the device's force time is read."""
        futures = [pool.submit(_then_synchronize, task, device)
                   for pool, task, device in zip(self._pools, tasks, self.devices, strict=True)]
        results, failure = [], None
        for i, future in enumerate(futures):  # wait for all: no device is left mid-step
            try:
                results.append(future.result())
            except BaseException as e:  # noqa: BLE001 - re-raised below, naming the device
                results.append(None)
                failure = failure or DeviceFault(i, self.devices[i].name, e)
        if failure is not None:
            raise failure
        return results

    def close(self) -> None:
        for pool in self._pools:
            pool.shutdown(wait=True)


def _then_synchronize(task: Callable, device: DeviceState):
    result = task()
    device.synchronize()
    return result


class SingleDriver:
    """The calling thread issues every device's work in turn, then waits for each device."""

    name = "single"

    def __init__(self, devices: Sequence[DeviceState]):
        self.devices = list(devices)

    def run(self, tasks: Sequence[Callable]) -> list:
        results = []
        for i, task in enumerate(tasks):
            try:
                results.append(task())
            except BaseException as e:
                raise DeviceFault(i, self.devices[i].name, e) from e
        for i, device in enumerate(self.devices):
            try:
                device.synchronize()
            except BaseException as e:
                raise DeviceFault(i, device.name, e) from e
        return results

    def close(self) -> None:
        pass


def make_driver(name: str, devices: Sequence[DeviceState]):
    if name == "threads":
        return ThreadsDriver(devices)
    if name == "single":
        return SingleDriver(devices)
    raise ValueError(f"unknown multi-device driver {name!r}; choose from {', '.join(DRIVERS)}")


# --- exchange ------------------------------------------------------------------------------------------
class HostExchange:
    """Every device's share rows copied to every other device through host memory: the fallback where
    devices cannot reach each other (and CPU "devices", where host memory is all there is)."""

    name = "host"

    def gather(self, devices: Sequence[DeviceState], field: str) -> None:
        for owner in devices:
            rows = owner.rows(field, owner.share)
            for other in devices:
                if other is not owner:
                    other.set_rows(field, owner.share, rows)


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


# --- the integrator's StateOps over several devices ----------------------------------------------------
class MultiDeviceOps:
    """app.integrator's StateOps for K devices: each step's work split by the devices' shares."""

    def __init__(self, devices: Sequence[DeviceState], driver, exchange):
        self.devices, self.driver, self.exchange = list(devices), driver, exchange
        self.exchange_count = 0
        self._device_ms, self._exchange_ms = [0.0] * len(self.devices), 0.0

    def take_times(self) -> tuple[list[float], float]:
        """(each device's force ms, exchange ms) summed since the last call, and start again: what a
        backend's step reports per device (the panel's bars, bench's scaling rows)."""
        times = self._device_ms, self._exchange_ms
        self._device_ms, self._exchange_ms = [0.0] * len(self.devices), 0.0
        return times

    def force(self) -> ForceWork:
        work = ForceWork()
        for part in self.driver.run([device.force for device in self.devices]):
            work += part
        for i, device in enumerate(self.devices):  # read after the driver waited for every device
            self._device_ms[i] += device.last_force_ms
        return work

    def kick_drift(self, half_dt: float, dt: float) -> None:
        self.driver.run([lambda d=d: d.kick_drift(half_dt, dt) for d in self.devices])
        self._exchange_positions()

    def kick(self, half_dt: float) -> None:
        self.driver.run([lambda d=d: d.kick(half_dt) for d in self.devices])

    def euler_damped(self, dt: float, damping: float) -> None:
        self.driver.run([lambda d=d: d.euler_damped(dt, damping) for d in self.devices])
        self._exchange_positions()

    def _exchange_positions(self) -> None:
        start = time.perf_counter()  # every exchange ends with the devices synchronised: host time is it
        self.exchange.gather(self.devices, "pos")
        self._exchange_ms += (time.perf_counter() - start) * 1e3
        self.exchange_count += 1

    def force_times_ms(self) -> list[float]:
        return [device.last_force_ms for device in self.devices]

    def reshare(self, spans: Sequence[Span]) -> None:
        """Give the devices new shares: every row of every field is made whole on every device first,
        so that a row changing hands keeps its velocity and its cached acceleration."""
        for field in ("vel", "acc", "speed"):
            self.exchange.gather(self.devices, field)
        for device, span in zip(self.devices, spans, strict=True):
            device.share = span


# --- a run -------------------------------------------------------------------------------------------------
DeviceFactory = Callable[[Bodies, Physics, str, list[Span]], list[DeviceState]]


class MultiDeviceRun:
    """A simulation over K devices made by `make_devices(bodies, physics, kernel, shares)`: load, step
    (the shared Integrator), re-balance, read back. `make_exchange(devices)` picks the exchange."""

    def __init__(self, make_devices: DeviceFactory, k: int, driver: str = "threads", weights=None,
                 make_exchange: Callable[[list], object] = lambda devices: HostExchange()):
        if k < 1:
            raise ValueError(f"devices: {k} must be >= 1")
        if driver not in DRIVERS:
            raise ValueError(f"unknown multi-device driver {driver!r}; choose from {', '.join(DRIVERS)}")
        self.make_devices, self.make_exchange = make_devices, make_exchange
        self.k, self.driver_name = int(k), driver
        self.weights = list(weights) if weights is not None else [1.0] * self.k
        self.devices: list = []
        self.ops: MultiDeviceOps | None = None
        self.integrator = Integrator()
        self.physics = Physics()

    def load(self, bodies: Bodies, physics: Physics, kernel: str) -> None:
        self.close()
        self.physics = physics
        self.devices = self.make_devices(bodies, physics, kernel, split(bodies.n, self.weights))
        self.ops = MultiDeviceOps(self.devices, make_driver(self.driver_name, self.devices),
                                  self.make_exchange(self.devices))
        self.integrator.invalidate()

    def step(self, steps: int = 1) -> ForceWork:
        return self.integrator.step(self.ops, self.physics, steps)

    def accelerations(self) -> np.ndarray:
        self.ops.force()
        self.integrator.acc_valid = True
        return self.gathered("acc")[:, :3].astype(np.float64)

    def rebalance(self) -> list[Span]:
        """Shares from each device's last measured force time (balanced_weights), rows moved to match."""
        shares = [d.share for d in self.devices]
        self.weights = balanced_weights(self.weights, shares, self.ops.force_times_ms())
        spans = split(sum(s.count for s in shares), self.weights)
        self.ops.reshare(spans)
        return spans

    def gathered(self, field: str) -> np.ndarray:
        """The whole of `field` on the host, each row from the device that owns it."""
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
