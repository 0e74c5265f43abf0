"""The CPU backend's force methods and state updates, shared by the backend (cpu.py) and its CPU
"devices" (cpu_multi.py): the kernel records, their evaluators through the force seam (app/engine/forces.py),
the element-wise updates (`CpuOps`), the float64 references on the host and the host's facts.

The pieces, each a small object:
- `NumbaAllPairs` / `NumbaPairs`, a record's policy: which numba kernel family (dtype, fastmath)
  evaluates it, and the builder of its evaluator;
- `CpuEvaluator` / `CpuPairsEvaluator`, the record on the host through the force seam;
- `CpuOps`, the integrator's StateOps on a backend's arrays (numba updates, forces via the evaluator).

numba is imported lazily (through `cpu_kernels`): without it the backend reports `why_not` instead of
failing at import, and kernels compile on first use (cached on disk afterwards).
"""

from __future__ import annotations

import contextlib
import logging
import platform
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.backends.base import KernelRecord
from app.backends.cpu_tree import OPENING_TUNABLES, THETA, NumbaTree
from app.core.errors import ConfigError
from app.engine.forces import (
    TREE_WALK_FLOPS,
    ErrorBudget,
    ForceEvaluator,
    ForceWork,
    IntChoice,
    Span,
    all_pairs_work,
    with_role,
)
from app.engine.refit_cadence import REFIT_TUNABLES
from app.model.physics import Physics
from app.parallel.decomposition import DOMAINS, PAIRS, PairTiles

log = logging.getLogger(__name__)


def _kernels_module():
    from app.backends import cpu_kernels  # imports numba

    return cpu_kernels


# --- the force seam on the host --------------------------------------------------------------------------
@dataclass(frozen=True)
class NumbaAllPairs:
    """A CPU record's policy: the numba all-pairs kernel compiled for one dtype, with or without fastmath."""

    dtype: type
    fastmath: bool

    def evaluator(self, record: KernelRecord, physics: Physics) -> CpuEvaluator:
        return CpuEvaluator(record, physics)


class CpuEvaluator(ForceEvaluator):
    """One CPU record with one physics: acc[targets] from pos[targets] and pos[sources] (numpy arrays)."""

    def __init__(self, record: KernelRecord, physics: Physics):
        super().__init__(record)
        policy = record.policy
        self.dtype = policy.dtype
        eps2 = self.dtype(physics.softening**2)  # the value the kernel sees (a tiny ε underflows in fp32)
        h = physics.h
        # The specialisation is picked here, once: ε = 0 skips the self term, H = 0 drops the repulsion.
        self.kernel = _kernels_module().accel_kernel(
            self.dtype, policy.fastmath, repulsion=h != 0.0, skip_self=eps2 == 0
        )
        self._scalars = (eps2, self.dtype(physics.G), self.dtype(h))

    def evaluate(self, pos, acc, targets: Span, sources: Span, stream=None) -> ForceWork:
        n = pos.shape[0]
        rows = targets.check_within(n, "targets").as_slice()
        cols = sources.check_within(n, "sources").as_slice()
        self.kernel(pos[rows], pos[cols], *self._scalars, acc[rows])  # row slices of C arrays: views
        return all_pairs_work(targets, sources)

    def evaluate_points(self, targets: np.ndarray, sources: np.ndarray, acc: np.ndarray) -> None:
        """acc[:, :3] = the accelerations of the (K, 4) rows `targets` (any bodies, e.g. a gathered sample)
        due to every row of `sources`, all in this record's dtype."""
        self.kernel(targets, sources, *self._scalars, acc)


@dataclass(frozen=True)
class NumbaPairs:
    """`cpu-n3l`'s policy: Newton's third law over the pair tiles of app.parallel.decomposition.PairTiles."""

    dtype: type = np.float64
    ti: int = 128  # atomics-n3l's i-tile at ki = 4 and its 64-body j-tiles
    tj: int = 64
    chunk: int = 4

    def evaluator(self, record: KernelRecord, physics: Physics) -> CpuPairsEvaluator:
        return CpuPairsEvaluator(record, physics)


