"""Equilibrium disk galaxies: an exponential disk (sech^2 vertical profile), a Hernquist bulge and a live
Hernquist dark halo, with velocities from the model's own softened potential (docs/galaxies.md).

The recipe is Hernquist's (1993, ApJS 86, 389), with the spheroids' velocities from their distribution
functions instead of his Gaussian moments:

* potential: the exact Plummer-softened pull of the model's smooth density (app/model/galaxy_pull.py):
  the spheroids as shells, the disk as rings on a fine (R, z) grid. No spherical estimate for the disk,
  no particle noise, and a cost that does not grow with N;
* bulge and halo: isotropic, from Eddington's inversion of each one's density in the spherical average
  of the total potential (Binney & Tremaine 2008, eq. 4.46b); velocities drawn from f(E) exactly;
* disk: sigma_R from a target Toomre Q at every radius, sigma_R = Q 3.36 G Sigma / kappa; sigma_phi from
  the epicycle ratio kappa^2 / (4 Omega^2); sigma_z from the vertical Jeans equation in the full potential
  at each (R, z); the mean rotation from the radial Jeans equation (the asymmetric drift):
  v_phi^2 = v_c^2 + sigma_R^2 (1 - kappa^2 / (4 Omega^2) + d ln(Sigma sigma_R^2) / d ln R).

The spheroids' densities are cut off smoothly beyond their radius (Kazantzidis, Magorrian & Moore 2004:
rho(r_t) (r / r_t)^c exp(-(r - r_t) / r_d) with the slope kept continuous), which keeps f(E) positive.

Internal units: G = 1, the disk's scale length and mass are 1; `build_galaxy` scales the result to the
caller's length and mass. Rows come in the order bulge, disk, halo.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from app.model.galaxy_pull import ring_pull, shell_potential_and_pull
from app.model.sampling import isotropic

# the scale length as a fraction of the disk's outer radius (the `radius` parameter), as the old preset
DISK_SCALES_PER_RADIUS = 4.0
_TOOMRE = 3.36  # Toomre's constant for a stellar disk
_CUT_DECAY = 0.1  # the spheroids' exponential cut-off length, as a fraction of their radius
_GRID = 1200  # radial nodes of the spherical tables (log-spaced)
_RING_R, _RING_Z = 200, 24  # the disk's mass grid (rings): radial cells, vertical cells per side
_TABLE_R, _TABLE_Z = 96, 20  # the disk's kinematic table: radii and heights where the pull is evaluated
_Z_EXTENT = 6.0  # the disk's grids reach 6 z0 (all but 1e-5 of a sech^2 layer's mass)
_SPEED_NODES = 512  # the speed grid of each radial bin of the spheroids' f(E) sampling


@dataclass(frozen=True)
class GalaxySpec:
    """One galaxy in internal units (disk scale length 1, disk mass 1, G = 1)."""

    disk_height: float  # z0 of sech^2(z / z0)
    disk_extent: float  # the disk's outer radius (R_d = 1)
    bulge_mass: float
    bulge_scale: float
    bulge_radius: float
    halo_mass: float  # within the model, the cut-off's tail included
    halo_scale: float
    halo_radius: float
    toomre_q: float
    softening: float


# ------------------------------------------------------------------------------------------- spheroids


class Spheroid:
    """A Hernquist sphere of total mass `mass` (tail included), scale a, cut off beyond r_t."""

    def __init__(self, mass: float, a: float, r_t: float, r_grid: np.ndarray):
        self.a, self.r_t, self.decay = a, r_t, _CUT_DECAY * r_t
        # the cut-off's exponent keeps d ln rho / d ln r continuous at r_t
        self.c = -1.0 - 3.0 * r_t / (r_t + a) + r_t / self.decay
        shape = self._shape(r_grid)
        cumulative = _cumulative_mass(r_grid, shape)
        self.norm = mass / cumulative[-1]
        self.r = r_grid
        self.rho = shape * self.norm
        self.enclosed = cumulative * self.norm
        self.mass = mass

    def _shape(self, r: np.ndarray) -> np.ndarray:
        x = r / self.a
        inner = 1.0 / (x * (1.0 + x) ** 3)
        xt = self.r_t / self.a
        at_cut = 1.0 / (xt * (1.0 + xt) ** 3)
        with np.errstate(over="ignore", under="ignore"):
            outer = at_cut * (r / self.r_t) ** self.c * np.exp(-(r - self.r_t) / self.decay)
        return np.where(r <= self.r_t, inner, outer)

    def sample_radii(self, rng: np.random.Generator, n: int) -> np.ndarray:
        u = rng.uniform(0.0, self.mass, n)
        return np.interp(u, self.enclosed, self.r)


def _cumulative_mass(r: np.ndarray, rho: np.ndarray) -> np.ndarray:
    """M(<r) of a density on a log grid: trapezoids in 4 pi r^3 rho d ln r, plus the inner power law."""
    integrand = 4.0 * np.pi * r**3 * rho
    dlnr = np.diff(np.log(r))
    inner = 4.0 * np.pi * r[0] ** 3 * rho[0] / 2.0  # rho ~ 1/r below the grid: M = 2 pi rho r^3
    return inner + np.concatenate([[0.0], np.cumsum(0.5 * (integrand[1:] + integrand[:-1]) * dlnr)])


def eddington(r: np.ndarray, rho: np.ndarray, psi: np.ndarray) -> np.ndarray:
    """f(E) at E = psi(r) for an isotropic component of density rho(r) in the relative potential psi(r)
    (decreasing in r): f = d/dE F / (sqrt(8) pi^2), F(E) = int_{psi < E} (d rho / d psi) d psi / sqrt(E - psi)
    written over r, F(E) = int_{r_E}^{inf} (-d rho / dr) dr / sqrt(E - psi(r)), with psi linear on each
    grid interval (the singularity at r_E integrates exactly). Negative values (round-off) are clipped."""
    drho = -np.diff(rho)  # -(d rho / dr) dr over each interval, > 0
    dpsi = np.maximum(psi[:-1] - psi[1:], 1e-300)
    energy = psi[:, None]
    upper = np.sqrt(np.maximum(energy - psi[None, 1:], 0.0))
    lower = np.sqrt(np.maximum(energy - psi[None, :-1], 0.0))
    # int over the interval of dr / sqrt(E - psi) = 2 (sqrt(E - psi_j+1) - sqrt(E - psi_j)) dr / dpsi;
    # times -(d rho / dr) = drho / dr: the dr cancels
    big_f = (2.0 * drho / dpsi * (upper - lower)).sum(axis=1)
    return np.maximum(np.gradient(big_f, psi) / (math.sqrt(8.0) * np.pi**2), 0.0)


def density_from_f(psi_at: np.ndarray, psi: np.ndarray, f: np.ndarray, nodes: int = 400) -> np.ndarray:
    """rho = 4 pi int_0^{v_esc} f(psi - v^2 / 2) v^2 dv at the relative potentials `psi_at`, f tabulated at
    E = psi: the check that `eddington` inverted right."""
    e_up, f_up = _increasing(psi, f)
    q = np.linspace(0.0, 1.0, nodes)
    out = np.empty(len(psi_at))
    for i, p in enumerate(psi_at):
        v = q * math.sqrt(2.0 * p)
        out[i] = 4.0 * np.pi * np.trapezoid(np.interp(p - 0.5 * v * v, e_up, f_up) * v * v, v)
    return out


def _increasing(psi: np.ndarray, f: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """f's table in increasing E, from E = 0 (unbound: f = 0) rather than clamped at the grid's last psi."""
    return np.concatenate([[0.0], psi[::-1]]), np.concatenate([[0.0], f[::-1]])


def sample_speeds(rng, radii, r_grid, psi, f) -> np.ndarray:
    """Speeds at `radii` from p(v) ~ v^2 f(psi(r) - v^2 / 2), by the inverse CDF per radial node."""
    e_up, f_up = _increasing(psi, f)
    node = np.clip(
        np.rint(np.interp(np.log(radii), np.log(r_grid), np.arange(r_grid.size))), 0, r_grid.size - 1
    )
    node = node.astype(np.int64)
    speeds = np.empty(radii.size)
    u = rng.uniform(0.0, 1.0, radii.size)
    q = np.linspace(0.0, 1.0, _SPEED_NODES)
    for k in np.unique(node):
        rows = np.flatnonzero(node == k)
        p = psi[k]
        weight = q * q * np.interp(p * (1.0 - q * q), e_up, f_up)
        cdf = np.concatenate([[0.0], np.cumsum(0.5 * (weight[1:] + weight[:-1]))])
        if cdf[-1] <= 0.0:  # no bound orbits here (f = 0): at rest
            speeds[rows] = 0.0
            continue
        speeds[rows] = np.interp(u[rows] * cdf[-1], cdf, q) * math.sqrt(2.0 * p)
    return speeds


# ------------------------------------------------------------------------------------------------ disk


class Disk:
    """An exponential disk of mass 1, scale length 1, sech^2 layer of height z0, cut at R = extent."""

    def __init__(self, z0: float, extent: float):
        self.z0, self.extent = z0, extent
        self.mass_inside = 1.0 - (1.0 + extent) * math.exp(-extent)  # of the untruncated disk
        self.sigma0 = 1.0 / (2.0 * np.pi * self.mass_inside)  # central surface density of the cut disk

    def surface_density(self, radius):
        return np.where(radius <= self.extent, self.sigma0 * np.exp(-radius), 0.0)

    def rings(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The disk as rings: cell-centred (R, z) over the radial and both vertical halves, with each cell's
        exact mass (the radial and vertical profiles integrated over the cell)."""
        r_edges = self.extent * np.linspace(0.0, 1.0, _RING_R + 1) ** 1.5  # finer near the centre
        m_r = np.diff(-(1.0 + r_edges) * np.exp(-r_edges)) / self.mass_inside  # M(<R) = 1 - (1 + R) e^-R
        z_edges = np.linspace(0.0, _Z_EXTENT * self.z0, _RING_Z + 1)
        m_z = 0.5 * np.diff(np.tanh(z_edges / self.z0))  # per side; sech^2 CDF is (1 + tanh) / 2
        m_z /= 2.0 * m_z.sum()
        r_mid = _mass_centre_radius(r_edges)
        z_mid = 0.5 * (z_edges[1:] + z_edges[:-1])
        R = np.repeat(r_mid, 2 * _RING_Z)
        z = np.tile(np.concatenate([z_mid, -z_mid]), _RING_R)
        m = np.outer(m_r, np.concatenate([m_z, m_z])).ravel()
        return R, z, m

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(R, phi, z) of n bodies: R ~ R e^-R below the extent, z ~ sech^2(z / z0)."""
        radius = rng.gamma(2.0, 1.0, n)
        while (out := radius > self.extent).any():
            radius[out] = rng.gamma(2.0, 1.0, int(out.sum()))
        phi = rng.uniform(0.0, 2.0 * np.pi, n)
        z = self.z0 * np.arctanh(rng.uniform(-1.0, 1.0, n) * (1.0 - 1e-12))
        return radius, phi, z


def _mass_centre_radius(edges: np.ndarray) -> np.ndarray:
    """The radius of a ring standing for an annulus: its area-weighted mean radius."""
    lo, hi = edges[:-1], edges[1:]
    return (2.0 / 3.0) * (hi**3 - lo**3) / (hi**2 - lo**2)


# ---------------------------------------------------------------------------------------------- galaxy


@dataclass
class Potential:
    """The model's softened potential as the generator uses it."""

    r: np.ndarray  # spherical grid
    psi: np.ndarray  # -Phi of the spherical average (all components)
    table_R: np.ndarray  # the disk's kinematic table: radii
    table_z: np.ndarray  # and heights (z >= 0)
    a_R: np.ndarray  # (R, z) the radial pull, all components
    a_z: np.ndarray  # (R, z) the vertical pull (towards the plane: < 0), all components


