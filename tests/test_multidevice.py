"""The multi-device driver over K CPU "devices" (CI's twin of several GPUs).

Splitting and re-balancing are pure functions; both drivers, the host exchange and re-sharing run on
real numba kernels, and accelerations and a 100-step fp64 trajectory from K shares must be bitwise those
of one device (the CPU backend itself).
"""

from __future__ import annotations

import numpy as np
import pytest

from app.backends.cpu import CPUBackend
from app.backends.cpu_multi import cpu_devices
from app.engine.forces import Span
from app.model.bodies import Bodies
from app.model.physics import Physics
from app.parallel.multidevice import DRIVERS, DeviceFault, MultiDeviceRun, balanced_weights, split

N = 301  # uneven shares for every K below


def cloud(n: int = N, seed: int = 3) -> Bodies:
    rng = np.random.default_rng(seed)
    return Bodies.from_arrays(
        rng.normal(size=(n, 3)), rng.normal(scale=0.5, size=(n, 3)), rng.uniform(0.5, 1.5, n) / n
    )


# --- splitting and balancing --------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [0, 1, 2, 7, 301, 65536])
@pytest.mark.parametrize("weights", [[1.0], [1, 1], [1, 1, 1], [3, 1], [1, 0, 2], [0.2, 0.3, 0.5, 1e-9]])
def test_split_covers_every_body_once_in_proportion(n, weights):
    spans = split(n, weights)
    assert len(spans) == len(weights) and spans[0].start == 0 and spans[-1].stop == n
    assert all(a.stop == b.start for a, b in zip(spans, spans[1:], strict=False))
    total = sum(weights)
    for span, w in zip(spans, weights, strict=True):
        assert abs(span.count - n * w / total) < 1.0


def test_split_rejects_nonsense_weights():
    for bad in ([], [0, 0], [1, -1]):
        with pytest.raises(ValueError):
            split(10, bad)


def test_balanced_weights_follow_the_measured_speed():
    shares = [Span(0, 500), Span(500, 500)]
    w = balanced_weights([1, 1], shares, [1.0, 3.0], smoothing=1.0)  # device 0 three times as fast
    assert w == pytest.approx([0.75, 0.25])
    half = balanced_weights([1, 1], shares, [1.0, 3.0], smoothing=0.5)
    assert half == pytest.approx([0.625, 0.375])  # blended with the previous split
    assert balanced_weights([1, 2], shares, [0.0, 3.0]) == [1, 2]  # no measurement: unchanged
    assert balanced_weights([1, 2], [Span(0, 0), Span(0, 9)], [1.0, 1.0]) == [1, 2]


# --- K devices against one --------------------------------------------------------------------------
def one_device(bodies: Bodies, physics: Physics, kernel: str, steps: int = 0):
    backend = CPUBackend()
    try:
        backend.load(bodies, physics, kernel)
        if steps:
            backend.step(steps)
            state = backend.state()
            return state.pos, state.vel
        return backend.accelerations()
    finally:
        backend.close()


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("kernel", ["cpu-fp64", "cpu-simd"])
def test_accelerations_from_k_shares_equal_one_device(kernel, k, driver):
    bodies, physics = cloud(), Physics(softening=0.02)
    multi = MultiDeviceRun(cpu_devices, k, driver)
    try:
        multi.load(bodies, physics, kernel)
        got = multi.accelerations()
    finally:
        multi.close()
    assert np.array_equal(got, one_device(bodies, physics, kernel))