class CpuPairsEvaluator(ForceEvaluator):
    """Each pair once, its reaction added to the source: one set of bodies against itself (the rows of a
    span of targets come from the whole set's evaluation; targets outside the sources join it massless)."""

    def __init__(self, record: KernelRecord, physics: Physics):
        super().__init__(record)
        self.policy = record.policy
        self.dtype = record.policy.dtype
        eps2 = float(physics.softening) ** 2
        self.kernel = _kernels_module().pairs_kernel(repulsion=physics.h != 0.0, skip_self=eps2 == 0)
        self._scalars = (eps2, float(physics.G), float(physics.h))

    def tiles(self, n: int) -> PairTiles:
        p = self.policy
        return PairTiles(int(n), p.ti, p.tj, p.chunk)

    def evaluate(self, pos, acc, targets: Span, sources: Span, stream=None) -> ForceWork:
        n = pos.shape[0]
        targets.check_within(n, "targets")
        sources.check_within(n, "sources")
        src = np.asarray(pos[sources.as_slice()], dtype=np.float64)
        if sources.contains(targets):  # the integrator's case: one set against itself
            bodies, rows = src, slice(targets.start - sources.start, targets.stop - sources.start)
        else:  # the targets ride along after the sources as massless bodies, which pull on nothing
            riders = np.array(pos[targets.as_slice()], dtype=np.float64)
            riders[:, 3] = 0.0
            bodies, rows = np.vstack([src, riders]), slice(sources.count, None)
        bodies = np.ascontiguousarray(bodies)
        part = np.zeros((bodies.shape[0], 4), dtype=np.float64)
        tiles = self.tiles(bodies.shape[0])
        self.kernel(bodies, part, tiles.ti, tiles.tj, tiles.chunk, 0, tiles.tasks, *self._scalars)
        acc[targets.as_slice(), :3] = part[rows, :3]
        return ForceWork(
            interactions=tiles.work(0, tiles.tasks),
            pair_equivalent=targets.count * sources.count,
            evaluations=1,
        )

    def evaluate_pairs(self, pos, acc, shares, index: int) -> ForceWork:
        """One device's slice of a pair split (app/parallel/decomposition.py): acc[:, :3] = the partial sums
        of the tasks of slice `index`, the slices cut in proportion to the shares' sizes."""
        n = pos.shape[0]
        tiles = self.tiles(n)
        lo, hi = tiles.slices([s.count for s in shares])[index]
        acc[:, :3] = 0
        if hi > lo:
            self.kernel(pos, acc, tiles.ti, tiles.tj, tiles.chunk, lo, hi, *self._scalars)
        return ForceWork(
            interactions=tiles.work(lo, hi), pair_equivalent=shares[index].count * n, evaluations=1
        )


class CpuOps:
    """app.engine.integrator's StateOps on host arrays: the numba updates, and forces of all bodies on all."""

    def __init__(self, evaluator: ForceEvaluator, pos, vel, acc, speed):
        self.evaluator = evaluator
        self.pos, self.vel, self.acc, self.speed = pos, vel, acc, speed
        self._everyone = Span.all(pos.shape[0])
        self._dtype = pos.dtype.type  # scalars in the state's dtype: a Python float promotes fp32 math
        self._k = _kernels_module()

    def force(self) -> ForceWork:
        return self.evaluator.evaluate(self.pos, self.acc, self._everyone, self._everyone)

    def kick_drift(self, half_dt: float, dt: float) -> None:
        self._k.kick_drift(self.pos, self.vel, self.acc, self._dtype(half_dt), self._dtype(dt))

    def kick(self, half_dt: float) -> None:
        self._k.kick(self.vel, self.acc, self._dtype(half_dt), self.speed)

    def euler_damped(self, dt: float, damping: float) -> None:
        self._k.euler_damped(self.pos, self.vel, self.acc, self._dtype(dt), self._dtype(damping), self.speed)


# --- the records -----------------------------------------------------------------------------------------
_SOURCE = "app/backends/cpu_kernels.py"
_ORIGIN = "The CUDA Handbook (Wilt), ch. 14 N-body: the multithreaded SIMD CPU variant"