def potential(spec: GalaxySpec, disk: Disk, bulge: Spheroid | None, halo: Spheroid) -> Potential:
    r = halo.r  # the spherical grid every spheroid is tabulated on
    eps = spec.softening
    shells_r = 0.5 * (r[1:] + r[:-1])
    shells_m = np.zeros(r.size - 1)
    for part in (bulge, halo):
        if part is not None:
            shells_m += np.diff(part.enclosed)
    ring_R, ring_z, ring_m = disk.rings()
    # the disk's spherical average: its rings' mass binned by spherical radius
    disk_shell = np.clip(np.searchsorted(r, np.hypot(ring_R, ring_z)) - 1, 0, r.size - 2)
    shells_m_all = shells_m + np.bincount(disk_shell, weights=ring_m, minlength=r.size - 1)
    phi, _ = shell_potential_and_pull(r, shells_r, shells_m_all, eps)
    psi = -phi
    # the disk table: rings for the disk, shells for the spheroids
    table_R = np.concatenate([[0.0], spec.disk_extent * 1.15 * np.linspace(0.0, 1.0, _TABLE_R)[1:] ** 1.5])
    table_R[0] = 1e-3
    table_z = _Z_EXTENT * disk.z0 * np.linspace(0.0, 1.0, _TABLE_Z) ** 1.5
    RR, ZZ = np.meshgrid(table_R, table_z, indexing="ij")
    a_R, a_z = ring_pull(RR, ZZ, ring_R, ring_z, ring_m, eps)
    rs = np.hypot(RR.ravel(), ZZ.ravel())
    _, a_sph = shell_potential_and_pull(rs, shells_r, shells_m, eps)
    a_R += a_sph * RR.ravel() / rs
    a_z += a_sph * ZZ.ravel() / rs
    return Potential(r, psi, table_R, table_z, a_R.reshape(RR.shape), a_z.reshape(RR.shape))


