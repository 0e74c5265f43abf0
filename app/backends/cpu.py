"""The `cpu` backend: numba-parallel kernels on a host-resident state, stepped by app.integrator.

State: contiguous (N, 4) pos [x, y, z, m], (N, 4) vel [vx, vy, vz, 0] and (N, 4) acc in the precision of
the kernel that last stepped them (float32 for `cpu-simd`, float64 for `cpu-fp64`), plus a float32 (N,)
speed array that the update kernels keep current for the renderer. The state is stepped through a
`Stepper` (app/integrator.py), as every state is; whether acc still holds a(x) is its business
(`Stepper.acc_valid`): the backend only calls `invalidate()` when the positions, the physics, the
kernel or its tunables change.

The pieces, each a small object:
- `NumbaAllPairs`, a record's policy: which numba kernel family (dtype, fastmath) evaluates it, and the
  builder of its evaluator;
- `CpuEvaluator`, the record on the host through the force seam (app/forces.py);
- `CpuOps`, the integrator's StateOps on the backend's arrays (numba updates, forces via the evaluator).

`set_kernel` only records the choice: the state is converted to the new kernel's precision at the next
`step`, so switching leaves it bitwise untouched until then.

numba is imported lazily (through `cpu_kernels`): without it the backend reports `why_not` instead of
failing at import, and kernels compile on first use (cached on disk afterwards).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass

import numpy as np

from app.backends.base import Backend, KernelRecord, StepTimings, check_physics
from app.backends.cpu_tree import OPENING_TUNABLES, THETA, NumbaTree
from app.bodies import Bodies
from app.decomposition import DOMAINS, PAIRS, PairTiles
from app.errors import ConfigError, NonFiniteState
from app.forces import (
    TREE_WALK_FLOPS,
    ErrorBudget,
    ForceEvaluator,
    ForceWork,
    IntChoice,
    Span,
    all_pairs_work,
)
from app.integrator import Stepper
from app.physics import Physics
from app.refit_cadence import REFIT_TUNABLES
from app.timing import HostTimer, stage_entries

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
        eps2 = self.dtype(physics.softening ** 2)  # the value the kernel sees (a tiny ε underflows in fp32)
        h = physics.h
        # The specialisation is picked here, once: ε = 0 skips the self term, H = 0 drops the repulsion.
        self.kernel = _kernels_module().accel_kernel(self.dtype, policy.fastmath, repulsion=h != 0.0,
                                                     skip_self=eps2 == 0)
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
    """`cpu-n3l`'s policy: Newton's third law over the pair tiles of app.decomposition.PairTiles."""

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
        return ForceWork(interactions=tiles.work(0, tiles.tasks),
                         pair_equivalent=targets.count * sources.count, evaluations=1)

    def evaluate_pairs(self, pos, acc, shares, index: int) -> ForceWork:
        """One device's slice of a pair split (app/decomposition.py): acc[:, :3] = the partial sums of
        the tasks of slice `index`, the slices cut in proportion to the shares' sizes."""
        n = pos.shape[0]
        tiles = self.tiles(n)
        lo, hi = tiles.slices([s.count for s in shares])[index]
        acc[:, :3] = 0
        if hi > lo:
            self.kernel(pos, acc, tiles.ti, tiles.tj, tiles.chunk, lo, hi, *self._scalars)
        return ForceWork(interactions=tiles.work(lo, hi), pair_equivalent=shares[index].count * n,
                         evaluations=1)


