"""`nbody-live bench`: force-kernel throughput per kernel and N, as JSON and a plot."""

from __future__ import annotations

import argparse
from pathlib import Path

from app.commands.common import positive_int

HELP = "time force kernels (median of CUDA events / perf_counter) over N; write JSON and a PNG plot"
DESCRIPTION = """\
For each kernel and each N: a seeded Plummer sphere, --warmup untimed launches, then the median of
--repeats timed force launches. Reports interactions/s (the interactions the kernel counted) and
GFLOP/s by the 20-flops-per-interaction convention (GPU Gems 3, CUDA samples), with the device name,
SM clock and driver; a kernel that evaluates fewer pairs than N² (a tree) also gets its interactions
per body (body-body plus body-cell, and the body-cell share) and an "equivalent all-pairs" rate N²/t,
labelled as such, and a kernel that reports its time per stage (a tree: keys, sort, build, moments, walk)
gets the median of each stage, printed under its row and in the JSON (stages_median_ms). Kernels
that cannot run at an N (too large, out of memory) are listed in the JSON with the reason, never
dropped.

examples:
  nbody-live bench --backend cuda --kernels all --n 4096,16384,65536,131072,1048576 \\
      --json bench/results/h100-2026-11-21.json --plot bench/results/h100-2026-11-21.png
  nbody-live bench --backend cpu --kernels cpu-simd --n 1024,4096
  mpiexec -n 3 nbody-live bench --backend cpu --kernels cpu-simd --n 65536   # per-rank force / exchange

Under mpiexec the ranks time every step together; a row's time is the slowest rank's force time, and
the row adds each rank's force and exchange medians and the imbalance (docs/distributed.md).
"""


def _ns(text: str) -> list[int]:
    try:
        ns = [int(v.replace("_", "")) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated whole numbers") from None
    if not ns or min(ns) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every N must be at least 1")
    return ns


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="auto", metavar="NAME", help="auto | cpu | cuda (default auto)")
    p.add_argument("--kernels", default="all", metavar="LIST",
                   help="comma-separated kernel names, or all (default: all kernels of the backend)")
    p.add_argument("--n", type=_ns, default=[4096, 16384, 65536], metavar="LIST",
                   help="comma-separated body counts (default 4096,16384,65536)")
    p.add_argument("--warmup", type=positive_int, default=3, metavar="K", help="untimed launches (3)")
    p.add_argument("--repeats", type=positive_int, default=10, metavar="K",
                   help="timed launches; the median is reported (10)")
    p.add_argument("--json", type=Path, metavar="FILE", help="write the results as JSON")
    p.add_argument("--plot", type=Path, metavar="FILE.png", help="write interactions/s vs N as a PNG")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=main)


def main(args) -> int:
    from app import distributed

    return distributed.as_job(_bench, args)


def _bench(args, comm) -> int:
    """The benchmark; under MPI (`comm`) every rank times its share of every step together and rank 0
    prints and writes the result."""
    from app import bench
    from app.backends import find_kernel, select_backend
    from app.errors import ConfigError
    from app.outputs import check_outputs

    lead = comm is None or comm.rank == 0
    if lead:
        check_outputs((args.json, "bench results"), (args.plot, "bench plot"))  # before the benchmarking

    cls = select_backend(args.backend)
    names = [r.name for r in cls.kernels()] if args.kernels == "all" else args.kernels.split(",")
    for name in names:
        if find_kernel(name).backend != cls.name:
            raise ConfigError(f"kernel {name!r} is not a {cls.name} kernel; {cls.name} kernels: "
                              + ", ".join(r.name for r in cls.kernels()))
    if comm is not None:
        from app.backends.ranks import ranks_backend_class

        cls = ranks_backend_class(comm, cls)
    result = bench.run_bench(cls, names, args.n, warmup=args.warmup, repeats=args.repeats,
                             progress=lead and not args.no_progress)
    if not lead:
        return 0
    bench.print_table(result)
    if args.json:
        bench.write_json(result, args.json)
        print(f"wrote {args.json}")
    if args.plot:
        from app.bench_plot import plot

        plot(result, args.plot)
        print(f"wrote {args.plot}")
    return 0
