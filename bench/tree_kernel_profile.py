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
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere in the checkout

import app.backends.cuda.tree as tree_module  # noqa: E402
from app.backends import backend_class  # noqa: E402
from app.bench import bench_bodies, check_scene  # noqa: E402
from app.forces import Span  # noqa: E402
from app.physics import Physics  # noqa: E402

WARMUP = 5


def profile(dev, record, pos: np.ndarray, theta: float) -> tuple[dict, dict, int]:
    """({kernel: [launches, ms]}, stage ms, levels) of the last of WARMUP + 1 evaluations."""
    names, marks = {}, []
    plain_fn, plain_walk, plain_launch = (tree_module.TreeEvaluator._fn, tree_module.TreeEvaluator._walk,
                                          tree_module.launch)

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
    tree_module.launch = timed_launch
    try:
        ev = record.policy.evaluator(record, dev, {})
        ev.set_physics(Physics(softening=0.01))
        ev.set_tunables(theta=theta)
        n = pos.shape[0]
        with dev.scope:
            p_dev, a_dev = dev.scratch("profile-pos", 16 * n), dev.scratch("profile-acc", 16 * n)
            dev.drv.memcpy_htod(p_dev, pos)
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
        tree_module.launch = plain_launch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", default="1048576,8388608", help="comma-separated body counts")
    p.add_argument("--scene", default="plummer", help="a bench scene (default plummer)")
    p.add_argument("--theta", type=float, default=0.6, help="opening angle (default 0.6)")
    args = p.parse_args(argv)
    cuda = backend_class("cuda")
    if cuda.why_not():
        print(f"tree_kernel_profile: needs the CUDA backend: {cuda.why_not()}", file=sys.stderr)
        return 2
    from app.backends.cuda.device import CudaDevice
    from app.backends.cuda.registry import RECORDS

    record = next(r for r in RECORDS if r.name == "tree")
    dev = CudaDevice(0)
    try:
        for n in (int(v) for v in args.n.split(",")):
            pos = bench_bodies(n, scene=check_scene(args.scene)).pos4(np.float32)
            totals, stages, levels = profile(dev, record, pos, args.theta)
            print(f"{args.scene} N = {n:,}, theta {args.theta:g}: {levels} levels; stages (ms) "
                  + " · ".join(f"{k} {v:.3f}" for k, v in stages.items()))
            for name, (count, ms) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
                print(f"  {name:22s} {count:3d} launches  {ms:8.3f} ms")
            every = sum(v[1] for v in totals.values())
            print(f"  {'all kernels':22s}               {every:8.3f} ms", flush=True)
    finally:
        dev.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
