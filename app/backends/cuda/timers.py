"""CUDA event pairs around launches, summed per category ('force', 'integrate') per step() call.

Events come from a pool that grows to the largest number of launches one call has needed and is
reused afterwards; `collect()` synchronises on the last event only (events on one stream complete in
order) and sums the elapsed times.
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager


class EventTimer:
    def __init__(self, drv):
        self._drv = drv
        self._pool: list = []
        self._used = 0
        self._pairs: list[tuple[str, object, object]] = []

    def reset(self) -> None:
        self._used = 0
        self._pairs.clear()

    def _event(self):
        if self._used == len(self._pool):
            self._pool.append(self._drv.Event())
        ev = self._pool[self._used]
        self._used += 1
        return ev

    @contextmanager
    def time(self, category: str):
        """Record an event before and after the launches in the body (not recorded if it raises)."""
        start, end = self._event(), self._event()
        start.record()
        yield
        end.record()
        self._pairs.append((category, start, end))

    def collect(self) -> dict[str, float]:
        """Milliseconds per category of everything timed since reset(); blocks until the last event."""
        totals: dict[str, float] = defaultdict(float)
        if self._pairs:
            self._pairs[-1][2].synchronize()
            for category, start, end in self._pairs:
                totals[category] += end.time_since(start)
        return dict(totals)

    def release(self) -> None:
        self.reset()
        self._pool.clear()
