"""The live force error (app/engine/force_error.py) and the CPU backend's side of it
(`force_error_sample`)."""

from __future__ import annotations

import numpy as np
import pytest
from fakes import FakeBackend

from app.backends import cpu_tree
from app.backends.cpu import CPUBackend
from app.engine.force_error import ForceErrorProbe
from app.engine.forces import KernelRecord
from app.model.physics import Physics, accelerations, relative_errors
from app.scene import load_scene, make_bodies

PHYS = Physics(softening=0.01, dt=1e-3)


def tree_backend(n: int = 4096, **tunables) -> CPUBackend:
    backend = CPUBackend()
    backend.load(make_bodies(load_scene("plummer", {"initial.n": n})), PHYS, kernel="cpu-tree")
    if tunables:
        backend.set_tunables(**tunables)
    return backend


def test_force_error_sample_is_the_cached_tree_rows_and_the_all_pairs_sum(monkeypatch):
    backend = tree_backend()
    backend.step(2)
    calls = []
    real = cpu_tree.CpuTreeEvaluator.evaluate
    monkeypatch.setattr(
        cpu_tree.CpuTreeEvaluator, "evaluate", lambda self, *a: calls.append(1) or real(self, *a)
    )
    rows = np.array([0, 17, 4000, 2048])
    approx, exact = backend.force_error_sample(rows)
    assert not calls, "the leapfrog's cached a(x) is what the tree computed for this state: no new walk"
    assert approx.dtype == exact.dtype == np.float64 and approx.shape == exact.shape == (4, 3)
    assert np.array_equal(approx, backend.accelerations()[rows])
    s = backend.state()
    pos32 = s.pos.astype(np.float32).astype(np.float64)
    ref = accelerations(pos32, s.mass.astype(np.float32).astype(np.float64), PHYS, targets=rows)
    assert relative_errors(exact, ref).max() < 2e-5  # float32 all-pairs, not the tree
    assert 0 < relative_errors(approx, exact).max() < 5e-3  # the tree's own error
    backend.close()


def test_euler_state_gets_its_tree_accelerations_evaluated_then_cached():
    backend = CPUBackend()
    backend.load(
        make_bodies(load_scene("plummer", {"initial.n": 1024})),
        Physics(softening=0.01, dt=1e-3, integrator="euler-damped"),
        kernel="cpu-tree",
    )
    # a build every evaluation and the cube test (no history): bitwise the fresh evaluator's
    backend.set_tunables(rebuild_every=1, opening="cube")
    backend.step(1)  # acc belongs to the previous positions now
    approx, _exact = backend.force_error_sample(np.arange(8))
    fresh = cpu_tree.NumbaTree().evaluator(backend.record("cpu-tree"), backend.physics)
    pos = backend.state().pos4(np.float32)
    acc = np.zeros_like(pos)
    from app.engine.forces import Span

    fresh.evaluate(pos, acc, Span.all(1024), Span.all(1024))
    assert np.array_equal(approx, acc[:8, :3].astype(np.float64))
    backend.close()


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_probe_samples_every_interval_only_when_something_changed():
    backend = tree_backend(2048)
    timings = backend.step(1)
    clock = Clock()
    probe = ForceErrorProbe(k=256, interval_s=1.0, seed=3, clock=clock)
    first = probe.tick(backend, timings)
    assert first is not None and probe.latest is first and first.k == 256 and first.n == 2048
    assert 0 < first.median <= first.p99 < 5e-3 and first.budget_p99 == 1e-3 and first.within_budget
    assert probe.interactions_per_body == pytest.approx(timings.interactions / 2048 / timings.force_evals)
    assert 100 < probe.interactions_per_body < 2048
    clock.t = 0.5
    timings = backend.step(1)
    assert probe.tick(backend, timings) is None  # not due
    clock.t = 1.2
    second = probe.tick(backend, timings)
    assert second is not None and second.sim_time > first.sim_time
    clock.t = 5.0
    assert probe.tick(backend, timings) is None  # due, but the state is where it was (paused)
    backend.set_tunables(theta=1.2)  # a new theta: at once, whatever the clock
    coarse = probe.tick(backend, timings)
    assert coarse is not None and coarse.p99 > second.p99
    backend.close()


def test_probe_keeps_nothing_for_an_exact_record_and_samples_all_of_a_small_n():
    backend = tree_backend(300)
    probe = ForceErrorProbe(k=1024, interval_s=0.0)
    sample = probe.tick(backend, backend.step(1))
    assert sample.k == 300  # N <= K: every body
    backend.set_kernel("cpu-simd")
    assert probe.tick(backend, backend.step(1)) is None
    assert probe.latest is None and probe.interactions_per_body == 0.0 and probe.note == ""
    backend.close()


def test_probe_says_why_when_the_backend_cannot_sample():
    class Approximate(FakeBackend):
        @classmethod
        def kernels(cls):
            return [KernelRecord(name="fake", doc="an approximate double", backend="fake", approximate=True)]

    backend = Approximate(np.ones((10, 4)))
    probe = ForceErrorProbe()
    assert probe.tick(backend) is None and probe.latest is None
    assert probe.note == "force error: the fake backend cannot sample its force error"


def test_a_costly_sample_waits_nine_times_its_cost_before_the_next():
    """The probe takes at most a tenth of the wall time: a sample that took 0.85 s of the clock is next
    due 7.65 s after it ended, not 1 s after it began (the 16M viewer's frames, force_error.py)."""
    backend = tree_backend(2048)
    timings = backend.step(1)
    clock = Clock()
    sample = backend.force_error_sample

    def slow(rows):
        clock.t += 0.85
        return sample(rows)

    backend.force_error_sample = slow
    probe = ForceErrorProbe(k=256, interval_s=1.0, seed=3, clock=clock)
    assert probe.tick(backend, timings) is not None and clock.t == pytest.approx(0.85)
    for t in (1.2, 2.0, 8.4):  # 8.4 - 0.85 < 9 x 0.85
        clock.t = t
        timings = backend.step(1)
        assert probe.tick(backend, timings) is None, t
    clock.t = 8.6
    assert probe.tick(backend, backend.step(1)) is not None  # ended at 9.45: next due at 17.1
    backend.force_error_sample = sample  # cheap samples from here: the interval again
    clock.t = 17.0
    assert probe.tick(backend, backend.step(1)) is None
    clock.t = 17.2
    assert probe.tick(backend, backend.step(1)) is not None
    clock.t = 18.3
    assert probe.tick(backend, backend.step(1)) is not None
    backend.close()