def bilinear(x_grid, y_grid, table, x, y):
    i = np.clip(np.searchsorted(x_grid, x) - 1, 0, x_grid.size - 2)
    j = np.clip(np.searchsorted(y_grid, y) - 1, 0, y_grid.size - 2)
    tx = np.clip((x - x_grid[i]) / (x_grid[i + 1] - x_grid[i]), 0.0, 1.0)
    ty = np.clip((y - y_grid[j]) / (y_grid[j + 1] - y_grid[j]), 0.0, 1.0)
    return (
        table[i, j] * (1 - tx) * (1 - ty)
        + table[i + 1, j] * tx * (1 - ty)
        + table[i, j + 1] * (1 - tx) * ty
        + table[i + 1, j + 1] * tx * ty
    )


@dataclass
class DiskKinematics:
    """The disk's velocity moments on the table (R, z)."""

    R: np.ndarray
    z: np.ndarray
    v_phi2: np.ndarray  # (R, z) mean rotation squared
    sigma_R: np.ndarray  # (R,)
    sigma_phi: np.ndarray  # (R,)
    sigma_z2: np.ndarray  # (R, z)
    kappa: np.ndarray  # (R,)


def disk_kinematics(spec: GalaxySpec, disk: Disk, pot: Potential) -> DiskKinematics:
    R, z = pot.table_R, pot.table_z
    omega2 = np.maximum(-pot.a_R[:, 0] / R, 1e-12)
    # kappa^2 between Omega^2 (a point mass) and 4 Omega^2 (solid rotation): beyond the disk's sharp cut
    # its slope alone would make kappa^2 negative, and sigma_R = Q 3.36 G Sigma / kappa blow up there
    kappa2 = np.clip(R * np.gradient(omega2, R) + 4.0 * omega2, omega2, 4.0 * omega2)
    kappa = np.sqrt(kappa2)
    sigma = np.maximum(disk.sigma0 * np.exp(-R), 1e-12)  # the exponential's Sigma (no cut) for the drift
    sigma_R = spec.toomre_q * _TOOMRE * sigma / kappa
    ratio = kappa2 / (4.0 * omega2)  # sigma_phi^2 / sigma_R^2 (epicycles)
    sigma_phi = sigma_R * np.sqrt(ratio)
    dln = np.gradient(np.log(sigma * sigma_R**2), np.log(R))
    v_c2 = np.maximum(-pot.a_R * R[:, None], 0.0)
    v_phi2 = np.maximum(v_c2 + (sigma_R**2 * (1.0 - ratio + dln))[:, None], 0.0)
    # vertical Jeans: rho sigma_z^2 = int_z^top rho |a_z| dz', rho ~ sech^2(z / z0)
    rho = 1.0 / np.cosh(z / disk.z0) ** 2
    integrand = rho[None, :] * np.maximum(-pot.a_z, 0.0)
    steps = 0.5 * (integrand[:, 1:] + integrand[:, :-1]) * np.diff(z)[None, :]
    from_top = np.concatenate([np.cumsum(steps[:, ::-1], axis=1)[:, ::-1], np.zeros((R.size, 1))], axis=1)
    sigma_z2 = from_top / rho[None, :]
    return DiskKinematics(R, z, v_phi2, sigma_R, sigma_phi, sigma_z2, kappa)


