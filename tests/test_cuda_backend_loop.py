"""CudaBackend's stepping loop without a GPU: the real backend, run (app/parallel/multidevice.py) and GPU
device (CudaShareDevice) over a fake CUDA device (no driver, a host clock, allocations that are only numbers),
fake evaluators and a recording StateOps in place of the kernels. What it pins is the host-side logic
the GPU tests cannot isolate: which steps launch the non-finite check, the step number a NonFiniteState
names, the force work summed over a call, the timer's brackets, the time after a failed call, a(x) left
invalid by it or by a kernel switch or a change of forces, and a kernel switch in place (compiled
first, the fp64 state promoted from the float rows in row order). tests/test_cuda.py runs the same
backend on a real GPU."""

from __future__ import annotations

from contextlib import nullcontext
from types import SimpleNamespace

import numpy as np
import pytest

from app.backends.cuda import backend as cuda_backend
from app.backends.cuda import multi as cuda_multi
from app.backends.cuda import registry
from app.backends.cuda import share_device as cuda_share_device
from app.backends.cuda.backend import CudaBackend
from app.backends.cuda.errors import KernelCompileError
from app.backends.cuda.state import GpuState
from app.core.errors import NonFiniteState, StateOutOfMemory
from app.engine.clocks import HostTimer
from app.engine.forces import ForceWork
from app.model.bodies import Bodies
from app.model.physics import Physics

N = 16
LEAPFROG = Physics(softening=0.01, dt=1e-3, integrator="leapfrog")
FP32, FP64 = "shared", "fp64"  # two real records (the fakes stand in for their kernels)


POOL = {"free": 2**30}  # the fake GPU's free bytes, shared by every FakeDevice of a test (one GPU)


class FakeAlloc:
    def __init__(self, address: int, size: int):
        self.address, self.size = address, size
        POOL["free"] -= size

    def __int__(self) -> int:
        return self.address

    def free(self) -> None:
        POOL["free"] += self.size
        self.size = 0


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
        self.name = f"fake GPU {ordinal}"
        self.scope = nullcontext()
        self.timer = BracketTimer()
        addresses = iter(range(0x1000, 0x100000, 0x1000))
        self.drv = SimpleNamespace(
            mem_get_info=lambda: (POOL["free"], 2**30),
            mem_alloc=lambda size: FakeAlloc(next(addresses), size),
            memcpy_htod=self._htod,
            memcpy_dtoh=lambda dst, src: None,
            memset_d32=lambda dst, value, count: None,
            Context=SimpleNamespace(synchronize=lambda: None),
            MemoryError=MemoryError,
        )
        self.uploads: list[tuple[int, np.ndarray]] = []

    def _htod(self, dst, src) -> None:
        self.uploads.append((int(dst), np.array(src)))

    def scratch(self, key: str, size: int) -> int:
        return hash(key) & 0xFFFF0

    def close(self) -> None:
        pass


class Gpu:
    """What the fakes share: the steps the ops took, the checks launched (after how many steps), the
    answer the next check result gives, the force evaluation to fail, the records compiled and the ops
    made (by precision)."""

    def __init__(self):
        self.calls: list[str] = []
        self.steps = 0
        self.checks: list[int] = []
        self.bad = -1
        self.fail_on_force: int | None = None
        self.fail_compile: str | None = None
        self.prepared: list[str] = []
        self.promoted: list[np.ndarray] = []

    @property
    def forces(self) -> int:
        return self.calls.count("force")


class RecordingOps:
    """The StateOps updates the device makes: records each call and counts completed steps."""

    def __init__(self, gpu: Gpu, force, precision: str):
        self.gpu, self.force, self.precision = gpu, force, precision

    def kick_drift(self, half_dt, dt):
        self.gpu.calls.append(f"kick_drift {self.precision}")

    def kick(self, half_dt):
        self.gpu.calls.append("kick")
        self.gpu.steps += 1

    def euler_damped(self, dt, damping):
        self.gpu.calls.append("euler_damped")
        self.gpu.steps += 1


