"""Several devices without host waits, without a GPU: a twin whose "GPUs" really queue their work.

Each twin GPU has a queue (its stream): kick-drift, force, kick, the exchange's copies into it and GPU 0's
render copies are queued there, with the marks and waits of `multidevice.queue_after`, and a scheduler
runs the queues' heads in a random interleaving (a wait is ready once the mark it names has run on its
own queue). Whatever order the scheduler picks, the positions and speeds must be bitwise those of the
single CPU backend: a missing wait between two devices shows as a wrong trajectory (the last test takes
the waits away and sees it). Also counted: blocking waits on the devices (none while stepping) and the
host's waits for the device threads (at most one per step, one per step() call with one device).
"""

from __future__ import annotations

import random
import threading
from collections import deque

import numpy as np
import pytest
from test_multidevice_backend import cloud
from test_multidevice_interop import KERNEL, TwinGpuDevice, TwinGpus, memmove, single_cpu, twin_backend

import app.backends.cuda.multi_interop as cuda_multi_interop
import app.backends.cuda.peer as cuda_peer
from app.engine.forces import all_pairs_work
from app.model.physics import Physics
from app.parallel.multidevice import DRIVERS


class Streams:
    """The twin GPUs' queues and the scheduler that runs them in a random order (thread-safe: the
    threads driver queues from one thread per device)."""

    def __init__(self, seed: int):
        self.queues: dict[int, deque] = {}
        self.done: set = set()  # the marks that have run (kept alive: ids of freed ones come back)
        self.rng = random.Random(seed)
        self.lock = threading.RLock()

    def queue(self, key: int, kind: str, payload) -> None:
        with self.lock:
            self.queues.setdefault(key, deque()).append((kind, payload))
            for _ in range(self.rng.randint(0, 2)):  # the GPUs run a little while the host queues more
                if not self._run_one():
                    break

    def _ready(self) -> list[deque]:
        return [q for q in self.queues.values() if q and (q[0][0] != "wait" or q[0][1] in self.done)]

    def _run_one(self) -> bool:
        ready = self._ready()
        if not ready:
            return False
        kind, payload = self.rng.choice(ready).popleft()
        if kind == "run":
            payload()
        elif kind == "mark":
            self.done.add(payload)
        return True

    def drain(self) -> None:
        with self.lock:
            while self._run_one():
                pass
            assert not any(self.queues.values()), "queued work waits for a mark that was never queued"


class QueueingDriver:
    """FakeGpu's driver whose device-to-device copy is queued on the GPU that issues it."""

    def __init__(self, streams: Streams, key: int, copies: list):
        self.streams, self.key, self.copies = streams, key, copies

    def memcpy_dtod_async(self, dst: int, src: int, nbytes: int) -> None:
        self.copies.append(("exchange", dst, src, nbytes))
        self.streams.queue(self.key, "run", lambda: memmove(dst, src, nbytes))


class QueueingGpuDevice(TwinGpuDevice):
    """A twin GPU that queues its work (each launch captures its rows when queued, as a kernel's
    arguments are) and counts the host's blocking waits on it."""

    def __init__(self, *args, streams: Streams, **kwargs):
        super().__init__(*args, **kwargs)
        self.streams, self.blocking_waits = streams, 0
        self.device.drv = QueueingDriver(streams, id(self), kwargs["copies"])

    def _queue(self, fn) -> None:
        self.streams.queue(id(self), "run", fn)

    def force(self):
        share = self.share
        self._queue(lambda: self.evaluator.evaluate(self.pos, self.acc, share, self.everyone))
        return all_pairs_work(share, self.everyone)

    def kick_drift(self, half_dt, dt):
        ops = self._share_ops()
        self._queue(lambda: ops.kick_drift(half_dt, dt))

    def kick(self, half_dt):
        ops = self._share_ops()
        self._queue(lambda: ops.kick(half_dt))

    def euler_damped(self, dt, damping):
        ops = self._share_ops()
        self._queue(lambda: ops.euler_damped(dt, damping))

    def launch_check(self):
        self._queue(super().launch_check)  # found once the queue gets there, as a GPU's flag

    def render_rows(self, pos, speed):
        self._queue(lambda: TwinGpuDevice.render_rows(self, pos, speed))  # on its stream, as the GPU's

    def check_result(self, wait):
        if wait:
            self.synchronize()
        return super().check_result(wait)

    def mark(self, tag):
        token = object()
        self.streams.queue(id(self), "mark", token)
        return token

    def wait_for(self, marker):
        self.streams.queue(id(self), "wait", marker)

    def synchronize(self):
        self.blocking_waits += 1
        self.streams.drain()

    def rows(self, field, span):
        self.synchronize()
        return super().rows(field, span)

    def set_rows(self, field, span, values):
        self.synchronize()
        super().set_rows(field, span, values)


