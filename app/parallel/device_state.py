"""What one device of a multi-device run is (app/parallel/multidevice.py): the `DeviceState` operations the
drivers, the exchanges and the decompositions call, and the `DeviceFault` that names a device that failed.
The device classes implement it: CPU "devices" (app/backends/cpu_multi.py), GPUs (app/backends/cuda/
share_device.py), MPI ranks' devices (app/backends/distributed.py)."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from app.core.errors import RuntimeFault
from app.engine.forces import ForceEvaluator, ForceWork, Span
from app.model.physics import Physics


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

    # the device's clock: HostTimer or EventTimer (`with timer.time(category): ...`); read-only here, so that
    # either satisfies it
    @property
    def timer(self) -> object: ...

    integrate_all: bool  # the run's decomposition integrates every row on every device (domains)
    evaluator: ForceEvaluator  # the record it runs, bound to this device (tunables reach it here)

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

    # the body (load order) in each state row (on a GPU: a host copy of its device array); read-only here:
    # a GPU's is a property, a CPU device's an attribute
    @property
    def ids(self) -> np.ndarray: ...

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
