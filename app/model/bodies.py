"""The particle state on the host: positions, velocities and masses in float64."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from app.core.errors import InputFileError

# (app.model.components reads app.model.config, which reads app.model.physics, which reads this module)
if TYPE_CHECKING:
    from app.model.components import Components


FLOAT32_MAX = float(np.finfo(np.float32).max)


def speeds(vel: np.ndarray) -> np.ndarray:
    """|v| of each body as float32 (what the renderer colours by): summed in float64, where float32 squares
    overflow above 1.8e19 (a run blowing up), and held at float32's largest value, not inf."""
    v = np.asarray(vel)[:, :3].astype(np.float64, copy=False)  # Bodies' float64: no copy (a per-frame call)
    s = np.sqrt(np.einsum("ij,ij->i", v, v))
    return np.minimum(s, FLOAT32_MAX, out=s).astype(np.float32)


@dataclass
class StepLevels:
    """Block time steps' per-body levels at a max-step boundary (app/engine/blocksteps.py), kept with a
    snapshot: body i steps dt_max / 2^levels[i]. Under the coarsening rules "boundary" and "aligned" they are
    the criterion's of a(x) and a resume finds them again from x; under "settled" they also remember the
    boundary before, and a bitwise resume needs them. They mean that only for the same dt_max, L
    (max_level) and rule."""

    levels: np.ndarray  # (N,) int32 in [0, max_level]
    max_level: int
    dt_max: float
    coarsen: str


@dataclass
class Bodies:
    pos: np.ndarray  # (N, 3) float64
    vel: np.ndarray  # (N, 3) float64
    mass: np.ndarray  # (N,) float64
    time: float = 0.0
    ids: np.ndarray | None = field(default=None)  # (N,) int64, when the source carries particle IDs
    components: Components | None = field(default=None)  # which part each body is (drawing only)
    # block time steps' levels (app/engine/blocksteps.py)
    step_levels: StepLevels | None = field(default=None)

    @property
    def n(self) -> int:
        return int(self.mass.shape[0])

    @classmethod
    def from_arrays(
        cls,
        pos,
        vel,
        mass,
        time: float = 0.0,
        ids=None,
        source: str = "bodies",
        components: Components | None = None,
        row_label=None,
    ) -> Bodies:
        """Build (float64, contiguous) and validate; `source` names the origin (a file, a generator) in
        error messages, `row_label(i)` body i's place in it (see `validate`)."""
        # a damaged file's NaN or huge values warn in the casts; `validate` below names the body instead
        with np.errstate(invalid="ignore", over="ignore"):
            bodies = cls(
                pos=np.ascontiguousarray(pos, dtype=np.float64).reshape(-1, 3),
                vel=np.ascontiguousarray(vel, dtype=np.float64).reshape(-1, 3),
                mass=np.ascontiguousarray(mass, dtype=np.float64).reshape(-1),
                time=float(time),
                ids=None if ids is None else np.asarray(ids, dtype=np.int64).reshape(-1),
                components=components,
            )
        bodies.validate(source, row_label)
        return bodies

    def validate(self, source: str = "bodies", row_label=None) -> None:
        """Raise InputFileError naming `source` and the first bad body.

        `row_label(i)` turns a body index into what the user can find in the file ("line 12",
        "record 3"); by default it is "body i".
        """
        label = row_label or (lambda i: f"body {i}")
        n = self.mass.shape[0]
        if n == 0:
            raise InputFileError(f"{source}: contains no bodies (N = 0); an N-body scene needs at least one")
        if self.pos.shape != (n, 3) or self.vel.shape != (n, 3):
            raise InputFileError(
                f"{source}: positions {self.pos.shape} and velocities {self.vel.shape} "
                f"do not match {n} masses"
            )
        if self.ids is not None and self.ids.shape != (n,):
            raise InputFileError(f"{source}: {self.ids.shape[0]} IDs for {n} bodies")
        if self.components is not None and self.components.n != n:
            raise InputFileError(f"{source}: {self.components.n} component indices for {n} bodies")
        for what, arr in (("mass", self.mass), ("position", self.pos), ("velocity", self.vel)):
            bad = ~np.isfinite(arr)
            if bad.any():
                i = int(np.argwhere(bad)[0][0])
                raise InputFileError(
                    f"{source}: {label(i)}: {what} is not finite ({arr[i]}); fix or remove that body"
                )
        neg = self.mass < 0
        if neg.any():
            i = int(np.argmax(neg))
            raise InputFileError(f"{source}: {label(i)}: negative mass {self.mass[i]}; masses must be >= 0")
        if not self.mass.any():
            raise InputFileError(f"{source}: every mass is zero; at least one body must have mass")

    def copy(self) -> Bodies:
        return Bodies(
            self.pos.copy(),
            self.vel.copy(),
            self.mass.copy(),
            self.time,
            None if self.ids is None else self.ids.copy(),
            None if self.components is None else self.components.copy(),
        )

    def pos4(self, dtype=np.float32) -> np.ndarray:
        """(N, 4) [x, y, z, m]: the layout of the vertex buffer and of every kernel's position input."""
        out = np.empty((self.n, 4), dtype=dtype)
        out[:, :3] = self.pos
        out[:, 3] = self.mass
        return out

    def vel4(self, dtype=np.float32) -> np.ndarray:
        """(N, 4) [vx, vy, vz, 0]: float4 keeps device loads 16 bytes wide."""
        out = np.zeros((self.n, 4), dtype=dtype)
        out[:, :3] = self.vel
        return out

    def extent(self) -> float:
        """Radius around the centre of mass holding 90% of the bodies: what the camera fits to."""
        com = np.average(self.pos, axis=0, weights=self.mass if self.mass.any() else None)
        r = np.linalg.norm(self.pos - com, axis=1)
        return float(np.quantile(r, 0.9)) if self.n > 1 else max(float(r[0]), 1.0)
