"""A decomposition that lives in tests/: the proof that docs/architecture.md's row "a new way of splitting a
force over devices" is true and complete, as tests/toy_backend.py is for a backend.

`replicated`: every device evaluates the forces of every body (all targets against all sources) and
integrates every body. Nothing moves between devices, ever: every copy starts equal and every device does
the same arithmetic on the same inputs, so the copies stay bitwise equal (the domain split's argument,
without its tree). Useless for speed, and that is the point: it is the smallest split that needs a device
operation of its own (`force_all`) and both of the update steps' switches (`integrate_all`,
`exchanges_positions`).

Following the row, each piece where it says:
- the `Decomposition` subclass and its one instance (`REPLICATED`), with `force(ops)`, `integrate_all`,
  `exchanges_positions`, `driver` and `sorts_state`;
- the device operation it calls: `ReplicatedDevice` adds it to the `DeviceState` protocol, and the CPU
  device class implements it (`ReplicatedCpuDevice`; in app/ it would be a method of CpuDevice and of the
  GPU's ShareDevice). A subclass outside app/ needs a way into the run: a device kind whose factory makes
  it (`ReplicatedCpuDevices`, which the backend's `device_kind()` returns), the row "a new kind of device";
- no exchange operation: it needs none;
- the records that name it (`replicated_record`: a CPU all-pairs record with `decomposition=REPLICATED`).
Nothing in app/ changes: MultiDeviceOps runs it as it runs the package's own splits.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Protocol

from app.backends.cpu_forces import cpu_record
from app.backends.cpu_multi import CpuDevice, CpuDevices
from app.engine.forces import ForceWork, KernelRecord, Span
from app.model.bodies import Bodies
from app.model.physics import Physics
from app.parallel.decomposition import Decomposition
from app.parallel.device_state import DeviceState


class ReplicatedDevice(DeviceState, Protocol):
    """The DeviceState operation a replicated split calls, beside the others."""

    def force_all(self) -> ForceWork: ...  # acc[all] = F(pos[all]; pos[all]), timed as "force"


class Replicated(Decomposition):
    name = "replicated"
    doc = "each device: every target against every source; every device integrates every body"
    exchanges = "nothing (every copy does the same arithmetic on the same inputs)"
    integrate_all = True
    exchanges_positions = False
    # Every device runs the whole evaluation, which on CPU devices is already parallel over every core of
    # the one host: a thread per device would only contend for them. (Not the base class's "threads", so
    # that a test of `--gpu-driver auto` shows the attribute is read.)
    driver = "single"
    sorts_state = False

    def force(self, ops) -> None:
        def evaluate(i: int, device: ReplicatedDevice) -> None:
            work = device.force_all()
            # The other copies' work is the same evaluation again, not more of the answer: counted once,
            # as every split counts its work (nothing twice), so that rates are the answer's
            if i == 0:
                ops.add_work(i, work)

        ops.submit(evaluate)


REPLICATED = Replicated()


class ReplicatedCpuDevice(CpuDevice):
    """A CPU "device" that also evaluates every row (the operation `Replicated.force` calls)."""

    def force_all(self) -> ForceWork:
        with self.timer.time("force"):
            return self.evaluator.evaluate(self.pos, self.acc, self.everyone, self.everyone)


def replicated_cpu_devices(
    bodies: Bodies, physics: Physics, kernel: str, shares: list[Span], lookup=cpu_record
) -> list[CpuDevice]:
    """A MultiDeviceRun factory (app/parallel/multidevice.py DeviceFactory): a ReplicatedCpuDevice a share."""
    return [ReplicatedCpuDevice(i, kernel, physics, bodies, share, lookup) for i, share in enumerate(shares)]


class ReplicatedCpuDevices(CpuDevices):
    """The CPU backend's device kind, making ReplicatedCpuDevices (every record of the backend still runs:
    they are CpuDevices with one operation more). MPI ranks' devices (`rank_maker`) are not covered."""

    def factory(self, k: int):
        return partial(replicated_cpu_devices, lookup=self.lookup)


def replicated_record(base: str = "cpu-fp64") -> KernelRecord:
    """The CPU all-pairs record `base` split as `replicated`: the same policy (so the same arithmetic),
    another name, no roles (the package's own records keep theirs: `exact`, `reference`, ...)."""
    record = cpu_record(base)
    return dataclasses.replace(
        record,
        name=f"toy-replicated-{base.removeprefix('cpu-')}",
        doc=f"{record.doc}; split over devices as `replicated` (tests/toy_decomposition.py)",
        tuned=False,
        roles=frozenset(),
        decomposition=REPLICATED,
    )
