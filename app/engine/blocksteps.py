"""Hierarchical block time steps: power-of-two levels, "drift all, kick active" (docs/blocksteps.md).

Levels: body i steps dt_i = dt_max / 2^l_i, l_i in [0, L] (dt_max = physics.dt, L = `max_level`); time
is counted in ticks of dt_min = dt_max / 2^L, and a level-l step is 2^(L-l) ticks. Every step starts on
a tick that is a multiple of its own length, so the bodies whose step ends at tick t (the *active* set)
are exactly those with t % 2^(L-l_i) == 0, and every body ends its step at t = 2^L: velocities are
synchronised at every dt_max boundary, as with the shared leapfrog (app/engine/integrator.py).

Criterion (GADGET-2, Springel 2005, MNRAS 364, 1105, eq. 34; GOTHIC, Miki & Umemura 2017, New Astron.
52, 65, uses the same form): dt_i = sqrt(2 η ε / |a_i|), ε the softening, η the accuracy parameter; the
wanted level is the smallest l with dt_max / 2^l <= dt_i, clamped to [0, L] (a = 0: level 0; ε = 0 or a
non-finite a: level L). Option `criterion="tidal"`: min of that and sqrt(2 η / ||T_i||), T the tidal tensor
(`tidal_steps`; measured against GADGET-2's in docs/blocksteps.md: neither keeps block steps' energy
within 2x of shared steps at ε = 0.01).

One max step (KDK per level, GADGET-2 / GOTHIC's "drift all, kick active"):

    t = 0, active = everyone
    while t < 2^L:
        kick(active, a dt_i / 2)            the opening half-kick of each step starting at t
        drift_all((t' - t) dt_min)          t' = the next tick at which some body's step ends
        t = t'; active = {i : t % 2^(L - l_i) == 0}
        force_active(active)                a(x) of the active targets against all sources
        kick(active, a dt_i / 2)            the closing half-kick, with the step's own dt_i
        l_i = new level of each active body (`relevel`)

Level changes happen only at the end of a body's own step: to a finer level at any such tick (t is a
multiple of every finer step, so the new step starts aligned), to a coarser one only where t is a
multiple of the coarser step (`coarsen="aligned"`), or only at the end of a max step, where every level
is aligned (`coarsen="boundary"`; "settled", the default, also keeps a body at the finer of the levels
it wants at this boundary and wanted at the one before). With the levels frozen, each level's schedule
is then a palindrome in time (t % s == 0 iff (2^L - t) % s == 0 for s dividing 2^L), and each body's
KDK brackets its drifts with equal half-kicks, so a max step reversed retraces itself
(tests/test_blocksteps.py). With L = 0 it is the shared leapfrog, operation for operation (bitwise,
against `app.engine.integrator.integrate`).

The scheduler (`BlockSteps`) owns the levels and the schedule; a backend implements `BlockOps` (three
updates and a force over an index array of rows); app/backends/blocksteps_ops.py has the float64 reference's
(`NumpyBlockOps`) and the CPU twin's (`TreeBlockOps`, cpu-tree walking only the groups that hold an
active body), app/backends/cuda/blockops.py the GPU's. It is not a Stepper: the Stepper's
one-step-one-force contract stays as it is.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from app.core.errors import ConfigError
from app.engine.forces import ForceWork
from app.model.config import COARSEN
from app.model.physics import Physics

MODES = ("block", "shared", "frozen")  # per-body levels; one level for all (the finest wanted); fixed levels
CRITERIA = ("gadget", "tidal")  # sqrt(2 η ε / |a|); its min with sqrt(2 η / |T|) (docs/blocksteps.md)


class BlockOps(Protocol):
    """One backend's state under block steps: positions, velocities and a(x) per body (rows)."""

    n: int
    # xp: the module of the ops' arrays (numpy when absent; CuPy for the GPU's): the scheduler keeps the
    # levels there and passes the rows and half steps as its arrays, so a substep moves no index array
    # between host and device. scope(): a context manager the scheduler holds around its work (the GPU's:
    # its context current, which CuPy needs to launch the scheduler's own array kernels).

    def drift_all(self, dt: float) -> None:
        """x += v·dt for every body (and the state's clock += dt)."""

    def force_active(self, rows: np.ndarray) -> ForceWork:
        """acc[rows] = a(x) of the bodies `rows` (int64, increasing) against all sources; only those rows
        count as targets in the work returned."""

    def kick(self, rows: np.ndarray, half_dts: np.ndarray) -> None:
        """v[rows] += acc[rows]·half_dts (one half step each, per row)."""

    def acc_norms(self, rows: np.ndarray) -> np.ndarray:
        """|acc[rows]| as float64 (the criterion's input)."""

    # Only for criterion "tidal" (ops without it raise there):
    # def tidal_norms(self, rows) -> np.ndarray: ||T[rows]||, the Frobenius norm of the tidal tensor
    #     T_ab = ∂a_a/∂x_b at the rows, from the last force_active (float64).


