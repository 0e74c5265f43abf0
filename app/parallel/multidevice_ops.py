"""The integrator's StateOps over several devices (app/parallel/multidevice.py): `MultiDeviceOps` hands each
phase (kick-drift, force, kick) to the devices through the driver, runs the record's decomposition for the
force, the exchange of positions after a drift, the non-finite checks, and the shares' hand-over
(`reshare`); the force work and each device's times come back from `finish` and `take_times`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import suppress

import numpy as np

from app.engine.forces import ForceWork, Span
from app.parallel.decomposition import TARGETS
from app.parallel.device_state import DeviceFault, DeviceState

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
