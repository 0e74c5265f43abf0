"""Block against shared time steps on one GPU (app/backends/cuda/blockops.py): issue 25's item 3 measured at
the size it names, the 1M collision over 2 time units.

    python3 bench/blocksteps_gpu.py [--n 1048576] [--scene collision] [--t 2] [--dt 0.0625] [--levels 6] \\
        [--eta 0.01] --csv $OUT/blocksteps-gpu.csv [--plot $OUT/blocksteps-gpu.png]
    python3 bench/blocksteps_gpu.py --replot --csv FILE.csv [--also OTHER.csv] --plot FILE.png

Each mode runs from the same bodies with the tree (cube test at --theta, a build every evaluation):
"block" (per-body levels from GADGET-2's criterion), "shared" (every body at the finest level any body
wants: the shared-step comparison at the same η, app/engine/blocksteps.py) and, when asked, "levelK" (every
body at level K throughout: shared steps of dt/2^K, K chosen to cost what block costs). After every max step
the energy is reduced on the device (app/backends/cuda/diagnostics.py) and a CSV row written (mode, max
step, time, wall seconds, E, |dE/E|, active fraction, bodies per level). The summary: simulated time per
wall second of each mode and their ratio (the bar: >= 3x), the largest |dE/E| of each and their ratio
(the bar: within 2x). Exit status 0 when it ran (the bars are reported, not judged), 2 bad input, 130
interrupted (the CSV keeps every row written).
"""

from __future__ import annotations

