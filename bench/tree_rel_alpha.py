"""The relative opening test's error and work against N on the CPU twin: what the default alpha must hold.

    python3 bench/tree_rel_alpha.py [--n 1000,4096,16384,81920] [--alpha 0.001,0.002] [--theta 0.5]

For each N and scene (the bench's seeded bodies, bench physics ε = 0.01), the tree `cpu-tree` evaluates a(x)
twice with the same positions: once to give the relative test its last accelerations (its first
evaluation takes the cube test at theta), then the measured one. Printed per setting: interactions a body
and the median / p99 / max relative error of up to 2,048 targets against the float64 all-pairs sum. The
cube test at --theta is the row compared with (the geometric default before the relative one). The twin's
lists are the GPU's bit for bit (tests/test_tree_gpu.py), so the counts are the GPU walk's too.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    ap.add_argument("--n", default="1000,4096,16384,81920", help="body counts (comma separated)")
    ap.add_argument("--alpha", default="0.001,0.0015,0.002", help="relative test accuracies")
    ap.add_argument("--theta", type=float, default=0.5, help="the cube test's theta beside them (0.5)")
    ap.add_argument("--sample", type=int, default=2048, help="targets against float64 (2,048)")
    args = ap.parse_args(argv)
    try:
        sizes = [int(v) for v in args.n.split(",")]
        alphas = [float(v) for v in args.alpha.split(",")]
    except ValueError as e:
        print(f"tree_rel_alpha: {e}: --n and --alpha take comma-separated numbers", file=sys.stderr)
        return 2
    from app.backends.cpu import CPUBackend
    from app.engine.forces import Span
    from app.model.physics import Physics, accelerations, relative_errors
    from app.tools.bench import bench_bodies

    physics = Physics(softening=0.01, dt=0.001)
    record = CPUBackend.record("cpu-tree")
    print(
        f"cpu-tree, bench bodies, eps {physics.softening}; second of two evaluations; "
        f"up to {args.sample:,} targets against float64"
    )
    print(f"{'N':>7} {'scene':9} {'setting':18} {'inter/body':>10} {'median':>9} {'p99':>9} {'max':>9}")
    for n in sizes:
        for scene in ("plummer", "collision"):
            bodies = bench_bodies(n, scene=scene)
            pos = np.empty((n, 4), np.float32)
            pos[:, :3], pos[:, 3] = bodies.pos, bodies.mass
            rows = np.sort(np.random.default_rng(7).choice(n, size=min(n, args.sample), replace=False))
            exact = accelerations(bodies.pos, bodies.mass, physics, targets=rows)
            settings = [("cube", {"opening": "cube", "theta": args.theta})]
            settings += [("rel", {"opening": "rel", "alpha": a, "theta": args.theta}) for a in alphas]
            for name, tunables in settings:
                ev = record.policy.evaluator(record, physics)
                ev.set_tunables(rebuild_every=1, **tunables)
                acc = np.zeros((n, 4), np.float32)
                ev.evaluate(pos, acc, Span.all(n), Span.all(n))
                work = ev.evaluate(pos, acc, Span.all(n), Span.all(n))
                err = relative_errors(acc[rows, :3].astype(np.float64), exact)
                value = f"theta={args.theta}" if name == "cube" else f"alpha={tunables['alpha']}"
                print(
                    f"{n:>7,} {scene:9} {name + ' ' + value:18} {work.interactions / n:>10,.0f} "
                    f"{np.median(err):>9.2e} {np.percentile(err, 99):>9.2e} {err.max():>9.2e}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
