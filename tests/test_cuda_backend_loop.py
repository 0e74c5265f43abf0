"""CudaBackend's stepping loop without a GPU: the real `load`, `step`, `check_finite` and `_prepare` over a
fake device (no driver, a host clock, allocations that are only numbers), a fake evaluator and a
recording StateOps in place of the kernels. What it pins is the host-side logic the GPU tests cannot
isolate: which steps launch the non-finite check, the step number a NonFiniteState names, the force work
summed over a call, the timer's brackets, the time after a failed call and a(x) left invalid by it or by
a change of precision. tests/test_cuda.py runs the same backend on a real GPU."""

from __future__ import annotations

from contextlib import nullcontext
from types import SimpleNamespace

import numpy as np
import pytest

from app.backends.cuda import backend as cuda_backend
from app.backends.cuda.backend import CudaBackend
from app.bodies import Bodies
from app.errors import NonFiniteState
from app.forces import ForceWork
from app.physics import Physics
from app.timing import HostTimer

N = 16
LEAPFROG = Physics(softening=0.01, dt=1e-3, integrator="leapfrog")


class FakeAlloc:
    def __init__(self, address: int):
        self.address = address

    def __int__(self) -> int:
        return self.address

    def free(self) -> None:
        pass


class BracketTimer(HostTimer):
    """The device clock's interface, writing down the categories it bracketed."""

    def __init__(self):
        super().__init__()
        self.brackets: list[str] = []

    def time(self, category: str):
        self.brackets.append(category)
        return super().time(category)


class FakeDevice:
    def __init__(self, ordinal: int):
        self.ordinal = ordinal
        self.scope = nullcontext()
        self.timer = BracketTimer()
        addresses = iter(range(0x1000, 0x100000, 0x1000))
        self.drv = SimpleNamespace(
            mem_get_info=lambda: (2**30, 2**30), mem_alloc=lambda size: FakeAlloc(next(addresses)),
            memcpy_htod=lambda dst, src: None, memcpy_dtoh=lambda dst, src: None,
            Context=SimpleNamespace(synchronize=lambda: None))

    def scratch(self, key: str, size: int) -> int:
        return hash(key) & 0xFFFF0

    def close(self) -> None:
        pass


class Gpu:
    """What the fakes share: the steps the ops took, the checks launched (after how many steps), the
    answer the next check result gives, and the precision of the record the evaluator resolves to."""

    def __init__(self):
        self.calls: list[str] = []
        self.steps = 0
        self.checks: list[int] = []
        self.bad = -1
        self.fail_on_force: int | None = None
        self.precision = "fp32"

    @property
    def forces(self) -> int:
        return self.calls.count("force")


class RecordingOps:
    """The StateOps the backend steps: records each call, counts completed steps, fails when told."""

    def __init__(self, gpu: Gpu):
        self.gpu = gpu

    def force(self) -> ForceWork:
        self.gpu.calls.append("force")
        if self.gpu.forces == self.gpu.fail_on_force:
            raise RuntimeError("launch failed")
        return ForceWork(interactions=N * N, pair_equivalent=N * N, evaluations=1)

    def kick_drift(self, half_dt, dt):
        self.gpu.calls.append("kick_drift")

    def kick(self, half_dt):
        self.gpu.calls.append("kick")
        self.gpu.steps += 1

    def euler_damped(self, dt, damping):
        self.gpu.calls.append("euler_damped")
        self.gpu.steps += 1


class FakeEvaluator:
    def __init__(self, gpu: Gpu):
        self.gpu = gpu

    def prepare(self, n: int) -> None:
        pass

    def active(self, n: int):
        return SimpleNamespace(precision=self.gpu.precision), {}

    def stage_ms(self) -> dict:
        return {}

    def forget(self) -> None:
        pass


@pytest.fixture
def gpu():
    return Gpu()


@pytest.fixture
def backend(gpu, monkeypatch):
    class FakeCheck:
        def __init__(self, device):
            pass

        def prepare(self):
            pass

        def launch(self, pos, vel, rows):
            gpu.checks.append(gpu.steps)

        def result(self, wait: bool) -> int:
            return gpu.bad

        def forget(self):
            pass

    monkeypatch.setattr(CudaBackend, "why_not", classmethod(lambda cls: None))
    monkeypatch.setattr(cuda_backend, "CudaDevice", FakeDevice)
    monkeypatch.setattr(cuda_backend, "default_ordinal", lambda: 0)
    monkeypatch.setattr(cuda_backend, "NonFiniteCheck", FakeCheck)
    monkeypatch.setattr(cuda_backend, "_ATEXIT", True)  # nothing of this test at the process's exit
    made = CudaBackend()
    evaluator = FakeEvaluator(gpu)
    made.evaluator = lambda name=None: evaluator
    made._ops = lambda pos, speed: RecordingOps(gpu)
    made.load(bodies(), LEAPFROG)
    yield made
    made.close()


