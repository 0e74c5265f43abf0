"""A/B and the force-error colours' numbers (app/engine/compare.py, app/engine/error_colours.py) with the CPU
backend's side of them (app/backends/cpu_compare.py), against float64 references computed here: fp32
all-pairs against fp64 differs by round-off, a tree at a large opening angle by far more; the state is
bitwise what it is with A/B off; the exact sum, taken in pieces, keeps its cadence."""

from __future__ import annotations

import math

import numpy as np
import pytest

from app.backends.cpu import CPUBackend
from app.engine.compare import ABCompare
from app.engine.error_colours import ExactErrors, error_positions, legend_ticks
from app.engine.forces import Span
from app.model.physics import Physics, accelerations, error_summary, relative_errors
from app.scene import load_scene, make_bodies

PHYS = Physics(softening=0.01, dt=1e-3)
N = 1024  # masses 1/N are exact in float32: every kernel sees the float64 reference's masses


def loaded(kernel: str, n: int = N, **tunables) -> CPUBackend:
    backend = CPUBackend()
    backend.load(make_bodies(load_scene("plummer", {"initial.n": n})), PHYS, kernel=kernel)
    if tunables:
        backend.set_tunables(**tunables)
    return backend


def key_of(backend) -> tuple:
    """What the controller passes as the key (app/ui/compare_actions.py)."""
    return (backend.kernel, backend.n, tuple(sorted(backend.tunables().items())), backend.physics)


def reference(backend) -> np.ndarray:
    """Float64 accelerations of the state as the kernels hold it (float32 positions promoted exactly)."""
    s = backend.state()
    return accelerations(s.pos, s.mass, PHYS)


def compared(backend, kernel_b: str, steps: int = 1, k: int = 4 * N):
    """A/B after `steps` steps, B evaluated at the last one; (ABResult, the last StepTimings)."""
    ops = backend.compare_ops()
    ab = ABCompare(k=k)
    ab.kernel_b = kernel_b
    for _ in range(steps):
        timings = backend.step(1)
        ab.observe_step(timings)
        result = ab.tick(ops, key_of(backend), backend.time, backend.n)
    return result, timings


def test_fp32_against_fp64_differs_by_round_off_and_the_numbers_are_the_float64_references():
    backend = loaded("cpu-simd")
    r, timings = compared(backend, "cpu-fp64", steps=3)
    expect = error_summary(backend.accelerations(), reference(backend))  # B is float64 to ~1e-15
    assert r.kernel_a == "cpu-simd" and r.kernel_b == "cpu-fp64" and r.n == r.k == N  # k >= N: every body
    assert r.median == pytest.approx(expect["median"], rel=1e-6)
    assert r.p99 == pytest.approx(expect["p99"], rel=1e-6)
    assert r.max == pytest.approx(expect["max"], rel=1e-6)
    assert 1e-9 < r.median < 1e-6 and r.p99 < 1e-5  # float32 round-off
    assert r.a_ms > 0 and r.b_ms > 0 and r.ratio == pytest.approx(r.b_ms / r.a_ms)
    assert r.sim_time == backend.time
    assert "B/A" in r.line() and "cpu-fp64" in r.line()


def test_a_tree_at_a_large_opening_angle_differs_far_more_and_b_runs_with_its_own_tunables():
    backend = loaded("cpu-tree", theta=1.0, opening="cube")  # θ's test at every step, not only the first
    r, _ = compared(backend, "cpu-fp64")
    expect = error_summary(backend.accelerations(), reference(backend))
    assert r.median == pytest.approx(expect["median"], rel=1e-6)
    assert r.p99 == pytest.approx(expect["p99"], rel=1e-6)
    assert r.median > 1e-4 and r.p99 > 1e-3  # measured: 3.5e-4 and 3.4e-3
    # B a tree: it runs with the tunables set for it while it ran, not A's and not its defaults
    backend = loaded("cpu-tree", theta=0.3)
    backend.set_kernel("cpu-simd")
    close, _ = compared(backend, "cpu-tree")
    backend.set_kernel("cpu-tree")
    backend.set_tunables(theta=1.0)
    backend.set_kernel("cpu-simd")
    far, _ = compared(backend, "cpu-tree")
    assert far.p99 > 10 * close.p99 and close.p99 < 3e-4  # theta 0.3: 1.0e-4 against fp64


