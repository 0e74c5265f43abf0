"""The refit's PNG: a tree's step time and p99 against rebuild_every, on one and on several devices, from
`bench` JSONs that sweep it (docs/tree.md, "The GPU refit").

    python3 bench/refit_plot.py bench/results/h200x2-2026-11-26-refit-1m.json \\
        bench/results/h200x2-2026-11-26-refit-8m.json --png bench/results/h200x2-2026-11-26-refit.png

Left: milliseconds per step (force + exchange; each sample the mean step of a whole cycle of R steps, as
`bench` times a record with a period tunable) against R, one colour per scene, θ and N, solid for one
device and dashed for more, the speed-up of the most devices written at each of its points. Right: the
p99 of the row's error sample against R, with the budget. Everything drawn comes from the JSONs; rows
without rebuild_every (another kernel) are left out, and a file with none of them is an error (exit 2).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere in the checkout

from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from app.tools.bench_plot import COLORS, MARKERS, _n_label, log2_axis  # noqa: E402

SIZE_PX = (1300, 680)
DPI = 100
P99_BUDGET = 1e-3


def refit_rows(results: list[dict]) -> dict[tuple, dict[int, dict[int, dict]]]:
    """(scene, θ, N) -> devices -> R -> row, for the ok rows that carry rebuild_every."""
    out: dict[tuple, dict[int, dict[int, dict]]] = {}
    for r in results:
        used = r.get("tunables_used") or {}
        if r.get("status") != "ok" or "rebuild_every" not in used:
            continue
        devices = len(r.get("devices_median_ms") or {}) or 1
        key = (r["scene"], used.get("theta"), r["n"])
        out.setdefault(key, {}).setdefault(devices, {})[int(used["rebuild_every"])] = r
    return out


def step_ms(row: dict) -> float:
    return row["median_ms"] + row.get("exchange_median_ms", 0.0)


def refit_figure(results: list[dict], title: str) -> Figure:
    rows = refit_rows(results)
    if not rows:
        raise ValueError("no tree rows with rebuild_every in these results")
    fig = Figure(figsize=(SIZE_PX[0] / DPI, SIZE_PX[1] / DPI), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    times, errors = fig.subplots(1, 2)
    every = sorted({e for by_dev in rows.values() for by_r in by_dev.values() for e in by_r})
    for i, ((scene, theta, n), by_dev) in enumerate(sorted(rows.items())):
        color, marker = COLORS[i % len(COLORS)], MARKERS[i % len(MARKERS)]
        label = f"{scene} θ {theta:g} N {_n_label(n)}"
        fewest = min(by_dev)
        for devices, by_r in sorted(by_dev.items()):
            rs = sorted(by_r)
            style = "-" if devices == fewest else "--"
            times.plot(
                rs,
                [step_ms(by_r[e]) for e in rs],
                style,
                color=color,
                marker=marker,
                label=f"{label} · {devices} device{'s' if devices > 1 else ''}",
            )
            if devices != fewest:
                for e in rs:
                    if e in by_dev[fewest]:
                        gain = step_ms(by_dev[fewest][e]) / step_ms(by_r[e])
                        times.annotate(
                            f"{gain:.2f}×",
                            (e, step_ms(by_r[e])),
                            textcoords="offset points",
                            xytext=(4, -12),
                            fontsize=7,
                            color=color,
                        )
        base = by_dev[fewest]
        rs = [e for e in sorted(base) if "p99" in (base[e].get("error") or {})]
        errors.plot(rs, [base[e]["error"]["p99"] for e in rs], "-", color=color, marker=marker, label=label)
    for ax in (times, errors):
        log2_axis(ax, every, [str(e) for e in every], "rebuild_every (a build, then R - 1 refits)")
    times.set_yscale("log")
    times.set_ylabel("ms per step (force + exchange), mean of a cycle")
    times.set_title("step time (dashed: more devices, their speed-up written)", fontsize=10)
    errors.axhline(P99_BUDGET, color="crimson", linestyle="--", linewidth=1, label="p99 budget")
    errors.set_ylabel("p99 relative acceleration error")
    errors.set_title("force error after the run (one device's row)", fontsize=10)
    times.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), fontsize=7, ncol=3)  # below: no line hidden
    errors.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), fontsize=7, ncol=3)
    fig.suptitle(title, fontsize=11)
    return fig


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="example: python3 bench/refit_plot.py A.json B.json --png refit.png",
    )
    p.add_argument("json", nargs="+", type=Path, help="bench JSONs sweeping rebuild_every (same device)")
    p.add_argument("--png", type=Path, required=True, help="the PNG to write")
    args = p.parse_args(argv)
    if not args.png.parent.is_dir():
        print(f"refit_plot: the folder of {args.png} does not exist", file=sys.stderr)
        return 2
    results, devices = [], set()
    for path in args.json:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            print(f"refit_plot: cannot read {path}: {e}", file=sys.stderr)
            return 2
        results += data.get("results") or []
        devices.add((data.get("device") or {}).get("name", "?"))
        date = data.get("date", "")
    try:
        fig = refit_figure(results, f"the tree's refit on {', '.join(sorted(devices))}  {date}")
    except ValueError as e:
        print(f"refit_plot: {e}", file=sys.stderr)
        return 2
    from app.core.outputs import atomic_write

    with atomic_write(args.png, "wb", "refit plot") as f:
        fig.savefig(f, dpi=DPI, format="png")
    print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
