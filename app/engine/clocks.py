"""The clocks a step is measured with, one interface: `reset()`, `with timer.time("force"): ...`,
`collect()` (and `collect_lagged()`, `discard()`, `release()`). `HostTimer` (perf_counter: the CPU
backend's) and `EventTimer` (CUDA event pairs: a GPU's); the integrator brackets its work with whichever
the backend hands it. Importing this module imports no pycuda: `EventTimer` is handed the driver module.
"""

from __future__ import annotations

import time as _time
from collections import defaultdict, deque
from contextlib import contextmanager
from typing import Any


class HostTimer:
    """perf_counter brackets summed per category: the CPU backend's clock, EventTimer's interface."""

    def __init__(self):
        self._totals: dict[str, float] = defaultdict(float)

    def reset(self) -> None:
        self._totals = defaultdict(float)

    @contextmanager
    def time(self, category: str):
        t = _time.perf_counter()
        try:
            yield
        finally:
            self._totals[category] += (_time.perf_counter() - t) * 1e3

    def collect(self) -> dict[str, float]:
        out, self._totals = dict(self._totals), defaultdict(float)
        return out

    def collect_lagged(self) -> dict[str, float]:
        return self.collect()

    def discard(self) -> None:
        self.reset()

    def release(self) -> None:
        self.reset()


# --- CUDA events ---------------------------------------------------------------------------------------
# Event pairs around launches, summed per category ('force', 'integrate') per step() call. Two ways to
# read them:
# - `collect()` blocks until the batch just recorded has finished: exact numbers for this call, what
#   `bench`, `validate` and the tests use.
# - `collect_lagged()` never waits: it returns the newest *earlier* batch that the GPU has finished
#   (usually the previous frame's). The live viewer uses it, because a CPU that waits on the GPU every
#   frame leaves the GPU idle while Python submits the draw — that idle time was most of the per-frame
#   overhead measured on the H200 (1.45 ms at N = 65,536).
# Events come from a free list and return to it once their batch has been read.


MAX_PENDING = 4  # batches the GPU may fall behind before collect_lagged() waits for the oldest


class EventTimer:
    def __init__(self, drv):
        self._drv = drv
        self._free: list = []
        self._batch: list[tuple[str, Any, Any]] = []
        self._pending: deque[list[tuple[str, Any, Any]]] = deque()

    def reset(self) -> None:
        """Start a new batch (the previous one, if not collected, is dropped)."""
        self._recycle(self._batch)
        self._batch = []

    def _event(self):
        return self._free.pop() if self._free else self._drv.Event()

    def _recycle(self, batch) -> None:
        for _, start, end in batch:
            self._free += [start, end]

    @contextmanager
    def time(self, category: str):
        """Record an event before and after the launches in the body (not recorded if it raises)."""
        start = self.start()
        try:
            yield
        except BaseException:
            self._free.append(start)
            raise
        self.stop(category, start)

    def start(self):
        """An event recorded now, for `stop`: brackets work issued in a group that `with time()` cannot
        wrap (one NCCL group over several GPUs)."""
        event = self._event()
        event.record()
        return event

    def stop(self, category: str, start) -> None:
        end = self._event()
        end.record()
        self._batch.append((category, start, end))

    @staticmethod
    def _totals(batch) -> dict[str, float]:
        totals: dict[str, float] = defaultdict(float)
        for category, start, end in batch:
            totals[category] += end.time_since(start)
        return dict(totals)

    def collect(self) -> dict[str, float]:
        """Milliseconds per category of the batch just recorded; blocks until its last event."""
        batch, self._batch = self._batch, []
        if not batch:
            return {}
        batch[-1][2].synchronize()  # one stream: every earlier event is complete too
        while self._pending:
            self._recycle(self._pending.popleft())
        totals = self._totals(batch)
        self._recycle(batch)
        return totals

    def collect_lagged(self) -> dict[str, float] | None:
        """Totals of the newest finished earlier batch, without waiting (None: none finished yet)."""
        if self._batch:
            self._pending.append(self._batch)
            self._batch = []
        if len(self._pending) > MAX_PENDING:  # back-pressure: never queue unbounded GPU work
            self._pending[0][-1][2].synchronize()
        newest = None
        while self._pending and self._pending[0][-1][2].query():
            done = self._pending.popleft()
            if newest is not None:
                self._recycle(newest)
            newest = done
        if newest is None:
            return None
        totals = self._totals(newest)
        self._recycle(newest)
        return totals

    def discard(self) -> None:
        """Drop every batch not yet collected, the pending ones too (what they measured no longer
        applies: a multi-device share changed)."""
        self.reset()
        while self._pending:
            self._recycle(self._pending.popleft())

    def release(self) -> None:
        self.discard()
        self._free.clear()
