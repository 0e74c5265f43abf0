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

The parts, one module each: what a device is (device_state.py: `DeviceState`, `DeviceFault`), the shares
and their re-balancing (shares.py), the two drivers (drivers.py: a host thread per device, or every
device's work issued from the calling thread), the order between devices, the host exchange and the
render copies (exchange.py), and the integrator's StateOps over the devices (multidevice_ops.py). This
module is the run over them: `MultiDeviceRun`, and the names of those modules (their importers' path).

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

from collections.abc import Callable

import numpy as np

from app.core.errors import ConfigError
from app.engine.forces import ForceWork, Span
from app.engine.integrator import CHECK_EVERY, Stepper
from app.model.bodies import Bodies
from app.model.config import DRIVERS  # (the settings' names; re-exported)
from app.model.physics import Physics
from app.model.typed_text import parse_device_count
from app.parallel.decomposition import TARGETS
from app.parallel.decomposition import of as decomposition_of
from app.parallel.device_state import DeviceFault, DeviceState
from app.parallel.drivers import (
    POLL_S,
    SWITCH_INTERVAL_S,
    SingleDriver,
    ThreadsDriver,
    drain_task,
    make_driver,
)
from app.parallel.exchange import HostExchange, RenderCopy, domain_spans, queue_after, render_copies
from app.parallel.multidevice_ops import TIMED, MultiDeviceOps
from app.parallel.shares import SMOOTHING, balanced_weights, split

__all__ = [  # what the run uses, and the names of the modules it was split into (their importers' path)
    "DRIVERS",
    "POLL_S",
    "SMOOTHING",
    "SWITCH_INTERVAL_S",
    "TIMED",
    "DeviceFactory",
    "DeviceFault",
    "DeviceState",
    "HostExchange",
    "MultiDeviceOps",
    "MultiDeviceRun",
    "RenderCopy",
    "SingleDriver",
    "ThreadsDriver",
    "balanced_weights",
    "domain_spans",
    "drain_task",
    "in_load_order",
    "make_driver",
    "parse_device_count",
    "queue_after",
    "render_copies",
    "resolve_device_count",
    "rows_holding",
    "split",
]


def resolve_device_count(request, available: int, what: str = "GPUs", all_count: int | None = None) -> int:
    """How many devices a request means here: "all" is `all_count` (default: every one that exists); more
    than exist is a ConfigError (exit 2) saying how many there are."""
    request = parse_device_count(request)
    if request == "all":
        return available if all_count is None else all_count
    if request > available:
        raise ConfigError(
            f"--gpus {request}: this machine has {available} {what}; ask for at most "
            f"{available} (or --gpus all)"
        )
    return request


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
        assert self.ops is not None, "load() first"  # load made the ops (and close dropped them)
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

    def ensure_acc(self) -> None:
        """The integrator's cached a(x) made current (evaluated now if it is not), for a reader of the
        devices' acceleration rows (one GPU's A/B, app/backends/cuda/compare.py)."""
        if not self.integrator.acc_valid:
            self._evaluate_forces()

    def _evaluate_forces(self) -> None:
        """a(x) of the current positions, each device its share's rows: the integrator's cache from now on."""
        assert self.ops is not None, "load() first"
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
        assert self.ops is not None, "load() first"
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
