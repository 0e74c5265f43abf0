"""The equilibrium galaxy generator (app/model/galaxy.py, docs/galaxies.md): its closed-form pulls against
float64 sums, Eddington's inversion against the density it inverts, the model's pull against the all-pairs
float64 sum over the bodies it draws, each component's virial ratio at t = 0, and a short cpu-tree run that
must keep the disk in equilibrium (looser bounds than the GPU machine's 65k run; numbers in the asserts)."""

from __future__ import annotations

import numpy as np
import pytest

from app.model import ics
from app.model.components import Components
from app.model.galaxy import Spheroid, bilinear, density_from_f, eddington, make_galaxy
from app.model.galaxy_check import measure, virial_ratios
from app.model.galaxy_pull import elliptic_ke, ring_pull, shell_potential_and_pull
from app.model.physics import Physics, accelerations

SPEC, _ = ics.galaxy_spec(softening=0.02)  # the presets' galaxy (internal ε 0.08)


def test_elliptic_integrals_known_values():
    k, e = elliptic_ke(np.array([1.0, 0.5, 1e-12]))  # m = 0, 0.5, 1 - 1e-12
    assert k[0] == pytest.approx(np.pi / 2, rel=1e-15) and e[0] == pytest.approx(np.pi / 2, rel=1e-15)
    assert k[1] == pytest.approx(1.8540746773013719, rel=1e-14)  # A&S table 17.1
    assert e[1] == pytest.approx(1.3506438810476755, rel=1e-14)
    assert k[2] == pytest.approx(np.log(4.0 / np.sqrt(1e-12)), rel=1e-10)  # K ~ ln(4 / k') as m -> 1
    assert e[2] == pytest.approx(1.0, abs=1e-10)


@pytest.mark.parametrize("target", [(0.3, 0.0), (0.7, 0.1), (1.5, -0.4), (1e-3, 0.2), (0.69, 0.12)])
def test_ring_pull_is_the_sum_over_the_ring(target):
    """A ring of radius 0.7 at z = 0.1 against 20,000 point masses on it (float64, softened)."""
    eps, radius, height, mass = 0.05, 0.7, 0.1, 2.0
    t = np.linspace(0.0, 2.0 * np.pi, 20_000, endpoint=False)
    points = np.column_stack([radius * np.cos(t), radius * np.sin(t), np.full_like(t, height)])
    R, z = target
    d = np.array([R, 0.0, z]) - points
    r2 = (d * d).sum(axis=1) + eps * eps
    want = -(mass / t.size) * (d / r2[:, None] ** 1.5).sum(axis=0)
    a_R, a_z = ring_pull([R], [z], [radius], [height], [mass], eps)
    np.testing.assert_allclose([a_R[0], a_z[0]], want[[0, 2]], rtol=1e-9, atol=1e-12)


def test_shell_pull_and_potential_are_the_angle_average():
    """Gauss-Legendre in cos(theta) over a shell: the softened kernel's exact average, inside and out."""
    eps, s = 0.05, 0.5
    x, w = np.polynomial.legendre.leggauss(400)
    for r in (0.1, 0.49, 0.5, 0.8, 3.0):
        d2 = r * r + s * s - 2.0 * r * s * x + eps * eps
        phi = -0.5 * (w / np.sqrt(d2)).sum()
        a_r = -0.5 * (w * (r - s * x) / d2**1.5).sum()
        got_phi, got_a = shell_potential_and_pull([r], [s], [1.0], eps)
        assert got_phi[0] == pytest.approx(phi, rel=1e-10) and got_a[0] == pytest.approx(a_r, rel=1e-8)


def test_eddington_inverts_the_density():
    """rho(r) = 4 pi int f v^2 dv from the inverted f, within 1% between the radii holding 0.1% and 99%
    of the halo's mass (inside, the table's first nodes; outside, the cut-off's tail)."""
    galaxy = make_galaxy(np.random.default_rng(0), (100, 400, 500), SPEC)
    pot = galaxy.potential
    halo = Spheroid(SPEC.halo_mass, SPEC.halo_scale, SPEC.halo_radius, pot.r)
    f = eddington(pot.r, halo.rho, pot.psi)
    assert (f >= 0).all()
    inside = np.interp([0.001, 0.99], halo.enclosed / halo.mass, pot.r)
    rows = np.flatnonzero((pot.r > inside[0]) & (pot.r < inside[1]))[::20]
    got = density_from_f(pot.psi[rows], pot.psi, f)
    np.testing.assert_allclose(got / halo.rho[rows], 1.0, atol=0.01)


def test_the_model_pull_is_the_bodies_pull():
    """The disk table's pull (rings and shells of the smooth model) against the float64 all-pairs pull of
    40,000 bodies drawn from it, at 400 disk bodies: the same within the realisation's Poisson noise."""
    rng = np.random.default_rng(3)
    galaxy = make_galaxy(rng, (4000, 16000, 20000), SPEC)
    pot = galaxy.potential
    disk = np.arange(4000, 20000)
    rows = rng.choice(disk, 400, replace=False)
    exact = accelerations(galaxy.pos, galaxy.mass, Physics(softening=SPEC.softening), targets=rows)
    x = galaxy.pos[rows]
    R = np.hypot(x[:, 0], x[:, 1])
    a_R = (x[:, 0] * exact[:, 0] + x[:, 1] * exact[:, 1]) / R
    model_R = bilinear(pot.table_R, pot.table_z, pot.a_R, R, np.abs(x[:, 2]))
    ratio = a_R / model_R
    assert np.median(ratio) == pytest.approx(1.0, abs=0.01)  # no bias
    assert np.percentile(np.abs(ratio - 1.0), 90) < 0.06  # the scatter of 40k bodies


