"""`nbody-live bench`: force-kernel throughput per kernel and N, as JSON and a plot."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from app.commands.options import (
    add_gpu_options,
    add_kernel_file_options,
    non_negative_int,
    positive_float,
    positive_int,
)
from app.core.backend_table import backend_choices
from app.model.ics import GENERATORS
from app.tools.bench import DEFAULT_ERROR_SAMPLE, DEFAULT_SCENE

log = logging.getLogger("nbody-live")

HELP = (
    "time force kernels (median of CUDA events / perf_counter) over N, scenes and tunable sweeps, "
    "with the force error of approximate kernels; write JSON and a PNG plot"
)
DESCRIPTION = """\
For each scene, N, kernel and tunable setting (one row each): the scene's seeded bodies (--scene; default
the Plummer sphere), --warmup untimed steps, then the median of --repeats timed steps: the force time
(CUDA events / perf_counter) and the full step (force + integrate). Reports interactions/s (the
interactions the kernel counted) and GFLOP/s by the 20-flops-per-interaction convention (GPU Gems 3,
CUDA samples), with the device name, SM clock and driver; a kernel that evaluates fewer pairs than N² (a
tree) also gets its interactions per body (body-body plus body-cell, and the body-cell share) and an
"equivalent all-pairs" rate N²/t, labelled as such, and a kernel that reports its time per stage (a tree:
keys, sort, build, moments, walk) gets the median of each stage, printed under its row and in the JSON
(stages_median_ms), and a tree its walk's FP32 throughput (walk_tflops: 23 flops per body-body, 51 per
body-cell; on a GPU also its share of the FP32 peak). A tree refitted between builds (its default:
the adaptive rule capped at rebuild_every=16; --tunable rebuild_every=4 --tunable rebuild_rule=fixed: a
build, then three refits) is timed in whole cycles: each of the --repeats samples is the mean step of
rebuild_every consecutive steps, so the builds count at their share. bench runs every
scene with one physics of its own (softening 0.01, dt 0.001, recorded in the JSON), not the scene file's:
a refit's cost grows with the motion per step (docs/tree.md, "The GPU refit").

--tunable NAME=V1,V2,... sweeps: one row per value (several swept tunables: every combination), applied
to the selected kernels that have NAME; the others run once with their own settings (so `best` is never
swept by theta). A tunable no selected kernel has is an error. A tree's accuracy is alpha under its
default opening test (rel; alpha's default, auto, follows N, and tunables_used in the JSON holds its
number), where theta shapes only a run's first step, and theta under the geometric
ones (--tunable opening=cube, or bmax: docs/tree.md, step 5). A sweep that changes nothing measured (theta
under rel, alpha under cube) is said in a line before the timing.

After its timing, a row of an approximate kernel (a tree; `info --kernels`) samples its force error:
the median, p99 and max relative acceleration error of --error-sample K random targets (the same targets
for every setting) against the exact all-pairs sum on the same device (fp32 `shared` on CUDA; under
--gpus, each target as the device owning it computed it, the sum on device 0). Per scene, N and device
count, the fastest setting whose p99 is within the kernel's budget (p99 <= 1e-3 for the trees) is
named in a summary line and in the JSON (fastest_within_budget).

Rows that cannot run (too large, out of memory, failed compile, over --max-seconds) are listed in the
JSON with the reason, never dropped. --max-seconds S skips a row whose warm-up and timed steps would take
longer than S seconds: predicted from the same kernel, scene and setting at a smaller N of the run
(scaled by N² for all-pairs, N log N for a tree), or stopped once it is running and its pace says so; this
is how a run keeps `best` at 1M and skips it at 8M (about 6 minutes there on an H200), with the reason in
the JSON.

