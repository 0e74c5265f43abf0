"""The integrator written once (app/engine/integrator.py).

1. Given the same accelerations, every fp64 StateOps takes bitwise the steps of the float64 reference
   (`NumpyOps`): the element-wise updates must round v + h·a and x + dt·v the same way everywhere (two
   roundings each, no fused multiply-add). The accelerations are injected, so that the force kernels'
   own (legitimately different) summation orders stay out of it.
2. The cached-acceleration bookkeeping: one force evaluation per leapfrog step after the first,
   `invalidate()` forces a recompute, euler-damped evaluates once per step.
3. `integrate`, the reference stepping, and the import direction (app.model.physics never imports the
integrator). 4. `Stepper`, the one owner of an Integrator: the checks' cadence, the timer, the summed work, a
failure
   leaving a(x) invalid, and no other code under app/ making an Integrator.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import app
from app.backends.cpu import CPUBackend
from app.backends.cpu_forces import CpuOps
from app.engine.clocks import HostTimer
from app.engine.forces import ForceEvaluator, ForceWork, Span, all_pairs_work
from app.engine.integrator import Integrator, NumpyOps, Stepper, integrate
from app.model.bodies import Bodies
from app.model.physics import Physics, accelerations

N = 257  # a multiple of nothing a vector unit or a thread block would care about
STEPS = 7
PHYSICS = {
    "leapfrog": Physics(dt=3.1e-3, integrator="leapfrog"),
    "euler-damped": Physics(dt=3.1e-3, integrator="euler-damped", damping=0.97),
}


def cloud(n: int = N, seed: int = 5) -> Bodies:
    rng = np.random.default_rng(seed)
    return Bodies.from_arrays(
        rng.normal(size=(n, 3)), rng.normal(scale=0.7, size=(n, 3)), rng.uniform(0.5, 1.5, n) / n
    )


# --- injected accelerations: float64 numpy, the same bits whoever asks ---------------------------------
FIXED = np.random.default_rng(9).normal(size=(N, 3))


def fixed_acc(pos, mass, physics):
    return FIXED.copy()


def acc_of_positions(pos, mass, physics):
    """Not a physical force, just a rule of the positions in correctly rounded operations only (no
    transcendental whose SIMD and scalar paths might differ), so each step feeds on the previous one."""
    x, y, z = pos[:, 0], pos[:, 1], pos[:, 2]
    r2 = x * x + y * y + z * z
    return -pos * (1.0 / (r2 + 0.3))[:, None] + 0.01 * np.roll(pos, 1, axis=0)


ACCELERATIONS = [pytest.param(fixed_acc, id="fixed"), pytest.param(acc_of_positions, id="of-positions")]


class InjectedEvaluator(ForceEvaluator):
    """A ForceEvaluator that writes `accel_fn`'s float64 accelerations (all targets on all sources)."""

    def __init__(self, accel_fn, mass, physics):
        super().__init__(CPUBackend.record("cpu-fp64"))
        self.accel_fn, self.mass, self.physics = accel_fn, mass, physics

    def evaluate(self, pos, acc, targets, sources, stream=None) -> ForceWork:
        assert targets == sources == Span.all(pos.shape[0])
        acc[:, :3] = self.accel_fn(np.ascontiguousarray(pos[:, :3]), self.mass, self.physics)
        return all_pairs_work(targets, sources)


# --- the StateOps under test ------------------------------------------------------------------------------
@dataclass
class Harness:
    ops: object  # an app.engine.integrator.StateOps
    read: Callable[[], tuple[np.ndarray, np.ndarray]]  # float64 host copies (pos (N, 3), vel (N, 3))


def numpy_ops(bodies: Bodies, physics: Physics, accel_fn) -> Harness:
    """The reference."""
    ops = NumpyOps(bodies, physics, accel_fn)
    return Harness(ops, lambda: (bodies.pos.copy(), bodies.vel.copy()))


def cpu_fp64_ops(bodies: Bodies, physics: Physics, accel_fn) -> Harness:
    """The cpu backend's numba updates on its (N, 4) float64 arrays."""
    pos, vel = bodies.pos4(np.float64), bodies.vel4(np.float64)
    ops = CpuOps(
        InjectedEvaluator(accel_fn, bodies.mass, physics),
        pos,
        vel,
        np.zeros_like(pos),
        np.zeros(bodies.n, np.float32),
    )
    return Harness(ops, lambda: (pos[:, :3].copy(), vel[:, :3].copy()))


