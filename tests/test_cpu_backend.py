"""The `cpu` backend against the float64 reference: both models x both integrators, small N,
kernel switching, timings and the renderer's arrays."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from app.backends import backend_class, cpu, cpu_forces
from app.backends.cpu import CPUBackend
from app.backends.cpu_forces import cpu_accelerations_fp64
from app.core.errors import ConfigError
from app.core.values import IntChoice
from app.engine.integrator import integrate
from app.model.bodies import Bodies
from app.model.physics import Physics, accelerations, relative_error

KERNELS = ("cpu-simd", "cpu-fp64")


def plummer_like(n: int, seed: int = 0) -> Bodies:
    """A seeded Plummer-like cloud (Plummer radii, isotropic directions, Gaussian velocities), M = 1."""
    rng = np.random.default_rng(seed)
    u = rng.uniform(0.05, 0.95, n)
    r = 1.0 / np.sqrt(u ** (-2.0 / 3.0) - 1.0)
    direction = rng.normal(size=(n, 3))
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    vel = rng.normal(scale=0.4, size=(n, 3)) / (1.0 + r[:, None] ** 2) ** 0.25
    return Bodies.from_arrays(r[:, None] * direction, vel, np.full(n, 1.0 / n))


def physics_for(model: str, integrator: str, softening: float) -> Physics:
    return Physics(
        G=1.0, softening=softening, dt=1e-3, integrator=integrator, damping=0.99, model=model, repulsion=2e-3
    )


def test_available_and_registered():
    assert CPUBackend.why_not() is None
    assert CPUBackend.available()
    assert backend_class("cpu") is CPUBackend
    assert [r.name for r in CPUBackend.kernels()] == [*KERNELS, "cpu-tree", "cpu-n3l"]  # test_cpu_tree.py,
    # test_decomposition.py
    assert CPUBackend.kernel_why_not("cpu-simd") is None
    assert "not a cpu kernel" in CPUBackend.kernel_why_not("nope")


# --- agreement with app.engine.integrator.integrate (float64)
# ------------------------------------------------ fp64 kernel: 1e-10 relative to the state's scale (only
# summation order differs). fp32 kernel: 1e-5 relative to the scale after 20 steps (float32 state: ~6e-8 per
# rounding).
STEPS = 20
TOLERANCE = {"cpu-fp64": 1e-10, "cpu-simd": 1e-5}


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("softening", [0.0, 0.05])
@pytest.mark.parametrize("integrator", ["leapfrog", "euler-damped"])
@pytest.mark.parametrize("model", ["gravity", "gravity-repulsion"])
@pytest.mark.parametrize("n", [1, 2, 31, 200])
def test_steps_agree_with_float64_reference(n, model, integrator, softening, kernel):
    b0 = plummer_like(n, seed=n)
    phys = physics_for(model, integrator, softening)
    backend = CPUBackend()
    backend.load(b0, phys, kernel=kernel)
    start = backend.state()  # what the kernel starts from (fp32-rounded for cpu-simd)
    ref = start.copy()
    integrate(ref, phys, STEPS)
    timings = backend.step(STEPS)
    got = backend.state()
    tol = TOLERANCE[kernel]
    pos_scale = max(1.0, float(np.max(np.abs(ref.pos))))
    vel_scale = max(1e-3, float(np.max(np.abs(ref.vel))))
    assert np.max(np.abs(got.pos - ref.pos)) <= tol * pos_scale
    assert np.max(np.abs(got.vel - ref.vel)) <= tol * vel_scale
    assert got.time == pytest.approx(STEPS * phys.dt, rel=1e-12)
    assert np.array_equal(got.mass, b0.mass)
    assert timings.steps == STEPS and timings.n == n and timings.kernel == kernel
    if n == 1:  # a lone body feels nothing: exact straight-line motion
        assert np.array_equal(backend.accelerations(), np.zeros((1, 3)))
        expected = start.vel * (phys.damping**STEPS if integrator == "euler-damped" else 1.0)
        np.testing.assert_allclose(got.vel, expected, rtol=1e-6)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("softening", [0.0, 0.05])
@pytest.mark.parametrize("model", ["gravity", "gravity-repulsion"])
def test_accelerations_match_reference(kernel, softening, model):
    b = plummer_like(200, seed=7)
    phys = physics_for(model, "leapfrog", softening)
    backend = CPUBackend()
    backend.load(b, phys, kernel=kernel)
    start = backend.state()
    acc = backend.accelerations()
    assert acc.dtype == np.float64 and acc.shape == (200, 3)
    worst, _ = relative_error(acc, accelerations(start.pos, start.mass, phys))
    assert worst <= (1e-10 if kernel == "cpu-fp64" else 1e-4)


@pytest.mark.parametrize("fastmath", [False, True])
@pytest.mark.parametrize("softening", [0.0, 0.01])
def test_fp32_kernel_keeps_the_terms_one_running_sum_drops(fastmath, softening):
    """A distant cluster's 32,768 small terms after a heavy core (tests/summation.py): the kernel's
    partial sums of SOURCE_TILE sources keep them. fastmath=False is cpu-simd's sum in sequential IEEE
    float32, which lost them (max rel err 8.4e-4) while it was one running sum; fastmath=True is
    cpu-simd's own kernel (5.3e-5 then, from its vector lanes)."""
    from summation import TARGETS, far_cluster

    from app.backends.cpu_kernels import accel_kernel
    from app.engine.forces import FP32_BUDGET
    from app.model.physics import relative_errors

    rows = far_cluster()
    phys = Physics(softening=softening)
    got = np.zeros((TARGETS.stop - TARGETS.start, 4), np.float32)
    kernel = accel_kernel(np.float32, fastmath, repulsion=False, skip_self=softening == 0.0)
    kernel(rows[TARGETS], rows, np.float32(softening**2), np.float32(1.0), np.float32(0.0), got)
    ref = accelerations(rows[:, :3].astype(np.float64), rows[:, 3].astype(np.float64), phys, targets=TARGETS)
    assert relative_errors(got[:, :3], ref).max() <= FP32_BUDGET.max_rel