class QueueingGpus(TwinGpus):
    """TwinGpus whose devices queue their work on `streams`; GPU 0's render copies queue on its stream."""

    def __init__(self, seed: int):
        super().__init__()
        self.streams = Streams(seed)
        self.devices: list[QueueingGpuDevice] = []

    def factory(self, k):
        def make(bodies, physics, kernel, shares):
            self.devices = [
                QueueingGpuDevice(
                    i,
                    kernel,
                    physics,
                    bodies,
                    share,
                    copies=self.copies,
                    reads=self.reads,
                    streams=self.streams,
                )
                for i, share in enumerate(shares)
            ]
            return self.devices

        return make

    def _copy(self, dst, src, nbytes):
        self.copies.append(("render", dst, src, nbytes))
        self.streams.queue(id(self.devices[0]), "run", lambda: memmove(dst, src, nbytes))


def step_and_check(k: int, driver: str, seed: int, calls=(1, 3, 4, 2)):
    """Step a K-twin-GPU backend drawing through the twin VBOs; after each step() call (the GPUs drained,
    as GL's draw after the unmap) the VBOs must hold the single CPU backend's state. Returns the counts."""
    bodies, physics = cloud(), Physics(softening=0.02, dt=2e-3)
    kind = QueueingGpus(seed)
    backend = twin_backend(k, driver, kind)
    host_waits = []
    try:
        backend.load(bodies, physics, KERNEL)
        assert backend.attach_gl_buffers(7, 8)
        gl = backend.gl_buffers
        kind.streams.drain()
        done = 0
        for steps in calls:
            before = [d.blocking_waits for d in kind.devices]
            driver_waits = backend._run.ops.driver.waits
            backend.step(steps)
            host_waits.append(
                (
                    steps,
                    backend._run.ops.driver.waits - driver_waits,
                    sum(d.blocking_waits for d in kind.devices) - sum(before),
                )
            )
            kind.streams.drain()
            done += steps
            want_pos, want_speed = single_cpu(bodies, physics, done)
            assert np.array_equal(gl.pos, want_pos), f"positions after {done} steps"
            assert np.array_equal(gl.speed, want_speed), f"speeds after {done} steps"
    finally:
        kind.streams.drain()
        backend.close()
    return host_waits


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("k", [1, 2, 3])
def test_queued_work_in_any_order_gives_the_single_device_trajectory(k, driver, seed):
    step_and_check(k, driver, seed)


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("k", [1, 3])
def test_stepping_never_blocks_on_a_device_and_waits_for_threads_at_most_once_a_step(k, driver):
    for steps, thread_waits, device_waits in step_and_check(k, driver, seed=5):
        assert device_waits == 0  # no host wait on a GPU while stepping and drawing
        if driver == "single" or (k, driver) == (1, "auto"):  # auto: one device needs no thread
            assert thread_waits == 0
        elif k == 1:
            assert thread_waits == 1  # one hand-over per step() call: no exchange to order
        else:
            assert thread_waits <= steps + 1  # before each step's exchange, and once at the end


def test_without_the_waits_between_devices_the_trajectory_breaks(monkeypatch):
    """The control: the same run with `queue_after` doing nothing is caught by the check above."""
    monkeypatch.setattr(cuda_peer, "queue_after", lambda *args: None)
    monkeypatch.setattr(cuda_multi_interop, "queue_after", lambda *args: None)
    with pytest.raises(AssertionError, match="after"):
        for seed in range(4):
            step_and_check(3, "single", seed)
