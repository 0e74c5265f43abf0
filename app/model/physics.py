"""Physics parameters and the float64 reference every kernel is measured against.

One body-body interaction (mirrored by kernels/common.cuh and the numba kernels), with s² = r² + ε²:
    gravity:            a_i += G m_j d / s³
    gravity-repulsion:  a_i += m_j d (G / s³ - H / s⁵)   (force G m m / r² minus H m m / r⁴)
where d = x_j - x_i. With ε = 0 the self term (d = 0) is skipped; with ε > 0 it contributes exactly zero,
which is why the GPU kernels can include it without a branch.

Integrators, one step of size dt (stepped by app.engine.integrator, which imports this module, never the
other way round; its `integrate` is the float64 reference stepping):
    leapfrog (kick-drift-kick):  v += a dt/2;  x += v dt;  a = A(x);  v += a dt/2
    euler-damped (the CUDA samples' integrateBodies):  a = A(x);  v = (v + a dt) · damping;  x += v dt

Time steps: `shared` (every body takes dt) or `block` (leapfrog on hierarchical levels: body i steps
dt / 2^l_i, l_i in [0, block_levels] from GADGET-2's criterion at accuracy block_eta, coarser only as
block_coarsen allows; dt is then the max step; app/engine/blocksteps.py, docs/blocksteps.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace

import numpy as np

from app.model.bodies import Bodies


@dataclass(frozen=True)
class Physics:
    G: float = 1.0
    softening: float = 0.01
    dt: float = 1e-3
    integrator: str = "leapfrog"
    damping: float = 1.0
    model: str = "gravity"
    repulsion: float = 0.0  # H of the gravity-repulsion model
    timesteps: str = "shared"  # or "block": hierarchical levels below dt (app/engine/blocksteps.py)
    block_levels: int = 6  # block steps: L, the finest step is dt / 2^L
    block_eta: float = 0.025  # block steps: the criterion's accuracy η (GADGET-2's default)
    block_coarsen: str = "settled"  # block steps: when a level may get coarser (config.COARSEN)

    def with_(self, **changes) -> Physics:
        return replace(self, **changes)

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def h(self) -> float:
        """The repulsion coefficient actually applied (zero for the pure-gravity model)."""
        return self.repulsion if self.model == "gravity-repulsion" else 0.0

    @property
    def forces(self) -> tuple:
        """What the force evaluation depends on (G, softening, H, model): not dt, the integrator or the
        damping. Equal forces: an evaluator and a cached a(x) stay valid."""
        return (self.G, self.softening, self.h, self.model)


_PAIRS_PER_CHUNK = 1 << 22  # (rows × N) pairs per chunk: ~100 MB per (rows, N, 3) float64 temporary


def _rows_per_chunk(n: int) -> int:
    """Rows per chunk: 512 up to N = 8k, fewer beyond, so that N = 82k does not need 1 GB temporaries."""
    return max(1, min(512, _PAIRS_PER_CHUNK // max(n, 1)))


def accelerations(
    pos: np.ndarray,
    mass: np.ndarray,
    physics: Physics,
    targets: slice | np.ndarray | None = None,
    chunk: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> np.ndarray:
    """Softened accelerations in float64, (N, 3); `targets` (a slice or an index array) restricts
    which bodies receive them, in that order, against all N sources.

    Chunked over targets so memory stays O(chunk · N) at any N (`_rows_per_chunk`); `progress(rows)` is
    told after each chunk.
    """
    pos = np.asarray(pos, dtype=np.float64)
    mass = np.asarray(mass, dtype=np.float64)
    idx = np.arange(pos.shape[0])[targets if targets is not None else slice(None)]
    out = np.empty((idx.size, 3))
    eps2 = physics.softening**2
    h = physics.h
    chunk = chunk or _rows_per_chunk(pos.shape[0])
    for start in range(0, idx.size, chunk):
        rows = idx[start : start + chunk]
        d = pos[None, :, :] - pos[rows, None, :]  # (c, N, 3): x_j - x_i
        s2 = np.einsum("cnk,cnk->cn", d, d) + eps2
        with np.errstate(divide="ignore", invalid="ignore"):
            inv = 1.0 / np.sqrt(s2)
            inv3 = inv * inv * inv
            w = physics.G * inv3 - h * inv3 * inv * inv if h else physics.G * inv3
        w[s2 == 0.0] = 0.0  # the self term when ε = 0 (and exact coincidences)
        w *= mass[None, :]
        out[start : start + rows.size] = np.einsum("cn,cnk->ck", w, d)
        if progress:
            progress(rows.size)
    return out


def kinetic_energy(vel: np.ndarray, mass: np.ndarray) -> float:
    return float(0.5 * np.sum(mass * np.einsum("ij,ij->i", vel, vel)))


def potential_energy(
    pos: np.ndarray,
    mass: np.ndarray,
    physics: Physics,
    chunk: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> float:
    """Σ over pairs i<j of -G m_i m_j / s + H m_i m_j / (3 s³), s² = r² + ε² (float64, chunked);
    `progress(rows)` is told how many more rows are done after each chunk (for a progress bar).
    Not finite (without a numpy warning) when two bodies coincide at ε = 0."""
    pos = np.asarray(pos, dtype=np.float64)
    mass = np.asarray(mass, dtype=np.float64)
    n = pos.shape[0]
    eps2 = physics.softening**2
    h = physics.h
    total = 0.0
    chunk = chunk or _rows_per_chunk(n)
    for start in range(0, n, chunk):
        rows = np.arange(start, min(start + chunk, n))
        d = pos[None, :, :] - pos[rows, None, :]
        s2 = np.einsum("cnk,cnk->cn", d, d) + eps2
        upper = np.arange(n)[None, :] > rows[:, None]  # each pair once
        s = np.sqrt(np.where(upper, s2, 1.0))
        with np.errstate(divide="ignore"):  # two bodies coinciding at ε = 0: -inf, which callers report
            pair = -physics.G / s + (h / (3.0 * s**3) if h else 0.0)
        total += float(np.sum(np.where(upper, pair * mass[rows, None] * mass[None, :], 0.0)))
        if progress:
            progress(rows.size)
    return total


def total_energy(bodies: Bodies, physics: Physics) -> float:
    return kinetic_energy(bodies.vel, bodies.mass) + potential_energy(bodies.pos, bodies.mass, physics)


def linear_momentum(vel: np.ndarray, mass: np.ndarray) -> np.ndarray:
    return np.sum(mass[:, None] * vel, axis=0)


def angular_momentum(pos: np.ndarray, vel: np.ndarray, mass: np.ndarray) -> np.ndarray:
    return np.sum(mass[:, None] * np.cross(pos, vel), axis=0)


def momentum_scale(vel: np.ndarray, mass: np.ndarray) -> float:
    """Σ m|v|: the natural scale against which linear-momentum drift is judged."""
    return float(np.sum(mass * np.linalg.norm(vel, axis=1)))


@dataclass(frozen=True)
class Diagnostics:
    """Conserved quantities of one state, float64."""

    time: float
    kinetic: float
    potential: float
    momentum: tuple[float, float, float]
    angular_momentum: tuple[float, float, float]
    momentum_scale: float

    @property
    def energy(self) -> float:
        return self.kinetic + self.potential


def diagnostics(
    bodies: Bodies,
    physics: Physics,
    progress: Callable[[int], None] | None = None,
    potential: Callable | None = None,
) -> Diagnostics:
    """Conserved quantities in float64; `potential(pos, mass, physics, progress=)` computes the O(N²)
    term (default: the numpy reference here; app.engine.energy's numba sum is the fast one)."""
    potential = potential or potential_energy
    return Diagnostics(
        time=bodies.time,
        kinetic=kinetic_energy(bodies.vel, bodies.mass),
        potential=potential(bodies.pos, bodies.mass, physics, progress=progress),
        momentum=tuple(linear_momentum(bodies.vel, bodies.mass)),
        angular_momentum=tuple(angular_momentum(bodies.pos, bodies.vel, bodies.mass)),
        momentum_scale=momentum_scale(bodies.vel, bodies.mass),
    )


def relative_errors(approx: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Per-body |approx - ref| / |ref|, with |ref| floored at 1e-3 of its RMS.

    The floor keeps a body sitting at a near-zero net force (the centre of a symmetric cloud) from
    turning round-off into a huge relative figure; it is stated in `validate`'s output.
    """
    ref = np.asarray(ref, dtype=np.float64)
    diff = np.linalg.norm(np.asarray(approx, dtype=np.float64) - ref, axis=-1)
    mag = np.linalg.norm(ref, axis=-1)
    floor = 1e-3 * float(np.sqrt(np.mean(mag**2))) if mag.size else 0.0
    return diff / np.maximum(mag, floor if floor > 0 else 1e-300)


def sample_rows(n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """K distinct rows of N drawn by `rng`, sorted (all N when N <= K): the bodies a force error is
    measured on (the live probe, A/B, a hot reload's validation)."""
    return np.arange(n) if k >= n else np.sort(rng.choice(n, size=k, replace=False))


def error_summary(approx: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """{'max', 'p99', 'median', 'rms'} of relative_errors: what `validate` prints and ErrorBudget judges,
    and the live force error (app/engine/force_error.py) shows."""
    rel = relative_errors(approx, ref)
    return {
        "max": float(rel.max()),
        "p99": float(np.percentile(rel, 99)),
        "median": float(np.median(rel)),
        "rms": float(np.sqrt(np.mean(rel**2))),
    }


def relative_error(approx: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """(max, RMS) of relative_errors."""
    rel = relative_errors(approx, ref)
    return float(np.max(rel)), float(np.sqrt(np.mean(rel**2)))
