"""Issue 27, item 2's machine against a fake compiler and the CPU backend (the CI twin of the viewer's hot
reload): a saved kernel file is built on a worker thread, validated on the current state against float64
on a seeded sample of targets, and swapped in between two steps, leaving the state bitwise untouched; a
compile error and a failed validation (a wrong kernel, a NaN kernel) are refused with their message, and
the old kernel keeps stepping. A file saved again while it builds is built again after."""

from __future__ import annotations

import hashlib
import os
import threading
import time

import numpy as np
import pytest

from app.backends.cpu import CPUBackend
from app.engine.kernel_reload import (
    BuildError,
    FileWatch,
    Reloader,
    sample_targets,
    validate_on_sample,
)
from app.model.ics import bench_bodies
from app.model.physics import Physics, accelerations

PHYSICS = Physics(softening=0.05, dt=1e-3)
BUDGET = 1e-4


def fp32_allpairs(pos, mass, rows):
    """A correct "kernel": the float32 all-pairs sum of targets `rows`."""
    p = pos.astype(np.float32)
    d = p[None, :, :] - p[rows][:, None, :]
    r2 = (d * d).sum(axis=2) + np.float32(PHYSICS.softening**2)
    w = mass.astype(np.float32)[None, :] / (r2 * np.sqrt(r2))
    return (d * w[:, :, None]).sum(axis=1).astype(np.float64)


def nan_at_the_eighth(pos, mass, rows):
    """A kernel that writes NaN into one body's acceleration."""
    acc = fp32_allpairs(pos, mass, rows)
    acc[7] = np.nan
    return acc


KERNELS = {
    "ok": fp32_allpairs,
    "wrong": lambda pos, mass, rows: 1.01 * fp32_allpairs(pos, mass, rows),
    "nan": nan_at_the_eighth,
}


def fake_compiler(path):
    """The file's first word names the kernel it compiles to; `error N` is a compile error at line N."""
    text = path.read_text().split()
    if text[0] == "error":
        raise BuildError(f"{path}({text[1]}): error: expected a ';'")
    return text[0]


def save(path, text):
    """Write `text` with a new modification time (a save one tick after the last)."""
    path.write_text(text)
    later = time.time_ns() + 1_000_000
    os.utime(path, ns=(later, later))


def poll_until(reloader, count, timeout=10.0):
    """Poll as the viewer's frames do until `count` reloads have finished (or `timeout`); returns them."""
    finished, deadline = [], time.monotonic() + timeout
    while len(finished) < count and time.monotonic() < deadline:
        finished += reloader.poll()
        time.sleep(0.01)
    return finished


class Viewer:
    """The CPU backend stepping, the kernel in use, and a reloader over one kernel file."""

    def __init__(self, tmp_path):
        self.backend = CPUBackend()
        self.backend.load(bench_bodies(2048, seed=3), PHYSICS, kernel="cpu-simd")
        self.kernel = "built-in"
        self.path = tmp_path / "mine.cu"
        self.path.write_text("ok")
        self.swaps: list[tuple[str, str]] = []  # (state hash before, after) at each swap
        self.reloader = Reloader(
            FileWatch([self.path]), fake_compiler, self.validate, self.swap, snapshot=self.backend.state
        )

    def digest(self) -> str:
        s = self.backend.state()
        return hashlib.sha256(s.pos.tobytes() + s.vel.tobytes()).hexdigest()

    def validate(self, built, s):
        """On the worker thread, on the snapshot the stepping thread took when the build finished."""
        return validate_on_sample(KERNELS[built], s.pos, s.mass, PHYSICS, BUDGET)

    def swap(self, built):
        before = self.digest()
        self.kernel = built
        self.swaps.append((before, self.digest()))

    def run_until_reloaded(self, timeout=10.0):
        """Step and poll, as the viewer's frames do, until a reload finishes; returns it and the steps."""
        steps, deadline = 0, time.monotonic() + timeout
        while time.monotonic() < deadline:
            done = self.reloader.poll()
            if done:
                return done[-1], steps
            self.backend.step(1)
            steps += 1
        raise AssertionError("no reload finished")

    def close(self):
        self.reloader.close()
        self.backend.close()