class FakeEvaluator:
    def __init__(self, gpu: Gpu, record):
        self.gpu, self.record = gpu, record

    def set_physics(self, physics) -> None:
        self.physics = physics

    def set_tunables(self, **values) -> None:
        pass

    def prepare(self, n: int) -> None:
        if self.record.name == self.gpu.fail_compile:
            raise KernelCompileError("fake.cu", "sm_90", 1, "error: injected")
        self.gpu.prepared.append(self.record.name)

    def active(self, n: int, devices: int = 1):
        return self.record, {}

    def evaluate(self, pos, acc, targets, sources) -> ForceWork:
        self.gpu.calls.append("force")
        if self.gpu.forces == self.gpu.fail_on_force:
            raise RuntimeError("launch failed")
        return ForceWork(interactions=N * N, pair_equivalent=N * N, evaluations=1)

    def stage_ms(self) -> dict:
        return {}


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
    for module in (cuda_backend, cuda_share_device):
        monkeypatch.setattr(module, "CudaDevice", FakeDevice)
    monkeypatch.setattr(cuda_backend, "default_ordinal", lambda: 0)
    monkeypatch.setattr(cuda_share_device, "NonFiniteCheck", FakeCheck)
    monkeypatch.setattr(
        cuda_share_device, "make_evaluator", lambda record, device, records: FakeEvaluator(gpu, record)
    )
    monkeypatch.setattr(cuda_multi.GpuDevices, "count", staticmethod(lambda: 2))
    monkeypatch.setattr(GpuState, "ops", lambda self, force, span: RecordingOps(gpu, force, "fp32"))
    monkeypatch.setattr(GpuState, "ops64", lambda self, force: RecordingOps(gpu, force, "fp64"))
    monkeypatch.setattr(GpuState, "promote", lambda self, mass: gpu.promoted.append(np.array(mass)))
    monkeypatch.setattr(cuda_backend, "_ATEXIT", True)  # nothing of this test at the process's exit
    POOL["free"] = 2**30
    made = CudaBackend()
    made.load(bodies(), LEAPFROG, FP32)
    yield made
    made.close()


def bodies(n: int = N) -> Bodies:
    rng = np.random.default_rng(1)
    return Bodies.from_arrays(rng.normal(size=(n, 3)), rng.normal(size=(n, 3)), rng.uniform(1, 2, n) / n)


def test_one_gpu_is_the_run_over_one_device(backend):
    from app.backends.multi import MultiDeviceBackend, multi_backend_class

    assert isinstance(backend, MultiDeviceBackend) and backend.k == 1 and len(backend._run.devices) == 1
    assert isinstance(backend._run.devices[0], cuda_multi.CudaShareDevice)
    assert backend._run.ops.driver.name == "single"  # no device thread for one device
    assert multi_backend_class(CudaBackend, 1) is CudaBackend  # --gpus 1 is this backend


def test_checks_fall_on_every_kth_step_counted_across_calls_and_loads(backend, gpu):
    """A check after every check_every-th step, counted across step() calls, none with check_every = 0.
    The count runs since load: a reload restarts it."""
    assert backend.check_every == 8
    for _ in range(6):
        backend.step(3)
    assert gpu.checks == [8, 16]
    backend.check_every = 0
    backend.step(10)
    assert gpu.checks == [8, 16]
    backend.check_every = 8
    backend.load(bodies(), LEAPFROG, FP32)
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
    assert found.value.device is None  # one GPU: no device to name
    with pytest.raises(NonFiniteState) as found:
        backend.check_finite()
    assert found.value.step == 8 and gpu.checks == [8, 8]


def test_work_is_summed_and_each_launch_bracketed(backend, gpu):
    timer = backend._run.devices[0].timer
    timings = backend.step(3)  # a(x) of the loaded state first, then one evaluation a step
    assert (timings.force_evals, timings.interactions, timings.pair_equivalent) == (4, 4 * N * N, 4 * N * N)
    assert timer.brackets == ["force"] + ["integrate", "force", "integrate"] * 3
    assert timings.steps == 3 and timings.force_ms >= 0.0 and timings.integrate_ms >= 0.0
    assert not [k for k in timings.extra if k.startswith("device:")]  # one GPU: no per-device bars
    timer.brackets.clear()
    assert backend.step(2).force_evals == 2  # the cached a(x) carries over to the next call
    assert timer.brackets == ["integrate", "force", "integrate"] * 2
    assert backend.step(0).force_evals == 0 and timer.brackets == ["integrate", "force", "integrate"] * 2


