"""The CPU backend's side of A/B and of the error colours (app/engine/compare.py CompareOps), on host arrays.

- B: the other record's own evaluator (made here with the backend's physics and the tunables set for that
  record: the backend's kept evaluator is A's, which may carry a tree's refit cadence between steps and
  must not be replaced), over a copy of the positions in B's precision, into a scratch acceleration array
  kept between evaluations (a tree's relative opening test reads its last rows there, as it reads the
  state's); timed with perf_counter around the evaluation, as the backend times its steps.
- A: the backend's a(x) of the current state (`accelerations()`: the integrator's cached one).
- The exact sum: cpu-fp64 (the record in the role "reference", numba, float64 throughout) over a float64
  snapshot of the positions, a span of targets per piece, against A's a(x) snapshotted with them.
- The colours: float32 (N,), load order (the CPU state is in load order), uploaded by the renderer.

Nothing here writes the backend's arrays: its state, cached a(x) and evaluator are only read.
"""

from __future__ import annotations

import time

import numpy as np

from app.backends.cpu_forces import announce_compiling
from app.engine.error_colours import error_positions, error_stats
from app.engine.forces import Span, with_role
from app.model.physics import relative_errors


class CpuCompare:
    """CompareOps over a CPUBackend (`backend.compare_ops()`)."""

    def __init__(self, backend):
        self.backend = backend
        self._kept: dict[
            str, tuple[tuple, object]
        ] = {}  # record -> (key, its evaluator): B's, the exact sum's
        self._scratch = np.zeros((0, 4), np.float32)  # B's accelerations, (N, 4) in B's dtype
        self._scratch_of: str | None = None  # whose they are
        self._snapshot: tuple[np.ndarray, np.ndarray] | None = None  # exact sum: float64 positions, A's a(x)
        self._exact = np.zeros((0, 4))
        self._reference = None  # the exact sum's evaluator (cpu-fp64), made by exact_begin
        self._colours = np.zeros(0, np.float32)

    def _fresh(self, name: str):
        """A new evaluator of record `name` with the backend's physics and the tunables set for it, its
        numba kernel compiled (or loaded from numba's cache) on one body, outside any timed region."""
        backend = self.backend
        record = backend.record(name)
        tunables = backend.tunables_for(record.name)
        evaluator = record.policy.evaluator(record, backend.physics)
        evaluator.set_tunables(**tunables)
        spare = record.policy.evaluator(record, backend.physics)
        spare.set_tunables(**tunables)
        one = np.zeros((1, 4), spare.dtype)
        with announce_compiling((spare.kernel,)):
            spare.evaluate(one, one.copy(), Span.all(1), Span.all(1))
        return evaluator

    def _other(self, name: str):
        """Record `name`'s evaluator (B's, or the exact sum's), kept while the force parameters and its
        tunables stay (a tree carries its refit between evaluations; the exact sum, taken every second,
        is not made and compiled again each time)."""
        backend = self.backend
        key = (backend.physics.forces, tuple(sorted(backend.tunables_for(name).items())))
        kept = self._kept.get(name)
        if kept is None or kept[0] != key:
            kept = self._kept[name] = (key, self._fresh(name))
        return kept[1]

    def evaluate_other(self, name: str) -> float:
        evaluator = self._other(name)
        pos = self.backend.positions(evaluator.dtype)
        n = pos.shape[0]
        if self._scratch.shape != pos.shape or self._scratch.dtype != pos.dtype or self._scratch_of != name:
            self._scratch = np.zeros_like(pos)  # (a tree's relative test then starts geometric, as on load)
            self._scratch_of = name
        t0 = time.perf_counter()
        evaluator.evaluate(pos, self._scratch, Span.all(n), Span.all(n))
        return (time.perf_counter() - t0) * 1e3

    def _other_acc(self) -> np.ndarray:
        if self._scratch.shape[0] != self.backend.n:
            raise RuntimeError("A/B: no evaluation of B at this N yet (evaluate_other first)")
        return self._scratch[:, :3].astype(np.float64)

    def sample(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        rows = np.asarray(rows, dtype=np.int64)
        return self.backend.accelerations()[rows], self._other_acc()[rows]

    def colour_other(self) -> dict[str, float]:
        return self._colour(relative_errors(self.backend.accelerations(), self._other_acc()))

    def _colour(self, errors: np.ndarray) -> dict[str, float]:
        self._colours = error_positions(errors)
        return error_stats(errors)

    def exact_begin(self) -> int:
        backend = self.backend
        self._snapshot = (backend.positions(np.float64), backend.accelerations())
        self._exact = np.zeros((backend.n, 4))
        self._reference = self._other(with_role(backend.kernels(), "reference").name)
        return backend.n

    def exact_piece(self, targets: Span) -> float:
        if self._snapshot is None or self._reference is None:
            raise RuntimeError("exact sum: exact_begin first")
        pos = self._snapshot[0]
        t0 = time.perf_counter()
        self._reference.evaluate(pos, self._exact, targets, Span.all(pos.shape[0]))
        return (time.perf_counter() - t0) * 1e3

    def colour_exact(self) -> dict[str, float]:
        if self._snapshot is None:
            raise RuntimeError("exact sum: exact_begin first")
        acc_a = self._snapshot[1]
        self._snapshot = None
        return self._colour(relative_errors(acc_a, self._exact[:, :3]))

    def clear_colours(self) -> None:
        self._colours = np.zeros(self.backend.n, np.float32)

    def paint(self) -> np.ndarray | None:
        if self._colours.shape[0] != self.backend.n:  # new bodies since: nothing known of them yet
            self.clear_colours()
        return self._colours

    def close(self) -> None:
        self._kept.clear()
        self._snapshot = None
        self._scratch = np.zeros((0, 4), np.float32)
