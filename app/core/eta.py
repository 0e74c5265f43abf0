"""Telling the time of a long loop. A progress bar (tqdm) shows its estimate only on a terminal; a run
into a log file, or a `--still 1e9` that advances for years, would say nothing. `Eta` says it once (a log
line: on stderr, hidden by -q): after the loop has run AFTER_S seconds, the time the rest will take at
the rate so far, when that is more than WORTH_S, with how to stop it and what stopping keeps.

    eta = Eta(total=frames, unit="frame", stops="Ctrl-C stops and keeps the frames so far")
    for done in range(1, frames + 1):
        ...                      # one frame
        eta.update(done)         # one line, once, if the rest is long
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

AFTER_S = 2.0  # run this long before estimating the rest (the first steps compile, warm caches)
WORTH_S = 60.0  # say the estimate when the rest takes longer than this


def duration(seconds: float) -> str:
    """'19.0 years', '1.7 h', '3.2 min', '45 s'."""
    for unit, size in (("years", 365.25 * 86400), ("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:,.1f} {unit}"
    return f"{seconds:.0f} s"


def eta_line(done: int, total: int, elapsed: float, unit: str, lead: str = "", stops: str = "") -> str | None:
    """The line for `done` of `total` units after `elapsed` seconds: None before AFTER_S, when done, or
    when the rest at the rate so far is WORTH_S or less."""
    if elapsed < AFTER_S or done <= 0 or done >= total:
        return None
    rest = (total - done) * elapsed / done
    if rest <= WORTH_S:
        return None
    rate = f"{done / elapsed:,.1f} {unit}s/s"
    tail = f"; {stops}" if stops else ""
    return f"{lead}{total - done:,} {unit}s to go at {rate} take about {duration(rest)} more{tail}"


class Eta:
    """`update(done)` after each unit of a loop of `total`; says `eta_line` once (to `say`: the log)."""

    def __init__(
        self,
        total: int,
        unit: str,
        lead: str = "",
        stops: str = "",
        say: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.total, self.unit, self.lead, self.stops = int(total), unit, lead, stops
        self.say = say or logging.getLogger("nbody-live").info
        self.clock = clock
        self.t0 = clock()
        self.told = False

    def update(self, done: int) -> None:
        if self.told:
            return
        line = eta_line(done, self.total, self.clock() - self.t0, self.unit, self.lead, self.stops)
        if line is not None:
            self.told = True
            self.say(line)
