"""The panel's "Benchmark all kernels": each available kernel in a fresh backend on a copy of one state.

    bench = Benchmark(steps=10, n=backend.n, pending=[records...], state=backend.state(), physics=...)
    res = bench.run_next()                    # one kernel per frame keeps the window alive

The rates come from each kernel's own timer and its own interaction count (StepTimings); a kernel that
evaluates fewer pairs than N² (a tree) also has its "equivalent all-pairs" rate.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from app.backends import backend_class
from app.engine.forces import KernelRecord
from app.engine.timing import StepTimings
from app.model.bodies import Bodies
from app.model.physics import Physics


@dataclass
class BenchResult:
    """One kernel of a benchmark: the timed steps' StepTimings, or why it failed."""

    kernel: str
    n: int
    steps: int
    timings: StepTimings | None = None
    wall_ms: float = 0.0
    error: str = ""

    @property
    def interactions_per_s(self) -> float:
        return self.timings.interactions_per_s if self.timings is not None else 0.0

    @property
    def pair_equivalent_per_s(self) -> float:
        """The "equivalent all-pairs" rate (N_targets x N_sources per evaluation over the same time)."""
        return self.timings.pair_equivalent_per_s if self.timings is not None else 0.0


@dataclass
class Benchmark:
    """`pending` kernels, each in a fresh backend instance loaded with a copy of `state`."""

    steps: int
    n: int
    pending: list[KernelRecord]
    state: Bodies
    physics: Physics
    results: list[BenchResult] = field(default_factory=list)

    def __post_init__(self):
        self.total = len(self.pending)

    @property
    def running(self) -> bool:
        return bool(self.pending)

    @property
    def progress(self) -> float:
        return len(self.results) / self.total if self.total else 1.0

    def run_next(self) -> BenchResult | None:
        """Time the next pending kernel: one warm-up step (compiles, first launches), then `steps` steps."""
        if not self.pending:
            return None
        rec = self.pending.pop(0)
        res = BenchResult(kernel=rec.name, n=self.n, steps=self.steps)
        t0 = time.perf_counter()
        b = None
        try:
            b = backend_class(rec.backend)()
            b.load(self.state.copy(), self.physics, rec.name)
            b.step(1)
            res.timings = b.step(self.steps)
        except Exception as e:  # noqa: BLE001 - one kernel failing does not stop the others
            res.error = f"{type(e).__name__}: {e}"
        finally:
            if b is not None:
                b.close()
        res.wall_ms = (time.perf_counter() - t0) * 1e3
        self.results.append(res)
        return res

    def summary(self) -> str:
        return "benchmark done: " + ", ".join(
            f"{r.kernel} {r.interactions_per_s / 1e9:.2f} G/s" for r in self.results if not r.error
        )
