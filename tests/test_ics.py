"""Generators: deterministic, exact N, finite; Plummer in virial equilibrium; parameters checked."""

import numpy as np
import pytest

from app.core.errors import ConfigError
from app.model import ics
from app.model.physics import Physics, kinetic_energy, potential_energy

NAMES = sorted(ics.GENERATORS)
GALAXIES = ("disk", "collision")


def test_registry_records_are_documented():
    assert set(NAMES) == {"plummer", "disk", "collision", "cube", "shell", "expand"}
    for name, gen in ics.GENERATORS.items():
        assert gen.name == name and gen.doc and "\n" not in gen.doc
        for key, spec in gen.params.items():
            assert spec.doc, (name, key)
            assert spec.min <= spec.default <= spec.max, (name, key)


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_exact_n_finite(name):
    a = ics.generate(name, 301, 11, {})
    b = ics.generate(name, 301, 11, {})
    c = ics.generate(name, 301, 12, {})
    assert a.n == 301 and a.pos.shape == (301, 3) and a.vel.shape == (301, 3)
    assert np.isfinite(a.pos).all() and np.isfinite(a.vel).all()
    np.testing.assert_array_equal(a.pos, b.pos)
    np.testing.assert_array_equal(a.vel, b.vel)
    assert not np.array_equal(a.pos, c.pos)
    assert a.mass.sum() == pytest.approx(1.0, rel=1e-12)
    if name not in GALAXIES:  # the galaxies' parts have their own body masses
        assert np.ptp(a.mass) == 0.0
    np.testing.assert_allclose(a.mass @ a.pos, 0.0, atol=1e-12)  # the centre-of-mass frame
    np.testing.assert_allclose(a.mass @ a.vel, 0.0, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_smallest_n(name):
    n = ics.GENERATORS[name].min_n
    assert ics.generate(name, n, 0, {}).n == n


@pytest.mark.parametrize("G", [1.0, 2.0])
def test_plummer_virial_equilibrium_for_any_G(G):
    b = ics.generate("plummer", 2048, 3, {}, G=G)
    kinetic = kinetic_energy(b.vel, b.mass)
    potential = potential_energy(b.pos, b.mass, Physics(G=G, softening=0.0))
    assert b.mass.sum() == pytest.approx(1.0, rel=1e-12)
    assert 2 * kinetic / -potential == pytest.approx(1.0, rel=0.1)
    assert kinetic + potential == pytest.approx(-0.25 * G, rel=0.1)


@pytest.mark.parametrize("name", ["disk", "collision"])
def test_equilibrium_generators_scale_velocities_by_sqrt_G(name):
    one, two = ics.generate(name, 400, 2, {}), ics.generate(name, 400, 2, {}, G=2.0)
    np.testing.assert_array_equal(one.pos, two.pos)
    np.testing.assert_allclose(two.vel, np.sqrt(2.0) * one.vel, rtol=1e-14)


@pytest.mark.parametrize("name", ["cube", "shell", "expand"])
def test_given_velocities_do_not_depend_on_G(name):
    np.testing.assert_array_equal(ics.generate(name, 100, 2, {}).vel, ics.generate(name, 100, 2, {}, G=2).vel)


@pytest.mark.parametrize("G", ["1", "2"])
def test_cli_plummer_is_virialised_for_any_G(G, tmp_path):
    from app.cli import main
    from app.model.formats import read

    out = tmp_path / "p.npz"
    assert (
        main(
            [
                "simulate",
                "plummer",
                "--n",
                "2048",
                "--G",
                G,
                "--steps",
                "1",
                "--dt",
                "1e-9",
                "--out",
                str(out),
                "--backend",
                "cpu",
                "--no-progress",
            ]
        )
        == 0
    )
    b = read(out)
    ratio = 2 * kinetic_energy(b.vel, b.mass) / -potential_energy(b.pos, b.mass, Physics(G=float(G)))
    assert ratio == pytest.approx(1.0, rel=0.1)


def test_plummer_scale_and_mass():
    base = ics.generate("plummer", 500, 1, {})
    scaled = ics.generate("plummer", 500, 1, {"scale": 2.0, "mass": 8.0})
    np.testing.assert_allclose(scaled.pos, 2.0 * base.pos, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(scaled.vel, 2.0 * base.vel, rtol=1e-12, atol=1e-15)  # v ∝ sqrt(M / R)
    assert scaled.mass.sum() == pytest.approx(8.0)


def test_disk_rotates_and_is_thin():
    b = ics.generate("disk", 4000, 5, {"bulge_mass": 0.1})
    rows = b.components.rows("disk")
    pos, vel = b.pos[rows], b.vel[rows]
    r = np.hypot(pos[:, 0], pos[:, 1])
    v_phi = (pos[:, 0] * vel[:, 1] - pos[:, 1] * vel[:, 0]) / r
    outer = r > 0.3
    assert (v_phi[outer] > 0).mean() > 0.9
    assert np.median(np.abs(pos[:, 2])) < 0.05
    assert r.max() < 1.02  # the disk ends at its radius (about the centre of mass of all parts)
    bulge = b.pos[b.components.rows("bulge")]
    assert np.median(np.linalg.norm(bulge, axis=1)) < 0.2  # Hernquist scale 0.05: half its mass inside 0.12


def test_galaxy_parts_masses_and_counts():
    n = 10_000
    b = ics.generate(
        "disk", n, 1, {"bulge_mass": 0.25, "halo_mass": 10.0, "bulge_bodies": 0.2, "halo_bodies": 0.4}
    )
    assert b.components.names == ("bulge", "disk", "halo")
    counts = dict(zip(b.components.names, b.components.counts(), strict=True))
    assert counts == {"bulge": 2000, "disk": 4000, "halo": 4000}
    total = {name: b.mass[b.components.rows(name)].sum() for name in b.components.names}
    assert total["bulge"] / total["disk"] == pytest.approx(0.25, rel=1e-12)
    assert total["halo"] / total["disk"] == pytest.approx(10.0, rel=1e-12)
    no_halo = ics.generate("disk", 1000, 1, {"halo_mass": 0.0, "bulge_mass": 0.0})
    assert no_halo.components is None  # one part: a plain disk
    with pytest.raises(ConfigError, match="leave no body .* for the disk"):
        ics.generate("disk", 10, 0, {"bulge_bodies": 0.5, "halo_bodies": 0.5})


def test_galaxy_velocities_use_the_runs_softening():
    soft = ics.generate("disk", 3000, 4, {}, softening=0.05)
    hard = ics.generate("disk", 3000, 4, {}, softening=0.001)
    np.testing.assert_array_equal(soft.pos, hard.pos)
    rows = soft.components.rows("disk")
    inner = rows[np.hypot(soft.pos[rows, 0], soft.pos[rows, 1]) < 0.05]
    # softening weakens the pull near the centre: slower orbits there
    speed = lambda b: np.linalg.norm(b.vel[inner], axis=1).mean()  # noqa: E731
    assert speed(soft) < 0.95 * speed(hard)


@pytest.mark.parametrize("e, separation", [(1.0, 6.0), (0.5, 2.5), (2.0, 10.0)])
def test_collision_orbit_is_the_kepler_conic(e, separation):
    """The relative orbit's energy and angular momentum are those of the conic with this pericentre."""
    mass, rp = 1.0, 1.2
    rel_pos, rel_vel = ics.kepler_orbit(separation, rp, e, mass)
    assert np.linalg.norm(rel_pos) == pytest.approx(separation, rel=1e-12)
    energy = 0.5 * rel_vel @ rel_vel - mass / separation
    h = np.cross(rel_pos, rel_vel)
    assert h[2] > 0 and h[:2] == pytest.approx([0.0, 0.0])
    assert h[2] ** 2 == pytest.approx(mass * rp * (1 + e), rel=1e-12)  # h^2 = G M p
    assert energy == pytest.approx(mass * (e - 1) / (2 * rp * (1 + e)) * (1 + e), rel=1e-9, abs=1e-12)
    assert rel_pos @ rel_vel < 0  # approaching


def test_collision_orbit_refuses_impossible_starts():
    with pytest.raises(ConfigError, match="beyond the orbit's apocentre"):
        ics.kepler_orbit(10.0, 1.0, 0.5, 1.0)  # apocentre 3
    with pytest.raises(ConfigError, match="inside the pericentre"):
        ics.kepler_orbit(0.5, 1.0, 1.0, 1.0)


def test_collision_two_galaxies_on_their_orbit():
    n = 4000
    b = ics.generate("collision", n, 9, {"separation": 8.0, "mass_ratio": 0.5})
    n1, n2 = ics.collision_split(n, 0.5)
    assert n1 + n2 == n and n2 / n1 == pytest.approx(0.5, rel=0.01)
    names = b.components.names
    assert names == tuple(f"galaxy{k}-{p}" for k in (1, 2) for p in ("bulge", "disk", "halo"))
    first, second = slice(0, n1), slice(n1, n)

    def centre(part):
        w = b.mass[part] / b.mass[part].sum()
        return w @ b.pos[part], w @ b.vel[part]

    (c1, v1), (c2, v2) = centre(first), centre(second)
    assert b.mass[second].sum() / b.mass[first].sum() == pytest.approx(0.5, rel=1e-12)
    rel_pos, rel_vel = ics.kepler_orbit(8.0, 1.0, 1.0, 1.0)
    np.testing.assert_allclose(c2 - c1, rel_pos, atol=1e-9)
    np.testing.assert_allclose(v2 - v1, rel_vel, atol=1e-9)
    spin = lambda rows, c, v: np.cross(b.pos[rows] - c, b.vel[rows] - v).sum(axis=0)  # noqa: E731
    s1 = spin(b.components.rows("galaxy1-disk"), c1, v1)
    s2 = spin(b.components.rows("galaxy2-disk"), c2, v2)
    assert s1[2] / np.linalg.norm(s1) > 0.99  # the primary's disk lies in the orbit's plane
    assert s2[2] / np.linalg.norm(s2) == pytest.approx(np.cos(np.radians(45.0)), abs=0.03)


@pytest.mark.parametrize(
    "params, fragment",
    [
        ({"scale": -1.0}, "scale = -1.0 is out of range"),
        ({"scale": float("nan")}, "scale = nan is out of range"),
        ({"mass": "heavy"}, "mass = 'heavy' is not a number"),
        ({"mass": True}, "mass = True is not a number"),
    ],
)
def test_bad_params_name_the_key(params, fragment):
    with pytest.raises(ConfigError, match=fragment):
        ics.generate("plummer", 10, 0, params)


def test_unknown_param_lists_valid_keys():
    with pytest.raises(ConfigError, match="scal: generator 'plummer' has no such parameter") as info:
        ics.generate("plummer", 10, 0, {"scal": 1.0})
    assert "valid keys: scale, mass" in str(info.value)


def test_out_of_range_names_range():
    with pytest.raises(
        ConfigError, match=r"incline2 = 400.0 is out of range; expected float in \[-180, 180\]"
    ):
        ics.generate("collision", 10, 0, {"incline2": 400.0})


def test_validate_params_for_scenes():
    values = ics.validate_params("plummer", {"scale": "2"}, key_prefix="initial.")
    assert values == {"scale": 2.0, "mass": 1.0}  # command-line strings become numbers
    with pytest.raises(ConfigError, match="initial.bogus: .*valid keys: initial.scale, initial.mass"):
        ics.validate_params("plummer", {"bogus": 1}, key_prefix="initial.")
    with pytest.raises(ConfigError, match="initial.mass = '-3' is out of range"):
        ics.validate_params("plummer", {"mass": "-3"}, key_prefix="initial.")


def test_bad_generator_n_and_seed():
    with pytest.raises(ConfigError, match="plummer"):
        ics.generate("galaxy", 10, 0, {})
    with pytest.raises(ConfigError, match="n = 0"):
        ics.generate("cube", 0, 0, {})
    with pytest.raises(ConfigError, match="n = 1"):
        ics.generate("collision", 1, 0, {})
    with pytest.raises(ConfigError, match="seed"):
        ics.generate("cube", 10, -1, {})
