"""Hot reload of a kernel file while the viewer runs (issue 27, item 2): watch, build in the background,
validate on the current state, and only then swap, between two steps. The old kernel keeps stepping
through a compile error or a failed validation, and the panel shows why.

    reloader = Reloader(FileWatch([path]), build, validate, swap, snapshot)
    ...                                   # once a frame, between steps, on the thread that steps:
    reloader.poll()                       # a saved file: a snapshot of the state, then a build and its
                                          # validation on a worker; a build that passed is swapped in,
                                          # one that did not is refused with the compiler's or the
                                          # validation's message; `history` says what happened and when

This module is the backend-free machine; what a build, a validation and a swap are is injected. The
CPU twin (tests/test_kernel_reload.py) builds a fake compiler's output and validates on the CPU
backend's state; the GPU's are app/backends/cuda/hot_reload.py (NVRTC or nvcc, a trial in a sandbox
process), wired into the viewer by app/ui/reload_actions.py.

Watching is polling: one os.stat per watched file per frame, which a 60 fps viewer notices within a
frame, far inside the issue's 1.5 s from save to swap. A watcher library (watchdog, watchfiles) would
add a thread and a dependency for a handful of files; not measured against it yet.
"""

from __future__ import annotations

import concurrent.futures
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.model.physics import Physics, accelerations, relative_errors, sample_rows

VALIDATION_TARGETS = 1024  # the seeded sample of targets a new build is checked on
HISTORY = 20  # reloads the panel lists


class BuildError(Exception):
    """A build that failed (the compiler's message, with the file and line it names)."""


@dataclass(frozen=True)
class Validation:
    """A new build's accelerations on the sampled targets against float64: ok, or why not, with the
    worst body (its index in the state) and its relative error."""

    ok: bool
    worst_body: int
    worst_error: float
    p99: float
    why: str = ""


@dataclass(frozen=True)
class Reload:
    """One reload of `path`: what came of it, its message, how long each stage took (None: not reached),
    and, for a swap, how long after the save the new kernel was live (from the poll that saw the save
    to the swap)."""

    path: Path
    outcome: str  # "swapped", "compile error", "validation failed", "swap failed"
    message: str
    compile_s: float
    validate_s: float | None = None
    swap_s: float | None = None
    live_s: float | None = None


class FileWatch:
    """The watched files' modification times, polled: `changed()` is the files saved since the last call
    (a file that disappears, mid-save by an editor that renames, counts when it is back)."""

    def __init__(self, paths):
        self.paths = [Path(p) for p in paths]
        self._seen = {p: self._mtime(p) for p in self.paths}

    @staticmethod
    def _mtime(path: Path) -> int | None:
        try:
            return os.stat(path).st_mtime_ns
        except OSError:
            return None

    def changed(self) -> list[Path]:
        out = []
        for path in self.paths:
            now = self._mtime(path)
            if now is not None and now != self._seen[path]:
                out.append(path)
            if now is not None:
                self._seen[path] = now
        return out


