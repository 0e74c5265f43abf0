"""Interleaved A/B of code variants on one machine: `bench` on each variant in turn, round after round,
then the medians and spreads of every row. For changes smaller than the run-to-run spread, such as the
tree at 1M on two GPUs, whose two-GPU step varied 3.85-5.3 ms between runs of the same code on two H200s
(bench/results/h200x2-2026-11-26-tree-1m-variance.txt): one run of each variant cannot tell a 5% change
from noise, while alternating them cancels drift of the machine (clocks, temperature) between variants.

    python3 bench/ab_interleaved.py --variant base=/path/to/old/checkout --variant new=. --rounds 4 \\
        --out $OUT/ab -- --backend cuda --kernels tree --n 1048576 --scene plummer,collision \\
        --tunable theta=0.5,0.6 --gpus 1,2 --warmup 2 --repeats 9

A variant is a name and a folder holding the code (a checkout, or `git archive <commit> app kernels |
tar -x -C DIR`); each `bench` runs there with that folder first on PYTHONPATH. Everything after `--` is
passed to `bench` (never --json, which this script sets: <out>/<variant>-<round>.json). Prints, per row
(kernel, scene, N, setting, device count), each variant's median force + exchange ms over the rounds and
its range, and the speed-up of each device count against the fewest per round (median and range).
Exit status 1 if a run failed (its output is printed), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path


def parse_variant(text: str) -> tuple[str, Path]:
    name, sep, folder = text.partition("=")
    if not sep or not name or not folder:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=FOLDER")
    path = Path(folder).resolve()
    if not (path / "app" / "__main__.py").is_file():
        raise argparse.ArgumentTypeError(
            f"{path}: no app/__main__.py there (a checkout, or an archive of one)"
        )
    return name, path


def row_key(row: dict) -> tuple:
    setting = json.dumps(row.get("tunables") or {}, sort_keys=True)
    return row["kernel"], row.get("scene") or "", row["n"], setting, row.get("gpus", 1)


def step_ms(row: dict) -> float:
    return float(row["median_ms"]) + float(row.get("exchange_median_ms") or 0.0)


def run_once(folder: Path, bench_args: list[str], out: Path) -> dict[tuple, float]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "app", "bench", *bench_args, "--no-progress", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True)
    if proc.returncode != 0 or not out.is_file():
        raise RuntimeError(
            f"{' '.join(cmd)} (in {folder}) exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
        )
    rows = json.loads(out.read_text())["results"]
    return {row_key(r): step_ms(r) for r in rows if r.get("status") == "ok"}


def speedups(times: dict[tuple, float]) -> dict[tuple, float]:
    """Each row's speed-up against the same row on the fewest devices of this run."""
    fewest: dict[tuple, tuple[int, float]] = {}
    for key, ms in times.items():
        base = key[:-1]
        if base not in fewest or key[-1] < fewest[base][0]:
            fewest[base] = (key[-1], ms)
    return {key: fewest[key[:-1]][1] / ms for key, ms in times.items() if key[-1] != fewest[key[:-1]][0]}


def spread(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}-{max(values):{fmt}}]"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    bench_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--variant", action="append", type=parse_variant, required=True, help="NAME=FOLDER, twice or more"
    )
    parser.add_argument("--rounds", type=int, default=4, help="rounds of every variant in turn (default 4)")
    parser.add_argument("--out", type=Path, required=True, help="folder for each run's bench JSON")
    args = parser.parse_args(own)
    if len(args.variant) < 2 or args.rounds < 1 or "--json" in bench_args or not bench_args:
        parser.error("two variants or more, --rounds >= 1, and bench's arguments after `--` (without --json)")
    args.out.mkdir(parents=True, exist_ok=True)
    times: dict[str, list[dict]] = {name: [] for name, _ in args.variant}
    try:
        for r in range(1, args.rounds + 1):
            for name, folder in args.variant:
                times[name].append(run_once(folder, bench_args, args.out / f"{name}-{r}.json"))
                print(f"round {r}/{args.rounds}: {name} done", file=sys.stderr, flush=True)
    except RuntimeError as e:
        print(f"ab_interleaved: {e}", file=sys.stderr)
        return 1
    keys = sorted({k for runs in times.values() for run in runs for k in run})
    ups_by_variant = {name: [speedups(run) for run in runs] for name, runs in times.items()}
    print(
        "row (kernel, scene, N, setting, devices): per variant, median [range] over rounds of force + "
        "exchange ms; speed-up against the fewest devices"
    )
    for key in keys:
        print(f"{key[0]} {key[1]} N={key[2]:,} {key[3]} x{key[4]}")
        for name, runs in times.items():
            ms = [run[key] for run in runs if key in run]
            ups = [ups_of_run[key] for ups_of_run in ups_by_variant[name] if key in ups_of_run]
            text = f"  {name:<12} {spread(ms, '.3f')} ms" if ms else f"  {name:<12} -"
            print(text + (f"   speed-up {spread(ups, '.2f')}" if ups else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
