"""How fast a refitted tree's walk grows, and what rebuild rule that asks for (docs/tree.md, "The GPU refit"):
the CPU twin's interaction counts, which are the GPU tree's bit for bit (tests/test_tree_gpu_refit.py).

    .venv/bin/python bench/tree_refit_growth.py --scene collision --n 1048576 --theta 0.5 --steps 12

Method: one leapfrog (KDK) trajectory of the scene (its own seed, softening and dt unless --softening and
--dt say otherwise; N from --n) in float64, driven by a build every evaluation (rebuild_every = 1). At each
evaluation a second evaluator that built at evaluation 0 and only refits since (rebuild_every = 16) is
evaluated at the same float32 positions. Per evaluation k since that build it prints the interactions per
body of both, the growth g_k = I_refit / I_build - 1, and the share of cells whose cube the refit grew.

Then the cost model, per step, in units of one walk after a build: a build evaluation costs 1 + b (b: what
a build costs beyond a refit, as a fraction of the walk: --build-cost, from a GPU's stage times), a refit
evaluation k costs 1 + g_k. A fixed rebuild_every = R costs (b + sum_{k<R} (1 + g_k)) / R per step, against
1 + b for a build every step. Two online rules are evaluated on the same growth curve:
- accumulated excess: rebuild once the walks since the build have together grown by more than one build
  costs, sum_{k>=1} g_k >= b (GOTHIC's rule, with interactions for times);
- predicted marginal against mean: rebuild when the next walk's growth, extrapolated from the last two
  (g_k + (g_k - g_{k-1})), reaches the cycle's mean extra cost including this walk, (b + sum_{j<=k} g_j) /
  (k + 1): the optimal-stopping condition of a renewal cycle whose cost grows (one more refit past that
  point raises the mean cost per step), looked at one evaluation ahead so as not to pay for the refit
  that shows it.
The curve is that of the first cycle after evaluation 0, assumed to repeat.
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere in the checkout

from tree_refit_error import RECORD, leapfrog_positions, scene_start  # noqa: E402 (bench/, this folder)

from app.engine.forces import Span  # noqa: E402
from app.model.physics import Physics  # noqa: E402

FIXED = (1, 2, 4, 8, 16)


def growth_curve(
    scene_name: str, n: int, theta: float, steps: int, softening: float | None, dt: float | None, out=print
) -> tuple[list[float], Physics]:
    """g_k for k = 0 .. steps (g_0 = 0: the build itself), printing a row per evaluation."""
    bodies, physics = scene_start(scene_name, n, softening, dt)
    n = bodies.n
    refitted = RECORD.policy.evaluator(RECORD, physics)
    refitted.set_tunables(theta=theta, rebuild_every=16)
    everyone = Span.all(n)
    out(f"# {scene_name}, N = {n:,}, theta {theta:g}, softening {physics.softening:g}, dt {physics.dt:g}")
    out(" k  build I/n  refit I/n   growth  cells grown")
    curve = []
    start = time.perf_counter()
    for k, pos, built in leapfrog_positions(bodies, physics, theta, steps):
        i_refit = refitted.evaluate(pos, np.zeros_like(pos), everyone, everyone).interactions
        if k == 0:  # the build both start from
            curve.append(0.0)
            continue
        curve.append(i_refit / built.interactions - 1.0)
        grown = refitted.last_grown / refitted.last_tree.ncell
        out(
            f"{k:2d} {built.interactions / n:10.1f} {i_refit / n:10.1f} {curve[-1]:+8.3f} "
            f"{100 * grown:10.1f}%"
        )
    out(f"# {steps} steps in {time.perf_counter() - start:.0f} s")
    return curve, physics


def fixed_cost(curve: list[float], every: int, b: float) -> float:
    """Mean cost per step of rebuild_every = `every` (units: one walk after a build)."""
    return (b + sum(1.0 + g for g in curve[:every])) / every


def excess_rule_cycle(curve: list[float], b: float) -> int:
    """The cycle length the accumulated-excess rule gives: the build evaluation, then refits until the
    walks' growth since the build adds up to at least b (the evaluation after that builds)."""
    total = 0.0
    for k, g in enumerate(curve[1:], start=1):
        total += g
        if total >= b:
            return k + 1
    return len(curve)


def marginal_rule_cycle(curve: list[float], b: float) -> int:
    """The cycle length of the predicted-marginal rule in steady state (every cycle on this curve): after
    refit k, the next build comes at k + 1 if the extrapolated next growth 2 g_k - g_{k-1} reaches
    (b + sum_{j<=k} g_j) / (k + 1); at k = 0 that is g_1 >= b, g_1 known from the cycle before."""
    if len(curve) > 1 and curve[1] >= b:
        return 1
    total = 0.0
    for k in range(1, len(curve)):
        total += curve[k]
        if 2 * curve[k] - curve[k - 1] >= (b + total) / (k + 1):
            return k + 1
    return len(curve)


def cost_lines(curve: list[float], b: float) -> list[str]:
    base = 1.0 + b
    lines = [f"cost per step against a build every step (b = {b:g} of a walk):"]
    for every in FIXED:
        if every <= len(curve):
            lines.append(f"  rebuild_every = {every:2d}: {fixed_cost(curve, every, b) / base:.3f}")
    for name, rule in (
        ("accumulated excess >= b", excess_rule_cycle),
        ("predicted growth >= mean extra cost", marginal_rule_cycle),
    ):
        cycle = rule(curve, b)
        capped = "" if cycle < len(curve) else f" (the curve's end: {len(curve) - 1} refits measured)"
        lines.append(
            f"  {name}: a build every {cycle} evaluations{capped}, {fixed_cost(curve, cycle, b) / base:.3f}"
        )
    best = min(range(1, len(curve) + 1), key=lambda e: fixed_cost(curve, e, b))
    lines.append(f"  best fixed cycle on this curve: {best}, {fixed_cost(curve, best, b) / base:.3f}")
    return lines


def main(argv=None) -> int:
    example = (
        "example:\n  .venv/bin/python bench/tree_refit_growth.py --scene collision --n 1048576 "
        "--theta 0.5 --steps 12 --build-cost 0.15"
    )
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog=example,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--scene", default="collision")
    ap.add_argument("--n", type=int, default=262144)
    ap.add_argument("--theta", type=float, default=0.5)
    ap.add_argument("--steps", type=int, default=12, help="evaluations after the build (at least 1)")
    ap.add_argument("--softening", type=float, default=None, help="instead of the scene's")
    ap.add_argument("--dt", type=float, default=None, help="instead of the scene's")
    ap.add_argument(
        "--build-cost",
        type=float,
        action="append",
        default=None,
        help="b: a build's cost beyond a refit, as a fraction of a walk (repeatable; default "
        "0.15, the H200 at 1M: about 0.9 ms of a 6 ms walk)",
    )
    args = ap.parse_args(argv)
    if args.steps < 1 or args.n < 2:
        ap.error("--steps must be >= 1 and --n >= 2")
    # each row flushed as it is measured: a long run shows its progress, and Ctrl-C keeps what it printed
    curve, _ = growth_curve(
        args.scene, args.n, args.theta, args.steps, args.softening, args.dt, out=partial(print, flush=True)
    )
    for b in args.build_cost or [0.15]:
        print("\n".join(cost_lines(curve, b)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
