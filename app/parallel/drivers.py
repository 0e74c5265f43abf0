"""The drivers of a multi-device run (app/parallel/multidevice.py): who issues each device's work.

Two drivers, as in the CUDA Handbook's multi-GPU chapter: `ThreadsDriver` runs each device's work on a
host thread of its own (the thread-per-GPU design; a device is always served by the same thread, as
CUDA contexts are per thread), `SingleDriver` issues every device's work from the calling thread (the
single-thread design: on GPUs the work is asynchronous). A failure on one device stops the step on all
and is raised as a DeviceFault naming the device. `make_driver` picks one by name (the settings'
`DRIVERS`; "auto" is resolved by the run: MultiDeviceRun.driver_for).
"""

from __future__ import annotations

import inspect
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from app.engine.forces import drain
from app.model.config import DRIVERS
from app.parallel.device_state import DeviceFault, DeviceState

POLL_S = 2e-5  # the single driver's sleep while no device's phase is ready (a tree phase is ~0.1-30 ms)
# Python hands the GIL to a waiting thread only when the holder blocks or after the switch interval (5 ms
# by default). A device thread issuing a tree build (dozens of small launches and CuPy calls, none of
# which lets go of the GIL) then keeps the other device threads from issuing theirs for up to 5 ms at a
# time, and two GPUs take turns instead of working together. With several device threads the interval
# is lowered to this, process-wide.
SWITCH_INTERVAL_S = 2e-4


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
        running: list[list[Any]] = []  # [device index, phases, ready test of the phase it yielded]
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
