"""Deterministic initial-condition generators, in N-body units.

Builders work with G = 1; `generate(..., G=g)` then multiplies the velocities of every generator that
promises equilibrium (`equilibrium=True`: plummer, disk, collision) by √g. That is the exact similarity
of the equations of motion (same orbits, time scaled by 1/√g), so a Plummer sphere stays in virial
balance and a disk on circular orbits for any G; velocities a user gives outright (cube, shell,
expand) are left as given.

Every generator is one record in `GENERATORS` (name, one-line doc, parameter table, builder), so the
scene loader, the CLI and the tests all walk the same table. `generate(name, n, seed, params)` checks
the parameters against the table (ConfigError naming the key and its range) and returns a validated
`Bodies`. The same seed gives bit-identical output: each call owns a fresh `np.random.default_rng(seed)`
and draws in a fixed order. All bodies have equal mass (`mass / n`, summing to `mass`), and
the result is moved to its centre-of-mass frame (position and velocity), which keeps the camera's
target and the momentum diagnostics at zero from the first frame. Generators that build parts give them
as components (app.model.components): disk's bulge and disk, and collision's galaxy1-bulge, galaxy1-disk,
galaxy2-bulge, galaxy2-disk.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from app.core.errors import ConfigError
from app.model.bodies import Bodies
from app.model.components import Components

_BIG = 1e6


class Param(NamedTuple):
    default: float | int
    type: type
    min: float
    max: float
    doc: str


_MASS = Param(1.0, float, 1e-12, 1e12, "total mass, shared equally by all bodies")


@dataclass(frozen=True)
class Generator:
    name: str
    doc: str
    params: dict[str, Param]
    # (rng, n, **params) -> (pos, vel) for G = 1, or (pos, vel, parts): parts [(name, count), ...] are the
    # model's components (app.model.components) as consecutive blocks of rows
    build: Callable[..., tuple]
    min_n: int = 1
    equilibrium: bool = False  # velocities balance gravity: scaled by √G

    def resolve(self, params: dict, key_prefix: str = "") -> dict:
        """Defaults overlaid with `params`, each checked for name, type and range.

        `key_prefix` is how the caller spells the keys ("initial." in a scene) so messages match what
        the user wrote; numeric strings (from a command line) are accepted and converted.
        """
        unknown = sorted(set(params) - set(self.params))
        if unknown:
            valid = ", ".join(key_prefix + k for k in self.params)
            raise ConfigError(
                f"{key_prefix}{unknown[0]}: generator {self.name!r} has no such parameter; "
                f"valid keys: {valid}"
            )
        return {
            key: _check_param(self.name, key_prefix + key, params.get(key, spec.default), spec)
            for key, spec in self.params.items()
        }

    def make(self, n: int, seed: int, G: float = 1.0, **params) -> Bodies:
        values = self.resolve(params)
        n = _check_int(f"generator {self.name!r}: n", n, self.min_n)
        seed = _check_int(f"generator {self.name!r}: seed", seed, 0)
        pos, vel, *parts = self.build(np.random.default_rng(seed), n, **values)
        pos, vel = _centre(pos, vel)
        if self.equilibrium:
            vel = vel * math.sqrt(G)
        return Bodies.from_arrays(
            pos,
            vel,
            np.full(n, values["mass"] / n),
            source=f"generator {self.name!r}",
            components=Components.from_sizes(parts[0]) if parts else None,
        )


def _check_param(generator: str, key: str, value, spec: Param):
    where = f"{key} = {value!r}"
    low, high = (str(int(v)) if spec.type is int else f"{v:g}" for v in (spec.min, spec.max))
    what = f"{spec.type.__name__} in [{low}, {high}] for generator {generator!r} ({spec.doc})"
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ConfigError(f"{where} is not a number; expected {what}") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where} is not a number; expected {what}")
    if spec.type is int:
        if not math.isfinite(value) or value != math.floor(value):
            raise ConfigError(f"{where} is not an integer; expected {what}")
        value = int(value)
    else:
        value = float(value)
    if not spec.min <= value <= spec.max:  # also rejects NaN
        raise ConfigError(f"{where} is out of range; expected {what}")
    return value


def _check_int(what: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ConfigError(f"{what} = {value!r} must be an integer >= {minimum}")
    if value < minimum:
        raise ConfigError(f"{what} = {value} must be >= {minimum}")
    return int(value)


def _centre(pos: np.ndarray, vel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # Equal masses: the centre of mass is the plain mean.
    return pos - pos.mean(axis=0), vel - vel.mean(axis=0)


def _isotropic(rng: np.random.Generator, n: int) -> np.ndarray:
    """Unit vectors uniform on the sphere (uniform cos θ and φ: no normalisation of near-zero vectors)."""
    cos_t = rng.uniform(-1.0, 1.0, n)
    phi = rng.uniform(0.0, 2.0 * np.pi, n)
    sin_t = np.sqrt(1.0 - cos_t * cos_t)
    return np.column_stack([sin_t * np.cos(phi), sin_t * np.sin(phi), cos_t])


# ---------------------------------------------------------------------------------------------- plummer

# Radii are drawn from the mass profile truncated at 99.9% of the mass (≈ 38.7 Plummer radii, NEMO
# mkplummer's default): the rare far outliers would blow up the camera's fit and the tree depth.
_PLUMMER_MFRAC = 0.999
_PLUMMER_A = 3.0 * np.pi / 16.0  # Plummer radius in Hénon units, where E = -3π/(64 a) = -1/4


def _plummer_speeds(rng: np.random.Generator, n: int) -> np.ndarray:
    """q = v / v_esc with density g(q) = q² (1 - q²)^(7/2), by von Neumann rejection (g < 0.1)."""
    out = np.empty(n)
    filled = 0
    while filled < n:
        k = max(2 * (n - filled), 64)  # acceptance is ~49%, so this usually finishes in one or two rounds
        q = rng.uniform(0.0, 1.0, k)
        y = rng.uniform(0.0, 0.1, k)
        accepted = q[y < q * q * (1.0 - q * q) ** 3.5][: n - filled]
        out[filled : filled + accepted.size] = accepted
        filled += accepted.size
    return out


def plummer_henon(rng: np.random.Generator, n: int, mass_fraction: float = _PLUMMER_MFRAC):
    """Aarseth, Hénon & Wielen (1974): a Plummer sphere in Hénon units (G = M = 1, E = -1/4).

    Radii come from the profile truncated at `mass_fraction` of the mass; returns (pos, vel).
    """
    m = rng.uniform(0.0, mass_fraction, n)
    m23 = m ** (2.0 / 3.0)
    r = np.sqrt(m23 / (1.0 - m23))  # inverse of m(r) = r³ / (1 + r²)^(3/2), Plummer radius 1
    pos = r[:, None] * _isotropic(rng, n)
    speed = _plummer_speeds(rng, n) * np.sqrt(2.0) * (1.0 + r * r) ** -0.25
    vel = speed[:, None] * _isotropic(rng, n)
    return pos * _PLUMMER_A, vel / np.sqrt(_PLUMMER_A)


def _build_plummer(rng, n, scale, mass):
    pos, vel = plummer_henon(rng, n)
    return pos * scale, vel * np.sqrt(mass / scale)


# ------------------------------------------------------------------------------------------------- disk

_DISK_SCALE = 0.25  # exponential scale length as a fraction of the outer radius (~91% of the mass inside)
_BULGE_SCALE = 0.1  # bulge virial radius as a fraction of the disk radius
_BULGE_EXTENT = 0.5  # bulge truncation radius as a fraction of the disk radius: no bulge stars far out
_DISK_SOFTENING = 0.05  # keeps v_c finite for disk bodies near the centre, as a fraction of the radius


def _disk_radii(rng: np.random.Generator, n: int, scale_length: float, r_max: float) -> np.ndarray:
    """R with density ∝ R exp(-R / h), i.e. Gamma(2, h), redrawn beyond r_max."""
    r = rng.gamma(2.0, scale_length, n)
    while (out := r > r_max).any():
        r[out] = rng.gamma(2.0, scale_length, int(out.sum()))
    return r


def _build_disk(rng, n, radius, thickness, central_mass, dispersion, mass):
    """Bulge (a small Plummer sphere) plus exponential disk in the x-y plane, rotating about +z; the
    bulge's rows come first (components bulge, disk)."""
    m = mass / n
    n_bulge = round(central_mass * n)
    n_disk = n - n_bulge
    b = _BULGE_SCALE * radius
    x = _BULGE_EXTENT / (_BULGE_SCALE * _PLUMMER_A)  # the truncation radius in Plummer radii
    bulge_pos, bulge_vel = plummer_henon(rng, n_bulge, mass_fraction=x**3 / (1.0 + x * x) ** 1.5)
    bulge_pos *= b
    bulge_vel *= np.sqrt(n_bulge * m / b)

    r_cyl = _disk_radii(rng, n_disk, _DISK_SCALE * radius, radius)
    phi = rng.uniform(0.0, 2.0 * np.pi, n_disk)
    z = rng.normal(0.0, thickness * radius, n_disk)
    disk_pos = np.column_stack([r_cyl * np.cos(phi), r_cyl * np.sin(phi), z])

    # Circular speed from the mass enclosed in a sphere through each body: a spherical approximation of
    # bulge + disk, close enough for "near-circular" and cheap (one sort) at any N.
    all_r = np.sort(np.linalg.norm(np.concatenate([bulge_pos, disk_pos]), axis=1))
    r_sph = np.linalg.norm(disk_pos, axis=1)
    enclosed = m * np.searchsorted(all_r, r_sph, side="right")
    eps = _DISK_SOFTENING * radius
    v_c = np.sqrt(enclosed * r_cyl**2 / (r_sph**2 + eps**2) ** 1.5)
    tangent = np.column_stack([-np.sin(phi), np.cos(phi), np.zeros(n_disk)])
    disk_vel = v_c[:, None] * tangent + rng.normal(0.0, 1.0, (n_disk, 3)) * (dispersion * v_c)[:, None]
    return (
        np.concatenate([bulge_pos, disk_pos]),
        np.concatenate([bulge_vel, disk_vel]),
        [("bulge", n_bulge), ("disk", n_disk)],
    )