def test_cpu_accelerations_fp64_is_the_reference():
    b = plummer_like(100, seed=1)
    for phys in (Physics(softening=0.0), Physics(softening=0.02, model="gravity-repulsion", repulsion=1e-3)):
        got = cpu_accelerations_fp64(b.pos, b.mass, phys)
        assert got.shape == (100, 3) and got.dtype == np.float64
        assert relative_error(got, accelerations(b.pos, b.mass, phys))[0] <= 1e-12


def test_fp32_state_tracks_float64_on_a_longer_run():
    """cpu-simd after 200 leapfrog steps of a 1,000-body cloud: positions within 1e-5 (absolute, the
    cloud's scale is ~1) and velocities within 1e-5 of the float64 run from the same start."""
    b0 = plummer_like(1000, seed=11)
    phys = Physics(softening=0.01, dt=1e-3)
    backend = CPUBackend()
    backend.load(b0, phys, kernel="cpu-simd")
    ref = backend.state()
    integrate(ref, phys, 200, accel_fn=cpu_accelerations_fp64)
    backend.step(200)
    got = backend.state()
    dx = float(np.max(np.abs(got.pos - ref.pos)))
    dv = float(np.max(np.abs(got.vel - ref.vel)))
    print(f"fp32 vs float64 after 200 steps, N=1000: max |dx| = {dx:.2e}, max |dv| = {dv:.2e}")
    assert dx <= 1e-5
    assert dv <= 1e-5


# --- kernel switching, physics changes, timings, renderer arrays ----------------------------------


def _snapshot(backend):
    s = backend.state()
    return s.pos.copy(), s.vel.copy(), s.time


def test_set_kernel_mid_run_leaves_state_bitwise_identical():
    backend = CPUBackend()
    backend.load(plummer_like(64, seed=2), Physics(softening=0.01), kernel="cpu-simd")
    backend.step(5)
    pos32 = backend.host_render_arrays()[0].copy()
    before = _snapshot(backend)
    for name in ("cpu-fp64", "cpu-simd", "cpu-fp64"):
        backend.set_kernel(name)
        assert backend.kernel == name
        backend.accelerations()  # evaluating the new kernel must not touch the state either
        after = _snapshot(backend)
        assert np.array_equal(after[0], before[0]) and np.array_equal(after[1], before[1])
        assert after[2] == before[2]
        assert np.array_equal(backend.host_render_arrays()[0], pos32)
    backend.step(5)  # now in float64, from the fp32 state exactly
    backend.set_kernel("cpu-simd")
    mid = _snapshot(backend)
    backend.accelerations()
    assert all(np.array_equal(a, b) for a, b in zip(mid[:2], _snapshot(backend)[:2], strict=True))
    backend.step(5)
    assert backend.state().time == pytest.approx(15 * 1e-3)


def test_switching_precision_keeps_agreement():
    b0 = plummer_like(50, seed=5)
    phys = Physics(softening=0.02)
    backend = CPUBackend()
    backend.load(b0, phys, kernel="cpu-fp64")
    ref = b0.copy()
    integrate(ref, phys, 10)
    backend.step(4)
    backend.set_kernel("cpu-simd")
    backend.step(2)
    backend.set_kernel("cpu-fp64")
    backend.step(4)
    assert np.max(np.abs(backend.state().pos - ref.pos)) <= 1e-6


