"""The `bench --plot` PNG: interactions/s against N, log-log, one line per kernel, from a bench result.

    fig = bench_figure(result)               # a matplotlib Figure (no pyplot: no global state, no GUI)
    plot(result, "bench/results/h200.png")   # the same, written as a PNG through the Agg canvas

Everything drawn comes from the result (app.bench's JSON): the measured rate of each kernel as a solid
line with markers (colour and marker both cycle, so 14 kernels never share a look), the "equivalent
all-pairs" rate of a kernel that evaluates fewer pairs than N² (a tree) as a dotted line in its colour,
and every entry of `references` dashed (a constant: the FP32 issue limit; points: a published series).
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from app.bench import EQUIVALENT_FIELD

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
          "#bcbd22", "#17becf")  # matplotlib's tab10: ten hues that stay apart
MARKERS = "os^vDP*Xh<>p"  # 12 markers against 10 colours: the first repeated look is kernel 61
LIMIT_COLOR = "crimson"
REFERENCE_COLOR = "0.35"
SIZE_PX = (1100, 660)
DPI = 100


def _n_label(n: int) -> str:
    if n >= 2**20 and n % 2**20 == 0:
        return f"{n >> 20}Mi"
    if n >= 1024 and n % 1024 == 0:
        return f"{n >> 10}Ki"
    return str(n)


def _series(result: dict, field: str) -> dict[str, list[tuple[int, float]]]:
    """kernel (on K GPUs, for `bench --gpus`) -> sorted (N, rate) of its measured rows that have `field`."""
    from app.bench import row_label

    series: dict[str, list[tuple[int, float]]] = {}
    for r in result.get("results", []):
        if r.get("status") == "ok" and field in r:
            series.setdefault(row_label(r), []).append((r["n"], r[field]))
    return {k: sorted(v) for k, v in series.items()}


def title(result: dict) -> str:
    dev = (result.get("device") or {}).get("name") or result.get("backend", "")
    date = str(result.get("date", ""))[:10]
    commit = ((result.get("git") or {}).get("commit") or "")[:8]
    return f"NBody Live force kernels on {dev}  {date}  {commit}".rstrip()


def bench_figure(result: dict) -> Figure:
    fig = Figure(figsize=(SIZE_PX[0] / DPI, SIZE_PX[1] / DPI), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)  # headless: the Agg raster canvas, whatever matplotlib's default backend is
    ax = fig.subplots()
    measured = _series(result, "interactions_per_s")
    equivalent = _series(result, EQUIVALENT_FIELD)
    for k, (name, pts) in enumerate(measured.items()):
        style = {"color": COLORS[k % len(COLORS)], "marker": MARKERS[k % len(MARKERS)]}
        ax.plot([n for n, _ in pts], [v / 1e9 for _, v in pts], linewidth=2, label=name, **style)
        if name in equivalent:
            eq = equivalent[name]
            ax.plot([n for n, _ in eq], [v / 1e9 for _, v in eq], linestyle=":", linewidth=1.5,
                    markerfacecolor="none", label=f"{name} (equivalent all-pairs)", **style)
    for ref in result.get("references", []):
        if "interactions_per_s" in ref:
            ax.axhline(ref["interactions_per_s"] / 1e9, linestyle="--", linewidth=1.5, color=LIMIT_COLOR,
                       label=ref["label"])
        else:
            ax.plot([n for n, _ in ref["points"]], [v / 1e9 for _, v in ref["points"]], linestyle="--",
                    marker=".", color=REFERENCE_COLOR, label=ref["label"])
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: _n_label(int(round(v)))))
    plain = FuncFormatter(lambda v, _pos: f"{v:,g}")  # 2,000 rather than 2×10³: rates are read, not sized
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    if not ax.lines:  # nothing measured: still a labelled, readable frame over the Ns asked for
        ns = [r["n"] for r in result.get("results", [])] or [1024, 65536]
        ax.set_xlim(min(ns) / 2, max(ns) * 2)
        ax.set_ylim(1e-3, 1e3)
    ax.set_xlabel("N (bodies)")
    ax.set_ylabel("G interactions / s")
    ax.set_title(title(result), fontsize=11)
    ax.grid(True, which="major", alpha=0.35)
    skipped = sum(r.get("status") != "ok" for r in result.get("results", []))
    if skipped:
        ax.text(0.99, 0.01, f"{skipped} run(s) not measured: see the JSON", transform=ax.transAxes,
                ha="right", va="bottom", fontsize=9, color="0.4")
    if ax.lines:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, borderaxespad=0.0)
    return fig


def plot(result: dict, png_path) -> Path:
    """Write `bench_figure(result)` as a PNG (SIZE_PX), atomically (app.outputs); returns the path."""
    from app.outputs import atomic_write

    png_path = Path(png_path)
    with atomic_write(png_path, "wb", "bench plot") as f:
        bench_figure(result).savefig(f, dpi=DPI, format="png")
    return png_path
