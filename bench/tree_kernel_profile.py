"""Per-kernel GPU time of the tree's evaluation (on the GPU machine): every launch of the tree's host code
is bracketed by CUDA events, and their durations are summed per kernel over one evaluation of a scene's
initial positions (after warm-up evaluations), beside the stage split the bench reports.

    python3 bench/tree_kernel_profile.py [--n 1048576,8388608] [--scene plummer] [--theta 0.6]

The events between launches add a little GPU time of their own: the stage figures here run slightly above
the bench's. Results of a run on an H200: bench/results/h200-2026-11-23-tree-kernel-profile.txt, quoted in
docs/tree.md (the build's share by kernel).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict

import numpy as np
from tree_device import (  # first: puts the checkout on sys.path
    open_tree,
    scene_arguments,
    scene_positions,
    tree_evaluator,
    upload,
)

import app.backends.cuda.tree as tree_module
from app.backends.cuda import tree_build, tree_refit, tree_walk
from app.engine.forces import Span

WARMUP = 5
LAUNCHING = (tree_module, tree_build, tree_walk, tree_refit)  # the evaluator's layers that call `launch`


def profile(dev, record, pos: np.ndarray, theta: float) -> tuple[dict, dict, int]:
    """({kernel: [launches, ms]}, stage ms, levels) of the last of WARMUP + 1 evaluations."""
    names, marks = {}, []
    plain_fn, plain_walk, plain_launch = (
        tree_module.TreeEvaluator._fn,
        tree_module.TreeEvaluator._walk,
        tree_module.launch,  # (every layer's is policies.launch)
    )

    def named_fn(self, symbol):
        fn = plain_fn(self, symbol)
        names[id(fn)] = symbol
        return fn

    def named_walk(self, *args, **kw):
        fn = plain_walk(self, *args, **kw)
        names[id(fn)] = "walk"
        return fn

    def timed_launch(fn, grid, block, stream, *args, **kw):
        before, after = dev.drv.Event(), dev.drv.Event()
        before.record(stream)
        plain_launch(fn, grid, block, stream, *args, **kw)
        after.record(stream)
        marks.append((names.get(id(fn), "?"), before, after))

    tree_module.TreeEvaluator._fn, tree_module.TreeEvaluator._walk = named_fn, named_walk
    for module in LAUNCHING:
        module.launch = timed_launch
    try:
        ev = tree_evaluator(record, dev, theta)
        n = pos.shape[0]
        with dev.scope:
            p_dev, a_dev = upload(dev, pos, "profile")
            stream = dev.drv.Stream()
            for _ in range(WARMUP + 1):
                marks.clear()
                ev.evaluate(p_dev, a_dev, Span.all(n), Span.all(n), stream)
                stages = ev.stage_ms()
            totals = defaultdict(lambda: [0, 0.0])
            for name, before, after in marks:
                totals[name][0] += 1
                totals[name][1] += after.time_since(before)
        return dict(totals), stages, len(ev.levels) - 1
    finally:
        tree_module.TreeEvaluator._fn, tree_module.TreeEvaluator._walk = plain_fn, plain_walk
        for module in LAUNCHING:
            module.launch = plain_launch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", default="1048576,8388608", help="comma-separated body counts")
    scene_arguments(p)
    args = p.parse_args(argv)
    dev, record = open_tree("tree_kernel_profile")
    try:
        for n in (int(v) for v in args.n.split(",")):
            pos = scene_positions(args.scene, n)
            totals, stages, levels = profile(dev, record, pos, args.theta)
            print(
                f"{args.scene} N = {n:,}, theta {args.theta:g}: {levels} levels; stages (ms) "
                + " · ".join(f"{k} {v:.3f}" for k, v in stages.items())
            )
            for name, (count, ms) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
                print(f"  {name:22s} {count:3d} launches  {ms:8.3f} ms")
            every = sum(v[1] for v in totals.values())
            print(f"  {'all kernels':22s}               {every:8.3f} ms", flush=True)
    finally:
        dev.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