@pytest.fixture
def viewer(tmp_path):
    v = Viewer(tmp_path)
    yield v
    v.close()


def test_a_correct_edit_is_validated_and_swapped_leaving_the_state_untouched(viewer):
    assert viewer.reloader.poll() == []  # nothing saved yet
    save(viewer.path, "ok")
    reload, _steps = viewer.run_until_reloaded()
    assert reload.outcome == "swapped" and viewer.kernel == "ok"
    assert reload.compile_s >= 0 and reload.validate_s is not None and reload.swap_s is not None
    assert reload.live_s is not None and reload.live_s >= reload.compile_s + reload.validate_s
    assert "worst body" in reload.message
    ((before, after),) = viewer.swaps
    assert before == after  # the swap changes the kernel, never the state
    assert list(viewer.reloader.history) == [reload]


@pytest.mark.parametrize(
    "text, outcome, said",
    [
        ("error 12", "compile error", "mine.cu(12): error: expected a ';'"),
        ("wrong", "validation failed", "> the budget 0.0001"),
        ("nan", "validation failed", "a non-finite acceleration"),
    ],
)
def test_a_bad_edit_is_refused_and_the_old_kernel_keeps_stepping(viewer, text, outcome, said):
    time_before = viewer.backend.time
    save(viewer.path, text)
    reload, steps = viewer.run_until_reloaded()
    assert reload.outcome == outcome and said in reload.message, reload
    assert viewer.kernel == "built-in" and viewer.swaps == []
    viewer.backend.step(3)
    assert viewer.backend.time > time_before  # stepping went on, with the old kernel
    if outcome == "validation failed":
        assert reload.message.startswith("body ")  # the worst body, by its index in the state
    save(viewer.path, "ok")  # and the next good save goes in
    assert viewer.run_until_reloaded()[0].outcome == "swapped" and viewer.kernel == "ok"


def test_a_file_saved_again_while_it_builds_is_built_again(tmp_path):
    path = tmp_path / "k.cu"
    path.write_text("ok")
    release, started, built = threading.Event(), threading.Event(), []

    def slow_build(p):
        started.set()
        release.wait(10)
        built.append(p.read_text())
        return p.read_text()

    swapped = []
    reloader = Reloader(FileWatch([path]), slow_build, lambda b, s: validate_ok(), swapped.append)
    try:
        save(path, "first")
        reloader.poll()
        assert started.wait(10) and reloader.busy
        save(path, "second")
        assert reloader.poll() == []  # the first build still runs; the second save waits for it
        release.set()
        finished = poll_until(reloader, 2)
        assert [r.outcome for r in finished] == ["swapped", "swapped"] and swapped == ["second", "second"]
        assert len(built) == 2
    finally:
        release.set()
        reloader.close()


def validate_ok():
    from app.engine.kernel_reload import Validation

    return Validation(True, 0, 0.0, 0.0)


def test_the_watch_sees_saves_and_an_editor_that_renames(tmp_path):
    a, b = tmp_path / "a.cu", tmp_path / "b.cu"
    a.write_text("1")
    b.write_text("1")
    watch = FileWatch([a, b])
    assert watch.changed() == []
    save(b, "2")
    assert watch.changed() == [b] and watch.changed() == []
    a.unlink()  # an editor's save: the file is gone for a moment, then back under its name
    assert watch.changed() == []
    save(a, "3")
    assert watch.changed() == [a]