class Reloader:
    """The machine, per saved file: `snapshot()` on the caller's thread (the one that steps and owns the
    device) when the save is seen: what validation needs of the state then, e.g. a host copy of the
    positions; then, on a worker thread, `build(path)` (BuildError for a compile error) and
    `validate(built, snapshot)` back to back (a trial may take a while, or hang until its bound: the
    viewer keeps drawing, and no frame boundary lies between the two); then `swap(built)` on the caller's
    thread, at its next poll, between two steps. A file saved again meanwhile is built again after."""

    def __init__(
        self,
        watch: FileWatch,
        build: Callable[[Path], object],
        validate: Callable[[object, object], Validation],
        swap: Callable[[object], None],
        snapshot: Callable[[], object] = lambda: None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.watch, self.build, self.validate, self.swap = watch, build, validate, swap
        self.snapshot, self.clock = snapshot, clock
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kernel-reload")
        self._jobs: dict[Path, tuple[concurrent.futures.Future, float]] = {}  # path -> (job, seen at)
        self._again: set[Path] = set()
        self.history: deque[Reload] = deque(maxlen=HISTORY)

    @property
    def busy(self) -> bool:
        return bool(self._jobs)

    def poll(self) -> list[Reload]:
        """Between two steps: start the jobs of saved files, swap in the builds that passed; returns the
        reloads finished now (also in `history`)."""
        for path in self.watch.changed():
            if path in self._jobs:
                self._again.add(path)
            else:
                self._start(path)
        done = []
        for path, (job, seen) in list(self._jobs.items()):
            if job.done():
                del self._jobs[path]
                done.append(self._finish(path, job.result(), seen))
                if path in self._again:
                    self._again.discard(path)
                    self._start(path)
        self.history.extend(done)
        return done

    def _start(self, path: Path) -> None:
        # The clock is read before the submit: the worker may start (and read its own clock) before
        # submit returns, and live_s must cover compile_s + validate_s.
        seen = self.clock()
        self._jobs[path] = (self._pool.submit(self._job, path, self.snapshot()), seen)

    def _job(self, path: Path, snapshot) -> tuple:
        """On the worker: (built, compile s, Validation, validate s), or (BuildError, compile s)."""
        t0 = self.clock()
        try:
            built = self.build(path)
        except BuildError as e:
            return e, self.clock() - t0
        except Exception as e:  # noqa: BLE001 - whatever went wrong is the reload's message, not a crash
            return BuildError(f"{path}: the build failed: {type(e).__name__}: {e}"), self.clock() - t0
        t1 = self.clock()
        try:
            check = self.validate(built, snapshot)
        except Exception as e:  # noqa: BLE001 - (as above): the old kernel keeps running
            nan = float("nan")
            check = Validation(False, -1, nan, nan, f"the validation failed: {type(e).__name__}: {e}")
        return built, t1 - t0, check, self.clock() - t1

    def _finish(self, path: Path, result: tuple, seen: float) -> Reload:
        if isinstance(result[0], BuildError):
            return Reload(path, "compile error", str(result[0]), result[1])
        built, compile_s, check, validate_s = result
        if not check.ok:
            return Reload(path, "validation failed", check.why, compile_s, validate_s)
        t0 = self.clock()
        try:
            self.swap(built)
        except Exception as e:  # noqa: BLE001 - a module that does not load, say: the old kernel stays
            return Reload(path, "swap failed", f"{type(e).__name__}: {e}", compile_s, validate_s)
        swapped = self.clock()
        return Reload(
            path,
            "swapped",
            f"worst body {check.worst_body}: {check.worst_error:.2e}, p99 {check.p99:.2e}",
            compile_s,
            validate_s,
            swapped - t0,
            swapped - seen,
        )

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def sample_targets(n: int, k: int = VALIDATION_TARGETS, seed: int = 0) -> np.ndarray:
    """`k` seeded distinct targets of `n` (all of them when n <= k), sorted."""
    return sample_rows(n, k, np.random.default_rng(seed))


def validate_on_sample(
    candidate: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray],
    pos: np.ndarray,
    mass: np.ndarray,
    physics: Physics,
    max_rel: float,
    k: int = VALIDATION_TARGETS,
    seed: int = 0,
) -> Validation:
    """`candidate(pos, mass, rows)` (a new build's accelerations of targets `rows` against every body)
    judged against float64 (numpy, on the host) on a seeded sample of targets (`judge`)."""
    rows = sample_targets(len(mass), k, seed)
    got = np.asarray(candidate(pos, mass, rows), dtype=np.float64)
    if not np.isfinite(got).all():
        return judge(got, got, rows, max_rel)  # (refused before the reference is computed)
    return judge(got, accelerations(pos, mass, physics, targets=rows), rows, max_rel)


def judge(got: np.ndarray, ref: np.ndarray, rows: np.ndarray, max_rel: float) -> Validation:
    """A new build's accelerations `got` of the sampled targets `rows` against their float64 `ref`: a
    non-finite value, or a relative error over `max_rel` on any sampled body, refuses it, naming the
    worst body (its index in the state)."""
    bad = ~np.isfinite(got).all(axis=1)
    if bad.any():
        body = int(rows[np.argmax(bad)])
        return Validation(False, body, float("nan"), float("nan"), f"body {body}: a non-finite acceleration")
    rel = relative_errors(got, ref)
    worst = int(np.argmax(rel))
    p99 = float(np.percentile(rel, 99))
    if rel[worst] > max_rel:
        body, error = int(rows[worst]), float(rel[worst])
        why = f"body {body}: relative error {error:.2e} > the budget {max_rel:g} (p99 {p99:.2e})"
        return Validation(False, body, error, p99, why)
    return Validation(True, int(rows[worst]), float(rel[worst]), p99)