RECORDS = (
    KernelRecord(
        name="cpu-simd",
        doc="fp32 all-pairs, numba parallel over targets + fastmath SIMD over sources (SoA copies)",
        backend="cpu",
        precision="fp32",
        source=_SOURCE,
        entry="accel_float32_*",
        origin=_ORIGIN,
        policy=NumbaAllPairs(np.float32, fastmath=True),
        roles=frozenset({"default", "exact"}),
    ),
    KernelRecord(
        name="cpu-fp64",
        doc="float64 all-pairs, numba parallel without fastmath: the accurate CPU path",
        backend="cpu",
        precision="fp64",
        source=_SOURCE,
        entry="accel_float64_*",
        origin=_ORIGIN,
        tuned=False,
        policy=NumbaAllPairs(np.float64, fastmath=False),
        roles=frozenset({"exact", "reference"}),
    ),
    KernelRecord(
        name="cpu-tree",
        doc="Barnes-Hut octree (Morton keys, quadrupoles, group walk), numba parallel over target groups",
        backend="cpu",
        precision="fp32",
        source="app/backends/cpu_tree_kernels.py",
        entry="tree_walk_float32_*",
        origin="Bonsai (Bedorf et al., arXiv:1106.1900) and Ryoanji (arXiv:2307.06345); docs/tree.md",
        tunables=(
            THETA,
            IntChoice("leaf", (8, 16, 32, 64), 16, doc="a cell with at most this many bodies is a leaf"),
            IntChoice(
                "group", (16, 32, 64, 128), 64, doc="targets walked together (consecutive in key order)"
            ),
            *REFIT_TUNABLES,
            *OPENING_TUNABLES,
        ),
        budget=ErrorBudget(max_rel=5e-3, p99_rel=1e-3),
        approximate=True,
        policy=NumbaTree(np.float32),
        decomposition=DOMAINS,
        period_tunable="rebuild_every",
        walk_flops=TREE_WALK_FLOPS,
        roles=frozenset({"block-steps"}),
    ),
    KernelRecord(
        name="cpu-n3l",
        doc="float64 Newton's third law over pair tiles (each pair once, the reaction to the source)",
        backend="cpu",
        precision="fp64",
        source=_SOURCE,
        entry="n3l_pairs_float64_*",
        origin="The CUDA Handbook (Wilt), ch. 14: Newton's third law; the CPU twin of atomics-n3l's split",
        tuned=False,
        policy=NumbaPairs(),
        decomposition=PAIRS,
    ),
)
BY_NAME = {rec.name: rec for rec in RECORDS}
DEFAULT_KERNEL = with_role(RECORDS, "default").name  # cpu-simd


def cpu_record(name: str) -> KernelRecord:
    """The CPU record called `name`; ConfigError naming the CPU kernels otherwise."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise ConfigError(f"kernel: {name!r} is not a cpu kernel; choose from {', '.join(BY_NAME)}") from None


def cpu_accelerations_fp64(pos: np.ndarray, mass: np.ndarray, physics: Physics) -> np.ndarray:
    """Float64 accelerations (N, 3) by the numba `cpu-fp64` kernel; a drop-in `accel_fn` for
    app.engine.integrator.integrate (same signature as app.model.physics.accelerations, ~100x faster at N =
    1k)."""
    pos = np.asarray(pos, dtype=np.float64)
    n = pos.shape[0]
    pos4 = np.empty((n, 4))
    pos4[:, :3] = pos
    pos4[:, 3] = mass
    acc = np.empty((n, 3))
    record = with_role(RECORDS, "reference")
    record.policy.evaluator(record, physics).evaluate(pos4, acc, Span.all(n), Span.all(n))
    return acc


def exact_rows(pos: np.ndarray, rows: np.ndarray, physics: Physics) -> np.ndarray:
    """Float64 (K, 3) accelerations of the bodies `rows` of the (N, 4) positions `pos` due to all N of
    them, summed in pos's precision: cpu-simd's kernel for float32 (fastmath: ~1e-6 relative), cpu-fp64's
    for float64. The exact half of the live force error (`force_error_sample`), for this backend and for
    the CPU devices of --gpus (cpu_multi.py), each over its own full copy of the positions."""
    record = with_role(RECORDS, "exact", "fp32" if pos.dtype == np.float32 else "fp64")
    evaluator = record.policy.evaluator(record, physics)
    targets = np.ascontiguousarray(pos[np.asarray(rows, dtype=np.int64)])
    acc = np.zeros(targets.shape, evaluator.dtype)
    evaluator.evaluate_points(targets, np.ascontiguousarray(pos), acc)
    return acc[:, :3].astype(np.float64)


@contextlib.contextmanager
def announce_compiling(dispatchers, poll_s: float = 0.2):
    """Says "compiling CPU kernels" (once a process) while the block runs, if and only if numba really
    compiles one of `dispatchers`: a miss of its on-disk cache is counted before the compile starts,
    while a cache load, which takes a fraction of a second, says nothing."""
    done = threading.Event()

    def watch():
        while not done.wait(poll_s):
            if any(sum(d.stats.cache_misses.values()) for d in dispatchers):
                if not _ANNOUNCED.is_set():
                    _ANNOUNCED.set()
                    log.info("compiling CPU kernels (first run only: numba caches them)…")
                return

    watcher = threading.Thread(target=watch, name="numba-compile-notice", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


_ANNOUNCED = threading.Event()  # said once a process


def first_nonfinite(pos: np.ndarray, vel: np.ndarray) -> int:
    """The first row whose position, mass (pos: (N, 4)) or velocity (vel: (N, 3|4)) is NaN/inf, else -1:
    the host's form of kernels/integrate.cu's `first_nonfinite` (this backend's guard, CPU devices')."""
    ok = np.isfinite(pos).all(axis=1) & np.isfinite(vel[:, :3]).all(axis=1)
    return -1 if ok.all() else int(np.argmin(ok))


def cpu_name() -> str:
    """The host's processor model (/proc/cpuinfo), else what the platform says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
