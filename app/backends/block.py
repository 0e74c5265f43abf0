"""`--timesteps block`: a Backend that steps hierarchical (block) time steps on the tree, so that run,
simulate and the panel drive it as they drive the shared-step backends.

    cls = block_steps_backend_class(select_backend("cuda"))   # or the CPU backend: the CPU twin
    backend = cls()
    backend.load(bodies, physics.with_(timesteps="block", dt=1/16, block_levels=6), "tree")
    backend.step(4)                       # four max steps of physics.dt, each its substeps per level

The scheduler is app/engine/blocksteps.py's `BlockSteps`, over the device's ops: `CudaBlockOps` (one GPU, the
`tree` record's walk of the active groups, the levels and rows on the device) or the CPU twin's
`TreeBlockOps` (`cpu-tree`). One `step` is one max step (physics.dt): every body starts and ends it
together, so between steps the state is synchronised (x, v and a(x) of every body at one time) and a
snapshot of x and v is nearly the whole state. Under the coarsening rules "boundary" and "aligned" every
level at a max-step boundary is the criterion's of a(x) (`relevel`), and a(x) follows from x (the tree
builds at every evaluation and a row's value does not depend on which rows are asked), so a run loaded
from a float64 snapshot continues bitwise from x and v alone. Under "settled" a level also remembers the
boundary before: the snapshot keeps the levels (`Bodies.step_levels`, npz keys step_levels*), and a load
of them with the same dt, L and rule continues bitwise (tests/test_blocksteps_backend.py).

Drawing: the scheme drifts every body at every substep ("drift all, kick active"), so every position is
current after each substep. `step_parts(parts, K)` (the viewer's run.frames_per_step = K) draws K frames
per max step: it runs the substeps that end within the next parts/K of the max step (the scheduler's
`substeps` generator, kept between frames) and draws x + v (s − t) at the frame's time s, t the last
substep's end, v each body's drift velocity then (its opening half-kick applied): the position the drift
will give, up to rounding, and the state itself untouched, so the trajectory does not depend on K. What
needs a synchronised state (a snapshot, a change of physics or tunables, `step`, accelerations) first
runs the max step in flight to its end; `synchronised` says when one is in flight (the energy monitor
waits for its end).

One device, the tree only: the block walk needs the tree's active-group walk and a(x) from x alone
(a build at every evaluation, a geometric opening test), which the multi-device split and the relative
test do not give (the ops refuse rebuild_every > 1 and opening = rel, naming the fix).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import numpy as np

from app.backends.base import Backend, KernelRecord, StepTimings, check_physics, wrapped_capabilities
from app.core.errors import ConfigError
from app.engine.blocksteps import BlockSteps, Substep, block_tunables, ops_scope
from app.engine.forces import ForceWork, with_role
from app.model.bodies import Bodies, StepLevels
from app.model.physics import Physics

HOST_UPLOAD = "host upload (block steps)"
INTEROP = "CUDA-GL interop (block steps)"
log = logging.getLogger(__name__)


def block_steps_backend_class(base: type[Backend]) -> type[BlockStepsBackend]:
    """The block-step form of `base` (cuda or cpu: a backend with a record in the role "block-steps");
    ConfigError for a backend without one (one that cannot run here says so through why_not)."""
    if base.why_not() is None and not any("block-steps" in r.roles for r in base.kernels()):
        raise ConfigError(
            f"--timesteps block: the {base.name} backend has no tree to walk active bodies "
            "with (no kernel in the role block-steps); use a backend that has one "
            "(`nbody-live info --kernels`)"
        )
    return type(
        f"BlockSteps{base.__name__}",
        (BlockStepsBackend,),
        {**wrapped_capabilities(base), "base": base},
    )


class BlockStepsBackend(Backend):
    """Block time steps on one device of `base` (made by block_steps_backend_class)."""

    base: type[Backend]
    timesteps = "block"  # (Backend.timesteps: what the panel, the controller and simulate ask)
    draws_within_steps = True  # step_parts: frames inside a max step

    @classmethod
    def why_not(cls) -> str | None:
        return cls.base.why_not()

    @classmethod
    def tree_kernel(cls) -> str:
        """The base backend's record in the role "block-steps" (tree, cpu-tree)."""
        return with_role(cls.base.kernels(), "block-steps").name

    @classmethod
    def kernels(cls) -> list[KernelRecord]:
        return [cls.base.record(cls.tree_kernel())]

    @classmethod
    def kernel_why_not(cls, name: str) -> str | None:
        if name != cls.tree_kernel():
            return (
                f"block time steps walk the tree ({cls.tree_kernel()}); shared time steps run {name} "
                "(--timesteps shared, or the panel's time steps)"
            )
        return cls.base.kernel_why_not(name)

    @classmethod
    def record(cls, name: str) -> KernelRecord:
        reason = cls.kernel_why_not(name) if name != cls.tree_kernel() else None
        if reason:
            raise ConfigError(f"kernel: {reason}")
        return cls.base.record(name)

    def __init__(self):
        self._ops = None
        self._sched: BlockSteps | None = None
        self._held: dict = {}  # what the base's block ops keep across loads (a GPU device)
        self._physics = Physics(timesteps="block")
        self._t0, self._steps = 0.0, 0
        self._mass = np.zeros(0)
        self._ids = None
        self._set: dict = {}  # tunables set on the tree record (validated), beside its defaults
        # a max step drawn in parts (step_parts): its substeps, the last one run, parts drawn of per_step
        self._flight: Iterator[Substep] | None = None
        self._at: Substep | None = None
        self._part, self._per_step = 0, 1
        self._gl = None  # the renderer's VBOs registered with the GPU's context (attach_gl_buffers)

    # --- state -----------------------------------------------------------------------------------
    def load(self, bodies: Bodies, physics: Physics, kernel: str | None = None) -> None:
        physics = self._checked(physics)
        self._drop_flight()
        self.record(kernel or self.tree_kernel())
        ops = self._make_ops(bodies, physics, self._set)
        saved = bodies.step_levels
        if saved is not None and (saved.levels.shape, saved.max_level, saved.dt_max, saved.coarsen) == (
            (bodies.n,),
            physics.block_levels,
            physics.dt,
            physics.block_coarsen,
        ):
            sched = self._scheduler(physics, saved.levels)
            sched.begin(ops, keep_levels=True)  # a(x) from x; the snapshot's levels kept
        else:
            sched = self._scheduler(physics)
            if saved is not None and physics.block_coarsen == "settled":
                log.warning(
                    "the snapshot's block-step levels were taken with dt %g, L = %d, rule %s; this "
                    "run has dt %g, L = %d, rule settled: its levels start from the criterion (not a "
                    "bitwise continuation)",
                    saved.dt_max,
                    saved.max_level,
                    saved.coarsen,
                    physics.dt,
                    physics.block_levels,
                )
        self._close_ops()
        self._ops, self._sched, self._physics = ops, sched, physics
        self._t0, self._steps = float(bodies.time), 0
        previous_n, self._mass = self.n, bodies.mass.astype(np.float64, copy=True)
        self._ids = None if bodies.ids is None else bodies.ids.copy()
        if self._gl is not None and self.n != previous_n:
            log.info("N = %d: CUDA-GL buffers detached until attach_gl_buffers is called again", self.n)
            self.detach_gl_buffers()
        self._publish()

    @staticmethod
    def _checked(physics: Physics) -> Physics:
        physics = check_physics(physics)
        if physics.timesteps != "block":
            raise ConfigError(
                "this backend steps block time steps; physics.timesteps is "
                f"{physics.timesteps!r} (the controller switches backends for shared steps)"
            )
        if physics.integrator != "leapfrog":
            raise ConfigError(
                "physics.integrator: block time steps are a leapfrog (kick-drift-kick) scheme; "
                "use --integrator leapfrog"
            )
        return physics

    def _make_ops(self, bodies: Bodies, physics: Physics, tunables: dict):
        # a copy (Backend.load's contract): the CPU twin's ops step their Bodies' arrays in place
        copy = Bodies.from_arrays(bodies.pos.copy(), bodies.vel.copy(), bodies.mass.copy(), time=bodies.time)
        return self.base.block_ops(copy, physics, tunables, self._held)

    @staticmethod
    def _scheduler(physics: Physics, levels=None) -> BlockSteps:
        """A scheduler whose first max step starts with a(x) of every body and the criterion's levels
        (`begin`), or a snapshot's `levels` (then begun with them kept): what the uninterrupted run has at
        the same boundary, bit for bit."""
        return BlockSteps(
            physics, physics.block_levels, physics.block_eta, levels=levels, coarsen=physics.block_coarsen
        )

    def _require(self):
        if self._ops is None:
            raise RuntimeError(f"{type(self).__name__}: call load() before stepping or reading the state")
        return self._ops, self._sched

    @property
    def kernel(self) -> str:
        return self.tree_kernel()

    def set_kernel(self, name: str) -> None:
        self.record(name)

    # --- tunables of the tree ------------------------------------------------------------------
    def tunables(self) -> dict:
        record = self.base.record(self.tree_kernel())
        return {**record.default_tunables(), **block_tunables(self._set)}  # what the steps run: cube, not rel

    def set_tunables(self, **values) -> None:
        record = self.base.record(self.tree_kernel())
        self._use_tunables({**self._set, **record.validate_tunables(values)})

    def clear_tunables(self) -> None:
        self._use_tunables({})

    def _use_tunables(self, values: dict) -> None:
        """From the next step: new ops over the current state, a(x) and the levels from the new tunables
        (the scheduler's begin). ConfigError, the old ones kept, for what breaks a(x) from x."""
        block_tunables(values)
        if self._ops is not None:
            ops = self._make_ops(self.state(), self._physics, values)
            self._close_ops()
            self._ops = ops
            assert self._sched is not None, "made with the ops by load"
            self._sched.ready = False
        self._set = values

    def set_physics(self, physics: Physics) -> None:
        """From the next step: new ops and scheduler from the current state (the levels from the
        criterion again: dt, L or η may have changed what they mean)."""
        physics = self._checked(physics)
        if self._ops is None:
            self._physics = physics
            return
        ops = self._make_ops(self.state(), physics, self._set)
        self._close_ops()
        self._swap_physics(physics)
        self._ops, self._sched = ops, self._scheduler(physics)

    @property
    def n(self) -> int:
        return int(self._mass.shape[0])

    def step(self, steps: int = 1) -> StepTimings:
        ops, sched = self._require()
        t0 = time.perf_counter()
        work = self._settle()
        work += sched.advance(ops, steps)
        ops.synchronize()
        self._steps += steps
        last = sched.last
        return self._timings(steps, t0, work, last.fraction, len(last.active))

    def step_parts(self, parts: int, per_step: int) -> StepTimings:
        """Advance by `parts` / `per_step` max steps (per_step >= 1: run.frames_per_step): the substeps
        that end by the next part's time run, the max step in flight kept between calls. The frame's
        positions are predicted to its time (host_render_arrays). A change of per_step first finishes the
        max step in flight."""
        ops, sched = self._require()
        parts, per_step = int(parts), int(per_step)
        if parts < 1 or per_step < 1:
            raise ValueError(f"step_parts({parts}, {per_step}): both must be >= 1")
        t0 = time.perf_counter()
        work = self._settle() if per_step != self._per_step else ForceWork()
        self._per_step = per_step
        end = 1 << sched.max_level
        steps = substeps = active = 0
        with ops_scope(ops):
            for _ in range(parts):
                self._part += 1
                if self._flight is None:
                    self._flight = sched.substeps(ops)
                    self._at = next(self._flight)  # the opening half-kicks
                assert self._at is not None, "a max step in flight has run a substep"
                # the substeps whose end tick s has s / end <= part / per_step (integers: exact)
                while self._at.t_next * per_step <= self._part * end and not self._at.done:
                    self._at = next(self._flight)
                    work += self._at.work
                    substeps += 1
                    active += self._at.active
                if self._at.done:
                    self._flight, self._at, self._part = None, None, 0
                    self._steps += 1
                    steps += 1
        ops.synchronize()
        fraction = active / (self.n * substeps) if substeps and self.n else 0.0
        return self._timings(steps, t0, work, fraction, substeps)

    def _timings(self, steps: int, t0: float, work: ForceWork, fraction: float, substeps: int) -> StepTimings:
        """The step's wall time (its force evaluations, drifts and kicks: all of it is the force method
        here), then the drawn rows written into the VBOs where they are attached (map and unmap timed)."""
        wall_ms = (time.perf_counter() - t0) * 1e3
        self._publish()
        gl = self._gl
        return StepTimings(
            kernel=self.kernel,
            steps=steps,
            n=self.n,
            force_ms=wall_ms,
            map_ms=gl.last_map_ms if gl else 0.0,
            unmap_ms=gl.last_unmap_ms if gl else 0.0,
            interactions=work.interactions,
            pair_equivalent=work.pair_equivalent,
            force_evals=work.evaluations,
            body_cell=work.body_cell,
            extra={"active_fraction": fraction, "substeps": float(substeps)},
        )

    def _settle(self) -> ForceWork:
        """Run the max step in flight (step_parts) to its end: the state is synchronised again."""
        work = ForceWork()
        if self._flight is None:
            return work
        ops, _ = self._require()
        assert self._at is not None, "a max step in flight has run a substep"
        with ops_scope(ops):
            while not self._at.done:
                self._at = next(self._flight)
                work += self._at.work
        self._flight, self._at, self._part = None, None, 0
        self._steps += 1
        log.debug("block steps: the max step drawn in parts ran to its end (t = %g)", self.time)
        return work

    def _drop_flight(self) -> None:
        """Forget a max step in flight (a load replaces the state it was advancing)."""
        self._flight, self._at, self._part = None, None, 0

    @property
    def synchronised(self) -> bool:
        return self._flight is None

    @property
    def time(self) -> float:
        """The drawn time: inside a max step drawn in parts, the last part's."""
        return super().time + self._part / self._per_step * self._physics.dt

    def _ahead(self) -> float:
        """How far the drawing is ahead of the state (time units): the last part's time minus the last
        substep's end."""
        if self._at is None:
            return 0.0
        assert self._sched is not None, "a max step in flight has its scheduler"
        end = 1 << self._sched.max_level
        return (self._part * end / self._per_step - self._at.t) * self._sched.dt_min

    def block_summary(self) -> str:
        """One line for a command's summary: the levels and the mean active fraction since the load."""
        _, sched = self._require()
        return (
            f"block steps L={sched.max_level} eta={sched.eta:g} coarsen={sched.coarsen}: "
            f"{100 * sched.total.fraction:.1f}% of the bodies active per substep"
        )

    def levels_histogram(self) -> np.ndarray:
        """Bodies per level (0..L), for the panel."""
        _, sched = self._require()
        return sched.histogram() if sched.levels is not None else np.zeros(sched.max_level + 1, np.int64)

    def accelerations(self) -> np.ndarray:
        ops, sched = self._require()
        self._settle()
        if not sched.ready:
            sched.begin(ops)
        return np.array(ops.host_acc(), dtype=np.float64)

    def force_error_sample(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The tree's a(x) of `rows` at the current positions against their all-pairs sum (the ops'
        force_error_sample); a(x) made first if no step has. Inside a max step drawn in parts, the rows'
        a(x) are evaluated at the positions of the last substep first: a body's a(x) is read only at the
        end of its own step, where it is evaluated again, so the trajectory does not change."""
        ops, sched = self._require()
        if self._flight is not None:
            with ops_scope(ops):
                ops.force_active(np.asarray(rows, dtype=np.int64))
        elif not sched.ready:
            sched.begin(ops)
        return ops.force_error_sample(rows)

    def tunable_specs(self):
        """The tree's tunables that block steps can change: not the refit cadence (a build every
        evaluation) nor the relative test's alpha (refused: a(x) must follow from x alone)."""
        return tuple(
            s
            for s in self.base.record(self.tree_kernel()).tunables
            if s.name not in ("rebuild_every", "rebuild_rule", "alpha")
        )

    def state(self) -> Bodies:
        """The synchronised state: a max step in flight (step_parts) is run to its end first."""
        ops, sched = self._require()
        self._settle()
        pos, vel = ops.host_state()
        bodies = Bodies.from_arrays(pos, vel, self._mass, time=self.time, ids=self._ids)
        bodies.components = self.components
        if sched.ready and sched.levels is not None:
            with ops_scope(ops):  # (the levels may be on the GPU: read with its context current)
                levels = sched.state().levels
            bodies.step_levels = StepLevels(levels, sched.max_level, sched.dt_max, sched.coarsen)
        return bodies

    @property
    def data_path(self) -> str:
        return INTEROP if self._gl is not None else HOST_UPLOAD

    def attach_gl_buffers(self, position_vbo: int, speed_vbo: int) -> bool:
        """On a GPU: the renderer's VBOs registered with the GPU's context (the GL context current), and
        filled on the device after every step (`_publish`: the drawn rows, x + v·ahead, made in place);
        False (the renderer uploads host_render_arrays) on the CPU, before a load, or where interop
        cannot work (one warning saying why)."""
        from app.backends.cuda.interop import fall_back, register_gl_buffers

        self.detach_gl_buffers()
        if self.base.memory != "device" or self._ops is None:  # interop needs the state on a GPU
            return False
        with self._ops.scope():
            gl, reason = register_gl_buffers(position_vbo, speed_vbo)
        if gl is None:
            assert reason is not None, "register_gl_buffers says why it registered nothing"
            return fall_back(reason)
        self._gl = gl
        try:
            self._publish()
        except Exception as e:  # a failing first write is reported here, not on a later frame
            self.detach_gl_buffers()
            return fall_back(str(e))
        log.info(
            "CUDA-GL interop active: block steps write GL buffers %d (positions) and %d (speeds)",
            int(position_vbo),
            int(speed_vbo),
        )
        return True

    def detach_gl_buffers(self) -> None:
        """The renderer is about to delete or resize its buffers."""
        if self._gl is not None:
            gl, self._gl = self._gl, None
            if self._ops is not None:
                with self._ops.scope():
                    gl.unregister()
            else:
                gl.unregister()

    def _publish(self) -> None:
        """The drawn rows into the attached VBOs (mapped only here; synchronised before the unmap)."""
        if self._gl is None or self._ops is None:
            return
        ops = self._ops
        with ops.scope(), self._gl.mapped_for(self.n) as mapped:
            ops.write_render_rows(mapped.pos, mapped.speed, self._ahead())
            ops.synchronize()

    def host_render_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        ops, _ = self._require()
        return ops.render_arrays(self._ahead())

    def _close_ops(self) -> None:
        self._drop_flight()
        self._ops = None

    def close(self) -> None:
        self.detach_gl_buffers()
        self._close_ops()
        for held in self._held.values():
            held.close()
        self._held.clear()
