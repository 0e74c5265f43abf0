"""Where a domain split's time goes on several GPUs (issue 23): the tree's evaluation on one GPU, one
device's domain alone, every device's domain at once from its own thread, as the threads driver runs
them, and from one thread taking the devices' phases in turns, as the single driver runs them.
Wall time (perf_counter, synchronised) and each device's GPU span per stage (its evaluator's stages, host
gaps included), so that host-bound parts (the GIL between device threads) show.

    python3 bench/tree_domains_probe.py [--n 1048576] [--theta 0.6] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.backends.cuda.context import device_count  # noqa: E402
from app.backends.cuda.multi import gpu_devices  # noqa: E402
from app.model.physics import Physics  # noqa: E402
from app.parallel.decomposition import share_cuts  # noqa: E402
from app.parallel.multidevice import SWITCH_INTERVAL_S, SingleDriver, split  # noqa: E402
from app.tools.bench import bench_bodies  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1 << 20)
    ap.add_argument("--theta", type=float, default=0.6)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--switch-interval",
        type=float,
        default=None,
        help="sys.setswitchinterval for the threads (default: the multi-device driver's)",
    )
    ap.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="ROWS",
        help="after the turns, profile them (cProfile) and print the ROWS functions of most own "
        "time: where the host's part of a step goes",
    )
    args = ap.parse_args(argv)
    sys.setswitchinterval(args.switch_interval or SWITCH_INTERVAL_S)
    k = device_count()
    bodies, physics = bench_bodies(args.n), Physics(softening=0.01)
    shares = split(args.n, [1.0] * k)
    devices = gpu_devices(list(range(k)))(bodies, physics, "tree", shares)
    for i, d in enumerate(devices):
        d.index, d.shares = i, shares
        d.evaluator.set_tunables(theta=args.theta)

    def one(d, index, cuts):
        with d.device.scope:
            t = time.perf_counter()
            d.evaluator.evaluate_domain(d.ptr["pos"], d.ptr["sacc"], args.n, cuts, index)
            d.device.drv.Context.synchronize()
            return (time.perf_counter() - t) * 1e3

    def stages(d):
        return {name: round(ms / args.repeats, 3) for name, ms in d.evaluator.stage_ms().items()}

    whole = [0, args.n]
    one(devices[0], 0, whole)  # warm-up
    devices[0].evaluator.stage_ms()
    t1 = [one(devices[0], 0, whole) for _ in range(args.repeats)]
    print(f"switch interval {sys.getswitchinterval() * 1e3:g} ms")
    print(
        f"N = {args.n:,}, theta {args.theta}: one GPU, the whole tree: {statistics.median(t1):.2f} ms "
        f"wall; stages {stages(devices[0])}"
    )
    cuts = share_cuts(shares)
    for i, d in enumerate(devices):
        one(d, i, cuts)
        d.evaluator.stage_ms()
        alone = [one(d, i, cuts) for _ in range(args.repeats)]
        print(
            f"device {i} alone, its domain of {k}: {statistics.median(alone):.2f} ms wall; stages {stages(d)}"
        )
    walls = []
    for _ in range(args.repeats):
        out = [0.0] * k
        threads = [
            threading.Thread(target=lambda i=i, d=d, out=out: out.__setitem__(i, one(d, i, cuts)))
            for i, d in enumerate(devices)
        ]
        t = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        walls.append(((time.perf_counter() - t) * 1e3, out))
    print(
        f"{k} devices at once (a thread each): {statistics.median(w for w, _ in walls):.2f} ms wall; "
        f"per device {[round(statistics.median(o[i] for _, o in walls), 2) for i in range(k)]} ms; stages "
        + "; ".join(f"{i}: {stages(d)}" for i, d in enumerate(devices))
    )
    for d in devices:
        d.evaluator.stage_ms()
    turns = []
    for _ in range(args.repeats):  # the single driver: one thread, the devices' phases in turns
        t = time.perf_counter()
        SingleDriver(devices).submit(
            [
                lambda i=i, d=d: d.evaluator.domain_phases(d.ptr["pos"], d.ptr["sacc"], args.n, cuts, i)
                for i, d in enumerate(devices)
            ]
        )
        for d in devices:
            with d.device.scope:
                d.device.drv.Context.synchronize()
        turns.append((time.perf_counter() - t) * 1e3)
    print(
        f"{k} devices from one thread, their phases in turns: {statistics.median(turns):.2f} ms wall; "
        "stages " + "; ".join(f"{i}: {stages(d)}" for i, d in enumerate(devices))
    )
    if args.profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(args.repeats):
            SingleDriver(devices).submit(
                [
                    lambda i=i, d=d: d.evaluator.domain_phases(d.ptr["pos"], d.ptr["sacc"], args.n, cuts, i)
                    for i, d in enumerate(devices)
                ]
            )
        profiler.disable()
        for d in devices:
            with d.device.scope:
                d.device.drv.Context.synchronize()
        print(f"host profile of {args.repeats} evaluations in turns (own time first):")
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.profile)
    for d in devices:
        d.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
