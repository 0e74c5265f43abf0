"""docs/architecture.md's row "a new way of splitting a force over devices", followed once from tests/:
tests/toy_decomposition.py's `replicated` split (every device evaluates and integrates every body) run by
the multi-device backend over K CPU "devices", with nothing in app/ changed.

- K = 1, 2, 3 devices, both drivers, over an fp64 and an fp32 record: accelerations, the trajectory, and
  every device's whole copy are bitwise one CPU backend's running the plain record (each device makes the
  one device's call, `evaluate(pos, acc, all, all)`, and the same updates over every row), and the work is
  counted once;
- `integrate_all` and `exchanges_positions` are honoured: no exchange is called, not even by a re-share,
  and `--gpu-driver auto` takes the split's `driver`;
- the controls: a device that evaluates only its share, or a split that integrates only the shares, is
  caught by the same comparison.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_multidevice import one_device
from toy_decomposition import REPLICATED, ReplicatedCpuDevice, ReplicatedCpuDevices, replicated_record

from app.backends.cpu import CPUBackend
from app.backends.cpu_multi import CpuDevice
from app.backends.multi import multi_backend_class
from app.model.bodies import Bodies
from app.model.physics import Physics
from app.parallel.decomposition import of
from app.parallel.multidevice import HostExchange

N = 257  # uneven shares for every K below
PHYSICS = Physics(softening=0.02, dt=2e-3)
BASES = ("cpu-fp64", "cpu-simd")  # float64, and float32 with fastmath
TOYS = {base: replicated_record(base) for base in BASES}
CALLS, STEPS = 3, 4  # step(STEPS) CALLS times


def cloud(n: int = N, seed: int = 11) -> Bodies:
    rng = np.random.default_rng(seed)
    return Bodies.from_arrays(
        rng.normal(size=(n, 3)), rng.normal(scale=0.3, size=(n, 3)), rng.uniform(0.5, 1.5, n) / n
    )


@pytest.fixture
def replicated(monkeypatch):
    """The toy records among the CPU backend's (where `record`, the multi-device backend and the devices'
    `lookup` find them), and its device kind making the devices that implement `force_all`."""
    kernels = CPUBackend.kernels()
    monkeypatch.setattr(CPUBackend, "kernels", classmethod(lambda cls: [*kernels, *TOYS.values()]))
    monkeypatch.setattr(
        CPUBackend,
        "device_kind",
        classmethod(lambda cls: ReplicatedCpuDevices(cls.record, cls.default_kernel)),
    )


def run_replicated(base: str, k: int, driver: str = "auto", steps_by=lambda backend: None):
    """The toy record of `base` on K CPU devices: (accelerations at load, timings of each call, state,
    every device's own pos and vel, the backend's facts); `steps_by(backend)` runs before stepping."""
    backend = multi_backend_class(CPUBackend, k, driver)()
    try:
        backend.load(cloud(), PHYSICS, TOYS[base].name)
        run = backend._run
        assert run is not None and run.decomposition is REPLICATED
        assert all(isinstance(d, ReplicatedCpuDevice) for d in run.devices)
        acc = backend.accelerations()
        steps_by(backend)
        timings = [backend.step(STEPS) for _ in range(CALLS)]
        copies = [(d.pos[:, :3].astype(np.float64), d.vel[:, :3].astype(np.float64)) for d in run.devices]
        facts = {
            "split": backend.split_name,
            "driver": backend.driver_name,
            "render_whole": run.render_whole,
            "drifts": run.ops.exchange_count,
        }
        return acc, timings, backend.state(), copies, facts
    finally:
        backend.close()


def test_the_toy_records_name_the_split_and_keep_their_bases_arithmetic(replicated):
    for base, toy in TOYS.items():
        assert of(toy) is REPLICATED and toy.policy == CPUBackend.record(base).policy
        assert CPUBackend.record(toy.name) is toy and not toy.roles
    assert REPLICATED.name and REPLICATED.doc and REPLICATED.exchanges


# --- K devices against one ---------------------------------------------------------------------------------
@pytest.mark.parametrize("driver", ["single", "threads"])
@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("base", BASES)
def test_k_replicated_devices_are_bitwise_one_cpu_backend(replicated, base, k, driver):
    acc, timings, state, copies, facts = run_replicated(base, k, driver)
    bodies, steps = cloud(), CALLS * STEPS
    assert np.array_equal(acc, one_device(bodies, PHYSICS, base))
    want_pos, want_vel = one_device(bodies, PHYSICS, base, steps=steps)
    assert np.array_equal(state.pos, want_pos) and np.array_equal(state.vel, want_vel)
    for pos, vel in copies:  # every device integrated every row: each copy is the whole answer
        assert np.array_equal(pos, want_pos) and np.array_equal(vel, want_vel)
    assert facts["split"] == "replicated" and facts["render_whole"]
    # the copies' work is counted once: K devices report one device's interactions
    assert sum(t.interactions for t in timings) == steps * N * N
    assert sum(t.pair_equivalent for t in timings) == steps * N * N


# --- the switches the update steps read ---------------------------------------------------------------------
def spy_on_the_exchange(monkeypatch) -> list[str]:
    """Every exchange operation the run calls, by name (none of them moves anything any more)."""
    called: list[str] = []
    for op in ("gather", "reduce_scatter", "gather_sorted"):
        monkeypatch.setattr(HostExchange, op, lambda self, *args, op=op: called.append(op))
    return called


def reshare(backend) -> None:
    backend._run.ops.force_times_ms = lambda: [1.0, 4.0, 2.0]  # uneven: the shares move
    backend.rebalance()


def test_no_exchange_runs_not_even_for_a_reshare(replicated, monkeypatch):
    """exchanges_positions = False: no positions move after a drift; integrate_all = True: a re-share
    (rows changing hands) has nothing to gather either; and no force exchange is queued by the split."""
    called = spy_on_the_exchange(monkeypatch)
    _acc, timings, state, copies, facts = run_replicated("cpu-fp64", 3, "threads", steps_by=reshare)
    assert called == []
    assert all(t.exchange_ms == 0 for t in timings)
    assert facts["drifts"] == CALLS * STEPS  # (the count of drifts after which an exchange could have run)
    want_pos, want_vel = one_device(cloud(), PHYSICS, "cpu-fp64", steps=CALLS * STEPS)
    assert np.array_equal(state.pos, want_pos) and np.array_equal(state.vel, want_vel)


@pytest.mark.parametrize(
    ("switch", "value", "expected"),
    [("exchanges_positions", True, {"gather"}), ("integrate_all", False, {"gather"})],
)
def test_the_spy_sees_the_exchanges_a_split_asks_for(replicated, monkeypatch, switch, value, expected):
    """The control of the test above: with either switch flipped, the run does call the exchange (after
    each drift; for a re-share, of vel, acc and speed)."""
    called = spy_on_the_exchange(monkeypatch)
    monkeypatch.setattr(type(REPLICATED), switch, value)
    run_replicated("cpu-fp64", 3, "threads", steps_by=reshare)
    assert set(called) == expected


def test_gpu_driver_auto_takes_the_splits_driver(replicated):
    assert REPLICATED.driver != "threads"  # (not the base class's default: the attribute is read)
    *_, facts = run_replicated("cpu-fp64", 2)
    assert facts["driver"] == REPLICATED.driver


# --- the controls: a broken replicated split must fail the comparison ---------------------------------------
def test_a_device_that_evaluates_only_its_share_is_caught(replicated, monkeypatch):
    monkeypatch.setattr(ReplicatedCpuDevice, "force_all", CpuDevice.force)  # targets' operation
    _acc, _timings, state, _copies, _facts = run_replicated("cpu-fp64", 2, "single")
    want_pos, _ = one_device(cloud(), PHYSICS, "cpu-fp64", steps=CALLS * STEPS)
    assert not np.array_equal(state.pos, want_pos)


def test_a_split_that_integrates_only_the_shares_is_caught(replicated, monkeypatch):
    """integrate_all off with no exchange: each device's copy of the other shares' positions goes stale."""
    monkeypatch.setattr(type(REPLICATED), "integrate_all", False)
    _acc, _timings, state, _copies, _facts = run_replicated("cpu-fp64", 2, "single")
    want_pos, _ = one_device(cloud(), PHYSICS, "cpu-fp64", steps=CALLS * STEPS)
    assert not np.array_equal(state.pos, want_pos)
