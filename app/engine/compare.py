"""A/B: the running kernel (A) against a second kernel (B) of the same backend, on the same state.

    ops = backend.compare_ops()            # the backend's side (CompareOps below): scratch buffers, clocks
    ab = ABCompare(k=1024, every=1)
    ab.kernel_b = "cpu-fp64"
    ab.observe_step(timings)               # each frame: A's force time per evaluation, from its steps
    ab.tick(ops, key, sim_time)            # each frame: B evaluated at the current state when due
    ab.latest                              # ABResult: both times, B / A, the accelerations' difference

A is timed as it runs, on the state: its force time per evaluation from the steps' StepTimings (the
backend's own clock: CUDA events on a GPU, perf_counter on the CPU), the median of the last TIMING_WINDOW
steps. B is evaluated on the current positions into a scratch acceleration buffer of the backend's, never
into the state, so the state and its trajectory stay bitwise what they are with A/B off; its time is the
same clock's around that one evaluation, the median of its last TIMING_WINDOW evaluations. The difference
is A's a(x) of the current state against B's on K sampled bodies (all of them when N <= K; a new sample
each time, numpy's default_rng from `seed`), as relative errors |a_A - a_B| / |a_B|
(app.model.physics.relative_errors, its floor): their median, 99th percentile and maximum.

Cadence: every `every`-th frame whose state changed (default every one: each of A's steps has B's time at
the same state beside it, so the two medians are of the same frames and the same device clocks and
temperature; what it costs, one evaluation of B a frame, is what the panel shows), and at once when A, B,
N, the tunables or the physics change. Nothing is evaluated while the state stays as it was (a paused
viewer costs nothing).
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from app.engine.forces import Span
from app.engine.timing import StepTimings
from app.model.physics import error_summary, sample_rows

DEFAULT_K = 1024
DEFAULT_EVERY = 1
TIMING_WINDOW = 15  # evaluations each median is over (the panel's live numbers take 15 frames too)


class CompareOps(Protocol):
    """A backend's side of A/B and of the error colours (`Backend.compare_ops()`): scratch buffers beside
    the state, never the state itself, and a per-body colour buffer the renderer draws. A is always the
    running kernel (its a(x): the integrator's cached one, evaluated now if it is not current)."""

    def evaluate_other(self, name: str) -> float:
        """Kernel `name` (of this backend) at the current positions into the scratch buffer; its time in
        ms by the backend's clock."""
        ...

    def sample(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Float64 (K, 3) of the bodies `rows` (load order): A's a(x) of the current state and B's
        scratch accelerations."""
        ...

    def colour_other(self) -> dict[str, float]:
        """Every body's relative error of A against B (the scratch) into the colour buffer
        (error_colours.error_positions); its median, p99 and max."""
        ...

    def exact_begin(self) -> int:
        """A snapshot of the positions and of A's a(x) for an exact sum; returns N."""
        ...

    def exact_piece(self, targets: Span) -> float:
        """The float64 all-pairs accelerations of the snapshot's rows `targets`; ms by the backend's clock."""
        ...

    def colour_exact(self) -> dict[str, float]:
        """Every body's relative error of the snapshot's a(x) against the finished exact sum into the colour
        buffer; its median, p99 and max."""
        ...

    def clear_colours(self) -> None:
        """The colour buffer back to the legend's low end (no error known yet)."""
        ...

    def paint(self) -> np.ndarray | None:
        """The colour buffer for the renderer's per-body attribute: None when the backend wrote the GL
        buffer itself (CUDA-GL interop), else float32 (N,) to upload."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class ABResult:
    """One A/B comparison: both kernels' force times at the same states and how far apart they are."""

    kernel_a: str
    kernel_b: str
    n: int
    k: int  # bodies sampled for the difference
    a_ms: float  # A's force time per evaluation, median of its last steps (nan: no step yet)
    b_ms: float  # B's, median of its last evaluations
    median: float  # |a_A - a_B| / |a_B| over the sample: median
    p99: float  # its 99th percentile
    max: float  # its worst body
    sim_time: float  # the state of the latest evaluation

    @property
    def ratio(self) -> float:
        """B's time over A's (nan while A has no time)."""
        return self.b_ms / self.a_ms if self.a_ms > 0 else math.nan

    def line(self) -> str:
        """One line for a report: both times, B / A and the difference."""
        a = f"{self.a_ms:.3f} ms" if self.a_ms > 0 else "no step timed"
        return (
            f"A/B at N = {self.n:,}: {self.kernel_a} {a} vs {self.kernel_b} {self.b_ms:.3f} ms a force "
            f"evaluation (B/A {self.ratio:.2f}x); |a_A - a_B| / |a_B| over {self.k:,} bodies: median "
            f"{self.median:.2e}, p99 {self.p99:.2e}, max {self.max:.2e}"
        )


class ABCompare:
    """A/B's cadence and numbers (see the module doc); `kernel_b` None: nothing to compare."""

    def __init__(
        self, k: int = DEFAULT_K, every: int = DEFAULT_EVERY, seed: int = 0, window: int = TIMING_WINDOW
    ):
        if k < 1:
            raise ValueError(f"k must be at least 1, not {k}")
        self.k = int(k)
        self.every = max(int(every), 1)
        self.rng = np.random.default_rng(seed)
        self.kernel_b: str | None = None
        self.latest: ABResult | None = None
        self.colour = False  # also write A's per-body error against B into the colour buffer
        self.colours_written = False  # the latest evaluation wrote them
        self._a_ms: deque[float] = deque(maxlen=window)
        self._b_ms: deque[float] = deque(maxlen=window)
        self._a_kernel: str | None = None
        self._seen: StepTimings | None = None
        self._key: tuple | None = None
        self._key_a: tuple | None = None  # what A's times were measured with
        self._a_fresh: float | None = None  # A's time observed since the last tick
        self._sim_time: float | None = None
        self._frames = 0
        self.ms = 0.0  # what the last evaluating tick cost (wall time: B, the sample, the colours)

    def reset(self) -> None:
        """Forget the numbers, A's times too (the next tick evaluates at once)."""
        self._a_ms.clear()
        self._restart()

    def _restart(self) -> None:
        self.latest, self._key, self._sim_time, self._frames = None, None, None, 0
        self._b_ms.clear()
        self.colours_written = False

    def observe_step(self, timings: StepTimings | None) -> None:
        """A's force time per evaluation from a step's timings (each StepTimings counted once)."""
        if timings is None or timings is self._seen:
            return
        self._seen = timings
        if timings.kernel != self._a_kernel:
            self._a_kernel = timings.kernel
            self._a_ms.clear()
        if timings.force_evals > 0 and timings.force_ms > 0:
            self._a_fresh = timings.force_ms / timings.force_evals
            self._a_ms.append(self._a_fresh)

    def a_ms(self, kernel: str) -> float:
        """A's median force time per evaluation of `kernel` over its last steps (nan: none timed)."""
        return float(np.median(self._a_ms)) if self._a_ms and self._a_kernel == kernel else math.nan

    def tick(self, ops: CompareOps, key: tuple, sim_time: float, n: int) -> ABResult | None:
        """B evaluated at the current state when due (`key`: what both kernels' a(x) depend on, A's name
        first); the new result, or None when nothing was evaluated."""
        t0 = time.perf_counter()
        result = self._tick(ops, key, sim_time, n)
        if result is not None:
            self.ms = (time.perf_counter() - t0) * 1e3
        return result

    def _tick(self, ops: CompareOps, key: tuple, sim_time: float, n: int) -> ABResult | None:
        if self.kernel_b is None or n == 0:
            return None
        fresh, self._a_fresh = self._a_fresh, None
        if key != self._key_a:  # A's kernel, N, tunables or the physics: its times are of another run,
            self._a_ms.clear()  # but the step of this frame's already ran with them
            if fresh is not None:
                self._a_ms.append(fresh)
            self._key_a = key
        key = (*key, self.kernel_b, self.colour)
        if key != self._key:
            self._restart()
            self._key = key
        elif sim_time == self._sim_time:
            return None  # the state B was last evaluated at
        else:
            self._frames += 1
            if self._frames % self.every:
                return None
        self._sim_time = sim_time
        self._b_ms.append(float(ops.evaluate_other(self.kernel_b)))
        rows = sample_rows(n, self.k, self.rng)
        a, b = ops.sample(rows)
        diff = error_summary(a, b)
        if self.colour:
            ops.colour_other()
        self.colours_written = self.colour
        kernel_a = str(key[0])
        self.latest = ABResult(
            kernel_a=kernel_a,
            kernel_b=self.kernel_b,
            n=int(n),
            k=int(rows.size),
            a_ms=self.a_ms(kernel_a),
            b_ms=float(np.median(self._b_ms)),
            median=diff["median"],
            p99=diff["p99"],
            max=diff["max"],
            sim_time=float(sim_time),
        )
        return self.latest
