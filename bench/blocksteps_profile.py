"""Where block time steps spend a GPU's time, and how much a scene lets them save (docs/blocksteps.md,
"What bounds the speed-up"): every substep of block and shared steps timed in parts, on one GPU.

    python3 bench/blocksteps_profile.py [--n 1048576] [--scene collision] [--t 2] [--dt 0.0625] \\
        [--levels 6] [--eta 0.01] [--softening 0.01] --csv $OUT/blocksteps-profile.csv \\
        [--plot $OUT/blocksteps-profile.png]
    python3 bench/blocksteps_profile.py --ics ../shared/data/bonsai_model3_child_compact.tipsy \\
        --softening 0.2 --dt 0.25 --csv $OUT/blocksteps-profile-bonsai.csv

The same run as bench/blocksteps_gpu.py (the tree at --theta, cube test, a build every evaluation; "shared"
is every body at the finest level any body wants), but each substep's force evaluation is bracketed by
device synchronisations, so that its wall time splits into:
- the tree's build stages (keys, sort, build, moments) and its walk, from the evaluator's CUDA events
  (`stage_ms`);
- the rest of `force_active` (float32 rows made from x, the active mask, a(x) copied back);
- everything outside it (drift, kicks, the criterion, the scheduler's array work, the host's loop).

The synchronisations cost a little; the speed ratio bench/blocksteps_gpu.py reports is the one to quote.
The summary and the plot leave out each mode's first max step, which may pay one-time costs: with the ops
of f3f7ce7, block's first substep on the 1M collision took 91 ms outside the force on an H200 (once; not
seen since the ops became kernels/blocksteps.cu, cause not measured).
What this adds are the bounds. The targets ratio (targets shared steps evaluate / block's) and the
interactions ratio (the same for the walk's interactions) bound what any implementation can gain on the
scene: a substep can cost no less than its walk. "Walk at shared's rate" is block's time with its walk
costing shared's time per interaction (a walk whose cost follows its active targets exactly) and every
other part as measured. The level histogram after the first evaluation gives the t = 0 bound: 2^finest /
mean(2^level) targets.

A CSV row per substep (mode, max step, tick, active rows, wall ms, force ms, stage ms, interactions) is
written as it comes, a line per max step goes to stdout, then the summary. The file or scene is read
before the GPU starts. Exit status 0 when it ran, 2 bad input, 130 interrupted
(the CSV keeps every row written).
"""

from __future__ import annotations

import argparse
import copy
import csv
import sys
import time
from pathlib import Path

import numpy as np

from app.core.errors import UserError

BUILD_STAGES = ("keys", "sort", "build", "moments")
FIELDS = ("mode", "max_step", "tick", "active", "wall_ms", "force_ms", *BUILD_STAGES, "walk", "interactions")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, default=1 << 20, help="bodies of --scene (default 1048576)")
    ap.add_argument("--scene", default="collision", help="an app.model.ics generator (default collision)")
    ap.add_argument("--ics", type=Path, help="a snapshot file instead of --scene (any format `run` reads)")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--t", type=float, default=2.0, help="time units to run each mode (default 2)")
    ap.add_argument("--dt", type=float, default=1 / 16, help="dt_max, the max step (default 1/16)")
    ap.add_argument("--levels", type=int, default=6, help="L: the finest step is dt / 2^L (default 6)")
    ap.add_argument("--eta", type=float, default=0.01, help="the criterion's accuracy (default 0.01)")
    ap.add_argument("--softening", type=float, default=0.01, help="ε (default 0.01)")
    ap.add_argument("--theta", type=float, default=0.5, help="the tree's opening angle (default 0.5)")
    ap.add_argument("--csv", type=Path, required=True, help="a row per substep (written as they come)")
    ap.add_argument("--plot", type=Path, help="each part's ms per substep against the active fraction")
    ap.add_argument("--replot", action="store_true", help="only draw --plot from an existing --csv")
    args = ap.parse_args(argv)
    problem = _check(args)
    if problem:
        print(f"blocksteps_profile: {problem}", file=sys.stderr)
        return 2
    if args.replot:
        plot(args.csv, args.plot)
        return 0
    try:
        bodies = load_bodies(args)  # before the GPU starts: a bad file or scene costs nothing
    except UserError as e:
        print(f"blocksteps_profile: {e}", file=sys.stderr)
        return 2
    try:
        rows = profile(args, bodies)
    except KeyboardInterrupt:
        print(f"interrupted: {args.csv} keeps the rows written", file=sys.stderr)
        return 130
    summarise(rows)
    if args.plot is not None:
        plot(args.csv, args.plot)
    return 0