def test_the_state_is_bitwise_what_it_is_with_ab_off():
    for kernel, other, tunables in (
        ("cpu-tree", "cpu-fp64", {"rebuild_every": 4}),  # A's refit cadence: an extra walk would shift it
        ("cpu-simd", "cpu-tree", {}),
    ):
        plain, watched = loaded(kernel, **tunables), loaded(kernel, **tunables)
        ops = watched.compare_ops()
        ab = ABCompare()
        ab.kernel_b, ab.colour = other, True
        exact = ExactErrors()
        for _ in range(6):
            plain.step(1)
            timings = watched.step(1)
            ab.observe_step(timings)
            ab.tick(ops, key_of(watched), watched.time, watched.n)
            exact.tick(ops, key_of(watched), watched.time)
            ops.paint()
        assert ab.latest is not None and exact.latest is not None
        a, b = plain.state(), watched.state()
        assert a.pos.tobytes() == b.pos.tobytes() and a.vel.tobytes() == b.vel.tobytes(), kernel
        assert plain.accelerations().tobytes() == watched.accelerations().tobytes(), kernel


def test_error_positions_are_the_legends_log_scale():
    errors = np.array([1e-7, 1e-4, 1e-1, 1e-9, 1.0, np.nan, 0.0, 1e-5])
    np.testing.assert_allclose(error_positions(errors), [0, 0.5, 1, 0, 1, 1, 0, 1 / 3], atol=1e-6)
    assert error_positions(errors).dtype == np.float32
    ticks = legend_ticks()
    assert ticks[0] == (0.0, "1e-7") and ticks[-1] == (1.0, "1e-1") and len(ticks) == 7


def test_the_colours_against_b_are_each_bodys_error_against_b():
    backend = loaded("cpu-tree", theta=1.0, opening="cube")
    ops = backend.compare_ops()
    ab = ABCompare()
    ab.kernel_b, ab.colour = "cpu-fp64", True
    ab.observe_step(backend.step(1))
    ab.tick(ops, key_of(backend), backend.time, backend.n)
    assert ab.colours_written
    expect = error_positions(relative_errors(backend.accelerations(), reference(backend)))
    got = ops.paint()
    assert got.shape == (N,) and got.dtype == np.float32
    np.testing.assert_allclose(got, expect, atol=1e-5)
    assert got.min() < 0.2 and got.max() > 0.8  # a tree's bodies spread over the scale
    ops.clear_colours()
    assert not ops.paint().any()


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Counted:
    """A CompareOps that counts exact_begin calls (the sums started)."""

    def __init__(self, ops):
        self.ops, self.begun = ops, 0

    def __getattr__(self, name):
        return getattr(self.ops, name)

    def exact_begin(self) -> int:
        self.begun += 1
        return self.ops.exact_begin()


def test_the_exact_sum_in_pieces_is_the_float64_reference_and_keeps_its_cadence():
    backend = loaded("cpu-tree", theta=1.0)
    backend.step(1)
    ops = Counted(backend.compare_ops())
    clock = Clock()
    exact = ExactErrors(interval_s=1.0, clock=clock)
    exact.rows = 100  # pieces of 100 targets at first
    key = key_of(backend)
    progress = []
    while exact.tick(ops, key, backend.time) is None:
        progress.append(exact.progress)
    assert progress[0] == pytest.approx(100 / N) and all(
        a < b for a, b in zip(progress, progress[1:], strict=False)
    )
    s = exact.latest
    assert s is not None and s.n == N and s.frames == len(progress) + 1 >= 2 and s.cost_ms > 0
    expect = error_summary(backend.accelerations(), reference(backend))
    assert s.median == pytest.approx(expect["median"], rel=1e-6) and s.p99 == pytest.approx(
        expect["p99"], rel=1e-6
    )
    np.testing.assert_allclose(
        ops.paint(), error_positions(relative_errors(backend.accelerations(), reference(backend))), atol=1e-5
    )
    assert ops.begun == 1
    # the same state: nothing; a new state before interval_s: nothing; after it: a new sum
    assert exact.tick(ops, key, backend.time) is None and exact.progress is None
    backend.step(1)
    assert exact.tick(ops, key, backend.time) is None and ops.begun == 1
    clock.t = 1.01
    exact.tick(ops, key, backend.time)
    assert ops.begun == 2 and (exact.progress is not None or exact.latest.sim_time == backend.time)
    # another tunable: a new sum at once, the one in progress dropped
    backend.set_tunables(theta=0.5)
    exact.tick(ops, key_of(backend), backend.time)
    assert ops.begun == 3