class _InScope:
    """Calls a StateOps with a CUDA device's context pushed (a backend holds it around its steps)."""

    def __init__(self, ops, scope):
        self._ops, self._scope = ops, scope

    def __getattr__(self, name):
        method = getattr(self._ops, name)

        def call(*args):
            with self._scope:
                return method(*args)

        return call


_DEVICE = []


def cuda_fp64_ops(bodies: Bodies, physics: Physics, accel_fn) -> Harness:
    """The cuda backend's fp64 updates (kernels/fp64.cu) on device dvec4 arrays; force() uploads the
    injected accelerations into acc64, read() copies the double state back."""
    from app.backends.cuda.device import CudaDevice  # (a gpu-marked case: conftest skips it without CUDA)
    from app.backends.cuda.state_ops import Fp64Ops

    if not _DEVICE:
        _DEVICE.append(CudaDevice(0))
    dev, n = _DEVICE[0], bodies.n
    pos64, vel64, acc64 = (dev.scratch(f"test-{k}", 32 * n) for k in ("pos64", "vel64", "acc64"))
    pos, vel = (dev.scratch(f"test-{k}", 16 * n) for k in ("pos", "vel"))
    speed = dev.scratch("test-speed", 4 * n)

    def read():
        p, v = np.empty((n, 4)), np.empty((n, 4))
        with dev.scope:
            dev.drv.memcpy_dtoh(p, pos64)
            dev.drv.memcpy_dtoh(v, vel64)
        return p[:, :3].copy(), v[:, :3].copy()

    def force() -> ForceWork:
        a = np.zeros((n, 4))
        a[:, :3] = accel_fn(read()[0], bodies.mass, physics)
        dev.drv.memcpy_htod(acc64, a)
        return all_pairs_work(Span.all(n), Span.all(n))

    with dev.scope:
        dev.drv.memcpy_htod(pos64, bodies.pos4(np.float64))
        dev.drv.memcpy_htod(vel64, bodies.vel4(np.float64))
        ops = Fp64Ops(dev, force, n, pos64, vel64, acc64, pos, vel, speed)
    return Harness(_InScope(ops, dev.scope), read)


# Every fp64 StateOps that must step bitwise like the reference: factory(bodies, physics, accel_fn) ->
# Harness, its force() writing accel_fn's result and its read() copying the state back as float64.
OPS_FACTORIES = [
    pytest.param(cpu_fp64_ops, id="cpu-fp64"),
    pytest.param(cuda_fp64_ops, id="cuda-fp64", marks=pytest.mark.gpu),
]


@pytest.mark.parametrize("integrator", list(PHYSICS))
@pytest.mark.parametrize("accel_fn", ACCELERATIONS)
@pytest.mark.parametrize("factory", OPS_FACTORIES)
def test_fp64_ops_step_bitwise_like_the_reference(factory, accel_fn, integrator):
    physics = PHYSICS[integrator]
    start = cloud()
    ref, got = numpy_ops(start.copy(), physics, accel_fn), factory(start.copy(), physics, accel_fn)
    ref_int, got_int = Integrator(), Integrator()
    for step in range(STEPS):  # one at a time, so that a mismatch names its step
        ref_int.step(ref.ops, physics)
        got_int.step(got.ops, physics)
        (ref_pos, ref_vel), (pos, vel) = ref.read(), got.read()
        assert np.array_equal(vel, ref_vel), f"velocities differ after step {step + 1}"
        assert np.array_equal(pos, ref_pos), f"positions differ after step {step + 1}"
    assert not np.array_equal(ref.read()[0], start.pos)  # it moved