def test_timings_are_positive():
    backend = CPUBackend()
    backend.load(plummer_like(300, seed=3), Physics(), kernel="cpu-simd")
    for kernel in KERNELS:
        backend.set_kernel(kernel)
        for integrator in ("leapfrog", "euler-damped"):
            backend.set_physics(backend.physics.with_(integrator=integrator))
            t = backend.step(3)
            assert t.force_ms > 0 and t.integrate_ms > 0
            assert t.steps == 3 and t.n == 300 and t.kernel == kernel
            assert t.force_evals in (3, 4)  # 4: a leapfrog that first evaluates A(x0)
            assert t.interactions == t.pair_equivalent == t.force_evals * 300 * 300
            assert t.interactions_per_s > 0 and t.gflops > 0


def test_leapfrog_costs_one_force_evaluation_per_step():
    backend = CPUBackend()
    backend.load(plummer_like(20), Physics())
    assert backend.step(4).force_evals == 5  # the first step also evaluates A(x0)
    assert backend.step(4).force_evals == 4
    backend.accelerations()  # the cached A(x): no evaluation, and the next step still reuses it
    assert backend.step(4).force_evals == 4
    backend.set_physics(backend.physics.with_(softening=0.02))
    assert backend.step(4).force_evals == 5  # A(x) of the old softening is stale
    backend.set_physics(backend.physics.with_(integrator="euler-damped"))
    assert backend.step(4).force_evals == 4  # one per step: each uses A of the positions it starts from
    backend.set_physics(backend.physics.with_(integrator="leapfrog"))
    assert backend.step(4).force_evals == 5  # the euler step moved x away from its A(x)


def test_set_physics_applies_from_next_step():
    b = plummer_like(40, seed=9)
    backend = CPUBackend()
    backend.load(b, Physics(softening=0.05), kernel="cpu-fp64")
    backend.step(3)
    backend.set_physics(Physics(softening=0.2, dt=2e-3))
    s = backend.state()
    np.testing.assert_allclose(
        backend.accelerations(), accelerations(s.pos, s.mass, Physics(softening=0.2)), rtol=1e-10, atol=1e-12
    )
    backend.step(2)
    assert backend.state().time == pytest.approx(3e-3 + 4e-3, rel=1e-12)


def test_host_render_arrays_are_live_float32_without_copies():
    backend = CPUBackend()
    backend.load(plummer_like(100, seed=4), Physics(), kernel="cpu-simd")
    backend.step(2)
    pos, speed = backend.host_render_arrays()
    assert pos.dtype == np.float32 and pos.shape == (100, 4) and pos.flags.c_contiguous
    assert speed.dtype == np.float32 and speed.shape == (100,)
    s = backend.state()
    assert np.array_equal(pos[:, :3].astype(np.float64), s.pos)
    np.testing.assert_allclose(speed, np.linalg.norm(s.vel, axis=1), rtol=1e-6)
    backend.step(1)
    pos2, speed2 = backend.host_render_arrays()
    assert pos2 is pos and speed2 is speed  # the same persistent buffers, updated in place
    np.testing.assert_allclose(speed2, np.linalg.norm(backend.state().vel, axis=1), rtol=1e-6)
    backend.set_kernel("cpu-fp64")
    backend.step(1)
    pos3, _ = backend.host_render_arrays()
    assert pos3.dtype == np.float32
    np.testing.assert_allclose(pos3[:, :3], backend.state().pos, rtol=1e-6)


def test_bad_kernel_and_physics_are_rejected():
    backend = CPUBackend()
    with pytest.raises(ConfigError, match="cpu-simd"):
        backend.load(plummer_like(3), Physics(), kernel="cuda-tiled")
    backend.load(plummer_like(3), Physics())
    assert backend.kernel == "cpu-simd"
    with pytest.raises(ConfigError, match="kernel"):
        backend.set_kernel("nope")
    with pytest.raises(ConfigError, match="integrator"):
        backend.set_physics(Physics(integrator="rk4"))
    with pytest.raises(ConfigError, match="model"):
        backend.set_physics(Physics(model="coulomb"))
    assert backend.kernel == "cpu-simd" and backend.physics == Physics()


def test_state_is_a_copy_with_ids_and_time():
    b = plummer_like(10)
    b.ids = np.arange(100, 110)
    b.time = 2.5
    backend = CPUBackend()
    backend.load(b, Physics(dt=0.01))
    b.pos[:] = 0.0  # load took a copy
    s = backend.state()
    assert np.array_equal(s.ids, np.arange(100, 110)) and s.time == 2.5
    assert np.any(s.pos != 0.0)
    s.pos[:] = 0.0  # state() hands out a copy
    assert np.any(backend.state().pos != 0.0)
    backend.step(3)
    assert backend.state().time == pytest.approx(2.53, rel=1e-12)


