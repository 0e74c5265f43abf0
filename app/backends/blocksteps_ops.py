"""Block time steps' ops on the host (app/engine/blocksteps.py's `BlockOps`): the float64 reference
(`NumpyBlockOps`: numpy or numba float64 sums of the active rows) and the CPU twin's (`TreeBlockOps`:
cpu-tree walking only the groups that hold an active body), with their force and tidal-norm rows.
"""

from __future__ import annotations

import numpy as np

from app.engine.blocksteps import block_tunables
from app.engine.forces import ForceWork, with_role
from app.model.bodies import Bodies, speeds
from app.model.physics import Physics, accelerations


# --- the float64 reference and the CPU twin -----------------------------------------------------------
def numpy_rows(pos: np.ndarray, mass: np.ndarray, physics: Physics, rows: np.ndarray) -> np.ndarray:
    """The float64 reference's forces on `rows` (app.model.physics.accelerations, all N bodies the
    sources)."""
    return accelerations(pos, mass, physics, targets=rows)


_TIDAL_KERNEL = None


def tidal_rows(pos: np.ndarray, mass: np.ndarray, physics: Physics, rows: np.ndarray) -> np.ndarray:
    """||T|| (Frobenius, float64) at the bodies `rows` from all the others: T_ab = Σ_j G m_j (3 d_a d_b /
    s^5 − δ_ab / s^3), d = x_j − x_i, s² = |d|² + ε² (the softened potential's Hessian; the self term
    and coincident bodies at ε = 0 left out). Gravity only. Numba, parallel over rows, compiled lazily."""
    global _TIDAL_KERNEL
    if physics.h:
        raise ValueError("the tidal criterion is for pure gravity (no repulsion term)")
    if _TIDAL_KERNEL is None:
        import numba

        @numba.njit(parallel=True, cache=True)
        def kernel(pos, mass, rows, eps2, g):  # pragma: no cover - numba compiles it
            out = np.empty(rows.size)
            for q in numba.prange(rows.size):
                i = rows[q]
                xx = yy = zz = xy = xz = yz = 0.0
                for j in range(pos.shape[0]):
                    dx, dy, dz = pos[j, 0] - pos[i, 0], pos[j, 1] - pos[i, 1], pos[j, 2] - pos[i, 2]
                    s2 = dx * dx + dy * dy + dz * dz + eps2
                    if j == i or s2 == 0.0:
                        continue
                    inv2 = 1.0 / s2
                    w = g * mass[j] * inv2 * np.sqrt(inv2)
                    w5 = 3.0 * w * inv2
                    xx += w5 * dx * dx - w
                    yy += w5 * dy * dy - w
                    zz += w5 * dz * dz - w
                    xy += w5 * dx * dy
                    xz += w5 * dx * dz
                    yz += w5 * dy * dz
                out[q] = np.sqrt(xx * xx + yy * yy + zz * zz + 2.0 * (xy * xy + xz * xz + yz * yz))
            return out

        _TIDAL_KERNEL = kernel
    return _TIDAL_KERNEL(
        np.ascontiguousarray(pos, dtype=np.float64),
        np.ascontiguousarray(mass, np.float64),
        np.asarray(rows, dtype=np.int64),
        float(physics.softening) ** 2,
        float(physics.G),
    )