# --- the cached acceleration -------------------------------------------------------------------------------
class Recorder:
    """A StateOps that only writes down what it was asked to do."""

    def __init__(self, fail_on_force: int | None = None):
        self.calls: list[str] = []
        self._fail_on_force = fail_on_force

    def force(self) -> ForceWork:
        self.calls.append("force")
        if self.calls.count("force") == self._fail_on_force:
            raise RuntimeError("force evaluation failed")
        return ForceWork(interactions=10, pair_equivalent=12, evaluations=1)

    def kick_drift(self, half_dt, dt):
        self.calls.append("kick_drift")

    def kick(self, half_dt):
        self.calls.append("kick")

    def euler_damped(self, dt, damping):
        self.calls.append("euler_damped")


LEAPFROG, EULER = PHYSICS["leapfrog"], PHYSICS["euler-damped"]


def test_leapfrog_evaluates_once_per_step_after_the_first():
    ops, integrator = Recorder(), Integrator()
    work = integrator.step(ops, LEAPFROG, 3)
    assert ops.calls == ["force"] + ["kick_drift", "force", "kick"] * 3
    assert work == ForceWork(interactions=40, pair_equivalent=48, evaluations=4)  # summed as counted
    assert integrator.acc_valid
    ops.calls.clear()
    assert integrator.step(ops, LEAPFROG, 2).evaluations == 2  # across step() calls too
    assert ops.calls == ["kick_drift", "force", "kick"] * 2


def test_invalidate_forces_a_recompute():
    ops, integrator = Recorder(), Integrator()
    integrator.step(ops, LEAPFROG)
    integrator.invalidate()
    assert not integrator.acc_valid
    assert integrator.step(ops, LEAPFROG).evaluations == 2


def test_ensure_acc_evaluates_only_when_stale():
    ops, integrator = Recorder(), Integrator()
    assert integrator.ensure_acc(ops).evaluations == 1 and integrator.acc_valid
    assert integrator.ensure_acc(ops) == ForceWork()
    assert integrator.step(ops, LEAPFROG).evaluations == 1  # the leapfrog uses what ensure_acc left


def test_euler_damped_evaluates_once_per_step():
    ops, integrator = Recorder(), Integrator()
    integrator.ensure_acc(ops)  # a valid a(x) is of no use to it: it evaluates at the start of each step
    ops.calls.clear()
    assert integrator.step(ops, EULER, 3).evaluations == 3
    assert ops.calls == ["force", "euler_damped"] * 3
    assert not integrator.acc_valid  # a(x) of the positions before the last update
    assert integrator.step(ops, LEAPFROG).evaluations == 2


def test_a_failed_force_evaluation_leaves_the_cache_invalid():
    ops, integrator = Recorder(fail_on_force=2), Integrator()
    with pytest.raises(RuntimeError):
        integrator.step(ops, LEAPFROG)  # the closing evaluation, after positions moved
    assert not integrator.acc_valid


def test_timer_brackets_force_and_update_work():
    timer = HostTimer()
    Integrator().step(Recorder(), LEAPFROG, 2, timer)
    assert set(timer.collect()) == {"force", "integrate"}


def test_unknown_integrator_is_rejected():
    with pytest.raises(ValueError, match="rk4"):
        Integrator().step(Recorder(), Physics(integrator="rk4"), 0)


# --- integrate: the reference stepping -------------------------------------------------------------------
def test_integrate_counts_and_returns_like_the_reference_did():
    b = cloud(40)
    calls = []

    def counting(pos, mass, physics):
        calls.append(1)
        return accelerations(pos, mass, physics)

    a = integrate(b, LEAPFROG, 5, accel_fn=counting)
    assert len(calls) == 6  # a(x0), then one per step
    assert np.array_equal(a, accelerations(b.pos, b.mass, LEAPFROG))  # a(x) at the final positions
    assert b.time == pytest.approx(5 * LEAPFROG.dt, rel=1e-14)
    calls.clear()
    a = integrate(b, LEAPFROG, 3, accel_fn=counting, acc=a)  # the cached a(x) saves the first evaluation
    assert len(calls) == 3
    calls.clear()
    integrate(b, EULER, 4, accel_fn=counting, acc=a)  # euler-damped has no use for it
    assert len(calls) == 4
    assert b.time == pytest.approx(12 * LEAPFROG.dt, rel=1e-14)


def test_physics_does_not_import_the_integrator():
    code = "import sys, app.model.physics; sys.exit('app.engine.integrator' in sys.modules)"
    env = {**os.environ, "PYTHONPATH": str(Path(app.__file__).resolve().parents[1])}
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == 0