With --gpus 1,2 (or 1,all) every kernel and N is timed through the multi-device driver on each device
count in turn (app/backends/multi.py, docs/multi-gpu.md), each kernel split as its record says
(app/parallel/decomposition.py: targets, pairs for atomics-n3l and `best`'s pick of it, domains for the
trees): rows are labelled "kernel ×K", each with its devices' median force times and the median exchange per
step; interactions count only the work that was needed (each pair or tree interaction once, whichever
device did it). Scaling rows give per kernel, scene, N and setting the speed-up of each count against the
fewest (force + exchange per step) and the efficiency, speed-up × K_base / K; the table printed (and the
JSON's scaling_at_budget) keeps a tree's fastest θ within its budget on the fewest devices, and --plot then
draws step time and speed-up against N (app/tools/scaling_plot.py). With --backend cpu the devices are CPU
"devices" (shares of the host: a test of the path, not of scaling).

examples:
  # the tree beside all-pairs `best` (issue 11's acceptance run; about 3 minutes on an H200)
  nbody-live bench --backend cuda --kernels tree,best --n 1048576,8388608 --scene plummer,collision \\
      --tunable opening=cube --tunable theta=0.3,0.5,0.6,0.7,0.9 --max-seconds 60 \\
      --json bench/results/h200-2026-11-24-tree.json --plot bench/results/h200-2026-11-24-tree.png
  nbody-live bench --backend cuda --kernels all --n 4096,16384,65536,131072,1048576 \\
      --json bench/results/h100-2026-11-21.json --plot bench/results/h100-2026-11-21.png
  nbody-live bench --backend cpu --kernels cpu-simd,cpu-tree --n 16384 --tunable opening=cube \\
      --tunable theta=0.3,0.7
  # the tree's default relative opening test, swept by alpha (issue 25's acceptance run; ~2 min, one H100)
  nbody-live bench --backend cuda --kernels tree --n 1048576,8388608,16777216 --scene plummer,collision \\
      --tunable alpha=0.001,0.003 --max-seconds 30 --json rel.json --plot rel.png
  nbody-live bench --backend cuda --kernels shared --n 65536,1048576 --gpus 1,2 --exchange peer \\
      --json bench/results/h200x2-scaling.json
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


def _device_classes(cls, args) -> dict:
    """--gpus 1,2: {K: the backend class over K devices} in the order given, each K once."""
    from app.commands.assembly import several_devices
    from app.model.typed_text import parse_device_count

    classes: dict[int, type] = {}
    for text in args.gpus.split(","):
        parse_device_count(text, "--gpus")
        multi = several_devices(
            cls, text, args.gpu_driver or "auto", args.exchange or "auto", chosen=args.backend != "auto"
        )
        classes.setdefault(multi.k, multi)
    return classes


def _scenes(text: str) -> list[str]:
    scenes = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in scenes if v not in GENERATORS]
    if not scenes or unknown:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected comma-separated generators from {', '.join(GENERATORS)}"
        )
    return list(dict.fromkeys(scenes))


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--backend",
        default="auto",
        metavar="NAME",
        help=f"{' | '.join(backend_choices())} (default auto: the first that works)",
    )
    p.add_argument(
        "--kernels",
        default="all",
        metavar="LIST",
        help="comma-separated kernel names, or all (default: all kernels of the backend)",
    )
    p.add_argument(
        "--n",
        type=_ns,
        default=[4096, 16384, 65536],
        metavar="LIST",
        help="comma-separated body counts (default 4096,16384,65536)",
    )
    p.add_argument(
        "--scene",
        type=_scenes,
        default=[DEFAULT_SCENE],
        metavar="LIST",
        help="comma-separated generators whose seeded bodies are timed, rows per scene: "
        f"{' | '.join(GENERATORS)} (default {DEFAULT_SCENE})",
    )
    p.add_argument("--seed", type=int, default=42, metavar="S", help="seed of the scenes' bodies (42)")
    p.add_argument(
        "--tunable",
        dest="tunables",
        action="append",
        default=[],
        metavar="NAME=V1,V2",
        help="a tunable of the kernels that have it, one row per value, e.g. --tunable "
        "theta=0.3,0.5,0.7 (repeatable; `nbody-live info --kernels` lists them)",
    )
    p.add_argument(
        "--error-sample",
        type=non_negative_int,
        default=DEFAULT_ERROR_SAMPLE,
        metavar="K",
        help="targets whose force error an approximate kernel's row samples after its timing "
        f"(default {DEFAULT_ERROR_SAMPLE:,}; 0: none)",
    )
    p.add_argument(
        "--max-seconds",
        type=positive_float,
        metavar="S",
        help="skip a row whose warm-up and timed steps would take longer (reason in the JSON; "
        "default: no limit)",
    )
    p.add_argument("--warmup", type=positive_int, default=3, metavar="K", help="untimed launches (3)")
    p.add_argument(
        "--repeats",
        type=positive_int,
        default=10,
        metavar="K",
        help="timed launches; the median is reported (10)",
    )
    _add_output_options(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_gpu_options(
        p,
        gpus_help="comma-separated device counts, e.g. 1,2 or 1,all: every kernel and N on "
        "each count through the multi-device driver, plus scaling rows (speed-up "
        'and efficiency per N); with --backend cpu, CPU "devices"',
    )
    add_kernel_file_options(p)
    p.set_defaults(func=main)


def _add_output_options(p) -> None:
    """--json, --resume and --plot."""
    p.add_argument(
        "--json",
        type=Path,
        metavar="FILE",
        help='write the results as JSON, rewritten after every row (marked "complete": false until the '
        "last), so a bench stopped by Ctrl-C or SIGTERM keeps what it measured",
    )
    p.add_argument(
        "--resume",
        type=Path,
        metavar="FILE",
        help="continue an interrupted bench from its JSON: its rows are kept, the rest of the same plan "
        "is run (give the same options), and the JSON is completed (in FILE, or --json)",
    )
    p.add_argument(
        "--plot",
        type=Path,
        metavar="FILE.png",
        help="write interactions/s vs N as a PNG (with --gpus 1,2: step time and speed-up)",
    )


def main(args) -> int:
    from app.backends import distributed

    return distributed.as_job(_bench, args)


def _resumed_rows(args, counts: list[int] | None) -> list[dict]:
    """The rows of the interrupted bench in --resume FILE; ConfigError when it is not one, or is complete,
    or was run with other settings than these options (`counts`: the --gpus device counts, or None)."""
    import json

    from app.core.errors import ConfigError, InputFileError

    path = args.resume
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputFileError(f"--resume {path}: no such file") from None
    except (OSError, ValueError) as e:
        raise InputFileError(f"--resume {path}: not a bench JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("results"), list) or "complete" not in data:
        raise InputFileError(
            f"--resume {path}: not the JSON of an interrupted bench (no results, no complete)"
        )
    if data["complete"]:
        raise ConfigError(f"--resume {path}: that bench is complete; nothing to resume")
    wanted = {
        "seed": args.seed,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "max_seconds": args.max_seconds,
    }
    for key, value in wanted.items():
        if data.get(key) != value:
            raise ConfigError(
                f"--resume {path}: it was run with {key} = {data.get(key)!r}, this command asks for "
                f"{value!r}; give the interrupted run's options"
            )
    if data.get("gpu_counts") != counts:

        def on(c) -> str:
            return f"--gpus {','.join(map(str, c))}" if c else "one device (no --gpus)"

        raise ConfigError(
            f"--resume {path}: it was run on {on(data.get('gpu_counts'))}, this command on {on(counts)}; "
            "give the interrupted run's --gpus"
        )
    return data["results"]


def _bench(args, comm) -> int:
    """The benchmark; under MPI (`comm`) every rank times its share of every step together and rank 0
    prints and writes the result."""
    from app.backends import select_backend
    from app.commands.options import parse_tunable_lists
    from app.commands.running import Stopped
    from app.core.errors import ConfigError
    from app.core.outputs import check_outputs, check_suffix
    from app.tools import bench

    tunables = parse_tunable_lists(args.tunables)
    lead = comm is None or comm.rank == 0
    if args.resume and args.json is None:
        args.json = args.resume
    if lead:
        check_outputs((args.json, "bench results"), (args.plot, "bench plot"))  # before the benchmarking
        check_suffix(args.plot, (".png",), "plot", "--plot")  # matplotlib's PNG under a .jpg name was one
        check_suffix(args.json, (".json",), "results", "--json")
    if comm is not None and args.gpus:
        raise ConfigError(
            f"--gpus {args.gpus}: under mpiexec each rank takes one GPU (of its local rank); "
            "leave --gpus out, or run one process with --gpus"
        )

    cls = select_backend(args.backend)
    counts = _device_classes(cls, args) if args.gpus else None
    done_rows = _resumed_rows(args, list(counts) if counts else None) if args.resume else None
    if counts:
        cls = next(iter(counts.values()))
    names = _kernel_names(cls, args.kernels)
    if lead:
        from app.tools.bench_sweep import sweep_notes

        records = {rec.name: rec for rec in cls.kernels()}
        for note in sweep_notes([records[k] for k in names if k in records], tunables):
            log.warning("%s", note)
    if comm is not None:
        from app.backends.ranks import ranks_backend_class

        cls = ranks_backend_class(comm, cls)
    options = {
        "warmup": args.warmup,
        "repeats": args.repeats,
        "progress": lead and not args.no_progress,
        "seed": args.seed,
        "scenes": args.scene,
        "tunables": tunables,
        "error_sample": args.error_sample,
        "max_seconds": args.max_seconds,
        "done_rows": done_rows,
    }
    if lead and args.json:  # the rows so far, after each row: an interrupted bench keeps what it measured
        options["on_row"] = lambda result: bench.write_json(result, args.json)
    try:  # SIGTERM raises as Ctrl-C does (app/cli.py's StopsRaise): the rows so far are kept either way
        if counts:
            result = bench.run_scaling(counts, names, args.n, **options)
        else:
            result = bench.run_bench(cls, names, args.n, **options)
        if lead:
            _write_outputs(result, args)
    except KeyboardInterrupt as stop:
        if lead:
            print(f"nbody-live bench: interrupted ({stop or 'SIGINT'}); {_kept(args)}", file=sys.stderr)
        return stop.exit_code if isinstance(stop, Stopped) else 130
    return 0


def _kept(args) -> str:
    """What an interrupted bench leaves: its JSON as the last row (or the end) left it."""
    import json

    if not args.json:
        return "nothing was kept: give --json FILE to keep the rows as they finish"
    if not args.json.exists():
        return f"no row had finished: {args.json} was not written"
    try:
        complete = json.loads(args.json.read_text()).get("complete")
    except (OSError, ValueError):  # /dev/null, or a file another process changed
        complete = None
    if complete:
        return f"{args.json} is complete" + (f"; {args.plot} was not written" if args.plot else "")
    return (
        f"the rows measured so far are in {args.json} (marked incomplete); continue with "
        f"nbody-live bench ... --resume {args.json}"
    )


def _kernel_names(cls, kernels: str) -> list[str]:
    """--kernels (all, or names) as names of `cls`'s records; ConfigError naming one of another backend."""
    from app.backends import find_kernel
    from app.core.errors import ConfigError

    names = [r.name for r in cls.kernels()] if kernels == "all" else kernels.split(",")
    for name in names:
        if find_kernel(name).backend != cls.name:
            raise ConfigError(
                f"kernel {name!r} is not a {cls.name} kernel; {cls.name} kernels: "
                + ", ".join(r.name for r in cls.kernels())
            )
    return names


def _write_outputs(result: dict, args) -> None:
    """The table, and the complete JSON and plot (rank 0's)."""
    from app.tools import bench

    bench.print_table(result)
    if args.json:
        bench.write_json(result, args.json)
        print(f"wrote {args.json}")
    if args.plot:
        if len(result.get("gpu_counts") or []) > 1:  # what a second device buys
            from app.tools.scaling_plot import plot_scaling

            plot_scaling(result, args.plot)
        else:
            from app.tools.bench_plot import plot

            plot(result, args.plot)
        print(f"wrote {args.plot}")
