"""The `cpu` backend: numba-parallel kernels on a host-resident state, stepped by app.engine.integrator.

State: contiguous (N, 4) pos [x, y, z, m], (N, 4) vel [vx, vy, vz, 0] and (N, 4) acc in the precision of
the kernel that last stepped them (float32 for `cpu-simd`, float64 for `cpu-fp64`), plus a float32 (N,)
speed array that the update kernels keep current for the renderer. The state is stepped through a
`Stepper` (app/engine/integrator.py), as every state is; whether acc still holds a(x) is its business
(`Stepper.acc_valid`): the backend only calls `invalidate()` when the positions, the physics, the
kernel or its tunables change.

The records, their evaluators and the updates (`CpuOps`) are cpu_forces.py's, shared with the CPU
"devices" of `--gpus K` (cpu_multi.py, the backend's `device_kind`).

`set_kernel` only records the choice: the state is converted to the new kernel's precision at the next
`step`, so switching leaves it bitwise untouched until then.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING

import numpy as np

from app.backends.base import (
    REFERENCE_ROWS,
    Backend,
    KernelRecord,
    StepTimings,
    TunablesPerKernel,
    check_physics,
)
from app.backends.cpu_forces import (
    DEFAULT_KERNEL,
    RECORDS,
    CpuEvaluator,
    CpuOps,
    announce_compiling,
    cpu_name,
    exact_rows,
    first_nonfinite,
)
from app.backends.cpu_multi import CpuDevices
from app.core.errors import NonFiniteState
from app.engine.clocks import HostTimer
from app.engine.forces import Span, target_chunks, with_role
from app.engine.integrator import Stepper
from app.engine.timing import stage_entries
from app.model.bodies import Bodies, speeds
from app.model.physics import Physics

if TYPE_CHECKING:
    from app.backends.cpu_forces import CpuPairsEvaluator
    from app.backends.cpu_tree import CpuTreeEvaluator

    # what the CPU records' policies make: each holds its numba force kernel (`kernel`) and its `dtype`
    HostEvaluator = CpuEvaluator | CpuPairsEvaluator | CpuTreeEvaluator

log = logging.getLogger(__name__)


# --- the backend -----------------------------------------------------------------------------------------
class CPUBackend(TunablesPerKernel, Backend):
    name = "cpu"
    default_kernel = DEFAULT_KERNEL
    uses_all_cores = True  # numba prange over every core

    @classmethod
    def block_ops(cls, bodies: Bodies, physics: Physics, tunables: dict, held: dict):
        """The cpu-tree twin's block-step ops (on `bodies`' own arrays, in place)."""
        from app.backends.blocksteps_ops import TreeBlockOps

        return TreeBlockOps(bodies, physics, tunables)

    @classmethod
    def device_kind(cls):
        """CPU "devices" over this backend's records (`--gpus K`, MPI ranks: cpu_multi.py)."""
        return CpuDevices(cls.record, cls.default_kernel)

    def device_info(self) -> dict:
        return {"name": cpu_name(), "cores": os.cpu_count(), "backend": self.name}

    def reference_rows(self, stacked: np.ndarray, k: int, physics: Physics, progress) -> np.ndarray:
        record = with_role(RECORDS, "reference")  # cpu-fp64: numba, parallel over the targets
        evaluator = record.policy.evaluator(record, physics)
        acc = np.zeros((k, 3))
        sources = Span(k, stacked.shape[0] - k)
        for targets in target_chunks(k, REFERENCE_ROWS):
            evaluator.evaluate(stacked, acc, targets, sources)
            progress(targets.count)
        return acc

    _warm: set = set()  # (record, force kernel) combinations already compiled / loaded in this process

    def __init__(self):
        self._kernel = self.default_kernel
        self._physics = Physics()
        # the state in the kernel's precision, (N, 4) rows: positions with the mass, velocities, a(x)
        self._pos: np.ndarray | None = None
        self._vel: np.ndarray | None = None
        self._acc: np.ndarray | None = None
        self._speed = np.zeros(0, np.float32)
        self._render_pos: np.ndarray | None = None
        self._kept_evaluator = None
        self._mass = np.zeros(0)
        self._ids = None
        self._t0 = 0.0  # time at the last change of dt ...
        self._steps = 0  # ... plus steps taken since, times dt
        self._stepper = Stepper()  # the integrator's cached a(x), stepping (app/engine/integrator.py)
        self._timer = HostTimer()

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
        return list(RECORDS)  # (a subclass with kernels of its own overrides this)

    @classmethod
    def kernel_why_not(cls, name: str) -> str | None:
        names = [r.name for r in cls.kernels()]
        if name not in names:
            return f"{name!r} is not a {cls.name} kernel (choose from {', '.join(names)})"
        return cls.why_not()

    # --- state -----------------------------------------------------------------------------------
    def load(self, bodies: Bodies, physics: Physics, kernel: str | None = None) -> None:
        self._physics = check_physics(physics)
        self._kernel = self._resolve(kernel)
        self._pos, self._vel = bodies.pos4(self._dtype), bodies.vel4(self._dtype)
        self._acc = np.zeros_like(self._pos)
        self._mass = bodies.mass.copy()
        self._ids = None if bodies.ids is None else bodies.ids.copy()
        self._speed = speeds(self._vel)
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

    # --- tunables (kept per kernel by TunablesPerKernel; evaluator() hands them on) -------------------
    def _tunables_changed(self) -> None:
        self._stepper.invalidate()

    # --- stepping --------------------------------------------------------------------------------
    @property
    def _dtype(self):
        return self.record(self._kernel).policy.dtype

    def _resolve(self, name: str | None) -> str:
        return self.record(name or self.default_kernel).name  # (ConfigError naming this backend's kernels)

    def _state(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(pos, vel, acc) of the loaded state; RuntimeError before load()."""
        if self._pos is None or self._vel is None or self._acc is None:
            raise RuntimeError("CPUBackend: call load() before stepping or reading the state")
        return self._pos, self._vel, self._acc

    def evaluator(self, name: str | None = None) -> HostEvaluator:
        """A record (default: the current kernel) with the current physics and the tunables set for it
        (cheap: the compiled kernel is looked up, not rebuilt). The same object while the state, kernel,
        force parameters and tunables stay: an evaluator may carry work from one step() call to the next
        (the tree's refit, rebuild_every), as the devices' evaluators of the multi-device run do."""
        record = self.record(name or self._kernel)
        tunables = self._tunable_store().get(record.name, {})
        # the force parameters, not dt or the integrator: those keep the evaluator
        key = (record.name, self._physics.forces, tuple(sorted(tunables.items())))
        kept = self._kept_evaluator
        if kept is not None and kept[0] == key:
            return kept[1]
        evaluator = record.policy.evaluator(record, self._physics)
        evaluator.set_tunables(**tunables)
        self._kept_evaluator = (key, evaluator)
        return evaluator

    def _ops(self, evaluator: HostEvaluator) -> CpuOps:
        pos, vel, acc = self._state()
        return CpuOps(evaluator, pos, vel, acc, self._speed)

    def _positions_in(self, dtype) -> np.ndarray:
        """The positions in `dtype`, masses from the float64 originals rather than a rounded copy."""
        pos = self._state()[0].astype(dtype)
        pos[:, 3] = self._mass
        return pos

    def positions(self, dtype) -> np.ndarray:
        """A copy of the current (N, 4) positions in `dtype` with the float64 masses (A/B's other kernel
        and the exact sum evaluate on it: app/backends/cpu_compare.py)."""
        return self._positions_in(dtype)

    def compare_ops(self):
        """A/B's other kernel and the error colours on host arrays beside the state (cpu_compare.py)."""
        from app.backends.cpu_compare import CpuCompare

        return CpuCompare(self)

    def _to_kernel_precision(self) -> None:
        dtype = self._dtype
        pos, vel, _ = self._state()
        if pos.dtype != dtype:
            self._pos = self._positions_in(dtype)
            self._vel = vel.astype(dtype)
            self._acc = np.zeros_like(self._pos)
            self._render_pos = None
            self._stepper.invalidate()

    def _warm_up(self, evaluator: HostEvaluator) -> None:
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
        with announce_compiling((evaluator.kernel, k.kick_drift, k.kick, k.euler_damped)):
            ops.force()
            ops.kick_drift(0.0, 0.0)
            ops.kick(0.0)
            ops.euler_damped(0.0, 1.0)
        CPUBackend._warm.add(key)
        log.debug("CPU kernels %s ready in %.2f s", key, time.perf_counter() - t)

    def step(self, steps: int = 1) -> StepTimings:
        if steps < 0:
            raise ValueError(f"steps must be >= 0, not {steps}")
        self._state()  # (RuntimeError before load())
        self._check_finite()  # before: one bad body contaminates every force within a single step
        self._to_kernel_precision()
        evaluator = self.evaluator()
        self._warm_up(evaluator)
        evaluator.stage_ms()  # (the warm-up's stages are not this step's)
        self._timer.reset()
        # No checks from the stepper (check_every = 0): the host checks the whole state once per call,
        # before the first step (a bad body spoils every force of the step) and after the last, and a
        # pass over host arrays costs far less than a step, so there is no cadence to keep.
        work = self._stepper.advance(
            self._ops(evaluator), self._physics, steps, check_every=0, timer=self._timer
        )
        ms = self._timer.collect()
        self._steps += steps
        self._check_finite()
        return StepTimings(
            kernel=self._kernel,
            steps=steps,
            n=self.n,
            force_ms=ms.get("force", 0.0),
            integrate_ms=ms.get("integrate", 0.0),
            interactions=work.interactions,
            pair_equivalent=work.pair_equivalent,
            force_evals=work.evaluations,
            body_cell=work.body_cell,
            extra=stage_entries(evaluator.stage_ms()),
        )

    def _check_finite(self) -> None:
        """The GPU's guard on the host: a blown-up state pauses the viewer instead of drawing NaNs.
        One vectorised pass per step() call (about 0.1 ms at N = 65k), not per step."""
        pos, vel, _ = self._state()
        bad = first_nonfinite(pos, vel)
        if bad >= 0:
            raise NonFiniteState(bad, step=self._steps, time=self.time)

    def accelerations(self) -> np.ndarray:
        return self._current_acc()[:, :3].astype(np.float64)

    def _current_acc(self) -> np.ndarray:
        """a(x) of the current state by the current kernel, (N, 4) in its dtype: the stepper's cached
        one (computed now, and cached, if not valid), or after a switch to a kernel of another precision
        not stepped yet, evaluated on a converted copy with the state untouched."""
        pos, _, acc = self._state()
        evaluator = self.evaluator()
        if pos.dtype == evaluator.dtype:  # a(x) of the state: the cached one, or cached from now on
            self._stepper.ensure_acc(self._ops(evaluator))
            return acc
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
        pos = self._state()[0]
        pos = pos if pos.dtype == self._dtype else self._positions_in(self._dtype)
        return approx, exact_rows(pos, rows, self._physics)

    def state(self) -> Bodies:
        pos, vel, _ = self._state()
        return Bodies(
            pos=pos[:, :3].astype(np.float64),
            vel=vel[:, :3].astype(np.float64),
            mass=self._mass.copy(),
            time=self.time,
            ids=None if self._ids is None else self._ids.copy(),
            components=self.components,
        )

    # --- rendering -------------------------------------------------------------------------------
    def host_render_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The live float32 (N, 4) positions and (N,) speeds: no copy on the fp32 path, so they are
        overwritten by the next `step` and must be treated as read-only."""
        pos = self._state()[0]
        if pos.dtype == np.float32:
            return pos, self._speed
        if self._render_pos is None:
            self._render_pos = np.empty(pos.shape, np.float32)
        np.copyto(self._render_pos, pos, casting="same_kind")
        return self._render_pos, self._speed

    def close(self) -> None:
        self._pos = self._vel = self._acc = self._render_pos = None


BACKEND = CPUBackend
