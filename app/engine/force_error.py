"""The live force error of an approximate force method (a tree code), as the panel shows it.

    probe = ForceErrorProbe(k=1024, interval_s=1.0, seed=0)
    probe.tick(backend, timings)        # once per frame: samples when due, else returns at once
    probe.latest                        # ForceErrorSample: median, p99, interactions per body, ...

Every `interval_s` of wall time, or COST_FACTOR times the last sample's own cost if that is longer (the
probe takes at most a tenth of the wall time), and at once when the kernel, N or its tunables change,
while the current record is `approximate` (KernelRecord.approximate: a tree), the probe draws a random
sample of K target bodies (numpy's default_rng from `seed`, without replacement; all bodies when N <= K)
and asks the backend for their accelerations both ways (`Backend.force_error_sample(rows) -> (approx, exact)`:
what the running record computed at the current state, and an all-pairs sum over every source). It keeps
the median and the 99th percentile of the per-body relative error |a - a_exact| / |a_exact|
(app.model.physics.relative_errors: |a_exact| floored at 1e-3 of the sample's RMS), and the interactions per
body of the last step (StepTimings: interactions / N / force evaluations). For an exact record it keeps
nothing, and the panel shows nothing. Nothing is sampled while the state, kernel and tunables stay as
they were (a paused viewer costs nothing).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import numpy as np

from app.model.physics import error_summary, sample_rows

log = logging.getLogger(__name__)

DEFAULT_K = 1024
DEFAULT_INTERVAL_S = 1.0
# A sample waits at least this many times its own cost after the last one ended, so the probe takes at
# most a tenth of the wall time. Why: with only the 1 s interval, counted from a sample's start, a sample
# that costs most of a second runs at nearly every frame. The viewer at 16M bodies (tree, one H200) lost
# ~0.85 s at nearly every frame on 2026-11-26 and at every third on 11-23 (bench/results/h200-2026-11-2*-
# run-16777216-*frames.csv), the pattern of such a sample; its likely cost is the exact half (K targets
# against every source, one thread a target: 4 blocks at K = 1,024). Not yet confirmed on a GPU.
COST_FACTOR = 9.0


@dataclass(frozen=True)
class ForceErrorSample:
    """One measurement of the running record's force error on K sampled bodies."""

    kernel: str
    n: int
    k: int  # bodies sampled
    median: float  # relative error, median over the sample
    p99: float  # and its 99th percentile
    max: float  # and the worst body of the sample
    budget_p99: float | None  # the record's ErrorBudget.p99_rel (None: it has none)
    sim_time: float  # the state's simulation time
    ms: float  # wall time the sample took (both evaluations and the statistics)

    @property
    def within_budget(self) -> bool | None:
        return None if self.budget_p99 is None else self.p99 <= self.budget_p99


class ForceErrorProbe:
    def __init__(
        self,
        k: int = DEFAULT_K,
        interval_s: float = DEFAULT_INTERVAL_S,
        seed: int = 0,
        clock=time.perf_counter,
    ):
        if k < 1:
            raise ValueError(f"k must be at least 1, not {k}")
        self.k = int(k)
        self.interval_s = float(interval_s)
        self.rng = np.random.default_rng(seed)
        self.clock = clock
        self.latest: ForceErrorSample | None = None
        self.interactions_per_body = 0.0  # of the last step of the current approximate record (0: none yet)
        self.note = ""  # why there is no sample although the record is approximate
        self.ms = 0.0  # what the last tick cost (wall time)
        self._last_t = -math.inf  # when the last sample ended
        self._wait_s = self.interval_s  # from then until the next is due: interval_s, or 9x its cost
        self._key: tuple | None = None  # (kernel, N, tunables) of the latest sample
        self._sim_time: float | None = None

    def reset(self) -> None:
        """Forget the latest sample (the next tick samples at once)."""
        self.latest, self._key, self._sim_time, self._last_t = None, None, None, -math.inf
        self._wait_s = self.interval_s
        self.interactions_per_body = 0.0

    def tick(self, backend, timings=None) -> ForceErrorSample | None:
        """Sample when due (see the module doc); returns the new sample, or None when none was taken.
        `timings`: the last StepTimings (for the interactions per body)."""
        t0 = time.perf_counter()
        try:
            return self._tick(backend, timings)
        finally:
            self.ms = (time.perf_counter() - t0) * 1e3

    def _tick(self, backend, timings) -> ForceErrorSample | None:
        record = backend.record(backend.kernel)
        if not record.approximate or backend.n == 0:
            if self.latest is not None or self.note:
                self.reset()
                self.note = ""
            return None
        ours = timings is not None and timings.kernel == record.name and timings.n == backend.n
        self.interactions_per_body = timings.interactions_per_body if ours else 0.0
        key = (record.name, backend.n, tuple(sorted(backend.tunables().items())))
        now = self.clock()
        sim_time = float(backend.time)
        if key != self._key:
            self.latest = None  # another kernel, N or tunables: sample at once
        elif now - self._last_t < self._wait_s or sim_time == self._sim_time:
            return None  # not due, or nothing changed since the last sample
        self._key, self._sim_time = key, sim_time
        try:
            sample = measure(backend, self.k, self.rng)
            self._last_t = self.clock()  # due again `_wait_s` after this one ended
            self._wait_s = max(self.interval_s, COST_FACTOR * (self._last_t - now))
        except NotImplementedError as e:
            self.note = f"force error: {e}"
            return None
        except Exception as e:  # noqa: BLE001 - the viewer goes on; the panel says why there is no number
            self.note = f"force error sampling failed: {type(e).__name__}: {e}"
            log.warning("%s", self.note)
            return None
        self.note = ""
        self.latest = sample
        return sample


def measure(backend, k: int, rng: np.random.Generator) -> ForceErrorSample:
    """One sample of K bodies (all of them when N <= K) from `backend.force_error_sample`."""
    t0 = time.perf_counter()
    n = backend.n
    rows = sample_rows(n, k, rng)
    approx, exact = backend.force_error_sample(rows)
    errors = error_summary(approx, exact)
    record = backend.record(backend.kernel)
    return ForceErrorSample(
        kernel=record.name,
        n=n,
        k=int(rows.size),
        median=errors["median"],
        p99=errors["p99"],
        max=errors["max"],
        budget_p99=record.error_budget.p99_rel,
        sim_time=float(backend.time),
        ms=(time.perf_counter() - t0) * 1e3,
    )
