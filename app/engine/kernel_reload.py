"""Hot reload of a kernel file while the viewer runs (issue 27, item 2): watch, build in the background,
validate on the current state, and only then swap, between two steps. The old kernel keeps stepping
through a compile error or a failed validation, and the panel shows why.

    reloader = Reloader(FileWatch([path]), build, validate, swap)
    ...                                   # once a frame, between steps, on the thread that steps:
    reloader.poll()                       # a saved file starts a build; a finished build is validated,
                                          # then swapped in, or refused with the compiler's or the
                                          # validation's message; `history` says what happened and when

This module is the backend-free machine; what a build, a validation and a swap are is injected. The
CPU twin (tests/test_kernel_reload.py) builds a fake compiler's output and validates on the CPU
backend's state; the CUDA wiring (nvcc or NVRTC, the evaluator's launch on the sampled targets) is the
issue's next part.

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

from app.model.physics import Physics, accelerations, relative_errors

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
    """One reload of `path`: what came of it, its message, and how long each stage took (None: not
    reached)."""

    path: Path
    outcome: str  # "swapped", "compile error", "validation failed"
    message: str
    compile_s: float
    validate_s: float | None = None
    swap_s: float | None = None


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
    """The machine: `build(path)` runs on a worker thread (BuildError for a compile error) and returns
    what `validate(built)` checks and `swap(built)` puts in, both on the caller's thread (the one that
    steps and owns the device). A file saved again while its build runs is built again after it."""

    def __init__(
        self,
        watch: FileWatch,
        build: Callable[[Path], object],
        validate: Callable[[object], Validation],
        swap: Callable[[object], None],
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.watch, self.build, self.validate, self.swap, self.clock = watch, build, validate, swap, clock
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kernel-build")
        self._building: dict[Path, tuple[concurrent.futures.Future, float]] = {}
        self._again: set[Path] = set()
        self.history: deque[Reload] = deque(maxlen=HISTORY)

    @property
    def busy(self) -> bool:
        return bool(self._building)

    def poll(self) -> list[Reload]:
        """Between two steps: start the builds of saved files, finish the builds that are done; returns
        the reloads finished now (also in `history`)."""
        for path in self.watch.changed():
            if path in self._building:
                self._again.add(path)
            else:
                self._start(path)
        done = []
        for path, (future, started) in list(self._building.items()):
            if future.done():
                del self._building[path]
                done.append(self._finish(path, future, started))
                if path in self._again:
                    self._again.discard(path)
                    self._start(path)
        self.history.extend(done)
        return done

    def _start(self, path: Path) -> None:
        started = self.clock()
        self._building[path] = (self._pool.submit(self._timed_build, path), started)

    def _timed_build(self, path: Path) -> tuple[object, float]:
        t0 = self.clock()
        built = self.build(path)
        return built, self.clock() - t0

    def _finish(self, path: Path, future, started: float) -> Reload:
        try:
            built, compile_s = future.result()
        except BuildError as e:
            return Reload(path, "compile error", str(e), self.clock() - started)
        t0 = self.clock()
        check = self.validate(built)
        validate_s = self.clock() - t0
        if not check.ok:
            return Reload(path, "validation failed", check.why, compile_s, validate_s)
        t0 = self.clock()
        self.swap(built)
        return Reload(
            path,
            "swapped",
            f"worst body {check.worst_body}: {check.worst_error:.2e}, p99 {check.p99:.2e}",
            compile_s,
            validate_s,
            self.clock() - t0,
        )

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def sample_targets(n: int, k: int = VALIDATION_TARGETS, seed: int = 0) -> np.ndarray:
    """`k` seeded distinct targets of `n` (all of them when n <= k), sorted."""
    if n <= k:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, size=k, replace=False))


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
    judged against float64 on a seeded sample of targets: a non-finite value, or a relative error over
    `max_rel` on any sampled body, refuses it, naming the worst body."""
    rows = sample_targets(len(mass), k, seed)
    got = np.asarray(candidate(pos, mass, rows), dtype=np.float64)
    bad = ~np.isfinite(got).all(axis=1)
    if bad.any():
        body = int(rows[np.argmax(bad)])
        return Validation(False, body, float("nan"), float("nan"), f"body {body}: a non-finite acceleration")
    rel = relative_errors(got, accelerations(pos, mass, physics, targets=rows))
    worst = int(np.argmax(rel))
    p99 = float(np.percentile(rel, 99))
    if rel[worst] > max_rel:
        body, error = int(rows[worst]), float(rel[worst])
        why = f"body {body}: relative error {error:.2e} > the budget {max_rel:g} (p99 {p99:.2e})"
        return Validation(False, body, error, p99, why)
    return Validation(True, int(rows[worst]), float(rel[worst]), p99)
