"""What a step cost: `StepTimings` (what `backend.step(n)` cost, in the backend's own clock, and how many
interactions the force evaluations did: the force evaluator counts them, N² is never assumed here), the
rate helpers, and the named entries of `StepTimings.extra` (a force method's stages, each device's and
each rank's force time). The clocks that measure it are engine/clocks.py; the per-frame log is
render/frames.py.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field

from app.engine.forces import STAGES

log = logging.getLogger(__name__)


FLOPS_PER_INTERACTION = 20  # the GPU Gems 3 / CUDA samples convention for GFLOP/s figures


def rate(count: float, ms: float) -> float:
    """count per second from a count and milliseconds (0 when nothing was timed)."""
    return count / (ms * 1e-3) if ms > 0 else 0.0


@dataclass
class StepTimings:
    """What `steps` steps cost, in milliseconds of the backend's own clock.

    `interactions` is what the force evaluations of these steps did, as their evaluator counted it
    (body-body plus body-cell for a tree); `pair_equivalent` is N_targets x N_sources per evaluation,
    the all-pairs work the same answer would have cost (equal to `interactions` for all-pairs kernels).
    """

    kernel: str
    steps: int
    n: int
    force_ms: float = 0.0
    integrate_ms: float = 0.0
    map_ms: float = 0.0
    unmap_ms: float = 0.0
    interactions: int = 0
    pair_equivalent: int = 0
    force_evals: int = 0
    body_cell: int = 0  # how many of `interactions` were body-cell (a tree's accepted cells)
    # anything else the backend measured; a force method's stages as "stage:<name>" (`stage_entries`)
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def stages(self) -> dict[str, float]:
        """The force evaluation's time split, ms per stage in stage order ({} when not reported)."""
        return stages_of(self.extra)

    @property
    def devices(self) -> dict[str, float]:
        """Several devices: each device's force ms ("<index> <name>": ms, in device order); {} for one."""
        return devices_of(self.extra)

    @property
    def exchange_ms(self) -> float:
        """Several devices: the time spent exchanging positions between them (0 for one)."""
        return float(self.extra.get(EXCHANGE_KEY, 0.0))

    @property
    def interactions_per_body(self) -> float:
        """Interactions per body and force evaluation (N for all-pairs; far fewer for a tree)."""
        return self.interactions / (self.n * self.force_evals) if self.n and self.force_evals else 0.0

    @property
    def interactions_per_s(self) -> float:
        return rate(self.interactions, self.force_ms)

    @property
    def pair_equivalent_per_s(self) -> float:
        """The "equivalent all-pairs" rate N²/t: labelled as such wherever it is shown."""
        return rate(self.pair_equivalent, self.force_ms)

    @property
    def gflops(self) -> float:
        """GFLOP/s by the 20-flops-per-interaction convention (GPU Gems 3, CUDA samples)."""
        return self.interactions_per_s * FLOPS_PER_INTERACTION * 1e-9


STAGE_PREFIX = "stage:"


def stage_entries(stage_ms: dict[str, float]) -> dict[str, float]:
    """A ForceEvaluator.stage_ms() as StepTimings.extra entries: {"stage:keys": ms, ...}."""
    return {STAGE_PREFIX + name: float(ms) for name, ms in stage_ms.items()}


DEVICE_PREFIX = "device:"
EXCHANGE_KEY = "exchange"


def device_entries(names: list[str], force_ms: list[float], exchange_ms: float) -> dict[str, float]:
    """A multi-device step's per-device force times and exchange time as StepTimings.extra entries."""
    entries = {
        f"{DEVICE_PREFIX}{i} {name}": float(ms)
        for i, (name, ms) in enumerate(zip(names, force_ms, strict=True))
    }
    entries[EXCHANGE_KEY] = float(exchange_ms)
    return entries


def devices_of(extra: dict[str, float]) -> dict[str, float]:
    """The "device:<index> <name>" entries of a StepTimings.extra as {"<index> <name>": ms}, in order."""
    return {k[len(DEVICE_PREFIX) :]: v for k, v in extra.items() if k.startswith(DEVICE_PREFIX)}


def stages_of(extra: dict[str, float]) -> dict[str, float]:
    """The "stage:<name>" entries of a StepTimings.extra as {name: ms}: app.engine.forces.STAGES first, in
    their order, then any other stage (a method's own, e.g. "gather") in the order given."""
    found = {k[len(STAGE_PREFIX) :]: v for k, v in extra.items() if k.startswith(STAGE_PREFIX)}
    rank = {name: i for i, name in enumerate(STAGES)}
    return dict(sorted(found.items(), key=lambda kv: rank.get(kv[0], len(STAGES))))


# StepTimings.extra entries of an MPI job: "rank:<i>:force" and "rank:<i>:exchange" (ms)
RANK_PREFIX = "rank:"


def rank_entries(force_ms, exchange_ms) -> dict[str, float]:
    """Every rank's force and exchange time (ms, indexed by rank) as StepTimings.extra entries."""
    out = {}
    for i, (force, exchange) in enumerate(zip(force_ms, exchange_ms, strict=True)):
        out[f"{RANK_PREFIX}{i}:force"], out[f"{RANK_PREFIX}{i}:exchange"] = float(force), float(exchange)
    return out


def ranks_of(extra: dict[str, float]) -> dict[str, list[float]]:
    """The "rank:<i>:<part>" entries of a StepTimings.extra as {"force": [ms by rank], "exchange": [...]};
    {} for a step of one process."""
    parts: dict[str, dict[int, float]] = defaultdict(dict)
    for key, value in extra.items():
        if key.startswith(RANK_PREFIX):
            rank, part = key[len(RANK_PREFIX) :].split(":", 1)
            parts[part][int(rank)] = value
    return {part: [by_rank[i] for i in sorted(by_rank)] for part, by_rank in parts.items()}


def imbalance(force_ms) -> float:
    """How much longer the slowest rank's force took than the mean: max / mean - 1 (0 = balanced)."""
    force_ms = [float(v) for v in force_ms]
    mean = sum(force_ms) / len(force_ms) if force_ms else 0.0
    return max(force_ms) / mean - 1.0 if mean > 0 else 0.0