@dataclass
class Galaxy:
    pos: np.ndarray
    vel: np.ndarray
    mass: np.ndarray
    parts: list[tuple[str, int]]
    potential: Potential
    kinematics: DiskKinematics


def make_galaxy(rng: np.random.Generator, counts: tuple[int, int, int], spec: GalaxySpec) -> Galaxy:
    """A galaxy of counts = (bulge, disk, halo) bodies in internal units (disk mass 1, R_d = 1)."""
    n_bulge, n_disk, n_halo = counts
    # out to 10x the largest cut-off radius: psi there is small beside psi where any body is
    r_grid = np.geomspace(1e-4, 10.0 * max(spec.halo_radius, spec.bulge_radius), _GRID)
    disk = Disk(spec.disk_height, spec.disk_extent)
    halo = Spheroid(spec.halo_mass, spec.halo_scale, spec.halo_radius, r_grid)
    bulge = (
        Spheroid(spec.bulge_mass, spec.bulge_scale, spec.bulge_radius, r_grid)
        if spec.bulge_mass > 0
        else None
    )
    pot = potential(spec, disk, bulge, halo)
    kin = disk_kinematics(spec, disk, pot)

    pos, vel, mass, parts = [], [], [], []

    def add(name: str, p: np.ndarray, v: np.ndarray, m: float) -> None:
        pos.append(p)
        vel.append(v)
        mass.append(np.full(len(p), m / max(len(p), 1)))
        parts.append((name, len(p)))

    def spheroid(part: Spheroid, count: int) -> tuple[np.ndarray, np.ndarray]:
        radii = part.sample_radii(rng, count)
        speeds = sample_speeds(rng, radii, pot.r, pot.psi, eddington(pot.r, part.rho, pot.psi))
        return radii[:, None] * isotropic(rng, count), speeds[:, None] * isotropic(rng, count)

    # rows in the order bulge, disk, halo; a part without bodies is left out (its mass too: the spec)
    if bulge is not None and n_bulge:
        add("bulge", *spheroid(bulge, n_bulge), bulge.mass)
    add("disk", *_disk_bodies(rng, n_disk, disk, kin), 1.0)
    if n_halo:
        add("halo", *spheroid(halo, n_halo), halo.mass)
    return Galaxy(np.concatenate(pos), np.concatenate(vel), np.concatenate(mass), parts, pot, kin)


def _disk_bodies(rng, n: int, disk: Disk, kin: DiskKinematics) -> tuple[np.ndarray, np.ndarray]:
    R, phi, z = disk.sample(rng, n)
    az = np.abs(z)
    v_mean = np.sqrt(bilinear(kin.R, kin.z, kin.v_phi2, R, az))
    s_R = np.interp(R, kin.R, kin.sigma_R)
    s_phi = np.interp(R, kin.R, kin.sigma_phi)
    s_z = np.sqrt(np.maximum(bilinear(kin.R, kin.z, kin.sigma_z2, R, az), 0.0))
    v_R = s_R * rng.standard_normal(n)
    v_phi = v_mean + s_phi * rng.standard_normal(n)
    v_z = s_z * rng.standard_normal(n)
    c, s = np.cos(phi), np.sin(phi)
    pos = np.column_stack([R * c, R * s, z])
    vel = np.column_stack([v_R * c - v_phi * s, v_R * s + v_phi * c, v_z])
    return pos, vel
