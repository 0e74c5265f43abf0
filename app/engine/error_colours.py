"""The per-body force error as a colour, and the exact sum's cadence for the error-against-exact view.

    positions = error_positions(relative_errors(approx, exact))   # float32 in [0, 1]: 1e-7 -> 0, 1e-1 -> 1
    exact = ExactErrors()
    exact.tick(ops, key, sim_time)    # once per frame: one piece of the exact sum when due (CompareOps)
    exact.latest                      # ExactSummary: median, p99, max over all N, what the sum cost

A body's colour is where its relative error |a - a_ref| / |a_ref| (app.model.physics.relative_errors: the
same floor, 1e-3 of the RMS of |a_ref| over the bodies compared) sits on a log scale from ERROR_LO (the
colormap's low end) to ERROR_HI (its top), clamped at both ends: the legend's range, fixed so that a colour
means the same error from frame to frame and kernel to kernel. 1e-7 is float32 round-off (an fp32 all-pairs
sum sits at the bottom), 1e-1 a tree at a very large opening angle: a tree's bodies spread over the middle,
its worst ones near the top. A backend writes the positions into the per-body float the particle shader's
colormap reads (the speed buffer; app/render/particles.py, render.color_by = error / error-ab).

The exact sum is O(N^2) in float64 (cpu-fp64's numba kernel on the CPU, the fp64 reference record on a
GPU). It is taken over a snapshot of the positions and of the running kernel's a(x) at one state, in pieces
of targets, one piece a frame, each sized to take about PIECE_MS (the viewer never stalls for the whole
sum: at N = 65,536 on two CPU cores it takes seconds), and again at most every `interval_s` of wall time,
and no sooner than its compute time divided by `share` after the last one started (so the exact sum takes
at most that share of the wall time on average), or at once when the running kernel, N, its tunables or the
physics change. Nothing is summed while the state stays as it was (a paused viewer costs nothing).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from app.engine.forces import Span

ERROR_LO = 1e-7  # the legend's low end: float32 round-off
ERROR_HI = 1e-1  # its top: a tree at a very large opening angle
DEFAULT_INTERVAL_S = 1.0
PIECE_MS = 15.0  # one frame's piece of the exact sum, about
FIRST_PIECE = 256  # rows of the first piece, before one has been timed
EXACT_SHARE = 0.25  # the exact sum's share of the wall time, at most, on average


def error_positions(errors: np.ndarray, lo: float = ERROR_LO, hi: float = ERROR_HI) -> np.ndarray:
    """Float32 positions in [0, 1] of relative errors on the legend's log scale (lo -> 0, hi -> 1,
    clamped; a non-finite error is the top)."""
    e = np.asarray(errors, dtype=np.float64)
    e = np.where(np.isfinite(e), e, hi)
    t = (np.log10(np.clip(e, lo, hi)) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))
    return t.astype(np.float32)


def error_stats(errors: np.ndarray) -> dict[str, float]:
    """Median, 99th percentile and maximum of per-body relative errors (what the panel shows beside the
    legend)."""
    return {
        "median": float(np.median(errors)),
        "p99": float(np.percentile(errors, 99)),
        "max": float(np.max(errors)),
    }


def legend_ticks(lo: float = ERROR_LO, hi: float = ERROR_HI) -> list[tuple[float, str]]:
    """(position in [0, 1], label) of every power of ten from lo to hi: the legend's scale."""
    first, last = round(math.log10(lo)), round(math.log10(hi))
    span = last - first
    return [((p - first) / span, f"1e{p}") for p in range(first, last + 1)]


@dataclass(frozen=True)
class ExactSummary:
    """One exact sum: the running kernel's error against it over all N bodies, and what it cost."""

    kernel: str
    n: int
    median: float  # relative error, median over every body
    p99: float
    max: float
    cost_ms: float  # the sum's compute time (the backend's clock), all its pieces
    frames: int  # frames (pieces) it was spread over
    sim_time: float  # the state it was taken at


class ExactErrors:
    """The error-against-exact view's exact sums, in pieces (see the module doc)."""

    def __init__(
        self,
        interval_s: float = DEFAULT_INTERVAL_S,
        piece_ms: float = PIECE_MS,
        share: float = EXACT_SHARE,
        clock=time.perf_counter,
    ):
        self.interval_s = float(interval_s)
        self.piece_ms = float(piece_ms)
        self.share = float(share)
        self.clock = clock
        self.latest: ExactSummary | None = None
        self.rows = FIRST_PIECE  # the next piece's targets
        self._key: tuple | None = None  # (kernel, N, tunables, physics) of the sum in progress or latest
        self._sim_time: float | None = None
        self._started = -math.inf  # wall time the latest sum started
        self._next: int | None = None  # the next target row of the sum in progress (None: none)
        self._n = 0
        self._cost = 0.0
        self._frames = 0

    def reset(self) -> None:
        """Forget the latest sum and any in progress (the next tick starts one)."""
        self.latest, self._key, self._sim_time, self._next = None, None, None, None
        self._started = -math.inf

    @property
    def progress(self) -> float | None:
        """The fraction of the sum in progress done, or None when none is."""
        return None if self._next is None else self._next / max(self._n, 1)

    def _due(self, key: tuple, sim_time: float) -> bool:
        if key != self._key:
            self.latest, self._key, self._next = None, key, None  # another kernel, N, tunables: now
            return True
        if self.latest is None:
            return True
        if sim_time == self._sim_time:
            return False  # the state the latest sum was taken at
        wait = max(self.interval_s, self.latest.cost_ms / 1e3 / self.share)
        return self.clock() - self._started >= wait

    def tick(self, ops, key: tuple, sim_time: float) -> ExactSummary | None:
        """One piece of the exact sum when one is due or in progress (`ops`: a CompareOps; `key`: what
        the running kernel's a(x) depends on, its name first); the summary when the sum completes."""
        if self._next is None or key != self._key:
            if not self._due(key, sim_time):
                return None
            self._n, self._next = int(ops.exact_begin()), 0
            self._cost, self._frames = 0.0, 0
            self._started, self._sim_time = self.clock(), sim_time
        assert self._next is not None, "a sum is in progress"
        count = min(self.rows, self._n - self._next)
        if count > 0:
            ms = float(ops.exact_piece(Span(self._next, count)))
            self._cost += ms
            self._frames += 1
            self._next += count
            self.rows = max(64, min(int(count * self.piece_ms / max(ms, 1e-3)), 4 * count))
        if self._next < self._n:
            return None
        stats = ops.colour_exact()
        self._next = None
        self.latest = ExactSummary(
            kernel=str(key[0]),
            n=self._n,
            median=float(stats["median"]),
            p99=float(stats["p99"]),
            max=float(stats["max"]),
            cost_ms=self._cost,
            frames=self._frames,
            sim_time=float(self._sim_time if self._sim_time is not None else sim_time),
        )
        return self.latest
