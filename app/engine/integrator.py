"""The integrator, written once: the step sequence of every backend, device and precision.

    leapfrog (kick-drift-kick):   v += a dt/2;  x += v dt;  a = F(x);  v += a dt/2
    euler-damped (CUDA samples):  a = F(x);  v = (v + a dt) · damping;  x += v dt

A backend supplies `StateOps` for its arrays in one precision: the three element-wise updates (numba
on the CPU, kernels/integrate.cu or kernels/fp64.cu on the GPU, numpy for the float64 reference) and
`force()`, which evaluates a = F(x) through the force seam (app/engine/forces.py) and returns the work done.
The CPU's updates, the GPU's fp64 ones (kernels/fp64.cu) and the reference compute v + h·a and x + dt·v
with two roundings each (no fused multiply-add), so given the same accelerations they take
bitwise-identical steps (tests/test_integrator.py); the GPU's fp32 updates (kernels/integrate.cu) use
fmaf, one rounding each.

The float64 reference is this same integrator over `NumpyOps` (numpy updates on a `Bodies`): `integrate`
is what every kernel's trajectory is measured against.

The leapfrog needs a(x) at the start of a step; it is cached between steps and between `step()`
calls. Whether it is still valid is decided here and nowhere else: the owner of the state calls its
Stepper's `invalidate()` when anything it depends on changed (positions replaced, physics or kernel
changed).

`Stepper` is the one place that steps a state: it owns the one `Integrator` (its cached a(x)), counts
the steps, runs the non-finite check every `check_every` of them and sums the force work. One backend's
state (CPUBackend, CudaBackend), K devices of one process (MultiDeviceRun), one device of each MPI rank
(RankRun) and the float64 reference (`integrate`) all step through one; no other class makes an
Integrator (tests/test_integrator.py walks app/ to keep it so).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Protocol

import numpy as np

from app.engine.forces import ForceWork, Span, all_pairs_work
from app.model.bodies import Bodies
from app.model.config import INTEGRATORS
from app.model.physics import Physics, accelerations

# Steps between the devices' non-finite checks (one GPU, or each device of several; 0: never): a check is
# one small launch whose 4-byte answer the host reads without waiting, so a blow-up pauses the viewer
# within a few steps instead of drawing NaNs.
CHECK_EVERY = 8


class StateOps(Protocol):
    """One backend's state (positions, velocities, accelerations, speeds) in one precision."""

    def force(self) -> ForceWork:
        """acc = F(pos) for this state's targets and sources."""

    def kick_drift(self, half_dt: float, dt: float) -> None:
        """v += a·half_dt; x += v·dt."""

    def kick(self, half_dt: float) -> None:
        """v += a·half_dt; speed = |v| (for the renderer)."""

    def euler_damped(self, dt: float, damping: float) -> None:
        """v = (v + a·dt)·damping; x += v·dt; speed = |v|."""


class _NoTimer:
    def time(self, category: str):
        return nullcontext()


def _check_integrator(physics: Physics) -> None:
    if physics.integrator not in INTEGRATORS:
        choices = ", ".join(INTEGRATORS)
        raise ValueError(f"unknown integrator {physics.integrator!r}; choose from {choices}")


class Integrator:
    """Advances a StateOps by whole steps; owns the cached-acceleration bookkeeping. Made only by a
    `Stepper`, through which everything steps (the module docstring says why)."""

    def __init__(self):
        self.acc_valid = False

    def invalidate(self) -> None:
        """The cached a(x) no longer matches the state or the physics: the next step recomputes it."""
        self.acc_valid = False

    def ensure_acc(self, ops: StateOps, timer=None) -> ForceWork:
        """Make the state's a(x) current: one force evaluation, unless the cached one still is."""
        if self.acc_valid:
            return ForceWork()
        with (timer or _NoTimer()).time("force"):
            work = ops.force()
        self.acc_valid = True
        return work

    def step(self, ops: StateOps, physics: Physics, steps: int = 1, timer=None) -> ForceWork:
        """Advance `steps` steps; brackets force and update work with `timer.time(category)`."""
        _check_integrator(physics)
        timer = timer or _NoTimer()
        work = ForceWork()
        dt = physics.dt
        for _ in range(int(steps)):
            if physics.integrator == "leapfrog":
                work += self.ensure_acc(ops, timer)
                self.acc_valid = False  # until the closing force evaluation below succeeded
                with timer.time("integrate"):
                    ops.kick_drift(0.5 * dt, dt)
                with timer.time("force"):
                    work += ops.force()
                self.acc_valid = True
                with timer.time("integrate"):
                    ops.kick(0.5 * dt)
            else:
                self.acc_valid = False  # the update moves x away from the a(x) it used
                with timer.time("force"):
                    work += ops.force()
                with timer.time("integrate"):
                    ops.euler_damped(dt, physics.damping)
        return work