def test_non_finite_state_names_the_first_bad_body():
    import numpy as np

    from app.backends.cpu import BACKEND
    from app.core.errors import NonFiniteState
    from app.model.bodies import Bodies
    from app.model.physics import Physics

    rng = np.random.default_rng(1)
    b = Bodies(rng.normal(size=(64, 3)), np.zeros((64, 3)), np.full(64, 1 / 64))
    backend = BACKEND()
    backend.load(b, Physics(softening=0.05))
    backend.step(1)
    backend._vel[17, 0] = np.nan  # what a blow-up leaves behind
    with pytest.raises(NonFiniteState) as e:
        backend.step(1)
    assert e.value.index == 17 and "body 17" in str(e.value)


# --- tunables ----------------------------------------------------------------------------------------------


def test_cpu_records_have_no_tunables_and_reject_any():
    backend = CPUBackend()
    backend.load(plummer_like(8), Physics())
    assert backend.tunable_specs() == () and backend.tunables() == {}
    backend.set_tunables()  # nothing to set is fine
    with pytest.raises(ConfigError, match=r"cpu-simd: no tunable 'block_size'"):
        backend.set_tunables(block_size=64)
    backend.clear_tunables()
    assert backend.tunables() == {}


class SpyPolicy(cpu_forces.NumbaAllPairs):
    """NumbaAllPairs that remembers the evaluators it built."""

    built: list = []

    def evaluator(self, record, physics):
        evaluator = super().evaluator(record, physics)
        SpyPolicy.built.append(evaluator)
        return evaluator


def test_tunables_are_validated_stored_per_record_and_reach_the_evaluator(monkeypatch):
    """With a tunable on cpu-simd (the CPU records have none of their own): set on one record, kept while
    another is current, applied from the next step, which recomputes A(x)."""
    simd = replace(
        cpu_forces.BY_NAME["cpu-simd"],
        tunables=(IntChoice("unroll", (1, 2, 4), 1),),
        policy=SpyPolicy(np.float32, fastmath=True),
    )
    monkeypatch.setitem(cpu_forces.BY_NAME, "cpu-simd", simd)
    monkeypatch.setattr(cpu, "RECORDS", (simd, cpu_forces.BY_NAME["cpu-fp64"]))  # (the backend's kernels())
    backend = CPUBackend()
    backend.load(plummer_like(16), Physics(), kernel="cpu-simd")
    assert backend.tunable_specs() == simd.tunables and backend.tunables() == {"unroll": 1}
    backend.step(2)
    with pytest.raises(ConfigError, match=r"cpu-simd.unroll: 3 is not one of 1, 2, 4"):
        backend.set_tunables(unroll=3)
    SpyPolicy.built.clear()
    backend.set_tunables(unroll=4)
    assert backend.tunables() == {"unroll": 4}
    assert backend.step(2).force_evals == 3  # the cached A(x) predates the change
    assert [e.tunables for e in SpyPolicy.built] == [{"unroll": 4}]
    backend.set_kernel("cpu-fp64")
    assert backend.tunables() == {}
    backend.set_kernel("cpu-simd")
    assert backend.tunables() == {"unroll": 4}
    backend.clear_tunables()
    assert backend.tunables() == {"unroll": 1}


@pytest.mark.parametrize("integrator", ["leapfrog", "euler-damped"])
def test_fp64_steps_are_bitwise_the_reference_over_the_same_kernel(integrator):
    """Both step through a Stepper (app/engine/integrator.py) and round the updates alike: given the same
    accelerations (cpu-fp64's kernel on both sides) the backend's trajectory is bitwise the float64
    reference's, however the steps are cut into step() calls and across a physics change that keeps the
    forces (a(x) stays cached) or changes them (evaluated again)."""
    phys = physics_for("gravity", integrator, 0.05)
    start = plummer_like(64, seed=3)
    backend = CPUBackend()
    backend.load(start, phys, kernel="cpu-fp64")
    ref = start.copy()
    leapfrog = integrator == "leapfrog"
    acc = None
    for steps, physics, evaluations in (
        (1, phys, 1 + leapfrog),
        (4, phys, 4),
        (0, phys, 0),
        (3, phys.with_(dt=2e-3), 3),
        (2, phys.with_(dt=2e-3, softening=0.07), 2 + leapfrog),
    ):
        if physics.softening != backend.physics.softening:
            acc = None  # the reference's cached a(x) belongs to the old forces
        backend.set_physics(physics)
        timings = backend.step(steps)
        acc = integrate(ref, physics, steps, accel_fn=cpu_accelerations_fp64, acc=acc)
        got = backend.state()
        assert np.array_equal(got.pos, ref.pos) and np.array_equal(got.vel, ref.vel), (steps, physics)
        assert timings.force_evals == evaluations, (steps, physics)
    assert got.time == pytest.approx(ref.time, rel=1e-12)