class CpuOps:
    """app.integrator's StateOps on host arrays: the numba updates, and forces of all bodies on all."""

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
        backend="cpu", precision="fp32", source=_SOURCE, entry="accel_float32_*", origin=_ORIGIN,
        policy=NumbaAllPairs(np.float32, fastmath=True)),
    KernelRecord(
        name="cpu-fp64",
        doc="float64 all-pairs, numba parallel without fastmath: the accurate CPU path",
        backend="cpu", precision="fp64", source=_SOURCE, entry="accel_float64_*", origin=_ORIGIN,
        tuned=False, policy=NumbaAllPairs(np.float64, fastmath=False)),
    KernelRecord(
        name="cpu-tree",
        doc="Barnes-Hut octree (Morton keys, quadrupoles, group walk), numba parallel over target groups",
        backend="cpu", precision="fp32", source="app/backends/cpu_tree_kernels.py",
        entry="tree_walk_float32_*",
        origin="Bonsai (Bedorf et al., arXiv:1106.1900) and Ryoanji (arXiv:2307.06345); docs/tree.md",
        tunables=(
            THETA,
            IntChoice("leaf", (8, 16, 32, 64), 16, doc="a cell with at most this many bodies is a leaf"),
            IntChoice("group", (16, 32, 64, 128), 64,
                      doc="targets walked together (consecutive in key order)"),
            *REFIT_TUNABLES,
            *OPENING_TUNABLES,
        ),
        budget=ErrorBudget(max_rel=5e-3, p99_rel=1e-3), approximate=True,
        policy=NumbaTree(np.float32), decomposition=DOMAINS, period_tunable="rebuild_every",
        walk_flops=TREE_WALK_FLOPS),
    KernelRecord(
        name="cpu-n3l",
        doc="float64 Newton's third law over pair tiles (each pair once, the reaction to the source)",
        backend="cpu", precision="fp64", source=_SOURCE, entry="n3l_pairs_float64_*",
        origin="The CUDA Handbook (Wilt), ch. 14: Newton's third law; the CPU twin of atomics-n3l's split",
        tuned=False, policy=NumbaPairs(), decomposition=PAIRS),
)
_BY_NAME = {rec.name: rec for rec in RECORDS}
DEFAULT_KERNEL = "cpu-simd"


def cpu_accelerations_fp64(pos: np.ndarray, mass: np.ndarray, physics: Physics) -> np.ndarray:
    """Float64 accelerations (N, 3) by the numba `cpu-fp64` kernel; a drop-in `accel_fn` for
    app.integrator.integrate (same signature as app.physics.accelerations, ~100x faster at N = 1k)."""
    pos = np.asarray(pos, dtype=np.float64)
    n = pos.shape[0]
    pos4 = np.empty((n, 4))
    pos4[:, :3] = pos
    pos4[:, 3] = mass
    acc = np.empty((n, 3))
    record = _BY_NAME["cpu-fp64"]
    record.policy.evaluator(record, physics).evaluate(pos4, acc, Span.all(n), Span.all(n))
    return acc


def exact_rows(pos: np.ndarray, rows: np.ndarray, physics: Physics) -> np.ndarray:
    """Float64 (K, 3) accelerations of the bodies `rows` of the (N, 4) positions `pos` due to all N of
    them, summed in pos's precision: cpu-simd's kernel for float32 (fastmath: ~1e-6 relative), cpu-fp64's
    for float64. The exact half of the live force error (`force_error_sample`), for this backend and for
    the CPU devices of --gpus (cpu_multi.py), each over its own full copy of the positions."""
    record = _BY_NAME["cpu-simd" if pos.dtype == np.float32 else "cpu-fp64"]
    evaluator = record.policy.evaluator(record, physics)
    targets = np.ascontiguousarray(pos[np.asarray(rows, dtype=np.int64)])
    acc = np.zeros(targets.shape, evaluator.dtype)
    evaluator.evaluate_points(targets, np.ascontiguousarray(pos), acc)
    return acc[:, :3].astype(np.float64)


@contextlib.contextmanager
def _announce_compiling(dispatchers, poll_s: float = 0.2):
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