import argparse
import copy
import csv
import sys
import time
from pathlib import Path

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__,
    )
    ap.add_argument("--n", type=int, default=1 << 20, help="bodies (default 1048576)")
    ap.add_argument("--scene", default="collision", help="an app.model.ics generator (default collision)")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--t", type=float, default=2.0, help="time units to run each mode (default 2)")
    ap.add_argument("--dt", type=float, default=1 / 16, help="dt_max, the max step (default 1/16)")
    ap.add_argument("--levels", type=int, default=6, help="L: the finest step is dt / 2^L (default 6)")
    ap.add_argument("--eta", type=float, default=0.01, help="the criterion's accuracy (default 0.01)")
    ap.add_argument("--softening", type=float, default=0.01)
    ap.add_argument("--theta", type=float, default=0.5, help="the tree's opening angle (cube test)")
    ap.add_argument(
        "--modes",
        default="block,shared",
        help="comma-separated: block, shared (every body at the finest level any body wants), "
        "levelK (every body at level K, never changed: shared steps of dt/2^K, e.g. the "
        "level whose cost equals block's); block and shared take a suffix :settled "
        "(the scheduler's default, as without one), :boundary or :aligned, the rule for "
        "when a level may get coarser (app.engine.blocksteps.relevel; committed runs "
        "without a suffix were made while the default was aligned: the header says which); "
        "default block,shared",
    )
    ap.add_argument("--csv", type=Path, required=True, help="per max step rows (written as they come)")
    ap.add_argument(
        "--plot",
        type=Path,
        metavar="PNG",
        help="|dE/E| and the active fraction against time, both modes, from the CSV",
    )
    ap.add_argument("--replot", action="store_true", help="only draw --plot from an existing --csv")
    ap.add_argument(
        "--also",
        type=Path,
        action="append",
        default=[],
        metavar="CSV",
        help="with --replot: another run's CSV drawn beside --csv's (e.g. its levelK modes)",
    )
    ap.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="MODE=LABEL",
        help="with --replot: draw MODE (in any of the CSVs) as LABEL (e.g. block=block:aligned, "
        "for a run made when aligned was the default rule); MODE= leaves it out (e.g. a "
        "second copy of the same shared run)",
    )
    args = ap.parse_args(argv)
    if args.replot:
        missing = [str(p) for p in (args.csv, *args.also) if not p.is_file()]
        unlabelled = [text for text in args.label if "=" not in text]
        if unlabelled:
            print(f"blocksteps_gpu: --label takes MODE=LABEL, not {unlabelled[0]!r}", file=sys.stderr)
            return 2
        if args.plot is None or missing:
            print(
                "blocksteps_gpu: --replot needs existing CSVs and a --plot (missing: "
                f"{', '.join(missing) or 'none'})",
                file=sys.stderr,
            )
            return 2
        labels = dict(text.split("=", 1) for text in args.label)
        plot([args.csv, *args.also], args.plot, labels)
        return 0
    modes = args.modes.split(",")
    if (
        args.n < 2
        or args.t <= 0
        or args.dt <= 0
        or not 0 <= args.levels <= 20
        or args.eta <= 0
        or any(_fixed_level(m, args.levels) is None and _adaptive(m) is None for m in modes)
    ):
        print(
            "blocksteps_gpu: --n >= 2, --t, --dt and --eta > 0, 0 <= --levels <= 20, --modes of "
            "block[:boundary|:settled|:aligned], shared[:...] and levelK (0 <= K <= --levels)",
            file=sys.stderr,
        )
        return 2
    if args.plot is not None and not args.plot.parent.is_dir():
        print(
            f"blocksteps_gpu: {args.plot.parent} is not a folder; make it or choose another --plot",
            file=sys.stderr,
        )
        return 2
    if not args.csv.parent.is_dir():
        print(
            f"blocksteps_gpu: {args.csv.parent} is not a folder; make it or choose another --csv",
            file=sys.stderr,
        )
        return 2
    from app.backends.cuda.blockops import CudaBlockOps
    from app.backends.cuda.device import CudaDevice
    from app.backends.cuda.diagnostics import device_diagnostics
    from app.model.ics import generate
    from app.model.physics import Physics

    physics = Physics(softening=args.softening, dt=args.dt)
    bodies = generate(args.scene, args.n, args.seed)
    steps = max(1, round(args.t / args.dt))
    device = CudaDevice(0)
    summary = {}
    print(
        f"{device.facts.name}: {args.scene} N={args.n:,}, {steps} max steps of {args.dt:g} "
        f"(L={args.levels}, eta={args.eta:g}, eps={args.softening:g}, theta={args.theta:g})",
        flush=True,
    )
    try:
        # untimed: one max step of each mode on a small model first, so that CuPy's kernels (the
        # scheduler's array work) are compiled before any mode's clock runs, not inside the first one's
        small = generate(args.scene, 4096, args.seed)
        for mode in modes:
            warm = CudaBlockOps(copy.deepcopy(small), physics, device, {"theta": args.theta})
            _schedule(mode, physics, args, small.n).max_step(warm)
        with args.csv.open("w", newline="") as f:
            out = csv.writer(f)
            out.writerow(
                [
                    "mode",
                    "max_step",
                    "time",
                    "wall_s",
                    "energy",
                    "rel_energy_error",
                    "active_fraction",
                    "levels",
                ]
            )
            for mode in modes:
                ops = CudaBlockOps(copy.deepcopy(bodies), physics, device, {"theta": args.theta})
                sched = _schedule(mode, physics, args, args.n)
                sched.begin(ops)  # a(x) and the levels, untimed: it also compiles the scheduler's kernels
                e0 = device_diagnostics(ops).energy
                wall = worst = 0.0
                for k in range(1, steps + 1):
                    t0 = time.perf_counter()
                    sched.max_step(ops)
                    with ops.scope():
                        ops.cp.cuda.Device().synchronize()
                    wall += time.perf_counter() - t0
                    e = device_diagnostics(ops).energy
                    worst = max(worst, abs(e - e0) / abs(e0))
                    out.writerow(
                        [
                            mode,
                            k,
                            f"{ops.time:.6g}",
                            f"{wall:.4f}",
                            f"{e:.10e}",
                            f"{abs(e - e0) / abs(e0):.3e}",
                            f"{sched.last.fraction:.4f}",
                            " ".join(map(str, sched.histogram())),
                        ]
                    )
                    f.flush()
                    print(
                        f"  {mode:6} step {k:3}/{steps}: t={ops.time:.3f}, {wall:8.2f} s, "
                        f"|dE/E| {abs(e - e0) / abs(e0):.2e}, active {sched.last.fraction:.3f}",
                        flush=True,
                    )
                summary[mode] = (steps * args.dt / wall, worst, sched.total.fraction, sched.total.targets)
    except KeyboardInterrupt:
        print(f"interrupted: {args.csv} keeps the rows written", file=sys.stderr)
        return 130
    finally:
        device.close()
    for mode, (rate, worst, fraction, targets) in summary.items():
        print(
            f"{mode:6}: {rate:.4f} time units per wall second, max |dE/E| {worst:.2e}, "
            f"active fraction {fraction:.3f}, {targets:,} targets evaluated"
        )
    for suffix in ("", ":boundary", ":settled", ":aligned"):  # each rule's block against its shared
        block, shared = f"block{suffix}", f"shared{suffix}"
        if block in summary and shared in summary:
            (rb, eb, _, tb), (rs, es, _, ts) = summary[block], summary[shared]
            print(
                f"{block} / {shared}: {rb / rs:.2f}x simulated time per wall second (bar >= 3), energy "
                f"{eb / es:.2f}x shared's (bar <= 2); {ts / tb:.2f}x fewer targets evaluated (the "
                "speed-up if a substep cost only its active targets' walks)"
            )
    if args.plot is not None:
        plot([args.csv], args.plot)
    return 0