def bodies() -> Bodies:
    rng = np.random.default_rng(1)
    return Bodies.from_arrays(rng.normal(size=(N, 3)), rng.normal(size=(N, 3)), np.full(N, 1.0 / N))


def test_checks_fall_on_every_kth_step_counted_across_calls_and_loads(backend, gpu):
    """A check after every check_every-th step, counted across step() calls, none with check_every = 0.
    The count runs since load, as in the runs over devices (app/multidevice.py): a reload restarts it
    (one GPU counted over the backend's life before the Stepper owned the count)."""
    assert backend.check_every == 8
    for _ in range(6):
        backend.step(3)
    assert gpu.checks == [8, 16]
    backend.check_every = 0
    backend.step(10)
    assert gpu.checks == [8, 16]
    backend.check_every = 8
    backend.load(bodies(), LEAPFROG)
    backend.step(9)  # steps 1..9 of the new state (29..37 the fake took): a check after its 8th
    assert gpu.checks == [8, 16, 36]
    assert backend.time == pytest.approx(9 * LEAPFROG.dt)  # the time restarts at load too


def test_a_bad_body_is_reported_with_the_step_count(backend, gpu):
    backend.step(5)
    gpu.bad = 7
    with pytest.raises(NonFiniteState) as found:
        backend.step(3)
    assert (found.value.index, found.value.step) == (7, 8) and gpu.checks == [8]
    assert found.value.time == pytest.approx(8 * LEAPFROG.dt)
    with pytest.raises(NonFiniteState) as found:
        backend.check_finite()
    assert found.value.step == 8 and gpu.checks == [8, 8]


def test_work_is_summed_and_each_launch_bracketed(backend, gpu):
    timer = backend.device.timer
    timings = backend.step(3)  # a(x) of the loaded state first, then one evaluation a step
    assert (timings.force_evals, timings.interactions, timings.pair_equivalent) == (4, 4 * N * N, 4 * N * N)
    assert timer.brackets == ["force"] + ["integrate", "force", "integrate"] * 3
    assert timings.steps == 3 and timings.force_ms >= 0.0 and timings.integrate_ms >= 0.0
    timer.brackets.clear()
    assert backend.step(2).force_evals == 2  # the cached a(x) carries over to the next call
    assert timer.brackets == ["integrate", "force", "integrate"] * 2
    assert backend.step(0).force_evals == 0 and timer.brackets == ["integrate", "force", "integrate"] * 2


def test_a_failed_step_leaves_a_of_x_invalid_and_the_time_at_the_last_whole_step(backend, gpu):
    backend.step(2)
    gpu.fail_on_force = gpu.forces + 2  # the closing evaluation of the call's second step
    with pytest.raises(RuntimeError, match="launch failed"):
        backend.step(5)
    assert gpu.steps == 3 and backend.time == pytest.approx(3 * LEAPFROG.dt)
    gpu.fail_on_force = None
    gpu.calls.clear()
    assert backend.step(1).force_evals == 2  # a(x) evaluated again before the step
    assert gpu.calls == ["force", "kick_drift", "force", "kick"]
    backend.step(4)
    assert gpu.checks == [8]  # the failed call's whole steps counted towards the cadence


def test_a_change_of_precision_leaves_a_of_x_invalid(backend, gpu):
    backend.step(1)
    gpu.precision = "fp64"  # e.g. `best` resolving to the fp64 record: the double state is promoted
    assert backend.step(1).force_evals == 2
    assert backend.step(1).force_evals == 1
    gpu.precision = "fp32"
    assert backend.step(1).force_evals == 2


def test_physics_changes_that_move_a_of_x_invalidate_it(backend, gpu):
    backend.step(1)
    backend.set_physics(LEAPFROG.with_(dt=2e-3))  # the same forces: a(x) still holds
    assert backend.step(1).force_evals == 1
    backend.set_physics(LEAPFROG.with_(dt=2e-3, softening=0.02))
    assert backend.step(1).force_evals == 2