def test_a_failed_step_leaves_a_of_x_invalid_and_the_time_at_the_last_whole_step(backend, gpu):
    backend.step(2)
    gpu.fail_on_force = gpu.forces + 2  # the closing evaluation of the call's second step
    with pytest.raises(RuntimeError, match="launch failed"):  # one GPU's own error, not a DeviceFault
        backend.step(5)
    assert gpu.steps == 3 and backend.time == pytest.approx(3 * LEAPFROG.dt)
    gpu.fail_on_force = None
    gpu.calls.clear()
    assert backend.step(1).force_evals == 2  # a(x) evaluated again before the step
    assert gpu.calls == ["force", "kick_drift fp32", "force", "kick"]
    backend.step(4)
    assert gpu.checks == [8]  # the failed call's whole steps counted towards the cadence


def test_a_kernel_switch_is_in_place_and_promotes_the_double_state_once(backend, gpu):
    backend.step(1)
    device = backend._run.devices[0]
    gpu.calls.clear()
    backend.set_kernel(FP64)
    assert backend._run.devices[0] is device and backend.precision == "fp64"  # the same device and state
    assert len(gpu.promoted) == 1 and np.array_equal(gpu.promoted[0], bodies().mass)  # row order = load
    assert backend.step(1).force_evals == 2 and "kick_drift fp64" in gpu.calls  # a(x) of the new kernel
    assert backend.step(1).force_evals == 1
    backend.set_kernel(FP32)
    assert backend.step(1).force_evals == 2
    backend.set_kernel(FP64)  # the float rows moved on: promoted again
    assert len(gpu.promoted) == 2 and backend.time == pytest.approx(4 * LEAPFROG.dt)


def test_a_kernel_that_does_not_compile_leaves_the_current_one(backend, gpu):
    backend.step(1)
    gpu.fail_compile = FP64
    with pytest.raises(KernelCompileError):
        backend.set_kernel(FP64)
    assert backend.kernel == FP32 and backend.precision == "fp32" and not gpu.promoted
    assert backend.step(1).force_evals == 1  # the cached a(x) still holds


def test_physics_changes_that_move_a_of_x_invalidate_it(backend, gpu):
    backend.step(1)
    device = backend._run.devices[0]
    backend.set_physics(LEAPFROG.with_(dt=2e-3))  # the same forces: a(x) still holds
    assert backend.step(1).force_evals == 1
    backend.set_physics(LEAPFROG.with_(dt=2e-3, softening=0.02))
    assert backend._run.devices[0] is device  # in place: the evaluator takes the new softening
    assert device.evaluator.physics.softening == 0.02
    assert backend.step(1).force_evals == 2


def test_records_are_the_registry_s_own(backend):
    assert [r.name for r in CudaBackend.kernels()] == [r.name for r in registry.RECORDS]
    assert CudaBackend.record(FP64).precision == "fp64"


def test_a_new_state_that_fits_only_without_the_current_one_replaces_it(backend, caplog):
    """A load is made beside the current state, so that a failure leaves it; where the current state
    holds the memory the new one needs, it is given back first (with one warning) and the load goes on."""
    per_body = 72  # float4 pos, vel, acc, sacc; float speed; int32 ids
    POOL["free"] = 24 * per_body - 1  # 24 bodies fit once the 16 held are given back, not beside them
    backend.load(bodies(24), LEAPFROG, FP32)
    assert backend.n == 24 and "released to make room" in caplog.text
    backend.step(1)
    POOL["free"] = 8 * per_body  # 40 do not fit even then: the error names what fits, the state is gone
    with pytest.raises(StateOutOfMemory, match=r"N = 40 bodies .* at most N ≈ \d+ fits"):
        backend.load(bodies(40), LEAPFROG, FP32)
    assert backend.n == 0
    with pytest.raises(RuntimeError, match="call load"):
        backend.step(1)


def test_without_a_current_state_nothing_is_released(backend):
    """Without a current state to give back, nothing is released: the message, and the run goes on."""
    backend.close()
    fresh = CudaBackend()
    try:
        POOL["free"] = 100
        with pytest.raises(StateOutOfMemory):
            fresh.load(bodies(), LEAPFROG, FP32)
        POOL["free"] = 2**30
        fresh.load(bodies(), LEAPFROG, FP32)
        assert fresh.step(1).force_evals == 2
    finally:
        fresh.close()


def test_one_gpu_names_no_devices_where_a_form_over_devices_would(backend):
    from app.backends.multi import devices_line

    assert devices_line(backend) == ""
    assert backend.data_path == "device only (no GL)"
