"""The scaling PNG of `bench --gpus 1,2` (and of MPI ranks beside it): what a second device buys.

    fig = scaling_figure(result, ranks=None)    # a matplotlib Figure (no pyplot)
    plot_scaling(result, "bench/results/h100x2-2026-11-25-scaling.png", ranks=mpi_result)

`result` is a `bench --gpus` JSON (its `scaling_at_budget` rows: per kernel, scene and N, a tree at the
fastest θ within its budget on the fewest devices); `ranks`, optionally, a `bench` JSON run under
`mpiexec -n R` on the same machine, whose rows are matched by kernel, scene, N and setting. Left panel:
milliseconds per step (force + exchange) against N, log-log, one colour per kernel and scene, solid for
the fewest devices, dashed for more, dotted for the ranks. Right panel: the speed-up of each against the
fewest devices, with the ideal K dashed. Everything drawn comes from the JSONs.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from app.tools.bench import series_key
from app.tools.bench_plot import COLORS, MARKERS, _n_label, log2_axis

SIZE_PX = (1300, 560)
DPI = 100


def ranks_step_ms(row: dict) -> float:
    """An MPI row's step as `bench --gpus` counts one: the slowest rank's force plus the largest exchange."""
    return row["median_ms"] + max(row.get("rank_exchange_median_ms") or [0.0])


def series(result: dict, ranks: dict | None = None) -> dict[str, dict]:
    """label -> {"points": {K or "ranks": [(N, step ms)]}, "speedup": {...: [(N, ×)]}} for each
    kernel and scene of `scaling_at_budget` (and the matching rows of `ranks`)."""
    out: dict[str, dict] = {}
    base: dict[tuple, float] = {}
    for r in result.get("scaling_at_budget") or []:
        label = f"{r['kernel']} · {r.get('scene')}"
        entry = out.setdefault(label, {"points": {}, "speedup": {}})
        entry["points"].setdefault(r["gpus"], []).append((r["n"], r["step_ms"]))
        entry["speedup"].setdefault(r["gpus"], []).append((r["n"], r["speedup"]))
        if r["gpus"] == r["baseline_gpus"]:
            base[series_key(r)] = r["step_ms"]
    if ranks:
        count = ranks.get("ranks") or 2
        for r in ranks.get("results") or []:
            if r.get("status") == "ok" and series_key(r) in base:
                entry, how = out[f"{r['kernel']} · {r.get('scene')}"], f"{count} ranks"
                entry["points"].setdefault(how, []).append((r["n"], ranks_step_ms(r)))
                entry["speedup"].setdefault(how, []).append((r["n"], base[series_key(r)] / ranks_step_ms(r)))
    return out


def scaling_figure(result: dict, ranks: dict | None = None) -> Figure:
    fig = Figure(figsize=(SIZE_PX[0] / DPI, SIZE_PX[1] / DPI), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    times, gains = fig.subplots(1, 2)
    counts = sorted(result.get("gpu_counts") or [1])
    styles = {k: ("-" if k == counts[0] else "--") for k in counts}
    for i, (label, s) in enumerate(series(result, ranks).items()):
        color, marker = COLORS[i % len(COLORS)], MARKERS[i % len(MARKERS)]
        for key, pts in s["points"].items():
            pts = sorted(pts)
            how = f"{key} GPU{'s' if key != 1 else ''}" if isinstance(key, int) else key
            times.plot(
                [n for n, _ in pts],
                [ms for _, ms in pts],
                styles.get(key, ":"),
                color=color,
                marker=marker,
                label=f"{label} · {how}",
            )
        for key, pts in s["speedup"].items():
            if key == counts[0]:
                continue
            pts = sorted(pts)
            how = f"{key} GPUs" if isinstance(key, int) else key
            gains.plot(
                [n for n, _ in pts],
                [x for _, x in pts],
                styles.get(key, ":"),
                color=color,
                marker=marker,
                label=f"{label} · {how}",
            )
    ticks = sorted({r["n"] for r in result.get("scaling_at_budget") or []})
    for ax in (times, gains):
        log2_axis(ax, ticks, [_n_label(n) for n in ticks], "N (bodies)")
    times.set_yscale("log")
    times.set_ylabel("ms per step (force + exchange)")
    times.set_title("step time; a tree at the fastest θ within p99 ≤ 1e-3 on one device", fontsize=10)
    for k in counts[1:]:
        gains.axhline(k / counts[0], color="crimson", linestyle="--", linewidth=1)
    gains.set_ylim(0, max(counts) / counts[0] * 1.15)
    gains.set_ylabel(f"speed-up against {counts[0]} device(s)")
    gains.set_title("speed-up (dashed red: ideal)", fontsize=10)
    device = (result.get("device") or {}).get("name", "")
    fig.suptitle(f"scaling on {device}  {result.get('date', '')}", fontsize=11)
    gains.legend(loc="lower right", fontsize=8)
    times.legend(loc="lower right", fontsize=7, ncol=2)
    return fig


def plot_scaling(result: dict, png_path, ranks: dict | None = None) -> Path:
    """Write `scaling_figure` as a PNG, atomically (app.core.outputs); returns the path."""
    from app.core.outputs import atomic_write

    png_path = Path(png_path)
    with atomic_write(png_path, "wb", "scaling plot") as f:
        scaling_figure(result, ranks).savefig(f, dpi=DPI, format="png")
    return png_path
