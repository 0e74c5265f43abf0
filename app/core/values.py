"""Typed values: an int from a set, a float in a range, a choice of texts, and the interval test they and
the scene settings share. A kernel's tunables are these (app/engine/forces.py KernelRecord.tunables; the
panel shows a combo or a slider for each), and the settings table (app/model/config.py `Field`) checks
its numbers with the same `within`, so a range means one thing everywhere."""

from __future__ import annotations

import math
from dataclasses import dataclass

from app.core.errors import ConfigError


def within(number: float, lo: float, hi: float, lo_open: bool = False) -> bool:
    """lo <= number <= hi (lo < number with lo_open); False for NaN."""
    low_ok = number > lo if lo_open else number >= lo
    return bool(low_ok and number <= hi)


# --- typed values ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class IntChoice:
    """An integer from a fixed set (block size, bodies per thread). The panel shows a combo."""

    name: str
    values: tuple[int, ...]
    default: int
    doc: str = ""
    read_when: tuple[str, tuple] | None = None  # (another tunable, its values under which this one is read)

    def validate(self, value, owner: str = "") -> int:
        try:
            number = int(value)
        except (TypeError, ValueError):
            number = None
        if number is None or number != value or number not in self.values:
            allowed = ", ".join(map(str, self.values))
            raise ConfigError(f"{_key(owner, self.name)}: {value!r} is not one of {allowed}")
        return number

    def describe(self) -> str:
        return f"one of {', '.join(map(str, self.values))}"


@dataclass(frozen=True)
class FloatRange:
    """A float in [lo, hi] (or (lo, hi] with lo_open): the tree's θ. The panel shows a slider."""

    name: str
    lo: float
    hi: float
    default: float
    doc: str = ""
    lo_open: bool = False
    log: bool = False  # the slider moves logarithmically
    read_when: tuple[str, tuple] | None = None  # (another tunable, its values under which this one is read)

    def validate(self, value, owner: str = "") -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        if isinstance(value, bool) or not within(number, self.lo, self.hi, self.lo_open):
            raise ConfigError(f"{_key(owner, self.name)}: {value!r} is not in {self.describe()}")
        return number

    def describe(self) -> str:
        return f"{'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}]"


@dataclass(frozen=True)
class Choice:
    """One of a few named options. The panel shows a combo."""

    name: str
    options: tuple[str, ...]
    default: str
    doc: str = ""
    read_when: tuple[str, tuple] | None = None  # (another tunable, its values under which this one is read)

    def validate(self, value, owner: str = "") -> str:
        if value not in self.options:
            raise ConfigError(f"{_key(owner, self.name)}: {value!r} is not one of {', '.join(self.options)}")
        return value

    def describe(self) -> str:
        return f"one of {', '.join(self.options)}"


def _key(owner: str, name: str) -> str:
    return f"{owner}.{name}" if owner else name
