"""The splat's cost per frame as a PNG, from a `bench/splat_cost.py` JSON (docs/rendering.md, "Measured"):
one stacked bar per (N, accumulation), its GPU stages (clear, accumulate, histogram, exposure, bloom, tone
map) in milliseconds, with the wall time of the whole draw (queued, then waited for) written above.

    python3 bench/splat_plot.py bench/results/h200-2026-11-26-splat-cost.json \\
        --png bench/results/h200-2026-11-26-splat-cost.png

Everything drawn comes from the JSON; a file without rows is an error (exit 2).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere in the checkout

from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from app.tools.bench_plot import _n_label  # noqa: E402

# (bloom: 0 where it was off; exposure: a kernel since session 23, absent from earlier files)
STAGES = ("clear", "accumulate", "histogram", "exposure", "bloom", "tonemap")
STAGE_COLORS = ("#888888", "#e0702a", "#3a7dc8", "#9c4dcc", "#c8a03a", "#4caf50")


def plot(data: dict, png: Path) -> None:
    rows = sorted(data["rows"], key=lambda r: (r["n"], r["method"]))
    fig = Figure(figsize=(9.0, 4.8), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    labels = [f"{_n_label(r['n'])}\n{r['method']}" for r in rows]
    bottom = [0.0] * len(rows)
    for stage, color in zip(STAGES, STAGE_COLORS, strict=True):
        values = [r["ms"].get(stage, 0.0) for r in rows]
        ax.bar(labels, values, bottom=bottom, color=color, label=stage)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    for x, (r, top) in enumerate(zip(rows, bottom, strict=True)):
        text = f"GPU {r['gpu_ms']:.2f} ms\nwall {r['wall_ms']:.2f} ms"
        ax.annotate(
            text, (x, top), ha="center", va="bottom", fontsize=8, xytext=(0, 3), textcoords="offset points"
        )
    ax.set_ylabel("ms per frame (CUDA events, median)")
    w, h = rows[0]["width"], rows[0]["height"]
    ax.set_title(f"splat draw, {w}x{h}, {data['scene']} bodies, {data['device']}", fontsize=10)
    ax.set_ylim(0, max(bottom) * 1.25)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(png)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", type=Path)
    ap.add_argument("--png", type=Path, required=True)
    args = ap.parse_args(argv)
    from app.core.errors import RuntimeFault
    from app.core.outputs import check_output

    try:
        check_output(args.png, "the plot")
    except RuntimeFault as e:
        print(f"splat_plot: {e}", file=sys.stderr)
        return 2
    try:
        data = json.loads(args.json.read_text())
        if not data.get("rows"):
            raise ValueError("no rows")
    except (OSError, ValueError) as e:
        print(f"splat_plot: {args.json}: not a splat_cost JSON with rows ({e})", file=sys.stderr)
        return 2
    plot(data, args.png)
    print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
