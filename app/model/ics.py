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
from app.model.sampling import isotropic

_BIG = 1e6


class Param(NamedTuple):
    default: float | int
    type: type
    min: float
    max: float
    doc: str


_MASS = Param(1.0, float, 1e-12, 1e12, "total mass, shared equally by all bodies")
DEFAULT_SOFTENING = 0.01  # physics.softening's default (app/model/physics.py), for callers without a scene


@dataclass(frozen=True)
class Generator:
    name: str
    doc: str
    params: dict[str, Param]
    # (rng, n, **params) -> (pos, vel) for G = 1, or (pos, vel, parts), or (pos, vel, parts, masses): parts
    # [(name, count), ...] are the model's components (app.model.components) as consecutive blocks of rows;
    # masses, per body, summing to the `mass` parameter (else every body has mass / n)
    build: Callable[..., tuple]
    min_n: int = 1
    equilibrium: bool = False  # velocities balance gravity: scaled by √G
    softened: bool = False  # the builder takes the run's softening (velocities from the softened pull)

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

    def make(
        self, n: int, seed: int, G: float = 1.0, softening: float = DEFAULT_SOFTENING, **params
    ) -> Bodies:
        values = self.resolve(params)
        n = _check_int(f"generator {self.name!r}: n", n, self.min_n)
        seed = _check_int(f"generator {self.name!r}: seed", seed, 0)
        if self.softened:
            values["softening"] = float(softening)
        pos, vel, *rest = self.build(np.random.default_rng(seed), n, **values)
        mass = rest[1] if len(rest) > 1 else np.full(n, values["mass"] / n)
        pos, vel = _centre(pos, vel, mass)
        if self.equilibrium:
            vel = vel * math.sqrt(G)
        return Bodies.from_arrays(
            pos,
            vel,
            mass,
            source=f"generator {self.name!r}",
            components=Components.from_sizes(rest[0]) if rest else None,
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


def _centre(pos: np.ndarray, vel: np.ndarray, mass: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Moved to the centre-of-mass frame (position and velocity)."""
    w = mass / mass.sum()
    return pos - w @ pos, vel - w @ vel


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
    pos = r[:, None] * isotropic(rng, n)
    speed = _plummer_speeds(rng, n) * np.sqrt(2.0) * (1.0 + r * r) ** -0.25
    vel = speed[:, None] * isotropic(rng, n)
    return pos * _PLUMMER_A, vel / np.sqrt(_PLUMMER_A)


def _build_plummer(rng, n, scale, mass):
    pos, vel = plummer_henon(rng, n)
    return pos * scale, vel * np.sqrt(mass / scale)


# ------------------------------------------------------------------------------------- disk, collision

# The galaxy generators' shared parameters (app/model/galaxy.py builds the model; docs/galaxies.md). Lengths
# are fractions of `radius`, the disk's outer radius, whose exponential scale length is radius / 4; masses
# are ratios to the disk's. The defaults are Milky-Way-like: halo 12x the disk within the model, the disk
# sub-maximal (the halo holds 0.6 of the pull at 2.2 scale lengths), Toomre Q 1.5.
_BULGE_EXTENT = 1.0  # where the bulge's density is cut off, fraction of radius (Hernquist scale 0.05)
_GALAXY_PARAMS = {
    "radius": Param(
        1.0, float, 1e-6, _BIG, "outer radius of the disk (length); its scale length is radius/4"
    ),
    "thickness": Param(0.025, float, 1e-4, 1.0, "disk's sech^2 scale height z0, as a fraction of radius"),
    "bulge_mass": Param(0.2, float, 0.0, 10.0, "bulge mass / disk mass (0: no bulge)"),
    "bulge_scale": Param(0.05, float, 1e-3, 1.0, "bulge's Hernquist scale, as a fraction of radius"),
    "halo_mass": Param(12.0, float, 0.0, 100.0, "dark halo mass within the model / disk mass (0: no halo)"),
    "halo_scale": Param(1.25, float, 1e-2, 100.0, "halo's Hernquist scale, as a fraction of radius"),
    "halo_radius": Param(3.75, float, 0.1, 100.0, "where the halo's density is cut off, fraction of radius"),
    "bulge_bodies": Param(0.1, float, 0.0, 0.9, "fraction of the bodies in the bulge"),
    "halo_bodies": Param(0.5, float, 0.0, 0.9, "fraction of the bodies in the halo"),
    "toomre_q": Param(
        1.5, float, 0.5, 10.0, "the disk's Toomre Q at every radius (sets its radial dispersion)"
    ),
    "mass": Param(1.0, float, 1e-12, 1e12, "total mass of the model: disk, bulge and halo"),
}


def galaxy_counts(n: int, bulge_bodies: float, halo_bodies: float, bulge_mass: float, halo_mass: float):
    """(bulge, disk, halo) bodies out of n; a part without mass gets none, and the disk at least one."""
    n_bulge = round(bulge_bodies * n) if bulge_mass > 0 else 0
    n_halo = round(halo_bodies * n) if halo_mass > 0 else 0
    n_disk = n - n_bulge - n_halo
    if n_disk < 1:
        raise ConfigError(
            f"bulge_bodies + halo_bodies leave no body of {n} for the disk; lower them or raise n"
        )
    return n_bulge, n_disk, n_halo


def galaxy_spec(softening: float = DEFAULT_SOFTENING, counts=(1, 1, 1), **params):
    """The internal GalaxySpec (disk scale length 1, disk mass 1) of the galaxy parameters `params` (the
    table's defaults for the rest) at the run's `softening`, and the length unit it is scaled by; a part
    with no bodies in `counts` (bulge, disk, halo) is left out of the model."""
    from app.model.galaxy import DISK_SCALES_PER_RADIUS, GalaxySpec

    p = {key: spec.default for key, spec in _GALAXY_PARAMS.items()} | params
    k = DISK_SCALES_PER_RADIUS  # internal lengths per `radius`
    length = p["radius"] / k
    spec = GalaxySpec(
        disk_height=p["thickness"] * k,
        disk_extent=k,
        bulge_mass=p["bulge_mass"] if counts[0] else 0.0,
        bulge_scale=p["bulge_scale"] * k,
        bulge_radius=_BULGE_EXTENT * k,
        halo_mass=p["halo_mass"] if counts[2] else 0.0,
        halo_scale=p["halo_scale"] * k,
        halo_radius=p["halo_radius"] * k,
        toomre_q=p["toomre_q"],
        softening=softening / length,
    )
    return spec, length


def _build_galaxy(rng, n, softening, bulge_bodies, halo_bodies, mass, **params):
    """One equilibrium galaxy (app/model/galaxy.py), scaled from its internal units (disk scale length 1,
    disk mass 1) to `radius` and `mass`; per-body masses, components bulge, disk, halo."""
    from app.model.galaxy import make_galaxy

    counts = galaxy_counts(n, bulge_bodies, halo_bodies, params["bulge_mass"], params["halo_mass"])
    spec, length = galaxy_spec(softening, counts, **params)
    galaxy = make_galaxy(rng, counts, spec)
    mass_unit = mass / galaxy.mass.sum()
    speed = math.sqrt(mass_unit / length)
    return galaxy.pos * length, galaxy.vel * speed, galaxy.parts, galaxy.mass * mass_unit


def _build_disk(rng, n, softening, **params):
    return _build_galaxy(rng, n, softening, **params)


# -------------------------------------------------------------------------------------------- collision


def _rotation_x(degrees: float) -> np.ndarray:
    t = np.radians(degrees)
    return np.array([[1.0, 0.0, 0.0], [0.0, np.cos(t), -np.sin(t)], [0.0, np.sin(t), np.cos(t)]])


def collision_split(n: int, mass_ratio: float) -> tuple[int, int]:
    """Bodies in the primary and secondary galaxy; the primary's come first in the output."""
    n1 = min(max(round(n / (1.0 + mass_ratio)), 1), n - 1)
    return n1, n - n1


def kepler_orbit(separation: float, pericentre: float, eccentricity: float, mass: float):
    """Relative position and velocity (secondary minus primary) of two point masses of total `mass`
    (G = 1) at `separation`, approaching on the conic with this pericentre and eccentricity; the orbit
    lies in the x-y plane with its angular momentum along +z."""
    if separation < pericentre:
        raise ConfigError(
            f"separation = {separation:g} is inside the pericentre ({pericentre:g}); start farther out"
        )
    semi_latus = pericentre * (1.0 + eccentricity)
    cos_f = (semi_latus / separation - 1.0) / eccentricity
    if cos_f < -1.0:
        apocentre = semi_latus / (1.0 - eccentricity)
        raise ConfigError(
            f"separation = {separation:g} is beyond the orbit's apocentre ({apocentre:g}) at eccentricity "
            f"{eccentricity:g}; start closer or raise the eccentricity"
        )
    f = -math.acos(min(cos_f, 1.0))  # before pericentre: approaching
    v_scale = math.sqrt(mass / semi_latus)
    v_r = v_scale * eccentricity * math.sin(f)
    v_t = v_scale * (1.0 + eccentricity * math.cos(f))
    radial = np.array([math.cos(f), math.sin(f), 0.0])
    along = np.array([-math.sin(f), math.cos(f), 0.0])
    return separation * radial, v_r * radial + v_t * along


def _build_collision(
    rng, n, softening, separation, pericentre, eccentricity, mass_ratio, incline1, incline2, **galaxy
):
    """Two equilibrium galaxies (halos included) on a Kepler orbit of their total masses; the secondary's
    lengths scale as mass^(1/3) (equal mean density); each disk is inclined about x by its angle."""
    n1, n2 = collision_split(n, mass_ratio)
    mass = galaxy.pop("mass")
    m1 = mass / (1.0 + mass_ratio)
    m2 = mass - m1
    radius = galaxy.pop("radius")
    built = []
    for count, m, r, incline in (
        (n1, m1, radius, incline1),
        (n2, m2, radius * mass_ratio ** (1 / 3), incline2),
    ):
        pos, vel, parts, masses = _build_galaxy(rng, count, softening, radius=r, mass=m, **galaxy)
        pos, vel = _centre(pos, vel, masses)
        rot = _rotation_x(incline)
        built.append((pos @ rot.T, vel @ rot.T, parts, masses))
    rel_pos, rel_vel = kepler_orbit(separation, pericentre, eccentricity, mass)
    f1, f2 = m2 / mass, m1 / mass  # each galaxy's share of the relative motion, about the centre of mass
    (p1, v1, parts1, w1), (p2, v2, parts2, w2) = built
    pos = np.concatenate([p1 - f1 * rel_pos, p2 + f2 * rel_pos])
    vel = np.concatenate([v1 - f1 * rel_vel, v2 + f2 * rel_vel])
    parts = [
        (f"galaxy{k}-{name}", count)
        for k, galaxy_parts in ((1, parts1), (2, parts2))
        for name, count in galaxy_parts
    ]
    return pos, vel, parts, np.concatenate([w1, w2])


# ----------------------------------------------------------------------------------- cube, shell, expand


def _build_cube(rng, n, size, velocity, mass):
    pos = rng.uniform(-0.5 * size, 0.5 * size, (n, 3))
    vel = rng.uniform(-velocity, velocity, (n, 3))
    return pos, vel


def _build_shell(rng, n, radius, thickness, rotation, mass):
    r = radius * rng.uniform(1.0 - 0.5 * thickness, 1.0 + 0.5 * thickness, n)
    pos = r[:, None] * isotropic(rng, n)
    vel = rotation * np.column_stack([-pos[:, 1], pos[:, 0], np.zeros(n)])  # rigid rotation ω ẑ × r
    return pos, vel


def _build_expand(rng, n, radius, rate, mass):
    r = radius * rng.uniform(0.0, 1.0, n) ** (1.0 / 3.0)
    pos = r[:, None] * isotropic(rng, n)
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
            "equilibrium disk galaxy: exponential disk, Hernquist bulge, live dark halo (docs/galaxies.md)",
            _GALAXY_PARAMS,
            _build_disk,
            equilibrium=True,
            softened=True,
        ),
        Generator(
            "collision",
            "two equilibrium disk galaxies, halos included, on a Kepler orbit of chosen pericentre",
            {
                "separation": Param(6.0, float, 1e-6, _BIG, "initial distance between the galaxies' centres"),
                "pericentre": Param(1.0, float, 1e-6, _BIG, "closest approach of the point-mass orbit"),
                "eccentricity": Param(
                    1.0, float, 0.01, 100.0, "of the orbit: 1 parabolic, < 1 bound, > 1 not"
                ),
                "mass_ratio": Param(1.0, float, 0.01, 100.0, "secondary mass / primary mass"),
                "incline1": Param(
                    0.0, float, -180.0, 180.0, "the primary disk's inclination about x, degrees"
                ),
                "incline2": Param(
                    45.0, float, -180.0, 180.0, "the secondary disk's inclination about x, degrees"
                ),
                **_GALAXY_PARAMS,
                "radius": Param(
                    1.0, float, 1e-6, _BIG, "primary disk's outer radius; the secondary scales as mass^(1/3)"
                ),
                "mass": Param(1.0, float, 1e-12, 1e12, "total mass of both galaxies, halos included"),
            },
            _build_collision,
            min_n=2,
            equilibrium=True,
            softened=True,
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


def generate(
    name: str,
    n: int,
    seed: int,
    params: dict | None = None,
    G: float = 1.0,
    softening: float = DEFAULT_SOFTENING,
) -> Bodies:
    """Bodies from generator `name` for gravitational constant G and the run's softening (the galaxies'
    velocities balance the softened pull); ConfigError for an unknown name, bad n/seed or a bad parameter."""
    return _lookup(name).make(n, seed, G, softening, **(params or {}))


BENCH_SCENE = "plummer"  # the benchmark's and tune's default generator


def bench_bodies(n: int, seed: int = 42, scene: str = BENCH_SCENE) -> Bodies:
    """The benchmark (and tune) state: app.model.ics's generator `scene` (default the Plummer sphere) with its
    default parameters, the same bodies for the same scene, n and seed."""
    return generate(scene, n, seed)