# --- the stepping loop of runs over devices --------------------------------------------------------------
def test_stepper_checks_every_kth_step_counted_across_calls_and_restarts():
    """MultiDeviceRun and RankRun step through one Stepper: a check after every check_every-th step,
    counted across advance() calls (so calls of 3 steps still check at 8, 16, ...), none with 0, the count
    kept or reset by restart(), and an exception leaving the cached a(x) invalid."""

    class Ops:
        def __init__(self, fail_at=None):
            self.forces, self.fail_at = 0, fail_at

        def force(self):
            self.forces += 1
            if self.forces == self.fail_at:
                raise RuntimeError("device lost")
            return ForceWork()

        def kick_drift(self, half_dt, dt):
            pass

        def kick(self, half_dt):
            pass

    stepper, checked = Stepper(), []
    ops, physics = Ops(), Physics(dt=1e-3)
    for _ in range(6):
        stepper.advance(ops, physics, 3, 8, lambda: checked.append(stepper.steps))
    assert checked == [8, 16] and stepper.steps == 18 and stepper.integrator.acc_valid
    assert ops.forces == 19  # the first step's a(x), then one a step
    stepper.advance(ops, physics, 5, 0, lambda: checked.append(-1))
    assert checked == [8, 16]
    stepper.restart(steps=7)
    assert stepper.steps == 7 and not stepper.integrator.acc_valid
    stepper.advance(ops, physics, 1, 8, lambda: checked.append(stepper.steps))
    assert checked == [8, 16, 8]
    broken = Ops(fail_at=3)
    with pytest.raises(RuntimeError, match="device lost"):
        stepper.advance(broken, physics, 4, 8, lambda: None)
    assert not stepper.integrator.acc_valid


def test_stepper_sums_the_work_and_brackets_each_launch_with_the_timer():
    """The backends time force and update work through the stepper: every force evaluation inside
    timer.time("force"), every update inside timer.time("integrate"), the work summed over the steps."""

    class BracketTimer(HostTimer):
        def __init__(self):
            super().__init__()
            self.brackets: list[str] = []

        def time(self, category):
            self.brackets.append(category)
            return super().time(category)

    ops, stepper, timer = Recorder(), Stepper(), BracketTimer()
    work = stepper.advance(ops, LEAPFROG, 2, timer=timer)
    assert work == ForceWork(interactions=30, pair_equivalent=36, evaluations=3)
    assert timer.brackets == ["force"] + ["integrate", "force", "integrate"] * 2
    assert set(timer.collect()) == {"force", "integrate"}
    timer.brackets.clear()
    assert stepper.advance(ops, EULER, 2, timer=timer).evaluations == 2
    assert timer.brackets == ["force", "integrate"] * 2
    assert stepper.advance(ops, LEAPFROG, 0, timer=timer) == ForceWork() and stepper.steps == 4


def test_stepper_checks_on_the_same_steps_however_the_calls_are_cut():
    """The cadence belongs to the steps, not to the calls: any cut of 40 steps into advance() calls checks
    after steps 8, 16, 24, 32, 40, and check_every = 0 (the default) never checks."""
    for cuts in ([40], [1] * 40, [3, 5, 7, 9, 16], [8, 8, 8, 8, 8], [0, 7, 1, 0, 32]):
        stepper, checked = Stepper(), []
        for steps in cuts:
            stepper.advance(Recorder(), LEAPFROG, steps, 8, lambda s=stepper, c=checked: c.append(s.steps))
        assert checked == [8, 16, 24, 32, 40], cuts
    stepper = Stepper()
    stepper.advance(Recorder(), LEAPFROG, 20)
    assert stepper.steps == 20


