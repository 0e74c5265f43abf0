"""The float64 reference (app.model.physics) and the acceptance numbers of the foundation issue.

Hand-checkable unit cases first, then the published initial conditions in ../shared/data/:
the figure-eight three-body orbit (returns to its start after one period) and the NBabel Plummer
spheres (energy and momentum conservation, fp32 kernels against float64 forces).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import shared_file

from app.backends.cpu import CPUBackend
from app.backends.cpu_forces import cpu_accelerations_fp64
from app.engine.integrator import integrate
from app.model.bodies import Bodies
from app.model.formats import read
from app.model.physics import (
    Physics,
    accelerations,
    kinetic_energy,
    linear_momentum,
    momentum_scale,
    potential_energy,
    relative_error,
    total_energy,
)

# --- shared data ------------------------------------------------------------------------------------


def read_bodies(name: str) -> Bodies:
    """A published data set from ../shared/data (the test skips when it is absent)."""
    return read(shared_file(name))


def two_bodies(m1=2.0, m2=3.0, r=2.0, v1=(0.0, 0.0, 0.0), v2=(0.0, 0.0, 0.0)) -> Bodies:
    return Bodies.from_arrays([[0.0, 0.0, 0.0], [r, 0.0, 0.0]], [v1, v2], [m1, m2])


# --- the reference on hand-checkable cases --------------------------------------------------------


@pytest.mark.parametrize("eps", [0.0, 0.5])
def test_two_body_newton_both_ways(eps):
    b = two_bodies(m1=2.0, m2=3.0, r=2.0)
    G = 1.5
    a = accelerations(b.pos, b.mass, Physics(G=G, softening=eps))
    s3 = (2.0**2 + eps**2) ** 1.5
    np.testing.assert_allclose(a[0], [G * 3.0 * 2.0 / s3, 0, 0], rtol=1e-14)  # toward body 2
    np.testing.assert_allclose(a[1], [-G * 2.0 * 2.0 / s3, 0, 0], rtol=1e-14)  # toward body 1
    if eps == 0.0:
        assert a[0, 0] == pytest.approx(G * 3.0 / 4.0, rel=1e-15)  # G m2 / r²
    np.testing.assert_allclose(b.mass @ a, 0.0, atol=1e-15)  # equal and opposite forces


def test_two_body_momentum_conserved_by_integration():
    b = two_bodies(v1=(0.0, 0.3, 0.1), v2=(0.05, -0.2, 0.0))
    p0 = linear_momentum(b.vel, b.mass)
    for integrator in ("leapfrog", "euler-damped"):
        c = b.copy()
        integrate(c, Physics(softening=0.0, dt=1e-2, integrator=integrator), 200)
        np.testing.assert_allclose(linear_momentum(c.vel, c.mass), p0, atol=1e-13)


def test_single_body_has_zero_acceleration():
    b = Bodies.from_arrays([[1.0, 2.0, 3.0]], [[0.1, 0.0, 0.0]], [1.0])
    for eps in (0.0, 0.01):
        assert np.array_equal(accelerations(b.pos, b.mass, Physics(softening=eps)), np.zeros((1, 3)))


def test_repulsion_sign_and_balance_radius():
    G, H = 1.0, 0.25
    phys = Physics(G=G, softening=0.0, model="gravity-repulsion", repulsion=H)
    r0 = math.sqrt(H / G)  # G m m / r² = H m m / r⁴
    a_in = accelerations(two_bodies(r=0.8 * r0).pos, [1.0, 1.0], phys)
    a_out = accelerations(two_bodies(r=1.25 * r0).pos, [1.0, 1.0], phys)
    a_eq = accelerations(two_bodies(r=r0).pos, [1.0, 1.0], phys)
    assert a_in[0, 0] < 0 < a_in[1, 0]  # inside: pushed apart
    assert a_out[0, 0] > 0 > a_out[1, 0]  # outside: pulled together
    np.testing.assert_allclose(a_eq, 0.0, atol=1e-14)
    # the exact value inside: G m / r² - H m / r⁴
    r = 0.8 * r0
    assert a_in[0, 0] == pytest.approx(G / r**2 - H / r**4, rel=1e-14)
    # the pure-gravity model ignores H
    a_grav = accelerations(two_bodies(r=r).pos, [1.0, 1.0], phys.with_(model="gravity"))
    assert a_grav[0, 0] == pytest.approx(G / r**2, rel=1e-14)


def test_euler_damped_reduces_kinetic_energy():
    phys = Physics(dt=1e-2, integrator="euler-damped", damping=0.9, softening=0.01)
    lone = Bodies.from_arrays([[0.0, 0.0, 0.0]], [[1.0, -2.0, 0.5]], [2.0])
    k0 = kinetic_energy(lone.vel, lone.mass)
    integrate(lone, phys, 3)
    assert kinetic_energy(lone.vel, lone.mass) == pytest.approx(k0 * 0.9**6, rel=1e-14)
    b = two_bodies(r=10.0, v1=(0.0, 1.0, 0.0), v2=(0.0, -1.0, 0.0))
    k0 = kinetic_energy(b.vel, b.mass)
    integrate(b, phys, 10)
    assert kinetic_energy(b.vel, b.mass) < 0.5 * k0
    undamped = two_bodies(r=10.0, v1=(0.0, 1.0, 0.0), v2=(0.0, -1.0, 0.0))
    integrate(undamped, phys.with_(damping=1.0), 10)
    assert kinetic_energy(undamped.vel, undamped.mass) > kinetic_energy(b.vel, b.mass)


@pytest.mark.parametrize("eps", [0.0, 0.3])
def test_two_body_potential_energy(eps):
    b = two_bodies(m1=2.0, m2=3.0, r=2.0)
    G = 1.5
    s = math.sqrt(4.0 + eps**2)
    pot = potential_energy(b.pos, b.mass, Physics(G=G, softening=eps))
    assert pot == pytest.approx(-G * 6.0 / s, rel=1e-15)
    H = 0.7
    phys = Physics(G=G, softening=eps, model="gravity-repulsion", repulsion=H)
    expected = -G * 6.0 / s + H * 6.0 / (3.0 * s**3)
    assert potential_energy(b.pos, b.mass, phys) == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize("model", ["gravity", "gravity-repulsion"])
def test_force_is_minus_gradient_of_potential(model):
    """The accelerations and the potential describe the same interaction (checked by central
    differences on a small random cloud)."""
    rng = np.random.default_rng(3)
    pos, mass = rng.normal(size=(5, 3)), rng.uniform(0.5, 2.0, 5)
    phys = Physics(G=1.3, softening=0.2, model=model, repulsion=0.05)
    a = accelerations(pos, mass, phys)
    h = 1e-6
    for i in range(5):
        for k in range(3):
            p, m = pos.copy(), pos.copy()
            p[i, k] += h
            m[i, k] -= h
            grad = (potential_energy(p, mass, phys) - potential_energy(m, mass, phys)) / (2 * h)
            assert -grad / mass[i] == pytest.approx(a[i, k], rel=1e-6, abs=1e-8)


# --- figure-eight: one period brings every body back --------------------------------------------

FIG8_PERIOD = 6.32591398
FIG8_STEPS = 6326


@pytest.mark.parametrize(("path", "tol"), [("reference", 1e-5), ("cpu-fp64", 1e-5), ("cpu-simd", 1e-3)])
def test_figure_eight_returns_after_one_period(path, tol):
    b0 = read_bodies("nemo_figure8.mpv")
    assert b0.n == 3
    phys = Physics(G=1.0, softening=0.0, dt=FIG8_PERIOD / FIG8_STEPS, integrator="leapfrog")
    if path == "reference":
        end = b0.copy()
        integrate(end, phys, FIG8_STEPS)
    else:
        backend = CPUBackend()
        backend.load(b0, phys, kernel=path)
        backend.step(FIG8_STEPS)
        end = backend.state()
    assert end.time == pytest.approx(b0.time + FIG8_PERIOD, rel=1e-12)
    err = float(np.max(np.abs(end.pos - b0.pos)))
    print(f"figure-eight {path}: max |x(T) - x(0)| = {err:.3e}")
    assert err <= tol


# --- NBabel 1k Plummer sphere: conservation over 1,000 leapfrog steps ----------------------------


@pytest.mark.parametrize(("path", "energy_tol"), [("float64", 1e-6), ("cpu-simd", 1e-4)])
def test_nbabel_1k_conserves_energy_and_momentum(path, energy_tol):
    b0 = read_bodies("nbabel_input1k")
    assert b0.n == 1024
    phys = Physics(G=1.0, softening=0.01, dt=1e-3, integrator="leapfrog")
    if path == "float64":
        start = b0
        end = b0.copy()
        integrate(end, phys, 1000, accel_fn=cpu_accelerations_fp64)
    else:
        backend = CPUBackend()
        backend.load(b0, phys, kernel=path)
        start = backend.state()  # the fp32-rounded initial state is where this run starts
        backend.step(1000)
        end = backend.state()
    e0, e1 = total_energy(start, phys), total_energy(end, phys)
    drift = abs(e1 - e0) / abs(e0)
    dp = float(np.max(np.abs(linear_momentum(end.vel, end.mass) - linear_momentum(start.vel, start.mass))))
    scale = momentum_scale(start.vel, start.mass)
    print(f"nbabel 1k {path}: E0 = {e0:.9f}, |dE/E0| = {drift:.3e}, |dP| / sum m|v| = {dp / scale:.3e}")
    assert e0 == pytest.approx(-0.25, rel=2e-2)  # standard N-body units (softening shifts it slightly)
    assert drift <= energy_tol
    assert dp <= 1e-6 * scale


# --- NBabel 16k: CPU kernels against the float64 reference forces ---------------------------------


@pytest.fixture(scope="module")
def nbabel_16k():
    b = read_bodies("nbabel_input16k")
    phys = Physics(softening=0.01)
    return b, phys, accelerations(b.pos, b.mass, phys)  # O(N²) numpy: ~10 s, computed once


@pytest.mark.slow
@pytest.mark.parametrize(("kernel", "tol"), [("cpu-simd", 1e-4), ("cpu-fp64", 1e-10)])
def test_nbabel_16k_accelerations_match_float64(nbabel_16k, kernel, tol):
    b, phys, ref = nbabel_16k
    assert b.n == 16384
    backend = CPUBackend()
    backend.load(b, phys, kernel=kernel)
    worst, rms = relative_error(backend.accelerations(), ref)
    print(f"nbabel 16k {kernel}: relative error max {worst:.3e}, rms {rms:.3e}")
    assert worst <= tol
