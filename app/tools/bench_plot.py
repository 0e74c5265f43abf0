"""The `bench --plot` PNG: interactions/s against N, log-log, one line per kernel, from a bench result; and,
when rows sampled their force error (an approximate kernel: a tree), a second panel of step time against
that error.

    fig = bench_figure(result)               # a matplotlib Figure (no pyplot: no global state, no GUI)
    plot(result, "bench/results/h200.png")   # the same, written as a PNG through the Agg canvas

Everything drawn comes from the result (app.tools.bench's JSON). Top panel: the measured rate of each series
(a kernel, and its scene and swept tunables when the run had several) as a solid line with markers (the
colour follows the kernel and scene, the marker cycles too, so 14 kernels never share a look), the
"equivalent all-pairs" rate of a kernel that evaluates fewer pairs than N² (a tree) as a dotted line in
its colour, and every entry of `references` dashed (a constant: the FP32 issue limit; points: a published
series). Accuracy panel: per kernel, scene and N, the median step time (force + integrate) of each
setting against its sampled p99 relative error, each point labelled with its setting, the fastest setting
within the budget ringed and labelled with its time; the budget as a vertical line, and the exact kernels
measured at the same scene and N as horizontal lines in the same colour.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from app.engine.forces import format_tunables
from app.tools.bench import EQUIVALENT_FIELD
from app.tools.bench_sweep import step_ms

COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)  # matplotlib's tab10: ten hues that stay apart
MARKERS = "os^vDP*Xh<>p"  # 12 markers against 10 colours: the first repeated look is kernel 61
LIMIT_COLOR = "crimson"
REFERENCE_COLOR = "0.35"
SIZE_PX = (1100, 660)
SIZE_PX_WITH_ERRORS = (1100, 1250)  # the accuracy panel under the rates
DPI = 100


# 2,000 rather than 2×10³ (values are read, not sized), and 4,000,000 rather than 4e+06
PLAIN = FuncFormatter(lambda v, _pos: f"{v:,.0f}" if v >= 1 else f"{v:g}")


def _n_label(n: int) -> str:
    if n >= 2**20 and n % 2**20 == 0:
        return f"{n >> 20}Mi"
    if n >= 1024 and n % 1024 == 0:
        return f"{n >> 10}Ki"
    return str(n)


def _series(result: dict, field: str) -> dict[str, list[tuple[int, float]]]:
    """series label -> sorted (N, rate) of its measured rows that have `field` (a series: a kernel on K
    GPUs for `bench --gpus`, and its scene and tunables where the run had several of them)."""
    series: dict[str, list[tuple[int, float]]] = {}
    several_scenes = len(result.get("scenes") or []) > 1
    for r in result.get("results", []):
        if r.get("status") == "ok" and field in r:
            series.setdefault(series_label(r, several_scenes), []).append((r["n"], r[field]))
    return {k: sorted(v) for k, v in series.items()}


def series_label(r: dict, scene: bool = False) -> str:
    """'tree · collision · theta=0.5': the kernel (×K on K GPUs), its scene (when `scene`), the tunables
    the row set."""
    kernel = f"{r['kernel']} ×{r['gpus']}" if "gpus" in r else r["kernel"]
    parts = [kernel, r.get("scene") if scene else None, format_tunables(r.get("tunables") or {})]
    return " · ".join(p for p in parts if p)


def _looks(result: dict, labels: list[str]) -> dict[str, dict]:
    """label -> {color, marker}: one colour per kernel and scene (the part before the tunables), the
    marker stepping on per series, so that settings of one kernel share a hue and differ in marker."""
    several_scenes = len(result.get("scenes") or []) > 1
    group_of = {
        series_label(r, several_scenes): (r["kernel"], r.get("scene") if several_scenes else None)
        for r in result.get("results", [])
    }
    groups = list(dict.fromkeys(group_of[label] for label in labels))
    seen: dict[tuple, int] = {}
    out = {}
    for label in labels:
        g = groups.index(group_of[label])
        k = seen[group_of[label]] = seen.get(group_of[label], -1) + 1
        out[label] = {"color": COLORS[g % len(COLORS)], "marker": MARKERS[(g + k) % len(MARKERS)]}
    return out


def title(result: dict) -> str:
    dev = (result.get("device") or {}).get("name") or result.get("backend", "")
    date = str(result.get("date", ""))[:10]
    commit = ((result.get("git") or {}).get("commit") or "")[:8]
    return f"NBody Live force kernels on {dev}  {date}  {commit}".rstrip()


def has_errors(result: dict) -> bool:
    """Whether any measured row sampled its force error (then the figure has the accuracy panel)."""
    return any(r.get("status") == "ok" and "p99" in (r.get("error") or {}) for r in result.get("results", []))


def bench_figure(result: dict) -> Figure:
    accuracy = has_errors(result)
    width, height = SIZE_PX_WITH_ERRORS if accuracy else SIZE_PX
    fig = Figure(figsize=(width / DPI, height / DPI), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)  # headless: the Agg raster canvas, whatever matplotlib's default backend is
    if accuracy:
        ax, err_ax = fig.subplots(2, 1, height_ratios=(1, 1))
    else:
        ax, err_ax = fig.subplots(), None
    _rates_panel(ax, result)
    if err_ax is not None:
        _accuracy_panel(err_ax, result)
    return fig


def _rates_panel(ax, result: dict) -> None:
    measured = _series(result, "interactions_per_s")
    equivalent = _series(result, EQUIVALENT_FIELD)
    looks = _looks(result, list(measured))
    for name, pts in measured.items():
        style = looks[name]
        ax.plot([n for n, _ in pts], [v / 1e9 for _, v in pts], linewidth=2, label=name, **style)
        if name in equivalent:
            eq = equivalent[name]
            ax.plot(
                [n for n, _ in eq],
                [v / 1e9 for _, v in eq],
                linestyle=":",
                linewidth=1.5,
                markerfacecolor="none",
                label=f"{name} (equivalent all-pairs)",
                **style,
            )
    for ref in result.get("references", []):
        if "interactions_per_s" in ref:
            ax.axhline(
                ref["interactions_per_s"] / 1e9,
                linestyle="--",
                linewidth=1.5,
                color=LIMIT_COLOR,
                label=ref["label"],
            )
        else:
            ax.plot(
                [n for n, _ in ref["points"]],
                [v / 1e9 for _, v in ref["points"]],
                linestyle="--",
                marker=".",
                color=REFERENCE_COLOR,
                label=ref["label"],
            )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: _n_label(int(round(v)))))
    if not ax.lines:  # nothing measured: still a labelled, readable frame over the Ns asked for
        ns = [r["n"] for r in result.get("results", [])] or [1024, 65536]
        ax.set_xlim(min(ns) / 2, max(ns) * 2)
        ax.set_ylim(1e-3, 1e3)
    _plain_log_labels(ax)
    ax.set_xlabel("N (bodies)")
    ax.set_ylabel("G interactions / s")
    ax.set_title(title(result), fontsize=11)
    ax.grid(True, which="major", alpha=0.35)
    skipped = sum(r.get("status") != "ok" for r in result.get("results", []))
    if skipped:
        ax.text(
            0.99,
            0.01,
            f"{skipped} run(s) not measured: see the JSON",
            transform=ax.transAxes,
            ha="right",
            va="bottom",
            fontsize=9,
            color="0.4",
        )
    _legend(ax)


def _accuracy_panel(ax, result: dict) -> None:
    """Step time against sampled p99 error per (kernel, scene, N); see the module doc."""
    rows = [r for r in result.get("results", []) if r.get("status") == "ok"]
    sampled = [r for r in rows if "p99" in (r.get("error") or {})]
    groups: dict[tuple, list[dict]] = {}
    for r in sampled:
        groups.setdefault((r["kernel"], r.get("scene"), r["n"]), []).append(r)
    chosen = {
        (e["kernel"], e["scene"], e["n"]): e
        for e in result.get("fastest_within_budget", [])
        if e.get("tunables") is not None
    }
    exact = [r for r in rows if "p99" not in (r.get("error") or {})]
    for g, ((kernel, scene, n), group) in enumerate(groups.items()):
        color, marker = COLORS[g % len(COLORS)], MARKERS[g % len(MARKERS)]
        xs, ys = [r["error"]["p99"] for r in group], [step_ms(r) for r in group]
        ax.plot(
            xs, ys, color=color, marker=marker, linewidth=1.5, label=f"{kernel} · {scene} · {_n_label(n)}"
        )
        for r, x, y in zip(group, xs, ys, strict=True):
            ax.annotate(
                format_tunables(r.get("tunables") or {}) or "default",
                (x, y),
                textcoords="offset points",
                xytext=(4, 4),
                fontsize=7,
                color=color,
            )
        best = chosen.get((kernel, scene, n))
        if best is not None:
            ax.plot(
                [best["p99"]],
                [best["step_median_ms"]],
                linestyle="none",
                marker="o",
                markersize=14,
                markerfacecolor="none",
                markeredgecolor=color,
                markeredgewidth=1.5,
            )
            ax.annotate(
                f"{best['step_median_ms']:.2f} ms",
                (best["p99"], best["step_median_ms"]),
                textcoords="offset points",
                xytext=(8, -12),
                fontsize=8,
                color=color,
                weight="bold",
            )
        for r in exact:
            if (r.get("scene"), r["n"]) == (scene, n):
                ax.axhline(
                    step_ms(r),
                    color=color,
                    linestyle="-.",
                    linewidth=1.2,
                    label=f"{r['kernel']} · {scene} · {_n_label(n)} (all-pairs: {step_ms(r):,.1f} ms)",
                )
    for budget in sorted({r["error"]["budget_p99"] for r in sampled if r["error"].get("budget_p99")}):
        ax.axvline(budget, color=LIMIT_COLOR, linestyle="--", linewidth=1.2, label=f"p99 budget {budget:g}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.margins(x=0.12, y=0.08)  # room for the setting labels right of the outermost points
    _plain_log_labels(ax)
    k = max(r["error"]["sample"] for r in sampled)
    ax.set_xlabel(f"p99 relative acceleration error ({k:,} random targets against the exact all-pairs sum)")
    ax.set_ylabel("ms per step (force + integrate)")
    ax.set_title("accuracy against time per step: the fastest setting within the budget ringed", fontsize=11)
    ax.grid(True, which="major", alpha=0.35)
    _legend(ax)


def log2_axis(ax, ticks, labels, xlabel: str) -> None:
    """A base-2 log x axis with these ticks and labels, and a light grid (the scaling and refit plots)."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, labels)
    ax.set_xlabel(xlabel)
    ax.grid(True, which="both", alpha=0.3)


def _plain_log_labels(ax) -> None:
    """Plain numbers on a log y axis. Minor ticks: every one labelled over up to two decades, the 2s and
    5s labelled over up to four, none beyond (their labels would run into each other)."""
    ax.yaxis.set_major_formatter(PLAIN)
    low, high = ax.get_ylim()
    if high > 100 * low:
        ax.yaxis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)))
    ax.yaxis.set_minor_formatter(PLAIN if high <= 1e4 * low else NullFormatter())


def _legend(ax) -> None:
    if ax.lines:
        many = len(ax.get_legend_handles_labels()[1]) > 16
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8 if many else 9, borderaxespad=0.0)


def plot(result: dict, png_path) -> Path:
    """Write `bench_figure(result)` as a PNG (SIZE_PX), atomically (app.core.outputs); returns the path."""
    from app.core.outputs import atomic_write

    png_path = Path(png_path)
    with atomic_write(png_path, "wb", "bench plot") as f:
        bench_figure(result).savefig(f, dpi=DPI, format="png")
    return png_path
