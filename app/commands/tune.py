"""`nbody-live tune`: measure the CUDA variants' tunables on this GPU; `best` reads the result."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from app.commands.bench import _ns
from app.commands.options import add_kernel_file_options, positive_int

HELP = (
    "time every CUDA variant's tunables per N on this GPU (or on K GPUs: --gpus K) and cache the fastest "
    "for `best`"
)
DESCRIPTION = """\
For each N: time every fp32 CUDA variant at its defaults (phase 1), then sweep the tunables (block
size, bodies per thread K, threads per body q, j-slices, N3L chunk) of the three fastest (phase 2),
within --budget-s seconds in all (compiling is not counted). The fastest configuration (as ranked
below) whose accelerations agree with float64 (the fp64 kernel's: max relative error <= 1e-4, or
<= twice that of `shared` where fp32 summation over N terms costs more) becomes the entry `best`
uses for N within a factor of 2.
At small N (launches of tens of µs) every configuration gets more timed launches, and the leaders are
timed again in interleaved rounds, each on a fresh load; a variant at its defaults wins over a faster
tuned configuration that is within the noise (docs/kernels.md, "Tuning").
The cache is keyed by GPU name, driver and a hash of the kernel sources, in the user cache dir
($NBODY_CACHE_DIR overrides); a stale or corrupt one is ignored and rewritten here. It holds a tuning
per device count (--gpus); a run replaces its own and keeps the others.

--gpus K (or all) times every variant through the multi-device driver on K GPUs, as `run --gpus K` runs
it (docs/multi-gpu.md; auto driver and exchange), each split as its record says: a share of the targets
(1/K of the work on each GPU) or, for atomics-n3l, a slice of the pair tiles. A step costs the slowest
GPU's force time plus the exchange that completes it, and that is what is ranked (as `bench --gpus`
scaling compares), so the winner is what scales on K GPUs, which need not be what is fastest on one. The
accelerations of the K GPUs are checked against the float64 reference of one GPU. `best` under `--gpus
K` runs this tuning on K GPUs; without one it runs the one-GPU pick and warns, naming `nbody-live tune
--gpus K`. --gpus 1 (the default) is one GPU: the single-GPU backend, the same run with K = 1. More
GPUs than the machine has is an error (exit status 2).

Ctrl-C or SIGTERM ends it at once (exit status 130 / 143): the N it finished are filed in the cache over
the tuning of the same device count already there (whose other N are kept), and --json FILE, rewritten
after every N, holds their measurements (marked "complete": false).

Without a cache, `best` (the CUDA default kernel) runs the committed picks of kernels/best_heuristic.json
for this GPU (by name, else compute capability; nearest tuned N), else atomics-n3l at its defaults.
--update-heuristic rewrites that table's family for the GPU of a tune result (no GPU needed): run it on
the JSON of a fresh tune and commit the table.

examples:
  nbody-live tune --n 4096,16384,65536,131072,1048576 --budget-s 120
  nbody-live tune --gpus 2 --n 65536,1048576 --budget-s 300    # the tuning `run --gpus 2` reads
  nbody-live tune --n 4096 --variants register-blocked,atomics-n3l --json tune-4096.json
  nbody-live tune --show
  nbody-live tune --update-heuristic bench/results/h200-2026-11-23-tune.json
