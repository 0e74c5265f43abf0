"""How far a disk galaxy is from equilibrium: the numbers issue 29 and docs/galaxies.md judge a model by.

From one snapshot (positions, velocities, masses, components) and the accelerations at those positions:

* the disk's half-mass and 90%-mass cylindrical radii, its rms thickness and its radial dispersion sigma_R
  (rms v_R of every disk body), about the disk's own centre of mass and mean velocity, in its own plane
  (z along its angular momentum: an inclined disk of a collision is measured as an isolated one);
* Toomre's Q = sigma_R kappa / (3.36 G Sigma) in radial bins, with kappa from the bodies' own radial pull
  (kappa^2 = R d Omega^2 / dR + 4 Omega^2, Omega^2 = <-a_R> / R in each bin);
* each component's virial ratio 2 K / |W|, W = sum m x . a in the total field (1 in a steady state, for
  each component on its own: d^2 I / dt^2 = 2 K + W = 0), about the centre of mass of all bodies.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

TOOMRE = 3.36


@dataclass
class DiskReport:
    time: float
    r50: float
    r90: float
    rms_z: float
    sigma_R: float
    q_radii: np.ndarray  # bin centres
    q: np.ndarray  # Q per bin
    virial: dict[str, float] = field(default_factory=dict)  # component -> 2K / |W|

    def row(self) -> dict[str, float]:
        """The scalar numbers, for a CSV row."""
        out = {
            "time": self.time,
            "r50": self.r50,
            "r90": self.r90,
            "rms_z": self.rms_z,
            "sigma_R": self.sigma_R,
            "q_min": float(np.nanmin(self.q)) if np.isfinite(self.q).any() else float("nan"),
        }
        out.update({f"virial_{name}": value for name, value in self.virial.items()})
        return out


def _weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    order = np.argsort(values)
    cumulative = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cumulative, q * cumulative[-1])])


def measure(
    pos, vel, mass, acc, components, time: float = 0.0, G: float = 1.0, disk: str = "disk", q_bins=None
) -> DiskReport:
    """The report of the component named `disk` (components: app.model.components.Components). `q_bins`:
    the radial bin edges for Q (default 12 bins between 0.1 and 0.9 of the disk's 99%-mass radius)."""
    pos, vel, mass, acc = (np.asarray(a, dtype=np.float64) for a in (pos, vel, mass, acc[:, :3]))
    rows = components.rows(disk)
    m = mass[rows]
    w = m / m.sum()
    x = pos[rows] - w @ pos[rows]
    v = vel[rows] - w @ vel[rows]
    a = acc[rows]
    # into the disk's own frame: z along its angular momentum (an inclined galaxy of a collision)
    turn = _onto_z(m @ np.cross(x, v))
    x, v, a = x @ turn.T, v @ turn.T, a @ turn.T
    R = np.hypot(x[:, 0], x[:, 1])
    safe = np.maximum(R, 1e-30)
    v_R = (x[:, 0] * v[:, 0] + x[:, 1] * v[:, 1]) / safe
    a_R = (x[:, 0] * a[:, 0] + x[:, 1] * a[:, 1]) / safe
    if q_bins is None:
        edge = _weighted_quantile(R, m, 0.99)
        q_bins = np.linspace(0.1 * edge, 0.9 * edge, 13)
    q_bins = np.asarray(q_bins, dtype=np.float64)
    which = np.digitize(R, q_bins) - 1
    inside = (which >= 0) & (which < q_bins.size - 1)
    k = q_bins.size - 1
    count = np.bincount(which[inside], minlength=k)
    mass_in = np.bincount(which[inside], weights=m[inside], minlength=k)
    with np.errstate(invalid="ignore", divide="ignore"):
        centre = np.bincount(which[inside], weights=(m * R)[inside], minlength=k) / mass_in
        area = np.pi * (q_bins[1:] ** 2 - q_bins[:-1] ** 2)
        surface = mass_in / area
        mean_vr = np.bincount(which[inside], weights=(m * v_R)[inside], minlength=k) / mass_in
        var_vr = (
            np.bincount(which[inside], weights=(m * v_R * v_R)[inside], minlength=k) / mass_in - mean_vr**2
        )
        omega2 = -np.bincount(which[inside], weights=(m * a_R)[inside], minlength=k) / mass_in / centre
        kappa2 = centre * np.gradient(omega2, centre) + 4.0 * omega2
        q = np.sqrt(np.maximum(var_vr, 0.0)) * np.sqrt(np.maximum(kappa2, 0.0)) / (TOOMRE * G * surface)
    q = np.where(count >= 20, q, np.nan)  # too few bodies for a dispersion
    return DiskReport(
        time=float(time),
        r50=_weighted_quantile(R, m, 0.5),
        r90=_weighted_quantile(R, m, 0.9),
        rms_z=float(np.sqrt(w @ (x[:, 2] ** 2))),
        sigma_R=float(np.sqrt(w @ (v_R * v_R))),
        q_radii=centre,
        q=q,
        virial=virial_ratios(pos, vel, mass, acc, components),
    )


def _onto_z(spin: np.ndarray) -> np.ndarray:
    """The rotation taking the direction of `spin` onto +z (Rodrigues' formula about spin x z)."""
    n = spin / np.linalg.norm(spin)
    axis = np.cross(n, [0.0, 0.0, 1.0])
    s, c = np.linalg.norm(axis), n[2]
    if s < 1e-12:
        return np.eye(3) if c > 0 else np.diag([1.0, -1.0, -1.0])
    k = axis / s
    cross = np.array([[0.0, -k[2], k[1]], [k[2], 0.0, -k[0]], [-k[1], k[0], 0.0]])
    return np.eye(3) + s * cross + (1.0 - c) * cross @ cross


def virial_ratios(pos, vel, mass, acc, components) -> dict[str, float]:
    """2 K / |W| of each component, W = sum m x . a, about the centre of mass of all bodies."""
    w = mass / mass.sum()
    x = pos - w @ pos
    v = vel - w @ vel
    out = {}
    for name in components.names:
        rows = components.rows(name)
        kinetic = 0.5 * float(mass[rows] @ (v[rows] ** 2).sum(axis=1))
        virial = float(mass[rows] @ (x[rows] * acc[rows, :3]).sum(axis=1))
        out[name] = 2.0 * kinetic / abs(virial) if virial else float("nan")
    return out