@pytest.mark.parametrize("integrator", ["leapfrog", "euler-damped"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_fp64_trajectory_from_three_shares_is_bitwise_one_devices(driver, integrator):
    bodies = cloud()
    physics = Physics(softening=0.02, dt=2e-3, integrator=integrator, damping=0.999)
    multi = MultiDeviceRun(cpu_devices, 3, driver, weights=[1, 2, 1.5])
    try:
        multi.load(bodies, physics, "cpu-fp64")
        multi.step(100)
        pos, vel = multi.gathered("pos")[:, :3], multi.gathered("vel")[:, :3]
        for device in multi.devices:  # the exchange left every copy of the positions whole
            assert np.array_equal(device.pos, multi.gathered("pos"))
        assert multi.ops.exchange_count == 100
    finally:
        multi.close()
    ref_pos, ref_vel = one_device(bodies, physics, "cpu-fp64", steps=100)
    assert np.array_equal(pos, ref_pos) and np.array_equal(vel, ref_vel)


def test_rebalancing_moves_rows_and_keeps_the_trajectory(monkeypatch):
    bodies, physics = cloud(), Physics(softening=0.02, dt=2e-3)
    multi = MultiDeviceRun(cpu_devices, 2, "threads")
    try:
        multi.load(bodies, physics, "cpu-fp64")
        multi.step(10)
        monkeypatch.setattr(multi.ops, "force_times_ms", lambda: [1.0, 4.0])  # device 1 is 4x slower
        spans = multi.rebalance()
        assert spans[0].count > spans[1].count and spans[0].count + spans[1].count == N
        multi.step(10)  # rows that changed hands kept their velocities and cached accelerations
        pos, vel = multi.gathered("pos")[:, :3], multi.gathered("vel")[:, :3]
    finally:
        multi.close()
    ref_pos, ref_vel = one_device(bodies, physics, "cpu-fp64", steps=20)
    assert np.array_equal(pos, ref_pos) and np.array_equal(vel, ref_vel)


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_failing_device_stops_the_step_and_is_named(driver, monkeypatch):
    multi = MultiDeviceRun(cpu_devices, 3, driver)
    try:
        multi.load(cloud(), Physics(softening=0.02), "cpu-fp64")

        def broken():
            raise RuntimeError("injected kernel failure")

        monkeypatch.setattr(multi.devices[1], "force", broken)
        with pytest.raises(DeviceFault, match=r"device 1 \(cpu1\): RuntimeError: injected kernel failure"):
            multi.step(1)
        assert multi.integrator.acc_valid is False  # nothing half-done is taken for a valid a(x)
    finally:
        multi.close()


# --- tasks in phases (the tree's evaluation: a generator yielding before each host read) -----------------
def _phased_tasks(log: list, fail_at: tuple[int, int] | None = None):
    def task(i):
        for phase in range(3):
            if (i, phase) == fail_at:
                raise RuntimeError(f"injected failure in phase {phase}")
            log.append((i, phase))
            yield
        log.append((i, "done"))

    return [lambda i=i: task(i) for i in range(3)]


def test_the_single_driver_takes_phased_tasks_in_turns():
    """Device 0's first phase, device 1's, device 2's, then device 0's second ...: while the host waits
    for one GPU, the others run what it queued (the tree on two H100s from one thread)."""
    from app.parallel.multidevice import SingleDriver

    log: list = []
    SingleDriver([object()] * 3).submit(_phased_tasks(log))
    assert log[:9] == [(i, p) for p in range(3) for i in range(3)]
    assert sorted(x for x in log if x[1] == "done") == [(0, "done"), (1, "done"), (2, "done")]


def test_the_threads_driver_runs_each_phased_task_to_its_end():
    from app.parallel.multidevice import ThreadsDriver

    log: list = []
    driver = ThreadsDriver([object()] * 3)
    try:
        driver.submit(_phased_tasks(log))
        driver.finish()
    finally:
        driver.close()
    for i in range(3):
        assert [x for x in log if x[0] == i] == [(i, 0), (i, 1), (i, 2), (i, "done")]


class _Named:
    def __init__(self, name):
        self.name = name


@pytest.mark.parametrize("driver", ["threads", "single"])
def test_a_phase_that_fails_names_its_device(driver):
    from app.parallel.multidevice import make_driver

    devices = [_Named(f"gpu{i}") for i in range(3)]
    run = make_driver(driver, devices)
    try:
        named = r"device 2 \(gpu2\): RuntimeError: injected failure in phase 1"
        with pytest.raises(DeviceFault, match=named):
            run.submit(_phased_tasks([], fail_at=(2, 1)))
            run.finish()
    finally:
        run.close()


def test_a_device_whose_work_is_not_ready_does_not_hold_up_the_others():
    """Device 0's first phase queued behind other work (GPU 0 drawing the last frame): the single driver
    takes device 1's phases meanwhile, and comes back to device 0 once its ready test says so."""
    from app.parallel.multidevice import SingleDriver

    log: list = []
    polls = {"n": 0}

    def held_up():
        polls["n"] += 1
        return "1 done" in log

    def device0():
        log.append("0 queued")
        yield held_up
        log.append("0 read")

    def device1():
        for phase in range(3):
            log.append(f"1 phase {phase}")
            yield lambda: True
        log.append("1 done")

    SingleDriver([_Named("gpu0"), _Named("gpu1")]).submit([device0, device1])
    assert log == ["0 queued", "1 phase 0", "1 phase 1", "1 phase 2", "1 done", "0 read"]
    assert polls["n"] >= 2  # asked, not waited on
