"""Generators: deterministic, exact N, finite; Plummer in virial equilibrium; parameters checked."""

import numpy as np
import pytest

from app.core.errors import ConfigError
from app.model import ics
from app.model.physics import Physics, kinetic_energy, potential_energy

NAMES = sorted(ics.GENERATORS)


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
    assert np.ptp(a.mass) == 0.0
    np.testing.assert_allclose(a.pos.mean(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(a.vel.mean(axis=0), 0.0, atol=1e-12)


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
    b = ics.generate("disk", 2000, 5, {"central_mass": 0.1})
    r = np.hypot(b.pos[:, 0], b.pos[:, 1])
    v_phi = (b.pos[:, 0] * b.vel[:, 1] - b.pos[:, 1] * b.vel[:, 0]) / r
    disk = r > 0.3
    assert (v_phi[disk] > 0).mean() > 0.95
    assert np.median(np.abs(b.pos[disk, 2])) < 0.05
    assert np.linalg.norm(b.pos, axis=1).max() < 1.2  # the bulge is truncated inside the disk


def test_collision_two_clumps_approaching():
    n = 2000
    b = ics.generate("collision", n, 9, {"separation": 8.0, "mass_ratio": 0.5})
    n1, n2 = ics.collision_split(n, 0.5)
    assert n1 + n2 == n and n2 / n1 == pytest.approx(0.5, rel=0.01)
    c1, c2 = b.pos[:n1].mean(axis=0), b.pos[n1:].mean(axis=0)
    v1, v2 = b.vel[:n1].mean(axis=0), b.vel[n1:].mean(axis=0)
    gap = np.linalg.norm(c2 - c1)
    assert gap == pytest.approx(np.hypot(8.0, 1.0), rel=1e-6)
    r1 = np.quantile(np.linalg.norm(b.pos[:n1] - c1, axis=1), 0.9)
    r2 = np.quantile(np.linalg.norm(b.pos[n1:] - c2, axis=1), 0.9)
    assert r1 + r2 < 0.5 * gap  # separated clumps
    assert np.dot(c2 - c1, v2 - v1) < 0  # closing in


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
    with pytest.raises(ConfigError, match=r"tilt = 400.0 is out of range; expected float in \[-180, 180\]"):
        ics.generate("collision", 10, 0, {"tilt": 400.0})


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
