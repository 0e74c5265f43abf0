"""When a tree refitted between builds builds next (docs/tree.md, "The GPU refit" and the rule after it).

A build every `every` evaluations (`fixed`), or (`adaptive`) at most that, and earlier once the refits
stop paying: after refit k, with g_k = I_k / I_0 - 1 the growth of its walk's interactions over the walk
after the build, the next evaluation builds when the next growth, extrapolated from the last two
(2 g_k - g_{k-1}), reaches the cycle's mean extra cost including this walk, (b + sum_{j<=k} g_j) / (k + 1),
b being what a build costs beyond a refit, as a fraction of the walk after it. That is the optimal-stopping
condition of a cycle whose cost grows, looked at one evaluation ahead (bench/tree_refit_growth.py measured
it within 0.7% of the best fixed cycle in five of six cases). Right after a build (k = 0) the condition is
g_1 >= b, with g_1 taken from the last cycle that refitted: where one refit already costs more than a
build (the 8M collision, whose first refit walks ~18% more), the tree builds every evaluation, and tries a
refit again after `every` builds in a row in case the motion calmed.

b is a model of the counts, not a timing, so that a run decides the same builds every time (recordings
stay deterministic) and K devices decide as one: a build costs as much as walking BUILD_FIXED interactions
plus BUILD_PER_BODY interactions per body, fitted to one H200's stage times (keys + sort + build against
the walk's time per interaction, bench/results/h200x2-2026-11-26-fixed.json: 0.45 ms + 0.195 ns per body,
1.45 ps per interaction). That makes b ~0.11 of a 1M Plummer walk at theta 0.6 and ~0.04 at 8M. The model
is one device's: on K devices each builds the whole tree but walks 1/K of it, so a build weighs K times
more there; the rule leaves that out to keep K devices bitwise one device.

The counts must be the whole evaluation's: one evaluator that walked every target reports its own
(`observe`); under a domain split each device walks its key range only, so the run sums the devices'
counts (MPI ranks: one allreduce a step) and gives every evaluator the same total (Domains.force), and
every device keeps building the same tree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from app.core.values import Choice, IntChoice

if TYPE_CHECKING:
    from app.engine.forces import KernelRecord

# what a build costs beyond a refit, in walk interactions (the module's docstring says where from)
BUILD_FIXED = 3.1e8
BUILD_PER_BODY = 135.0
# b as a fixed fraction of a walk instead of the model, for every cadence made after it is set: the tests'
# small clouds (a few thousand bodies, whose walks the model's fixed launch cost dwarfs) set it
BUILD_COST: float | None = None
RULES = ("fixed", "adaptive")
# both trees' cadence tunables, defined once (the records of cpu-tree and tree list them)
REFIT_TUNABLES = (
    IntChoice(
        "rebuild_every",
        (1, 2, 4, 8, 16),
        16,
        doc="build the tree every this many evaluations, refit its moments and cubes between "
        "(docs/tree.md, Refit)",
    ),
    Choice(
        "rebuild_rule",
        RULES,
        "adaptive",
        doc="fixed: a build every rebuild_every evaluations; adaptive: at most that, and earlier once the "
        "refits' walks grow past what a build costs (app/engine/refit_cadence.py)",
        read_when=("rebuild_every", (2, 4, 8, 16)),
    ),
)


class RefitCadence:
    """The build-or-refit decision of one tree evaluator, from the evaluations since its last build."""

    def __init__(self, every: int = 1, rule: str = "fixed", build_cost: float | None = None):
        """`build_cost`: b as a fixed fraction of a walk (the analyses); None: BUILD_COST if set, else the
        model of the counts (BUILD_FIXED, BUILD_PER_BODY)."""
        if rule not in RULES:
            raise ValueError(f"rule must be one of {RULES}, not {rule!r}")
        self.every, self.rule = int(every), rule
        build_cost = BUILD_COST if build_cost is None else build_cost
        self.build_cost = None if build_cost is None else float(build_cost)
        self.since_build = 0  # evaluations since the last build (0: the last evaluation built)
        self._bodies = 0  # N of the last build
        self._baseline = 0  # the interactions of the walk after the build
        self._growth: list[float] = []  # g_1 .. g_k of the refits since
        self._first_growth: float | None = None  # g_1 of the last cycle that refitted
        self._builds_in_a_row = 0  # builds since that cycle, each straight after the one before

    @classmethod
    def of(cls, tunables: dict) -> RefitCadence:
        """The cadence a tree's tunables ask for (rebuild_every, rebuild_rule; the record's defaults when the
        evaluator is made, then whatever set_tunables gives it)."""
        return cls(int(tunables.get("rebuild_every", 1)), tunables.get("rebuild_rule", "fixed"))

    @property
    def refits(self) -> bool:
        """Whether this cadence ever refits (rebuild_every > 1)."""
        return self.every > 1

    def build_fraction(self) -> float:
        """b: what the next build costs beyond a refit, as a fraction of the walk after the last build."""
        if self.build_cost is not None:
            return self.build_cost
        if self._baseline <= 0:
            return float("inf")  # nothing walked: no walk to save, build
        return (BUILD_FIXED + BUILD_PER_BODY * self._bodies) / self._baseline

    def next_builds(self) -> bool:
        """Whether the next evaluation builds (given a tree it could refit)."""
        if self.since_build + 1 >= self.every:
            return True
        if self.rule != "adaptive":
            return False
        g = self._growth
        if not g:  # right after a build: refit only if the last cycle's first refit cost less than a build
            if self._first_growth is None or self._builds_in_a_row + 1 >= self.every:
                return False  # never measured, or `every` builds in a row: try a refit again
            return self._first_growth >= self.build_fraction()
        k = len(g)
        ahead = 2 * g[-1] - (g[-2] if k > 1 else 0.0)
        return ahead >= (self.build_fraction() + sum(g)) / (k + 1)

    def built(self, bodies: int = 0) -> None:
        """The evaluation built the tree of `bodies` bodies."""
        if self._growth:
            self._first_growth, self._builds_in_a_row = self._growth[0], 0
        elif self.since_build == 0 and self._baseline > 0:  # a build straight after a build
            self._builds_in_a_row += 1
        self.since_build = 0
        self._bodies = int(bodies)
        self._baseline = 0
        self._growth = []

    def refitted(self) -> None:
        self.since_build += 1

    def observe(self, interactions: int) -> None:
        """The whole evaluation's interaction count, once per evaluation after it ran: the build's is the
        baseline, a refit's adds its growth."""
        if self.since_build == 0:
            self._baseline = int(interactions)
        elif self._baseline > 0 and len(self._growth) < self.since_build:
            self._growth.append(int(interactions) / self._baseline - 1.0)