class NumpyBlockOps:
    """The float64 reference's BlockOps: numpy updates on a `Bodies` (its clock advances with each drift),
    forces of the active rows as probes of all sources from `rows_fn(pos, mass, physics, rows)` (default
    `numpy_rows`; `app.backends.cpu_forces.exact_rows`'s numba float64 sum is the fast one). The updates are
    NumpyOps' (app/engine/integrator.py) row for row, so with L = 0 the trajectory is integrate()'s, bitwise.
    `tidal=True` also keeps ||T|| of the active rows (`tidal_rows`, one more O(rows · N) pass) for the
    criterion "tidal"."""

    def __init__(
        self,
        bodies: Bodies,
        physics: Physics,
        rows_fn=None,
        acc: np.ndarray | None = None,
        tidal: bool = False,
    ):
        self.bodies = bodies
        self.physics = physics
        self.rows_fn = rows_fn or numpy_rows
        self.acc = np.zeros((bodies.n, 3)) if acc is None else np.array(acc, dtype=np.float64)
        self.n = bodies.n
        self.tidal = np.zeros(bodies.n) if tidal else None

    def drift_all(self, dt: float) -> None:
        b = self.bodies
        b.pos += dt * b.vel
        b.time += dt

    def force_active(self, rows: np.ndarray) -> ForceWork:
        b = self.bodies
        self.acc[rows] = self.rows_fn(b.pos, b.mass, self.physics, rows)
        if self.tidal is not None:
            self.tidal[rows] = tidal_rows(b.pos, b.mass, self.physics, rows)
        return ForceWork(interactions=rows.size * self.n, pair_equivalent=rows.size * self.n, evaluations=1)

    def kick(self, rows: np.ndarray, half_dts: np.ndarray) -> None:
        self.bodies.vel[rows] += self.acc[rows] * half_dts[:, None]

    def acc_norms(self, rows: np.ndarray) -> np.ndarray:
        return np.linalg.norm(self.acc[rows], axis=1)

    # --- the host's view, for a Backend (app/backends/block.py) ------------------------------------------
    def synchronize(self) -> None:
        """Nothing to wait for on the host."""

    def host_state(self) -> tuple[np.ndarray, np.ndarray]:
        """Copies of x and v, float64 (N, 3)."""
        return self.bodies.pos.copy(), self.bodies.vel.copy()

    def host_acc(self) -> np.ndarray:
        return self.acc.copy()

    def render_arrays(self, ahead: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """float32 [x, y, z, m] rows (x + v·ahead: a drawing predicted between substeps) and speeds, what
        a renderer uploads."""
        rows = self.bodies.pos4(np.float32)
        if ahead:
            rows[:, :3] = (self.bodies.pos + ahead * self.bodies.vel).astype(np.float32)
        return rows, speeds(self.bodies.vel)

    def force_error_sample(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(a(x) kept for `rows`, their all-pairs accelerations at the same float32 positions by the CPU
        backend's exact_rows: the live force error's halves, app/engine/force_error.py). a(x) must be
        current."""
        from app.backends.cpu_forces import exact_rows

        rows = np.asarray(rows, dtype=np.int64)
        return self.acc[rows].copy(), exact_rows(self.bodies.pos4(np.float32), rows, self.physics)

    def tidal_norms(self, rows: np.ndarray) -> np.ndarray:
        if self.tidal is None:
            raise ValueError("criterion 'tidal' needs NumpyBlockOps(..., tidal=True)")
        return self.tidal[rows]


class TreeBlockOps(NumpyBlockOps):
    """The CPU twin's BlockOps: float64 x and v, forces by `cpu-tree` walking only the groups that hold an
    active body (CpuTreeEvaluator.evaluate_rows). Its groups are the full evaluation's, so a row's a(x)
    does not depend on which rows are active: a checkpoint's a(x) can be recomputed bitwise from x."""

    def __init__(
        self, bodies: Bodies, physics: Physics, tunables: dict | None = None, acc: np.ndarray | None = None
    ):
        from app.backends.cpu_forces import RECORDS  # lazy: numba (the CPU backend's records)

        super().__init__(bodies, physics, acc=acc)
        record = with_role(RECORDS, "block-steps")  # cpu-tree
        self.evaluator = record.policy.evaluator(record, physics)
        self.evaluator.set_tunables(**block_tunables(tunables))
        self._pos4 = np.empty((self.n, 4))
        self._acc32 = np.zeros((self.n, 4), np.float32)  # the walk's own precision (float32 rows)

    def force_active(self, rows: np.ndarray) -> ForceWork:
        b = self.bodies
        self._pos4[:, :3] = b.pos
        self._pos4[:, 3] = b.mass
        work = self.evaluator.evaluate_rows(self._pos4, self._acc32, rows)
        self.acc[rows] = self._acc32[rows, :3]  # float32 -> float64: exact
        return work

    def tidal_norms(self, rows: np.ndarray) -> np.ndarray:
        raise ValueError("criterion 'tidal' needs ||T|| from the walk, which cpu-tree does not compute yet")