def test_a_sum_costing_more_than_its_share_waits_longer():
    exact = ExactErrors(interval_s=1.0, share=0.25, clock=Clock())

    class Slow:
        def exact_begin(self):
            return 10

        def exact_piece(self, targets: Span) -> float:
            return 2000.0  # 2 s of compute: the next sum no sooner than 8 s after

        def colour_exact(self):
            return {"median": 1e-3, "p99": 1e-2, "max": 1e-1}

    slow = Slow()
    assert exact.tick(slow, ("k",), 1.0) is not None
    exact.clock.t = 7.9
    assert exact.tick(slow, ("k",), 2.0) is None and exact.progress is None
    exact.clock.t = 8.1
    assert exact.tick(slow, ("k",), 2.0) is not None


class FakeOps:
    """A CompareOps whose B is A plus a known relative offset, counting B's evaluations."""

    def __init__(self, n: int, offset: float = 1e-3):
        self.n, self.offset, self.evaluated = n, offset, []
        self.acc = np.random.default_rng(1).normal(size=(n, 3))

    def evaluate_other(self, name: str) -> float:
        self.evaluated.append(name)
        return 2.0

    def sample(self, rows):
        b = self.acc[rows]
        return b * (1 + self.offset), b

    def colour_other(self):
        return {"median": self.offset, "p99": self.offset, "max": self.offset}


def test_ab_evaluates_every_kth_frame_whose_state_changed_and_at_once_after_a_change():
    from app.engine.timing import StepTimings

    ops = FakeOps(100)
    ab = ABCompare(k=10, every=3)
    assert ab.tick(ops, ("A",), 0.0, 100) is None and not ops.evaluated  # no kernel B: nothing
    ab.kernel_b = "B"
    ab.observe_step(StepTimings(kernel="A", steps=1, n=100, force_ms=4.0, force_evals=2))
    r = ab.tick(ops, ("A",), 0.0, 100)  # a new pair: at once
    assert r is not None and r.k == 10 and r.a_ms == 2.0 and r.b_ms == 2.0 and r.ratio == 1.0
    assert r.median == pytest.approx(1e-3) and r.p99 == pytest.approx(1e-3)
    assert ab.tick(ops, ("A",), 0.0, 100) is None  # the same state (paused): nothing
    done = [ab.tick(ops, ("A",), t, 100) is not None for t in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0)]
    assert done == [False, False, True, False, False, True] and len(ops.evaluated) == 3
    ab.kernel_b = "C"
    assert ab.tick(ops, ("A",), 6.0, 100) is not None and ops.evaluated[-1] == "C"  # another B: at once
    r = ab.tick(ops, ("A'",), 6.0, 100)  # another A: at once, A's times forgotten
    assert r is not None and math.isnan(r.a_ms) and math.isnan(r.ratio)


def test_record_refuses_the_error_views_which_only_the_live_viewer_computes(tmp_path, capsys):
    from app.cli import main

    for view in ("error", "error-ab"):
        args = ["record", "plummer", "--n", "64", "--set", f"render.color_by={view}", "--still", "0"]
        assert main([*args, "--out", str(tmp_path / "still.png")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"render.color_by = {view} is the live viewer's" in err[0]
    assert not (tmp_path / "still.png").exists()


def test_a_replay_refuses_the_error_views_too(tmp_path, capsys):
    """A replay has no Compare tab: its speed buffer would be drawn as errors, so it says so instead."""
    from app.cli import main

    series = tmp_path / "series"
    sim = ["simulate", "plummer", "--n", "64", "--steps", "2", "--backend", "cpu", "--no-progress"]
    assert (
        main([*sim, "--snapshot-every", "1", "--out-dir", str(series), "--out", str(tmp_path / "end.npz")])
        == 0
    )
    capsys.readouterr()
    rc = main(["run", str(series), "--headless", "--frames", "1", "--set", "render.color_by=error"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "is the live viewer's" in err[0] and "a replay colours by" in err[0]