def array_module(a):
    """numpy, or CuPy for a CuPy array (the GPU's ops keep the levels and the rows on the device)."""
    if isinstance(a, np.ndarray) or not type(a).__module__.startswith("cupy"):
        return np
    import cupy  # only reached with a CuPy array in hand

    return cupy


def step_levels(dt: np.ndarray, dt_max: float, max_level: int) -> np.ndarray:
    """The smallest l in [0, max_level] with dt_max / 2^l <= dt (int32); nan -> max_level, inf -> 0.
    `dt` may be a CuPy array (the result is then one too)."""
    xp = array_module(dt)
    dt = xp.asarray(dt, dtype=np.float64)
    dt = xp.where(xp.isnan(dt), 0.0, dt)
    # -dt_max / 2^l, made where dt lives (no copy from the host), exact: ldexp scales by a power of two
    minus_steps = xp.ldexp(xp.full(max_level + 1, -float(dt_max)), -xp.arange(max_level + 1, dtype=np.int32))
    level = xp.searchsorted(minus_steps, -dt, side="left")  # the first l with steps[l] <= dt
    return xp.minimum(level, max_level).astype(np.int32)


def gadget_steps(norms: np.ndarray, eta: float, softening: float) -> np.ndarray:
    """GADGET-2's dt_i = sqrt(2 η ε / |a_i|): inf where a = 0, nan where a is not finite or ε = 0."""
    xp = array_module(norms)
    norms = xp.asarray(norms, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return xp.sqrt(2.0 * eta * softening / norms)


def tidal_steps(norms: np.ndarray, tidal: np.ndarray, eta: float, softening: float) -> np.ndarray:
    """min(GADGET-2's step, sqrt(2 η / ||T_i||)), ||T|| the tidal tensor's Frobenius norm (Grudić &
    Hopkins 2020, MNRAS, arXiv:1910.06349: a dynamical time ||T||^(-1/2) that does not vanish where |a| does).
    Both terms have the same η and agree in scale at the softening length (a pair at r = ε: |a| ≈
    ||T|| ε), so `shared` at the same η is the same finest-level rule."""
    with np.errstate(divide="ignore", invalid="ignore"):
        dyn = np.sqrt(2.0 * eta / np.asarray(tidal, dtype=np.float64))
    return np.minimum(gadget_steps(norms, eta, softening), dyn) if softening > 0 else dyn


def wanted_levels(
    norms: np.ndarray, dt_max: float, max_level: int, eta: float, softening: float
) -> np.ndarray:
    """The criterion: the smallest l in [0, max_level] with dt_max / 2^l <= sqrt(2 η ε / |a|) (int32)."""
    return step_levels(gadget_steps(norms, eta, softening), dt_max, max_level)


def aligned_level(t: int, max_level: int) -> int:
    """The coarsest level whose steps are aligned with tick t (t a multiple of 2^(L - l)); 0 at t = 0."""
    if t == 0:
        return 0
    trailing = (t & -t).bit_length() - 1  # the largest power of two dividing t
    return max(0, max_level - trailing)


def relevel(
    wanted: np.ndarray, t: int, max_level: int, old: np.ndarray | None = None, coarsen: str = "aligned"
) -> np.ndarray:
    """New levels of bodies whose steps end at tick t (`old`: their levels; None at begin()). The wanted
    level when it is finer than or equal to the old one (t ends an old step, so it is a multiple of every
    finer step), else, with coarsen "aligned", the coarsest level between the wanted and the old one that
    tick t is aligned with (a coarser step starting off its grid would break the schedule's palindrome,
    and with it each level's time symmetry; since t ends a step of the old level, aligned_level(t) <= old,
    and both cases are one max); with coarsen "boundary", the old level until t ends a max step, where
    every level is aligned and the wanted one is taken; "settled" is "boundary" with the wanted level
    floored at the one wanted at the boundary before (`BlockSteps._assign`: a body gets coarser only to a
    level it wanted at two boundaries in a row). Measured (docs/blocksteps.md): "boundary" cut the energy
    drift 1.7-14x against "aligned" on softened models (the 1M collision 3.5x, at the same cost);
    "settled" (the scheduler's default) cut it again, 4.8x on the 1M collision on an H100, to 1.28x shared
    steps', and 3-4x on the CPU twin's softened cases; "aligned" does better where close encounters at
    small softening dominate."""
    xp = array_module(wanted)
    wanted = xp.asarray(wanted, dtype=np.int32)
    if coarsen in ("boundary", "settled"):
        if old is None or t % (1 << max_level) == 0:
            return wanted
        return xp.maximum(wanted, old.astype(np.int32, copy=False))
    return xp.maximum(wanted, np.int32(aligned_level(t, max_level)))


@dataclass
class BlockState:
    """What resumes a run at a max-step boundary, beside the ops' state (x, v, a(x), time): the levels,
    the max steps taken and the tick within the max step (always 0 at a boundary)."""

    levels: np.ndarray
    steps: int = 0
    tick: int = 0


@dataclass
class MaxStepRecord:
    """One max step's schedule: per substep its end tick and number of active targets."""

    ticks: list[int] = field(default_factory=list)
    active: list[int] = field(default_factory=list)
    n: int = 0

    @property
    def targets(self) -> int:
        """Active targets evaluated, summed over the substeps (the force work in target units)."""
        return int(sum(self.active))

    @property
    def substep_fractions(self) -> list[float]:
        return [a / self.n for a in self.active] if self.n else []

    @property
    def fraction(self) -> float:
        """Active targets / (N · substeps): the mean active fraction of the max step's substeps."""
        return self.targets / (self.n * len(self.active)) if self.active else 0.0


@dataclass(frozen=True)
class Substep:
    """Where a max step run by `BlockSteps.substeps` stands after a substep: every position is at tick
    `t` and every velocity is the one its body drifts with until `t_next`, the next substep's end (the
    opening half-kicks of the steps starting at t are applied), so a drawing at tick s in [t, t_next]
    can predict x + v (s - t) dt_min exactly as the drift will make it (up to rounding). `work`: the
    force work of this substep (none for the max step's opening). `done`: t ends the max step, and the
    state is synchronised (velocities included)."""

    t: int
    t_next: int
    work: ForceWork
    active: int = 0  # the targets this substep evaluated
    done: bool = False


class BlockSteps:
    """The block time-step scheduler over a `BlockOps`: levels (int32, owned here), the schedule, the
    criterion, and the counts. `mode`: "block" (per-body levels from the criterion), "shared" (every
    body at the finest level any body wants: the shared-step comparison at the same η), "frozen" (the
    levels given, never changed)."""

    def __init__(
        self,
        physics: Physics,
        max_level: int,
        eta: float = 0.025,
        mode: str = "block",
        levels: np.ndarray | None = None,
        criterion: str = "gadget",
        coarsen: str = "settled",
    ):
        if mode not in MODES:
            raise ValueError(f"unknown block-step mode {mode!r}; choose from {', '.join(MODES)}")
        if criterion not in CRITERIA:
            raise ValueError(f"unknown block-step criterion {criterion!r}; choose from {', '.join(CRITERIA)}")
        if coarsen not in COARSEN:
            raise ValueError(f"unknown coarsening rule {coarsen!r}; choose from {', '.join(COARSEN)}")
        if not 0 <= int(max_level) <= 30:
            raise ValueError(f"max_level {max_level} is not in [0, 30]")
        if physics.integrator != "leapfrog":
            raise ValueError("block time steps are a leapfrog (KDK) scheme")
        if mode == "frozen" and levels is None:
            raise ValueError("frozen levels need `levels`")
        self.physics = physics
        self.max_level = int(max_level)
        self.eta = float(eta)
        self.mode = mode
        self.criterion = criterion
        self.coarsen = coarsen
        self.dt_max = float(physics.dt)
        self.dt_min = self.dt_max / (1 << self.max_level)
        self.levels: np.ndarray | None = None if levels is None else self._checked(levels)
        self.floor: np.ndarray | None = (
            None  # coarsen "settled": the levels wanted at the last max-step boundary
        )
        self.steps = 0
        self.ready = False  # a(x) of every body and the levels match the state (begin() makes them)
        self.last = MaxStepRecord()
        self.total = MaxStepRecord()  # every substep since begin()/resume(), for the counts
        self.work = ForceWork()

    def _known_levels(self) -> np.ndarray:
        """The levels, which the constructor (frozen), begin() or a resume have set by now."""
        assert self.levels is not None, "no levels yet: begin() has not run"
        return self.levels

    def _checked(self, levels) -> np.ndarray:
        levels = array_module(levels).array(levels, dtype=np.int32)  # (a copy, numpy or CuPy as given)
        if levels.size and (int(levels.min()) < 0 or int(levels.max()) > self.max_level):
            raise ValueError(f"levels outside [0, {self.max_level}]")
        return levels

    # --- state ------------------------------------------------------------------------------------------
    @classmethod
    def resume(
        cls,
        state: BlockState,
        physics: Physics,
        max_level: int,
        eta: float = 0.025,
        mode: str = "block",
        criterion: str = "gadget",
        coarsen: str = "settled",
    ) -> BlockSteps:
        """A scheduler continuing `state`; its ops must hold the checkpoint's x, v and a(x) (or have
        recomputed a(x) with a force whose rows do not depend on which rows are asked: the tree's
        active-group walk, the numba float64 sum). Under "settled" the first max step takes the floor
        from that a(x) (`_max_step`)."""
        if state.tick != 0:
            raise ValueError("block steps resume only at a max-step boundary (tick 0)")
        sched = cls(physics, max_level, eta, mode, levels=state.levels, criterion=criterion, coarsen=coarsen)
        sched.steps = int(state.steps)
        sched.ready = True
        return sched

    def state(self) -> BlockState:
        if not self.ready:
            raise ValueError("no state to checkpoint: begin() has not run, or a max step failed")
        return BlockState(levels=_host(self.levels).copy(), steps=self.steps, tick=0)

    def histogram(self) -> np.ndarray:
        """Bodies per level, levels 0..L (numpy; counted on the host wherever the levels live, so that it
        needs no device context current)."""
        return np.bincount(_host(self.levels), minlength=self.max_level + 1)

    def finest_ticks(self) -> int:
        """Ticks of the finest step any body takes (a step of level l is 2^(L - l) ticks): from a tick that
        is a multiple of every step, the next substep ends this far ahead."""
        return 1 << (self.max_level - int(self._known_levels().max()))

    def active_rows(self, t: int):
        """The bodies whose steps end at tick t (0 < t <= 2^L), in index order: t is a multiple of 2^(L - l)
        exactly when l >= aligned_level(t), so one comparison over the levels finds them (on the GPU this
        replaced five launches over every body: each one's ticks, then t mod ticks)."""
        levels = self._known_levels()
        return array_module(levels).flatnonzero(levels >= aligned_level(t, self.max_level))

    def half_dts(self, rows: np.ndarray) -> np.ndarray:
        # exact: dt_max times a power of two (ldexp, not exp2, which CUDA's libm does not promise exact)
        levels = self._known_levels()
        return array_module(levels).ldexp(0.5 * self.dt_max, -levels[rows])

    def _on(self, ops: BlockOps):
        """The ops' array module (`ops.xp`, numpy by default), the levels moved there (a resume from a
        host checkpoint onto the GPU's ops)."""
        xp = getattr(ops, "xp", np)
        if self.levels is not None and array_module(self.levels) is not xp:
            self.levels = xp.asarray(_host(self.levels))
        return xp

    def _wanted(self, ops: BlockOps, rows: np.ndarray) -> np.ndarray:
        eps = self.physics.softening
        if self.criterion == "tidal":
            if not hasattr(ops, "tidal_norms"):
                raise ValueError(
                    f"criterion 'tidal' needs ops with tidal_norms(); {type(ops).__name__} has none"
                )
            dt = tidal_steps(ops.acc_norms(rows), ops.tidal_norms(rows), self.eta, eps)
        else:
            dt = gadget_steps(ops.acc_norms(rows), self.eta, eps)
        return step_levels(dt, self.dt_max, self.max_level)

    # --- stepping ---------------------------------------------------------------------------------------
    def begin(self, ops: BlockOps, keep_levels: bool = False) -> ForceWork:
        """a(x) of every body, and the levels from the criterion (kept when frozen, or with keep_levels:
        the levels given, e.g. a snapshot's, with the criterion's levels only remembered as "settled"'s
        floor, which makes a resume bitwise under every rule)."""
        with ops_scope(ops):
            return self._begin(ops, keep_levels)

    def _begin(self, ops: BlockOps, keep_levels: bool = False) -> ForceWork:
        everyone = self._on(ops).arange(ops.n, dtype=np.int64)
        work = ops.force_active(everyone)
        self._count(self.total, 0, ops.n)
        if keep_levels and self.levels is not None and self.levels.shape == (ops.n,):
            self.floor = self._wanted(ops, everyone)
        elif self.mode != "frozen":
            self.levels = self._assign(self._wanted(ops, everyone), None, 0)
        elif self._known_levels().shape != (ops.n,):  # frozen: the constructor's levels
            raise ValueError(f"{self._known_levels().shape[0]} levels for {ops.n} bodies")
        self.ready = True
        self.work += work
        return work

    def _assign(self, wanted: np.ndarray, rows: np.ndarray | None, t: int) -> np.ndarray:
        """The levels after the bodies `rows` (None: all, at t = 0) ended their steps at tick t."""
        wanted = self._as_mode(wanted)
        if self.coarsen == "settled" and t % (1 << self.max_level) == 0:  # a boundary (every body ends)
            floor, self.floor = self.floor, wanted.copy()
            if floor is not None and rows is not None:
                wanted = array_module(wanted).maximum(wanted, floor)
        before = None if rows is None else self._known_levels()[rows]
        new = relevel(wanted, t, self.max_level, before, self.coarsen)
        if rows is None:
            return new
        levels = self._known_levels().copy()
        levels[rows] = new
        return levels

    def _as_mode(self, wanted: np.ndarray) -> np.ndarray:
        if self.mode == "shared" and wanted.size:  # all bodies are active together: the finest wanted
            return array_module(wanted).full(wanted.shape, int(wanted.max()), np.int32)
        return wanted

    def _count(self, record: MaxStepRecord, tick: int, active: int) -> None:
        record.ticks.append(tick)
        record.active.append(int(active))
        record.n = self.levels.shape[0] if self.levels is not None else active

    def max_step(self, ops: BlockOps) -> ForceWork:
        """Advance one dt_max: the substeps of every level (the module docstring's loop). An exception
        leaves the scheduler not ready: the next max step starts with begin() again."""
        with ops_scope(ops):
            return self._max_step(ops)

    def _max_step(self, ops: BlockOps) -> ForceWork:
        work = ForceWork()
        for sub in self.substeps(ops):
            work += sub.work
        return work

    def substeps(self, ops: BlockOps) -> Iterator[Substep]:
        """One max step, a substep at a time (the module docstring's loop, its opening half-kicks moved
        to the end of the substep before, which changes no operation's order): a `Substep` after the
        opening half-kicks at t = 0, then one after every substep, the last with done=True. A caller
        that draws between substeps (app/backends/block.py) runs each next() with ops_scope(ops) entered
        and runs the generator to its done before it reads a synchronised state; `max_step` runs it
        whole. Until done the scheduler is not ready: an abandoned max step starts again with begin()."""
        if not self.ready:
            self._begin(ops)
        xp = self._on(ops)
        rows = xp.arange(ops.n, dtype=np.int64)  # everyone starts a step at a max-step boundary
        if self.coarsen == "settled" and self.floor is None and self.mode != "frozen":
            # after resume(): the floor is the criterion's level of the a(x) the ops hold, as at the
            # boundary the checkpoint was taken at (a(x) follows from x), so the run continues bitwise
            self.floor = self._as_mode(self._wanted(ops, rows))
        self.ready = False
        end = 1 << self.max_level
        record = MaxStepRecord(n=ops.n)
        work = ForceWork()
        t = 0
        ops.kick(rows, self.half_dts(rows))  # opening half-kicks
        t_next = t + self.finest_ticks()  # t is a multiple of every step: the finest ends first
        yield Substep(t, t_next, ForceWork())
        while True:
            ops.drift_all((t_next - t) * self.dt_min)
            t = t_next
            rows = self.active_rows(t)
            done = ops.force_active(rows)
            work += done
            self._count(record, t, rows.size)
            self._count(self.total, t, rows.size)
            ops.kick(rows, self.half_dts(rows))  # closing half-kicks, with each step's own dt
            if self.mode != "frozen":
                self.levels = self._assign(self._wanted(ops, rows), rows, t)
            if t == end:
                break
            ops.kick(rows, self.half_dts(rows))  # opening half-kicks of the steps starting at t
            t_next = t + self.finest_ticks()
            yield Substep(t, t_next, done, int(rows.size))
        self.steps += 1
        self.last = record
        self.work += work
        self.ready = True
        yield Substep(t, t, done, int(rows.size), done=True)

    def advance(self, ops: BlockOps, steps: int) -> ForceWork:
        work = ForceWork()
        for _ in range(int(steps)):
            work += self.max_step(ops)
        return work


def block_tunables(tunables: dict | None) -> dict:
    """A tree's tunables for block steps: a build at every evaluation and a geometric opening test (cube
    unless bmax is asked), whatever the record's defaults, so that a(x) follows from x alone, which a
    resume needs; ConfigError naming the fix for rebuild_every > 1 or opening = rel."""
    tunables = dict(tunables or {})
    if int(tunables.get("rebuild_every", 1)) != 1:
        raise ConfigError(
            "block steps build the tree at every evaluation (a refit's tree depends on the "
            "build before it, so a(x) would not follow from x alone, which a resume needs); "
            "drop rebuild_every"
        )
    if tunables.get("opening") == "rel":
        raise ConfigError(
            "block steps take a geometric opening test (the relative one reads the last "
            "accelerations, so a(x) would not follow from x alone, which a resume needs); "
            "use opening=cube or bmax"
        )
    return {**tunables, "rebuild_every": 1, "opening": tunables.get("opening", "cube")}


def ops_scope(ops):
    """The ops' scope() (BlockOps: the GPU's context current), or nothing to enter."""
    scope = getattr(ops, "scope", None)
    return scope() if scope is not None else nullcontext()


def _host(a) -> np.ndarray:
    return a if isinstance(a, np.ndarray) else a.get()