_DISK_PARAMS = {
    "radius": Param(1.0, float, 1e-6, _BIG, "outer radius of the disk (length)"),
    "thickness": Param(0.02, float, 0.0, 1.0, "vertical Gaussian scale height as a fraction of radius"),
    "central_mass": Param(0.2, float, 0.0, 1.0, "fraction of the bodies in the central bulge"),
    "dispersion": Param(0.05, float, 0.0, 1.0, "random velocity per component, fraction of circular speed"),
    "mass": _MASS,
}


# -------------------------------------------------------------------------------------------- collision


def _rotation_x(degrees: float) -> np.ndarray:
    t = np.radians(degrees)
    return np.array([[1.0, 0.0, 0.0], [0.0, np.cos(t), -np.sin(t)], [0.0, np.sin(t), np.cos(t)]])


def collision_split(n: int, mass_ratio: float) -> tuple[int, int]:
    """Bodies in the primary and secondary galaxy; the primary's come first in the output."""
    n1 = min(max(round(n / (1.0 + mass_ratio)), 1), n - 1)
    return n1, n - n1


def _build_collision(rng, n, separation, speed, impact, mass_ratio, tilt, radius, mass):
    """Primary at -x, secondary (tilted about x) at +x offset by `impact` in y, closing along x."""
    n1, n2 = collision_split(n, mass_ratio)
    m1, m2 = mass * n1 / n, mass * n2 / n  # equal body masses: the realised ratio is n2 / n1
    d = _DISK_PARAMS
    common = {k: d[k].default for k in ("thickness", "central_mass", "dispersion")}
    pos1, vel1, parts1 = _build_disk(rng, n1, radius=radius, mass=m1, **common)
    pos1, vel1 = _centre(pos1, vel1)
    # Equal mean density: a lighter galaxy is smaller.
    pos2, vel2, parts2 = _build_disk(rng, n2, radius=radius * (m2 / m1) ** (1 / 3), mass=m2, **common)
    pos2, vel2 = _centre(pos2, vel2)
    rot = _rotation_x(tilt)
    pos2, vel2 = pos2 @ rot.T, vel2 @ rot.T
    rel_pos = np.array([separation, impact, 0.0])
    rel_vel = np.array([-speed, 0.0, 0.0])
    f1, f2 = m2 / (m1 + m2), m1 / (m1 + m2)  # each galaxy's share of the relative motion, about the COM
    pos = np.concatenate([pos1 - f1 * rel_pos, pos2 + f2 * rel_pos])
    vel = np.concatenate([vel1 - f1 * rel_vel, vel2 + f2 * rel_vel])
    parts = [
        (f"galaxy{k}-{name}", count) for k, galaxy in ((1, parts1), (2, parts2)) for name, count in galaxy
    ]
    return pos, vel, parts