def tree_accelerations(pos, mass, softening):
    """The cpu-tree's accelerations (theta 0.5: ~1e-3, far inside the 5% these tests allow)."""
    from app.backends.cpu import CPUBackend
    from app.model.bodies import Bodies

    backend = CPUBackend()
    backend.load(Bodies.from_arrays(pos, np.zeros_like(pos), mass), Physics(softening=softening), "cpu-tree")
    try:
        return backend.accelerations()
    finally:
        backend.close()


@pytest.mark.parametrize(
    "name, n, params",
    [
        ("disk", 32768, {}),
        ("collision", 65536, {}),
        ("disk", 32768, {"halo_mass": 0.0}),  # a disk and bulge alone: the disk's cut sets kappa's floor
        ("disk", 32768, {"halo_mass": 0.0, "bulge_mass": 0.0}),  # a bare exponential disk
    ],
)
def test_every_component_starts_in_virial_equilibrium(name, n, params):
    """2K / |W| of each part (bulge, disk, halo; for the collision each galaxy alone, about its own centre)
    within 5% of 1 at t = 0, W = sum m x . a at the run's softening. At the preset's N: a bulge of 600
    bodies scatters by ~6% from draw to draw (13% seen at 6,000 bodies a galaxy); 3,277 bodies, ~3%."""
    softening = 0.02
    b = ics.generate(name, n, 5, params, softening=softening)
    if b.components is None:  # one part: name it
        b.components = Components(("disk",), np.zeros(b.n, np.uint8))
    names = np.array(b.components.names)
    galaxies = ("galaxy1-", "galaxy2-") if name == "collision" else ("",)
    for prefix in galaxies:
        rows = np.flatnonzero(np.char.startswith(names[b.components.index], prefix))
        acc = tree_accelerations(b.pos[rows], b.mass[rows], softening)
        ratios = virial_ratios(b.pos[rows], b.vel[rows], b.mass[rows], acc, b.components.take(rows))
        ratios = {part: value for part, value in ratios.items() if part.startswith(prefix)}
        assert len(ratios) == len(names) // len(galaxies)
        for part, value in ratios.items():
            assert value == pytest.approx(1.0, abs=0.05), (part, ratios)


def test_a_short_cpu_tree_run_keeps_the_disk_in_equilibrium():
    """The preset's disk at 8,192 bodies (3,277 in the disk), cpu-tree, 1 time unit at dt 0.002. Measured
    (2026-11-26): radii within 1%, rms z +7%, sigma_R +23% (two-body heating by 9.6x heavier halo bodies at
    this N; +3% at 65k), Q min 1.28 -> 1.38, virial ratios 0.99-1.08. The old preset (docs/galaxies.md)
    fails every one of these: its sigma_R grew 10x in 2 time units."""
    from app.backends.cpu import CPUBackend
    from app.scene import load_scene, make_bodies

    scene = load_scene("disk", {"initial.n": 8192, "run.backend": "cpu", "run.kernel": "cpu-tree"})
    bodies = make_bodies(scene)
    backend = CPUBackend()
    backend.load(bodies, scene.physics, "cpu-tree")
    try:

        def report():
            state = backend.state()
            return measure(state.pos, state.vel, state.mass, backend.accelerations(), bodies.components)

        start = report()
        backend.step(500)
        end = report()
    finally:
        backend.close()
    assert end.r50 == pytest.approx(start.r50, rel=0.05)
    assert end.r90 == pytest.approx(start.r90, rel=0.05)
    assert end.rms_z == pytest.approx(start.rms_z, rel=0.3)
    assert end.sigma_R == pytest.approx(start.sigma_R, rel=0.4)
    assert np.nanmin(end.q) >= 1.1
    for name, value in end.virial.items():
        assert value == pytest.approx(1.0, abs=0.12), (name, end.virial)


def test_an_inclined_disk_measures_as_the_same_disk():
    """measure() works in the disk's own plane: the collision's second galaxy (inclined 45 degrees) gives the
    numbers of its first (the same model, other bodies) within their scatter, and a rotated copy the same."""
    b = ics.generate("collision", 20_000, 2, {"separation": 20.0}, softening=0.02)
    acc = np.zeros_like(b.pos)  # Q is not compared here
    one = measure(b.pos, b.vel, b.mass, acc, b.components, disk="galaxy1-disk")
    two = measure(b.pos, b.vel, b.mass, acc, b.components, disk="galaxy2-disk")
    for field in ("r50", "r90", "rms_z", "sigma_R"):
        assert getattr(two, field) == pytest.approx(getattr(one, field), rel=0.05), field
    t = np.radians(70.0)
    turn = np.array([[1.0, 0.0, 0.0], [0.0, np.cos(t), -np.sin(t)], [0.0, np.sin(t), np.cos(t)]])
    again = measure(b.pos @ turn.T, b.vel @ turn.T, b.mass, acc, b.components, disk="galaxy2-disk")
    for field in ("r50", "r90", "rms_z", "sigma_R"):
        assert getattr(again, field) == pytest.approx(getattr(two, field), rel=1e-9), field