"""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "tune", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--n",
        type=_ns,
        default=[4096, 16384, 65536, 131072],
        metavar="LIST",
        help="comma-separated body counts (default 4096,16384,65536,131072)",
    )
    p.add_argument(
        "--variants", metavar="LIST", help="comma-separated kernels to consider (default: every fp32 variant)"
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=120.0,
        metavar="S",
        help="time budget for the whole sweep in seconds (default 120)",
    )
    p.add_argument(
        "--repeats",
        type=positive_int,
        default=3,
        metavar="K",
        help="timed launches per configuration, at least; the median counts (3; up to 50 where "
        "launches are short)",
    )
    p.add_argument(
        "--gpus",
        default="1",
        metavar="N|all",
        help="time the variants split over N GPUs (or all) through the multi-device driver and "
        "cache the result as the tuning on N GPUs, which `best` under `--gpus N` reads "
        "(default 1: one GPU, the single-GPU backend)",
    )
    p.add_argument("--json", type=Path, metavar="FILE", help="also write the full result here")
    p.add_argument(
        "--show",
        action="store_true",
        help="print the cache for this GPU (every device count's tuning) and exit",
    )
    p.add_argument(
        "--update-heuristic",
        type=Path,
        metavar="TUNE.json",
        help="rewrite the GPU family of this tune result in kernels/best_heuristic.json (the "
        "picks `best` runs without a cache) and exit; needs no GPU",
    )
    add_kernel_file_options(p)
    p.set_defaults(func=main)


def main(args) -> int:
    from app.backends import select_backend
    from app.commands.running import Stopped
    from app.core.errors import ConfigError
    from app.core.outputs import atomic_write, check_outputs, check_suffix

    if args.update_heuristic:
        return _update_heuristic(args.update_heuristic)
    if not args.show:
        check_outputs((args.json, "tune results"))  # before the minutes of tuning
        check_suffix(args.json, (".json",), "tune result", "--json")
    cls = select_backend("cuda")
    from app.backends.cuda import tune, tuning_cache
    from app.engine.forces import format_tunables

    if args.show:
        from app.backends.cuda.context import device_facts

        gpu, driver = tuning_cache.device_key(device_facts())
        data, why = tuning_cache.read_file(gpu, driver, tuning_cache.source_hash(cls.kernels()))
        if data is None:
            print(why)
            return 1
        for k, result in data["tunings"].items():
            print(f"on {tuning_cache.on_gpus(int(k))}:")
            for e in result["best"]:
                print(
                    f"  N = {e['n']:>9,}: {e['variant']} {format_tunables(e['tunables'])}: "
                    f"{e['interactions_per_s'] / 1e9:,.0f} G interactions/s"
                )
        print(tuning_cache.cache_path(gpu, driver))
        return 0
    if args.budget_s <= 0:
        raise ConfigError(f"--budget-s: {args.budget_s} must be > 0")
    cls = _on_gpus(cls, args.gpus)
    variants = args.variants.split(",") if args.variants else None

    def keep(result: dict) -> None:  # after each N, so that an interrupted tune keeps what it measured
        with atomic_write(args.json, "w", "tune results") as f:
            f.write(json.dumps(result, indent=1, default=str) + "\n")

    try:  # SIGTERM raises as Ctrl-C does (app/cli.py's StopsRaise)
        result = tune.run_tune(
            cls,
            args.n,
            variants=variants,
            budget_s=args.budget_s,
            repeats=args.repeats,
            on_n=keep if args.json else None,
        )
    except KeyboardInterrupt as stop:
        if not args.json:
            kept = "give --json FILE to keep every N's measurements as it finishes"
        elif not args.json.exists():
            kept = f"no N had finished: {args.json} was not written"
        else:
            kept = f"the N finished so far are in {args.json} (marked incomplete)"
        print(f"nbody-live tune: interrupted ({stop or 'SIGINT'}); {kept}", file=sys.stderr)
        return stop.exit_code if isinstance(stop, Stopped) else 130
    if args.json:
        keep(result)
        print(f"wrote {args.json}")
    return 0 if result["best"] else 1


def _on_gpus(cls, gpus: str):
    """The backend class that times on `gpus` GPUs: `cls` itself for one, else its multi-device form
    (the helper `run --gpus` uses: more GPUs than exist is a ConfigError, exit status 2)."""
    from app.commands.assembly import several_devices

    multi = several_devices(cls, gpus)
    return multi if multi.k > 1 else cls


def _update_heuristic(tune_json: Path) -> int:
    from app.backends.cuda import heuristic, registry
    from app.engine.forces import format_tunables

    table = heuristic.update_from_tune(tune_json, registry.RECORDS)
    family = next(f for f in table["families"] if f["from"] == heuristic.shown(tune_json))
    for pick in family["picks"]:
        print(f"N = {pick['n']:>9,}: {pick['variant']} {format_tunables(pick['tunables'])}")
    cc = family["compute_capability"]
    print(
        f"wrote {heuristic.shown(heuristic.TABLE)}: {family['gpu']} "
        + (
            f"(and compute capability {cc})"
            if cc
            else "(matched by name only: the tune result has no compute capability)"
        )
    )
    return 0