# ----------------------------------------------------------------------------------- cube, shell, expand


def _build_cube(rng, n, size, velocity, mass):
    pos = rng.uniform(-0.5 * size, 0.5 * size, (n, 3))
    vel = rng.uniform(-velocity, velocity, (n, 3))
    return pos, vel


def _build_shell(rng, n, radius, thickness, rotation, mass):
    r = radius * rng.uniform(1.0 - 0.5 * thickness, 1.0 + 0.5 * thickness, n)
    pos = r[:, None] * _isotropic(rng, n)
    vel = rotation * np.column_stack([-pos[:, 1], pos[:, 0], np.zeros(n)])  # rigid rotation ω ẑ × r
    return pos, vel


def _build_expand(rng, n, radius, rate, mass):
    r = radius * rng.uniform(0.0, 1.0, n) ** (1.0 / 3.0)
    pos = r[:, None] * _isotropic(rng, n)
    pos -= pos.mean(axis=0)  # centre first so the Hubble flow v = H r is about the centre of mass
    return pos, rate * pos


GENERATORS: dict[str, Generator] = {
    g.name: g
    for g in (
        Generator(
            "plummer",
            "Plummer sphere in Hénon units (M = 1, E = -1/4, virial equilibrium)",
            {
                "scale": Param(
                    1.0, float, 1e-6, _BIG, "length unit: the virial radius (Plummer a = 3π/16 · scale)"
                ),
                "mass": _MASS,
            },
            _build_plummer,
            equilibrium=True,
        ),
        Generator(
            "disk",
            "rotating disk galaxy: central bulge plus an exponential disk on near-circular orbits",
            _DISK_PARAMS,
            _build_disk,
            equilibrium=True,
        ),
        Generator(
            "collision",
            "two disk galaxies on an approaching orbit, the second tilted about x",
            {
                "separation": Param(6.0, float, 1e-6, _BIG, "initial distance between the galaxies along x"),
                "speed": Param(0.5, float, 0.0, _BIG, "relative approach speed along x (at G = 1; times √G)"),
                "impact": Param(1.0, float, -_BIG, _BIG, "impact parameter: offset across the approach (y)"),
                "mass_ratio": Param(1.0, float, 0.01, 100.0, "secondary mass / primary mass"),
                "tilt": Param(45.0, float, -180.0, 180.0, "tilt of the secondary's disk about x, degrees"),
                "radius": Param(
                    1.0, float, 1e-6, _BIG, "primary disk radius; the secondary scales as mass^(1/3)"
                ),
                "mass": _MASS,
            },
            _build_collision,
            min_n=2,
            equilibrium=True,
        ),
        Generator(
            "cube",
            "uniform random positions in a cube, optional small random velocities",
            {
                "size": Param(2.0, float, 1e-6, _BIG, "edge length of the cube"),
                "velocity": Param(0.0, float, 0.0, _BIG, "maximum random speed per velocity component"),
                "mass": _MASS,
            },
            _build_cube,
        ),
        Generator(
            "shell",
            "bodies on a thin spherical shell, rotating rigidly about z",
            {
                "radius": Param(1.0, float, 1e-6, _BIG, "mean shell radius"),
                "thickness": Param(0.1, float, 0.0, 1.9, "shell width as a fraction of radius"),
                "rotation": Param(0.5, float, -_BIG, _BIG, "angular velocity about +z"),
                "mass": _MASS,
            },
            _build_shell,
        ),
        Generator(
            "expand",
            "uniform sphere with a radial Hubble-like outflow v = rate · r",
            {
                "radius": Param(1.0, float, 1e-6, _BIG, "radius of the sphere"),
                "rate": Param(1.0, float, 0.0, _BIG, "expansion rate H (escape for M = R = 1 is √2)"),
                "mass": _MASS,
            },
            _build_expand,
        ),
    )
}


def _lookup(name: str) -> Generator:
    generator = GENERATORS.get(name)
    if generator is None:
        raise ConfigError(f"unknown generator {name!r}; choose from {', '.join(GENERATORS)}")
    return generator


def validate_params(name: str, params: dict, key_prefix: str = "") -> dict:
    """The complete, typed parameter dict for generator `name` (defaults filled in); ConfigError if bad."""
    return _lookup(name).resolve(params, key_prefix)


def generate(name: str, n: int, seed: int, params: dict | None = None, G: float = 1.0) -> Bodies:
    """Bodies from generator `name` for gravitational constant G; ConfigError for an unknown name, bad
    n/seed or a bad parameter."""
    return _lookup(name).make(n, seed, G, **(params or {}))


BENCH_SCENE = "plummer"  # the benchmark's and tune's default generator


def bench_bodies(n: int, seed: int = 42, scene: str = BENCH_SCENE) -> Bodies:
    """The benchmark (and tune) state: app.model.ics's generator `scene` (default the Plummer sphere) with its
    default parameters, the same bodies for the same scene, n and seed."""
    return generate(scene, n, seed)