@pytest.mark.parametrize("fails_in", ["force", "kick", "euler_damped", "check"])
def test_a_failure_mid_step_leaves_a_of_x_invalid(fails_in):
    """Whatever raises inside a step (a launch, an update after the closing force evaluation had made
    a(x) valid, the check), the stepper's a(x) is invalid afterwards and its count is the whole steps
    taken; the next step evaluates a(x) again."""

    class Failing(Recorder):
        def __init__(self):
            super().__init__()
            self.armed = True

        def _maybe_fail(self, name):
            self.calls.append(name)
            if self.armed and name == fails_in and self.calls.count(name) == 2:
                raise RuntimeError(f"{name} failed")

        def force(self):
            self._maybe_fail("force")
            return ForceWork(evaluations=1)

        def kick(self, half_dt):
            self._maybe_fail("kick")

        def euler_damped(self, dt, damping):
            self._maybe_fail("euler_damped")

    physics = EULER if fails_in == "euler_damped" else LEAPFROG
    ops, stepper = Failing(), Stepper()
    with pytest.raises(RuntimeError, match="failed"):
        stepper.advance(ops, physics, 5, 1, lambda: ops._maybe_fail("check"))
    assert not stepper.acc_valid
    assert stepper.steps == {"force": 0, "kick": 1, "euler_damped": 1, "check": 2}[fails_in]
    ops.armed = False
    ops.calls.clear()
    assert stepper.advance(ops, LEAPFROG, 1).evaluations == 2  # a(x) of the current state, then the step
    assert ops.calls[:2] == ["force", "kick_drift"]


def test_stepper_owns_the_cached_acceleration():
    ops, stepper = Recorder(), Stepper()
    assert not stepper.acc_valid
    assert stepper.ensure_acc(ops).evaluations == 1 and stepper.acc_valid
    assert stepper.ensure_acc(ops) == ForceWork()
    stepper.invalidate()
    assert not stepper.acc_valid and stepper.ensure_acc(ops).evaluations == 1
    stepper.acc_valid = False  # what an owner says after evaluating a(x) itself, or the opposite
    assert stepper.advance(ops, LEAPFROG, 1).evaluations == 2
    stepper.acc_valid = True
    assert stepper.advance(ops, LEAPFROG, 1).evaluations == 1
    stepper.restart(steps=3)
    assert not stepper.acc_valid and stepper.steps == 3


def test_stepper_rejects_an_unknown_integrator_before_any_step():
    ops = Recorder()
    with pytest.raises(ValueError, match="rk4"):
        Stepper().advance(ops, Physics(integrator="rk4"), 0)
    assert ops.calls == []


def integrator_constructions(root: Path) -> list[tuple[str, str]]:
    """(file under root, enclosing class or '<module>') of every call that makes an Integrator in the
    sources under `root`, read with ast (comments and strings do not count): `Integrator(...)`, an
    alias of it imported from app.engine.integrator, or `<module>.Integrator(...)`."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        names = {"Integrator"} | {
            alias.asname
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
            if alias.name == "Integrator" and alias.asname
        }

        def visit(node, owner, names=names, path=path):
            if isinstance(node, ast.ClassDef):
                owner = node.name
            if isinstance(node, ast.Call):
                func = node.func
                if (isinstance(func, ast.Name) and func.id in names) or (
                    isinstance(func, ast.Attribute) and func.attr == "Integrator"
                ):
                    found.append((path.relative_to(root.parent).as_posix(), owner))
            for child in ast.iter_child_nodes(node):
                visit(child, owner)

        visit(tree, "<module>")
    return found


def test_only_the_stepper_makes_an_integrator(tmp_path):
    """Issue 23 item 2: the backends, the runs over devices and the reference step through a Stepper; an
    Integrator made anywhere else would be a second cached a(x) and a second cadence."""
    found = integrator_constructions(Path(app.__file__).resolve().parent)
    assert found == [("app/engine/integrator.py", "Stepper")]
    # the walker finds what it must (so that the assertion above can fail)
    pkg = tmp_path / "app"
    pkg.mkdir()
    (pkg / "backend.py").write_text(
        "import app.engine.integrator as integ\n"
        "from app.engine.integrator import Integrator as Made\n"
        "# Integrator() in a comment is not a call\n"
        "class Backend:\n"
        "    def __init__(self):\n"
        "        self.a = Made()\n"
        "        self.b = integ.Integrator()\n"
        "        self.doc = 'Integrator()'\n"
        "def reference():\n"
        "    return Integrator()\n"
    )
    where = "app/backend.py"
    assert integrator_constructions(pkg) == [(where, "Backend"), (where, "Backend"), (where, "<module>")]