def _check(args) -> str | None:
    """The first problem with the arguments, said with its fix, or None."""
    if args.replot:
        if not args.csv.is_file():
            return f"--replot reads {args.csv}, which is not a file"
        return None if args.plot else "--replot draws --plot; give one"
    if args.ics is not None and not args.ics.is_file():
        return f"--ics {args.ics} is not a file"
    if args.n < 2 or args.t <= 0 or args.dt <= 0 or not 0 <= args.levels <= 20:
        return "--n >= 2, --t and --dt > 0, --levels in [0, 20]"
    if args.eta <= 0 or args.softening <= 0 or args.theta <= 0:
        return "--eta, --softening and --theta must be > 0 (the criterion needs ε)"
    for path in (args.csv, args.plot):
        if path is not None and not path.parent.is_dir():
            return f"{path.parent} is not a folder; make it or choose another path"
    return None


def load_bodies(args):
    """The bodies of --ics or --scene (UserError, said as it comes, for a bad file or an unknown scene)."""
    from app.model import formats
    from app.model.ics import generate

    return formats.read(args.ics) if args.ics else generate(args.scene, args.n, args.seed)


def profile(args, bodies) -> list[dict]:
    from app.backends.cuda.blockops import CudaBlockOps
    from app.backends.cuda.device import CudaDevice
    from app.engine.blocksteps import BlockSteps
    from app.model.ics import generate
    from app.model.physics import Physics

    physics = Physics(softening=args.softening, dt=args.dt)
    scene = args.ics.name if args.ics else args.scene
    steps = max(1, round(args.t / args.dt))
    device = CudaDevice(0)
    print(
        f"{device.facts.name}: {scene} N={bodies.n:,}, {steps} max steps of {args.dt:g} (L={args.levels}, "
        f"eta={args.eta:g}, eps={args.softening:g}, theta={args.theta:g}); each substep synchronised",
        flush=True,
    )
    rows: list[dict] = []
    try:
        small = generate("collision", 4096, args.seed)  # CuPy's kernels compiled before any clock
        for mode in ("block", "shared"):
            warm = CudaBlockOps(copy.deepcopy(small), physics, device, {"theta": args.theta})
            BlockSteps(physics, args.levels, eta=args.eta, mode=mode).max_step(warm)
        with args.csv.open("w", newline="") as f:
            out = csv.DictWriter(f, FIELDS)
            out.writeheader()
            for mode in ("block", "shared"):
                ops = CudaBlockOps(copy.deepcopy(bodies), physics, device, {"theta": args.theta})
                sched = BlockSteps(physics, args.levels, eta=args.eta, mode=mode)
                sched.begin(ops)
                _say_levels(mode, sched.histogram(), args.levels)
                for k in range(1, steps + 1):
                    timed = _timed_max_step(ops, sched, mode, k)
                    for row in timed:
                        out.writerow(row)
                        rows.append(row)
                    f.flush()
                    wall = sum(r["wall_ms"] for r in timed)
                    print(
                        f"  {mode:6} max step {k:3}/{steps}: {len(timed)} substeps, {wall:8.1f} ms",
                        flush=True,
                    )
                print(f"  {mode}: {steps} max steps, {sched.total.targets:,} targets", flush=True)
    finally:
        device.close()
    return rows


def _say_levels(mode: str, histogram, top: int) -> None:
    """The t = 0 levels and the targets bound they set; a warning when bodies sit at a clamp (the
    criterion wanted a level outside [0, L], so the bound is understated: choose --dt or --levels)."""
    hist = np.asarray(histogram, np.float64)
    levels = np.arange(hist.size)
    bound = 2.0 ** levels[hist > 0].max() / (hist @ 2.0**levels / hist.sum())
    shares = ", ".join(f"{lv}: {100 * h / hist.sum():.1f}%" for lv, h in zip(levels, hist, strict=True) if h)
    print(f"  {mode} at t = 0: bodies per level {{{shares}}}; targets bound {bound:.2f}x", flush=True)
    if mode == "block" and (hist[0] or hist[top]):
        print("  warning: bodies at level 0 or L are clamped there; widen --levels or move --dt", flush=True)