def _schedule(mode: str, physics, args, n: int):
    """The scheduler of a mode: block or shared, or levelK (every one of n bodies at level K, frozen)."""
    from app.engine.blocksteps import BlockSteps

    level = _fixed_level(mode, args.levels)
    if level is None:
        kind, coarsen = _adaptive(mode)
        return BlockSteps(physics, args.levels, eta=args.eta, mode=kind, coarsen=coarsen)
    return BlockSteps(physics, args.levels, eta=args.eta, mode="frozen", levels=np.full(n, level, np.int32))


def _adaptive(mode: str) -> tuple[str, str] | None:
    """(block or shared, the coarsening rule) of a mode "block[:rule]" / "shared[:rule]", else None."""
    from app.model.config import COARSEN

    kind, _, coarsen = mode.partition(":")
    coarsen = coarsen or COARSEN[0]  # the scheduler's default
    return (kind, coarsen) if kind in ("block", "shared") and coarsen in COARSEN else None


def _fixed_level(mode: str, top: int) -> int | None:
    """K of a mode "levelK" within [0, top], else None."""
    if mode.startswith("level") and mode[5:].isdigit() and int(mode[5:]) <= top:
        return int(mode[5:])
    return None


def plot(csv_paths: list[Path], png: Path, labels: dict[str, str] | None = None) -> None:
    """Two panels from the CSVs: |dE/E| against time per mode (log scale), and the mean active fraction
    of each max step's substeps. Written atomically (a temporary file, then renamed)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows: dict[str, list[tuple[float, float, float]]] = {}
    for csv_path in csv_paths:
        with csv_path.open() as f:
            for r in csv.DictReader(f):
                mode = (labels or {}).get(r["mode"], r["mode"])
                if not mode:
                    continue
                rows.setdefault(mode, []).append(
                    (float(r["time"]), float(r["rel_energy_error"]), float(r["active_fraction"]))
                )
    fig = Figure(figsize=(8, 6), layout="constrained")
    FigureCanvasAgg(fig)
    energy, active = fig.subplots(2, 1, sharex=True, height_ratios=(2, 1))
    for mode, pts in rows.items():
        t, de, fr = zip(*pts, strict=True)
        energy.semilogy(t, de, marker="o", ms=3, label=mode)
        active.plot(t, fr, marker="o", ms=3, label=mode)
    energy.set_ylabel("|E(t) - E(0)| / |E(0)|")
    energy.set_title("block against shared time steps: " + "\n".join(p.name for p in csv_paths), fontsize=8)
    energy.legend()
    energy.grid(True, which="both", alpha=0.3)
    active.set_ylabel("active fraction")
    active.set_xlabel("time")
    active.set_ylim(0, 1.05)
    active.grid(True, alpha=0.3)
    tmp = png.with_name(png.name + ".part")
    fig.savefig(tmp, format="png", dpi=110)
    tmp.replace(png)
    print(f"wrote {png}")


if __name__ == "__main__":
    sys.exit(main())