class Stepper:
    """The one owner of an Integrator, and so the one stepping loop: a single backend's state
    (CPUBackend, CudaBackend), K devices of one process (app/parallel/multidevice.py `MultiDeviceRun`), one
    device of each MPI rank (app/backends/distributed.py `RankRun`) and the float64 reference (`integrate`).

    It holds the cached a(x) (`acc_valid`, `invalidate`, `ensure_acc`), the steps taken (`steps`), and
    the cadence of the non-finite checks: `check()` runs after every `check_every`-th step counted
    (0: never), counted across `advance()` calls, so every owner's checks fall on the same steps."""

    def __init__(self):
        self.integrator = Integrator()
        self.steps = 0  # counted by advance(); restart() sets it (its owner decides when a count starts)

    # --- the cached a(x) ---------------------------------------------------------------------------------
    @property
    def acc_valid(self) -> bool:
        """Whether the state's acceleration buffer holds a(x) of its current positions."""
        return self.integrator.acc_valid

    @acc_valid.setter
    def acc_valid(self, valid: bool) -> None:
        # for an owner that evaluated a(x) of the current state into that buffer itself (a backend's
        # `accelerations()`), or knows it from elsewhere (`integrate(acc=...)`)
        self.integrator.acc_valid = bool(valid)

    def invalidate(self) -> None:
        """The cached a(x) no longer matches the state or the physics: the next step recomputes it."""
        self.integrator.invalidate()

    def ensure_acc(self, ops: StateOps, timer=None) -> ForceWork:
        """Make the state's a(x) current: one force evaluation, unless the cached one still is."""
        return self.integrator.ensure_acc(ops, timer)

    # --- stepping -----------------------------------------------------------------------------------------
    def restart(self, steps: int = 0) -> None:
        """A new state: its a(x) is not known; `steps` already taken."""
        self.integrator.invalidate()
        self.steps = int(steps)

    def advance(
        self, ops: StateOps, physics: Physics, steps: int, check_every: int = 0, check=None, timer=None
    ) -> ForceWork:
        """`steps` steps, `check()` after each that completes a `check_every` block; returns the force
        work of the steps summed. With a `timer`, force and update work are bracketed by
        `timer.time("force")` / `timer.time("integrate")`. An exception leaves the cached a(x) invalid (a
        half-done step is not a state to start from) and `steps` counting the whole steps taken."""
        _check_integrator(physics)
        work = ForceWork()
        try:
            for _ in range(int(steps)):
                work += self.integrator.step(ops, physics, 1, timer)
                self.steps += 1
                if check_every and self.steps % check_every == 0:
                    check()
        except BaseException:
            self.integrator.invalidate()
            raise
        return work


# --- the float64 reference -------------------------------------------------------------------------------
class NumpyOps:
    """The float64 reference's StateOps: numpy updates on a `Bodies`, forces from
    `accel_fn(pos, mass, physics)` (app.model.physics.accelerations unless given). Its clock is the state's:
    each drift advances `bodies.time` by dt. No speed array: nothing renders the reference."""

    def __init__(self, bodies: Bodies, physics: Physics, accel_fn=None, acc: np.ndarray | None = None):
        self.bodies = bodies
        self.physics = physics
        self.accel_fn = accel_fn or accelerations
        self.acc = acc

    def force(self) -> ForceWork:
        b = self.bodies
        self.acc = self.accel_fn(b.pos, b.mass, self.physics)
        everyone = Span.all(b.n)
        return all_pairs_work(everyone, everyone)

    def _forces(self) -> np.ndarray:
        assert self.acc is not None, "the Integrator evaluates the forces before any kick"
        return self.acc

    def kick_drift(self, half_dt: float, dt: float) -> None:
        b = self.bodies
        b.vel += half_dt * self._forces()
        b.pos += dt * b.vel
        b.time += dt

    def kick(self, half_dt: float) -> None:
        self.bodies.vel += half_dt * self._forces()

    def euler_damped(self, dt: float, damping: float) -> None:
        b = self.bodies
        b.vel += dt * self._forces()
        b.vel *= damping
        b.pos += dt * b.vel
        b.time += dt


def integrate(bodies: Bodies, physics: Physics, steps: int, accel_fn=None, acc: np.ndarray | None = None):
    """Advance `bodies` in place by `steps` steps in float64; returns the last accelerations evaluated
    (for the leapfrog a(x) at the final positions; `acc` when no step evaluated any).

    `accel_fn(pos, mass, physics)` defaults to the chunked numpy `accelerations`; passing `acc` (the
    accelerations at the current positions) saves the leapfrog's first force evaluation.
    """
    ops = NumpyOps(bodies, physics, accel_fn, acc)
    stepper = Stepper()
    stepper.acc_valid = acc is not None
    stepper.advance(ops, physics, steps)  # no non-finite checks: the caller reads the float64 state itself
    return ops.acc