# --- the backend -----------------------------------------------------------------------------------------
class CPUBackend(Backend):
    name = "cpu"
    _warm: set = set()  # (record, force kernel) combinations already compiled / loaded in this process

    def __init__(self):
        self._kernel = DEFAULT_KERNEL
        self._physics = Physics()
        self._pos = self._vel = self._acc = None
        self._speed = np.zeros(0, np.float32)
        self._render_pos = None
        self._kept_evaluator = None
        self._mass = np.zeros(0)
        self._ids = None
        self._t0 = 0.0  # time at the last change of dt ...
        self._steps = 0  # ... plus steps taken since, times dt
        self._stepper = Stepper()  # the integrator's cached a(x), stepping (app/integrator.py)
        self._timer = HostTimer()
        self._tunables: dict[str, dict] = {}  # record name -> values set (validated), over its defaults

    # --- discovery -------------------------------------------------------------------------------
    @classmethod
    def why_not(cls) -> str | None:
        try:
            import numba  # noqa: F401
        except ImportError as e:
            return f"numba is not importable ({e}); pip install numba"
        return None

    @classmethod
    def kernels(cls) -> list[KernelRecord]:
        return list(RECORDS)

    @classmethod
    def kernel_why_not(cls, name: str) -> str | None:
        if name not in _BY_NAME:
            return f"{name!r} is not a cpu kernel (choose from {', '.join(_BY_NAME)})"
        return cls.why_not()

    # --- state -----------------------------------------------------------------------------------
    def load(self, bodies: Bodies, physics: Physics, kernel: str | None = None) -> None:
        self._physics = check_physics(physics)
        self._kernel = self._resolve(kernel)
        self._pos, self._vel = bodies.pos4(self._dtype), bodies.vel4(self._dtype)
        self._acc = np.zeros_like(self._pos)
        self._mass = bodies.mass.copy()
        self._ids = None if bodies.ids is None else bodies.ids.copy()
        self._speed = np.linalg.norm(self._vel[:, :3], axis=1).astype(np.float32)
        self._render_pos = None
        self._kept_evaluator = None  # (key, evaluator) of `evaluator`: new bodies, new evaluator
        self._t0, self._steps = float(bodies.time), 0
        self._stepper.restart()

    @property
    def kernel(self) -> str:
        return self._kernel

    def set_kernel(self, name: str) -> None:
        name = self._resolve(name)
        if name != self._kernel:
            self._stepper.invalidate()  # another kernel's a(x); the state is converted at the next step
        self._kernel = name

    def set_physics(self, physics: Physics) -> None:
        old = self._swap_physics(physics)
        if (physics.G, physics.softening, physics.h) != (old.G, old.softening, old.h):
            self._stepper.invalidate()

    @property
    def n(self) -> int:
        return int(self._mass.shape[0])

    # --- tunables --------------------------------------------------------------------------------
    def tunables(self) -> dict:
        return _BY_NAME[self._kernel].with_tunables(self._tunables.get(self._kernel, {}))

    def set_tunables(self, **values) -> None:
        checked = _BY_NAME[self._kernel].validate_tunables(values)
        self._tunables[self._kernel] = {**self._tunables.get(self._kernel, {}), **checked}
        self._stepper.invalidate()

    def clear_tunables(self) -> None:
        self._tunables.clear()
        self._stepper.invalidate()

    # --- stepping --------------------------------------------------------------------------------
    @property
    def _dtype(self):
        return _BY_NAME[self._kernel].policy.dtype

    def _resolve(self, name: str | None) -> str:
        name = name or DEFAULT_KERNEL
        if name not in _BY_NAME:
            raise ConfigError(f"kernel: {name!r} is not a cpu kernel; choose from {', '.join(_BY_NAME)}")
        return name

    def _require_state(self):
        if self._pos is None:
            raise RuntimeError("CPUBackend: call load() before stepping or reading the state")

    def evaluator(self, name: str | None = None) -> ForceEvaluator:
        """A record (default: the current kernel) with the current physics and the tunables set for it
        (cheap: the compiled kernel is looked up, not rebuilt). The same object while the state, kernel,
        force parameters and tunables stay: an evaluator may carry work from one step() call to the next
        (the tree's refit, rebuild_every), as the devices' evaluators of the multi-device run do."""
        record = _BY_NAME[self._resolve(name or self._kernel)]
        tunables = self._tunables.get(record.name, {})
        # the force parameters, not dt or the integrator: those keep the evaluator
        key = (record.name, self._physics.forces, tuple(sorted(tunables.items())))
        kept = self._kept_evaluator
        if kept is not None and kept[0] == key:
            return kept[1]
        evaluator = record.policy.evaluator(record, self._physics)
        evaluator.set_tunables(**tunables)
        self._kept_evaluator = (key, evaluator)
        return evaluator

    def _ops(self, evaluator: CpuEvaluator) -> CpuOps:
        return CpuOps(evaluator, self._pos, self._vel, self._acc, self._speed)

    def _positions_in(self, dtype) -> np.ndarray:
        """The positions in `dtype`, masses from the float64 originals rather than a rounded copy."""
        pos = self._pos.astype(dtype)
        pos[:, 3] = self._mass
        return pos

    def _to_kernel_precision(self) -> None:
        dtype = self._dtype
        if self._pos.dtype != dtype:
            self._pos = self._positions_in(dtype)
            self._vel = self._vel.astype(dtype)
            self._acc = np.zeros_like(self._pos)
            self._render_pos = None
            self._stepper.invalidate()

    def _warm_up(self, evaluator: CpuEvaluator) -> None:
        """Compile (or load from numba's cache) the kernels of one step outside the timed region."""
        key = (evaluator.record.name, evaluator.kernel.py_func.__name__)
        if key in CPUBackend._warm:
            return
        t = time.perf_counter()
        one = np.zeros((1, 4), evaluator.dtype)
        # a fresh evaluator of the same record: the run's own keeps work between steps (a tree's refit
        # cadence), which a one-body evaluation would reset
        spare = evaluator.record.policy.evaluator(evaluator.record, self._physics)
        spare.set_tunables(**evaluator.tunables)
        ops = CpuOps(spare, one, one.copy(), one.copy(), np.zeros(1, np.float32))
        k = ops._k
        with _announce_compiling((evaluator.kernel, k.kick_drift, k.kick, k.euler_damped)):
            ops.force()
            ops.kick_drift(0.0, 0.0)
            ops.kick(0.0)
            ops.euler_damped(0.0, 1.0)
        CPUBackend._warm.add(key)
        log.debug("CPU kernels %s ready in %.2f s", key, time.perf_counter() - t)

    def step(self, steps: int = 1) -> StepTimings:
        if steps < 0:
            raise ValueError(f"steps must be >= 0, not {steps}")
        self._require_state()
        self._check_finite()  # before: one bad body contaminates every force within a single step
        self._to_kernel_precision()
        evaluator = self.evaluator()
        self._warm_up(evaluator)
        evaluator.stage_ms()  # (the warm-up's stages are not this step's)
        self._timer.reset()
        # No checks from the stepper (check_every = 0): the host checks the whole state once per call,
        # before the first step (a bad body spoils every force of the step) and after the last, and a
        # pass over host arrays costs far less than a step, so there is no cadence to keep.
        work = self._stepper.advance(self._ops(evaluator), self._physics, steps, check_every=0,
                                     timer=self._timer)
        ms = self._timer.collect()
        self._steps += steps
        self._check_finite()
        return StepTimings(kernel=self._kernel, steps=steps, n=self.n, force_ms=ms.get("force", 0.0),
                           integrate_ms=ms.get("integrate", 0.0), interactions=work.interactions,
                           pair_equivalent=work.pair_equivalent, force_evals=work.evaluations,
                           body_cell=work.body_cell, extra=stage_entries(evaluator.stage_ms()))

    def _check_finite(self) -> None:
        """The GPU's guard on the host: a blown-up state pauses the viewer instead of drawing NaNs.
        One vectorised pass per step() call (about 0.1 ms at N = 65k), not per step."""
        bad = first_nonfinite(self._pos, self._vel)
        if bad >= 0:
            raise NonFiniteState(bad, step=self._steps, time=self.time)

    def accelerations(self) -> np.ndarray:
        return self._current_acc()[:, :3].astype(np.float64)

    def _current_acc(self) -> np.ndarray:
        """a(x) of the current state by the current kernel, (N, 4) in its dtype: the stepper's cached
        one (computed now, and cached, if not valid), or after a switch to a kernel of another precision
        not stepped yet, evaluated on a converted copy with the state untouched."""
        self._require_state()
        evaluator = self.evaluator()
        if self._pos.dtype == evaluator.dtype:  # a(x) of the state: the cached one, or cached from now on
            self._stepper.ensure_acc(self._ops(evaluator))
            return self._acc
        pos = self._positions_in(evaluator.dtype)
        acc = np.zeros(pos.shape, evaluator.dtype)
        evaluator.evaluate(pos, acc, Span.all(self.n), Span.all(self.n))
        return acc

    def force_error_sample(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(approx, exact), float64 (K, 3), for the bodies `rows` (original order) at the current positions:
        approx = the running kernel's accelerations (the integrator's cached a(x); evaluated and cached now
        if it is not current), exact = `exact_rows` in the kernel's precision."""
        rows = np.asarray(rows, dtype=np.int64)
        approx = self._current_acc()[rows, :3].astype(np.float64)
        pos = self._pos if self._pos.dtype == self._dtype else self._positions_in(self._dtype)
        return approx, exact_rows(pos, rows, self._physics)

    def state(self) -> Bodies:
        self._require_state()
        return Bodies(pos=self._pos[:, :3].astype(np.float64), vel=self._vel[:, :3].astype(np.float64),
                      mass=self._mass.copy(), time=self.time,
                      ids=None if self._ids is None else self._ids.copy(), components=self.components)


    # --- rendering -------------------------------------------------------------------------------
    def host_render_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The live float32 (N, 4) positions and (N,) speeds: no copy on the fp32 path, so they are
        overwritten by the next `step` and must be treated as read-only."""
        self._require_state()
        if self._pos.dtype == np.float32:
            return self._pos, self._speed
        if self._render_pos is None:
            self._render_pos = np.empty(self._pos.shape, np.float32)
        np.copyto(self._render_pos, self._pos, casting="same_kind")
        return self._render_pos, self._speed

    def close(self) -> None:
        self._pos = self._vel = self._acc = self._render_pos = None


BACKEND = CPUBackend
