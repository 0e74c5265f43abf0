"""When a tree refitted between builds builds next (docs/tree.md, "The GPU refit" and the rule after it).

A build every `every` evaluations (`fixed`), or (`adaptive`) at most that, and earlier once the refits
stop paying: after refit k, with g_k = I_k / I_0 - 1 the growth of its walk's interactions over the walk
after the build, the next evaluation builds when the next growth, extrapolated from the last two
(2 g_k - g_{k-1}), reaches the cycle's mean extra cost including this walk, (b + sum_{j<=k} g_j) / (k + 1),
b being what a build costs beyond a refit, as a fraction of a walk. That is the optimal-stopping condition
of a cycle whose cost grows, looked at one evaluation ahead (bench/tree_refit_growth.py measured it within
0.7% of the best fixed cycle in five of six cases).

The counts must be the whole evaluation's: one evaluator that walked every target reports its own
(`observe`); under a domain split each device walks its key range only, so the run sums the devices'
counts (MPI ranks: one allreduce a step) and gives every evaluator the same total (Domains.force), and
every device keeps building the same tree.
"""

from __future__ import annotations

# what a build costs beyond a refit, as a fraction of the walk after it: the H200's stage times at 1M
# (keys + sort + build + moments against the refit's levels: about 0.9 of a 6 ms walk; 0.04 at 8M)
BUILD_COST = 0.15
RULES = ("fixed", "adaptive")


class RefitCadence:
    """The build-or-refit decision of one tree evaluator, from the evaluations since its last build."""

    def __init__(self, every: int = 1, rule: str = "fixed", build_cost: float = BUILD_COST):
        if rule not in RULES:
            raise ValueError(f"rule must be one of {RULES}, not {rule!r}")
        self.every, self.rule, self.build_cost = int(every), rule, float(build_cost)
        self.since_build = 0  # evaluations since the last build (0: the last evaluation built)
        self._baseline = 0  # the interactions of the walk after the build
        self._growth: list[float] = []  # g_1 .. g_k of the refits since

    @property
    def refits(self) -> bool:
        """Whether this cadence ever refits (rebuild_every > 1)."""
        return self.every > 1

    def next_builds(self) -> bool:
        """Whether the next evaluation builds (given a tree it could refit)."""
        if self.since_build + 1 >= self.every:
            return True
        if self.rule != "adaptive" or not self._growth:
            return False
        g = self._growth
        k = len(g)
        ahead = 2 * g[-1] - (g[-2] if k > 1 else 0.0)
        return ahead >= (self.build_cost + sum(g)) / (k + 1)

    def built(self) -> None:
        self.since_build = 0
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