def relative_scale(alpha: float, g) -> np.float32:
    """The relative test's alpha / G in float32, which both trees' walks multiply by a group's smallest
    last |a| (`opening = rel`); 0 with no attraction to scale it (G <= 0): then every group tests the
    geometric rows."""
    if not float(g) > 0:
        return np.float32(0.0)
    return np.float32(float(alpha) / float(g))


class CadencedTree:
    """What both tree evaluators (the CPU twin's and the GPU's) do with their RefitCadence: made from the
    tunables (the record's defaults, then set_tunables), the evaluations since the build, and the whole
    evaluation's counts under the adaptive rule. Listed before ForceEvaluator in their bases, whose
    `wants_totals` and `observe_evaluation` it answers."""

    record: KernelRecord
    _tunables: dict
    _cadence: RefitCadence

    def _restart_cadence(self) -> None:
        """A cadence started afresh from the current tunables: the next evaluation that can refit decides
        on nothing measured before. Also the relative opening test's history: until this evaluator has
        evaluated once, the acceleration rows may be another kernel's, settings' or state's, so its groups
        take the geometric test (`relative_scale`), on every backend and device count alike."""
        self._cadence = RefitCadence.of(self._tunables)
        self._evaluated = False

    def _relative_scale(self, g, bodies: int) -> np.float32 | float:
        """The walk's rel_scale (`relative_scale`) for a tree of `bodies` sources (every device's tree
        holds all N, so that alpha's auto gives one number on any device count), or 0 before this
        evaluator's first evaluation since its start, or under another opening test (the geometric
        test)."""
        if not self._evaluated or self._tunables.get("opening") != "rel":
            return 0.0
        return relative_scale(self.alpha_at(bodies), g)

    def alpha_at(self, bodies: int) -> float:
        """The relative test's alpha at N = `bodies`: the tunable's number, or auto's for that N."""
        return float(self.record.value_at("alpha", self._tunables["alpha"], bodies))

    @property
    def since_build(self) -> int:
        """Evaluations since the last build (0: the last evaluation built)."""
        return self._cadence.since_build

    def wants_totals(self) -> bool:
        return self._cadence.rule == "adaptive" and self._cadence.refits

    def observe_evaluation(self, interactions: int) -> None:
        self._cadence.observe(interactions)
