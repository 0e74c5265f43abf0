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


AUTO = "auto"  # a FloatRange value that follows N (FloatRange.by_n)


@dataclass(frozen=True)
class FloatRange:
    """A float in [lo, hi] (or (lo, hi] with lo_open): the tree's θ. The panel shows a slider.

    With `by_n`, the value may also be AUTO ("auto"), which means a number that depends on the body
    count: by_n's last step (from N, number) with from N <= N. Where the right number falls as N grows
    (the relative test's error at one alpha falls with N: docs/tree.md), the default can be auto, and
    only the code that knows N (the walk: its sources) turns it into a number (`value_at`)."""

    name: str
    lo: float
    hi: float
    default: float | str
    doc: str = ""
    lo_open: bool = False
    log: bool = False  # the slider moves logarithmically
    read_when: tuple[str, tuple] | None = None  # (another tunable, its values under which this one is read)
    by_n: tuple[tuple[int, float], ...] = ()  # auto's steps: (from N bodies, number), the first from 0

    def __post_init__(self):
        if self.by_n:
            starts = [start for start, _ in self.by_n]
            if starts[0] != 0 or starts != sorted(set(starts)):
                raise ValueError(f"{self.name}: by_n must start at N = 0 and rise: {self.by_n}")
            for _, number in self.by_n:
                self.validate(number)
        if self.default == AUTO and not self.by_n:
            raise ValueError(f"{self.name}: the default is {AUTO!r} but by_n gives it no numbers")

    def validate(self, value, owner: str = "") -> float | str:
        if self.by_n and value == AUTO:
            return AUTO
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        if isinstance(value, bool) or not within(number, self.lo, self.hi, self.lo_open):
            raise ConfigError(f"{_key(owner, self.name)}: {value!r} is not in {self.describe()}")
        return number

    def value_at(self, value: float | str, n: int) -> float:
        """The number `value` (validated) stands for at N = n bodies: itself, or auto's step for n."""
        if value != AUTO:
            return float(value)
        return next(number for start, number in reversed(self.by_n) if n >= start)

    def describe(self) -> str:
        interval = f"{'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}]"
        return f"{interval} or {AUTO}" if self.by_n else interval

    def describe_auto(self) -> str:
        """'0.001; 0.002 from 1,048,576 bodies; 0.003 from 8,388,608': what auto is (empty without by_n)."""
        steps = [f"{number:g}" if start == 0 else f"{number:g} from {start:,}" for start, number in self.by_n]
        if len(steps) > 1:
            steps[1] += " bodies"
        return "; ".join(steps)


def default_text(spec) -> str:
    """A tunable's default as --help, `info` and the panel's tooltip say it ('0.5'; 'auto: 0.001; ...')."""
    if isinstance(spec, FloatRange) and spec.default == AUTO:
        return f"{AUTO}: {spec.describe_auto()}"
    return str(spec.default)


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