def _timed_max_step(ops, sched, mode: str, k: int) -> list[dict]:
    """One max step with every force evaluation bracketed by synchronisations: a dict per substep."""
    evaluator, real, done = ops.evaluator, ops.force_active, []
    sync = ops.cp.cuda.Device().synchronize

    def force_active(rows):
        sync()
        evaluator.stage_ms()  # (resets the stage clock)
        t0 = time.perf_counter()
        work = real(rows)
        sync()
        end = time.perf_counter()
        stages = evaluator.stage_ms()
        done.append(
            {
                "mode": mode,
                "max_step": k,
                "active": int(rows.size),
                "force_ms": (end - t0) * 1e3,
                **{s: stages.get(s, 0.0) for s in (*BUILD_STAGES, "walk")},
                "interactions": work.interactions,
                "end": end,
            }
        )
        return work

    ops.force_active = force_active
    try:
        with ops.scope():
            sync()
            start = time.perf_counter()
            for sub in sched.substeps(ops):
                if sub.done:  # the last kicks and levels belong to the last substep
                    sync()
                    done[-1]["end"] = time.perf_counter()
    finally:
        ops.force_active = real
    # a substep's wall time: from the end of the one before (or the max step's start) to its own end
    for row, tick in zip(done, sched.last.ticks, strict=True):
        row["tick"] = tick
        row["wall_ms"], start = (row["end"] - start) * 1e3, row.pop("end")
    return done


def _parts(rows: list[dict]) -> dict[str, float]:
    """A mode's totals: wall, walk, build stages, the rest of force_active, outside it (ms), substeps,
    targets and interactions."""
    walk = sum(r["walk"] for r in rows)
    build = sum(r[s] for r in rows for s in BUILD_STAGES)
    force = sum(r["force_ms"] for r in rows)
    wall = sum(r["wall_ms"] for r in rows)
    return {
        "wall": wall,
        "walk": walk,
        "build": build,
        "force rest": force - walk - build,
        "outside": wall - force,
        "substeps": len(rows),
        "targets": sum(r["active"] for r in rows),
        "interactions": sum(r["interactions"] for r in rows),
    }


def _settled(rows: list[dict]) -> list[dict]:
    """The rows after each mode's first max step (see the module docstring)."""
    return [r for r in rows if int(r["max_step"]) > 1]


def summarise(rows: list[dict]) -> None:
    if _settled(rows):
        rows = _settled(rows)
        print("(each mode's max step 1 left out: one-time costs)")
    parts = {m: _parts([r for r in rows if r["mode"] == m]) for m in ("block", "shared")}
    for mode, p in parts.items():
        per = p["substeps"]
        split = ", ".join(f"{k} {p[k] / per:.2f}" for k in ("walk", "build", "force rest", "outside"))
        print(
            f"{mode:6}: {p['wall'] / 1e3:.2f} s in {per} substeps, {p['wall'] / per:.2f} ms a substep "
            f"({split}); {p['targets']:,} targets, {p['interactions']:,} interactions"
        )
    b, s = parts["block"], parts["shared"]
    per_interaction = s["walk"] / s["interactions"]
    ideal = b["wall"] - b["walk"] + b["interactions"] * per_interaction
    fixed = s["wall"] - s["walk"]
    print(
        f"block / shared, as measured (synchronised): {s['wall'] / b['wall']:.2f}x\n"
        f"bounds: targets {s['targets'] / b['targets']:.2f}x fewer, interactions "
        f"{s['interactions'] / b['interactions']:.2f}x fewer (the speed-up if a substep cost only its walk)\n"
        f"block's walk at shared's rate per interaction: {s['wall'] / ideal:.2f}x; "
        f"the parts other than the walk are {100 * fixed / s['wall']:.0f}% of a shared substep"
    )


def plot(csv_path: Path, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with csv_path.open() as f:
        rows = list(csv.DictReader(f))
    rows = _settled(rows) or rows
    n = max(int(r["active"]) for r in rows)
    fig, ax = plt.subplots(figsize=(8, 5))
    marks = {"block": "o", "shared": "s"}
    colours = {"walk": "C0", "build stages": "C1", "rest of force": "C2", "outside force": "C3", "wall": "k"}
    for mode, mark in marks.items():
        mine = [r for r in rows if r["mode"] == mode]
        frac = np.array([int(r["active"]) / n for r in mine])
        cols = {
            k: np.array([float(r[k]) for r in mine]) for k in ("wall_ms", "force_ms", "walk", *BUILD_STAGES)
        }
        build = sum(cols[s] for s in BUILD_STAGES)
        series = {
            "walk": cols["walk"],
            "build stages": build,
            "rest of force": cols["force_ms"] - cols["walk"] - build,
            "outside force": cols["wall_ms"] - cols["force_ms"],
            "wall": cols["wall_ms"],
        }
        for name, y in series.items():
            ax.scatter(frac, y, s=10, marker=mark, color=colours[name], alpha=0.5, label=f"{name} ({mode})")
    ax.set_xlabel("active fraction of the substep")
    ax.set_ylabel("ms per substep")
    ax.set_xlim(0, 1.05)
    ax.set_ylim(0, None)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(f"block and shared steps per substep, {csv_path.stem}", fontsize=9)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
