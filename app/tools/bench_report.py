"""The `bench` command's output (app.tools.bench): the result as JSON (`write_json`, `load_json`), its
table on the terminal (`format_table`, with each row's details: what `best` ran, a tree's interactions and
stages, several devices' and ranks' times; `print_table` adds the scaling table), and two results'
rates of one kernel side by side (`compare_kernel`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from app.engine.forces import format_tunables
from app.model.ics import BENCH_SCENE as DEFAULT_SCENE
from app.tools.bench_row import (
    DEVICES_FIELD,
    EQUIVALENT_FIELD,
    EXCHANGE_FIELD,
    GFLOPS_FIELD,
    STAGES_FIELD,
    WALK_TFLOPS_FIELD,
)
from app.tools.bench_scaling import format_scaling


def write_json(result: dict, path) -> None:
    """The results as JSON, written atomically (app.core.outputs); RuntimeFault naming `path` on failure."""
    from app.core.outputs import atomic_write

    with atomic_write(path, "w", "bench results") as f:
        f.write(json.dumps(result, indent=2, default=_json_default) + "\n")


def _json_default(obj):
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, tuple | set):
        return list(obj)
    return str(obj)


def load_json(path) -> dict:
    return json.loads(Path(path).read_text())


def row_label(row: dict) -> str:
    """'tree theta=0.5', 'best ×2': the kernel, the tunables the row set (nothing for a kernel's own
    settings) and its device count when it has one (`bench --gpus`)."""
    kernel = f"{row['kernel']} ×{row['gpus']}" if "gpus" in row else row["kernel"]
    return " ".join(filter(None, [kernel, format_tunables(row.get("tunables") or {})]))


def format_table(result: dict) -> str:
    from app.tools.bench_sweep import summary_lines

    dev = result.get("device") or {}
    head = f"{result.get('backend', '?')} on {dev.get('name', '?')}"
    if dev.get("sm_clock_max_mhz"):
        head += f", SM clock max {dev['sm_clock_max_mhz']:.0f} MHz"
    if dev.get("driver_version"):
        head += f", driver {dev['driver_version']}"
    head += f"; medians of {result.get('repeats', '?')} steps"
    rows = result.get("results", [])
    # the "equivalent all-pairs" column only when a kernel evaluated fewer pairs than N² (a tree), the
    # error columns only when a row sampled its force error
    equivalent = any(EQUIVALENT_FIELD in r for r in rows)
    errors = any("p99" in (r.get("error") or {}) for r in rows)
    heads = (
        ["force ms", "step ms", "G inter/s", "GFLOP/s(20)"]
        + (["eq. all-pairs G/s"] if equivalent else [])
        + (["err median", "err p99", "err max"] if errors else [])
    )
    widths = [11, 11, 11, 12] + ([17] if equivalent else []) + ([10, 9, 9] if errors else [])
    labels = [row_label(r) for r in rows]
    label_w = max([16, *map(len, labels)])
    scene_w = max([5, *(len(r.get("scene", DEFAULT_SCENE)) for r in rows)])

    def line(label: str, scene: str, n: str, cells: list[str], note: str = "") -> str:
        text = f"{label:<{label_w}} {scene:<{scene_w}} {n:>10} " + " ".join(
            f"{c:>{w}}" for c, w in zip(cells, widths, strict=True)
        )
        return text + (f"  {note}" if note else "")

    lines = [head, line("kernel", "scene", "N", heads, "note")]
    for label, r in zip(labels, rows, strict=True):
        scene, n = r.get("scene", DEFAULT_SCENE), f"{r['n']:,}"
        if r.get("status") == "ok":
            ips = r["interactions_per_s"]
            step = r.get("step_median_ms")
            cells = [
                f"{r['median_ms']:.4f}",
                "-" if step is None else f"{step:.4f}",
                f"{ips / 1e9:.2f}",
                f"{r[GFLOPS_FIELD]:.1f}",
            ]
            if equivalent:
                cells.append(f"{r[EQUIVALENT_FIELD] / 1e9:.2f}" if EQUIVALENT_FIELD in r else "-")
            err = r.get("error") or {}
            if errors:
                cells += [f"{err[k]:.2e}" for k in ("median", "p99", "max")] if "p99" in err else ["-"] * 3
            note = f"error sample: {err['reason']}" if "reason" in err else ""
            lines.append(line(label, scene, n, cells, note))
            lines += detail_lines(r)
        else:
            lines.append(line(label, scene, n, ["-"] * len(heads), f"{r.get('status')}: {r.get('reason')}"))
    if any("p99" in (r.get("error") or {}) for r in rows):
        k = max((r["error"]["sample"] for r in rows if "p99" in (r.get("error") or {})), default=0)
        lines.append(
            f"err: relative acceleration error of {k:,} random targets against the exact all-pairs "
            "sum on the same device (step ms = force + integrate)"
        )
    lines += summary_lines(result.get("fastest_within_budget", []))
    return "\n".join(lines)


def detail_lines(r: dict) -> list[str]:
    """Under a row: what it ran (`best`), what its interactions were when not all-pairs, and its time split
    per stage."""
    out = [f"{'':<16}   runs {r['runs']}"] if r.get("runs") else []
    if EQUIVALENT_FIELD in r:
        cells = r.get("body_cell", 0)
        out.append(
            f"{'':<16}   {r['interactions'] / r['n']:,.0f} interactions/body (body-body + body-cell, "
            f"{100 * cells / r['interactions']:.0f}% body-cell): {r['interactions_per_s'] / 1e9:.2f} "
            f"G/s; equivalent all-pairs N²/t {r[EQUIVALENT_FIELD] / 1e9:.2f} G/s"
        )
    if r.get(STAGES_FIELD):
        split = " · ".join(f"{name} {ms:.3f}" for name, ms in r[STAGES_FIELD].items())
        out.append(f"{'':<16}   stages (median ms): {split}")
    if r.get(WALK_TFLOPS_FIELD):
        bb, bc = r["walk_flops"]
        share = r.get("walk_fp32_peak_fraction")
        peak = f", {100 * share:.0f}% of the device's FP32 peak" if share else ""
        out.append(
            f"{'':<16}   walk {r[WALK_TFLOPS_FIELD]:.1f} TFLOP/s FP32 ({bb} flops per body-body, "
            f"{bc} per body-cell){peak}"
        )
    if r.get(DEVICES_FIELD):
        split = " · ".join(f"{name} {ms:.3f}" for name, ms in r[DEVICES_FIELD].items())
        out.append(f"{'':<16}   devices (median force ms): {split}; exchange {r[EXCHANGE_FIELD]:.3f}")
    if r.get("ranks"):
        force = " / ".join(f"{v:.3f}" for v in r["rank_force_median_ms"])
        exchange = " / ".join(f"{v:.3f}" for v in r["rank_exchange_median_ms"])
        out.append(
            f"{'':<16}   {r['ranks']} ranks (median ms per rank): force {force} · exchange {exchange}"
            f" · imbalance {100 * r['rank_imbalance']:.0f}%"
        )
    return out


def print_table(result: dict) -> None:
    print(format_table(result))
    scaling = format_scaling(result)
    if scaling:
        print(scaling)


def compare_kernel(first: dict, second: dict, kernel: str, ns: list[int]) -> list[dict]:
    """`kernel`'s rate at each N in two bench results: [{n, first, second, ratio = first / second}], with
    None where a result has no ok row (bench/best_default.sh: best untuned / best tuned)."""

    def rates(result: dict) -> dict[int, float]:
        return {
            r["n"]: r["interactions_per_s"]
            for r in result.get("results", [])
            if r.get("kernel") == kernel and r.get("status") == "ok"
        }

    a, b = rates(first), rates(second)
    return [
        {
            "n": n,
            "first": a.get(n),
            "second": b.get(n),
            "ratio": a[n] / b[n] if a.get(n) and b.get(n) else None,
        }
        for n in ns
    ]