def test_the_validation_sample_is_seeded_and_judged_against_float64():
    b = bench_bodies(3000, seed=5)
    rows = sample_targets(3000)
    assert len(rows) == 1024 and np.array_equal(rows, sample_targets(3000)) and np.all(np.diff(rows) > 0)
    assert np.array_equal(sample_targets(100), np.arange(100))
    good = validate_on_sample(KERNELS["ok"], b.pos, b.mass, PHYSICS, BUDGET)
    assert good.ok and good.worst_error < BUDGET and good.worst_body in rows
    exact = lambda pos, mass, r: accelerations(pos, mass, PHYSICS, targets=r)  # noqa: E731
    assert validate_on_sample(exact, b.pos, b.mass, PHYSICS, BUDGET).worst_error == 0.0
    bad = validate_on_sample(KERNELS["wrong"], b.pos, b.mass, PHYSICS, BUDGET)
    assert not bad.ok and bad.worst_error == pytest.approx(0.01, rel=1e-3)


def test_validation_runs_off_the_stepping_thread(tmp_path):
    """A trial that takes long (a kernel that hangs until its bound) must not stop the frames: poll
    returns at once while the validation waits, and the swap happens on the polling thread."""
    path = tmp_path / "k.cu"
    path.write_text("ok")
    release, validating, threads = threading.Event(), threading.Event(), {}

    def slow_validate(built, snap):
        threads["validate"] = threading.current_thread().name
        validating.set()
        release.wait(10)
        return validate_ok()

    def swap(built):
        threads["swap"] = threading.current_thread().name

    reloader = Reloader(FileWatch([path]), lambda p: "built", slow_validate, swap, snapshot=lambda: "snap")
    try:
        save(path, "new")
        for _ in range(500):
            reloader.poll()
            if validating.is_set():
                break
            time.sleep(0.01)
        assert validating.is_set() and reloader.busy
        t0 = time.perf_counter()
        assert reloader.poll() == [] and time.perf_counter() - t0 < 0.05  # a frame is not held up
        release.set()
        for _ in range(500):
            if reloader.poll():
                break
            time.sleep(0.01)
        assert threads == {"validate": threads["validate"], "swap": threading.current_thread().name}
        assert threads["validate"] != threading.current_thread().name
    finally:
        release.set()
        reloader.close()


def test_a_stage_that_raises_is_a_refused_reload_not_a_crash(tmp_path):
    """Whatever a build, a validation or a swap raises ends that reload with its message; the poll (the
    viewer's frame) goes on."""
    path = tmp_path / "k.cu"
    path.write_text("ok")

    def boom(*_args):
        raise RuntimeError("boom")

    for build, validate, swap, outcome in (
        (boom, lambda b, s: validate_ok(), lambda b: None, "compile error"),
        (lambda p: "built", boom, lambda b: None, "validation failed"),
        (lambda p: "built", lambda b, s: validate_ok(), boom, "swap failed"),
    ):
        reloader = Reloader(FileWatch([path]), build, validate, swap)
        try:
            save(path, outcome)
            finished = poll_until(reloader, 1)
            assert [r.outcome for r in finished] == [outcome] and "boom" in finished[0].message
        finally:
            reloader.close()


def test_live_time_starts_before_the_worker_can_start(tmp_path):
    """live_s (seen to swapped) covers compile_s + validate_s even when the worker thread runs before the
    stepping thread reads its clock again (the CI failure of session 25: a 4 ms GIL switch put the
    worker's readings before 'seen'). The stepping thread's first reading here waits up to 0.3 s for
    the worker's three (build start, build end, validation end), which can only come first if 'seen' is
    read after the job is submitted."""
    path = tmp_path / "k.cu"
    path.write_text("ok")
    tick, lock, worker_done = [0.0], threading.Lock(), threading.Event()
    stepping = threading.current_thread()

    def clock():
        if threading.current_thread() is stepping:
            worker_done.wait(0.3)
        with lock:
            tick[0] += 1.0
            if threading.current_thread() is not stepping and tick[0] >= 3:
                worker_done.set()
            return tick[0]

    reloader = Reloader(
        FileWatch([path]), lambda p: "built", lambda b, s: validate_ok(), lambda b: None, clock=clock
    )
    try:
        save(path, "new")
        (reload,) = poll_until(reloader, 1)
        assert reload.outcome == "swapped"
        assert reload.live_s >= reload.compile_s + reload.validate_s + reload.swap_s
    finally:
        reloader.close()
