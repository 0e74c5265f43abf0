"""`bench --gpus 1,2` (app.tools.bench.run_scaling): the scaling between device counts of one benchmark's
rows. Per series (kernel, scene, N and the tunables set), the speed-up of each device count against the
fewest and its efficiency, over the force + exchange time of a step (`step_ms`); the rows at the setting an
approximate kernel is run at (`scaling_at_budget`), and their table (`format_scaling`).
"""

from __future__ import annotations

from app.engine.forces import format_tunables
from app.tools.bench_row import EXCHANGE_FIELD


def step_ms(row: dict) -> float:
    """What scaling compares: the force time of all devices plus the position exchange of one step."""
    return row["median_ms"] + row.get(EXCHANGE_FIELD, 0.0)


def series_key(row: dict) -> tuple:
    """(kernel, scene, N, setting): what a row of one device count is compared with on another."""
    return row["kernel"], row.get("scene"), row["n"], format_tunables(row.get("tunables") or {})


def scaling_rows(rows: list[dict]) -> list[dict]:
    """Per series (kernel, scene, N and the tunables the row set) measured on several device counts:
    speed-up of each count against the smallest (its force + exchange time per step, `step_ms`) and the
    efficiency, speed-up × K_base / K. Rows of other scenes or settings are never compared."""
    ok: dict[tuple, dict[int, dict]] = {}
    for r in rows:
        if r.get("status") == "ok" and "gpus" in r:
            ok.setdefault(series_key(r), {})[r["gpus"]] = r
    out = []
    for (kernel, scene, n, _setting), by_k in ok.items():
        base = min(by_k)
        for k in sorted(by_k):
            speedup = step_ms(by_k[base]) / step_ms(by_k[k])
            out.append(
                {
                    "kernel": kernel,
                    "scene": scene,
                    "n": n,
                    "tunables": dict(by_k[k].get("tunables") or {}),
                    "gpus": k,
                    "baseline_gpus": base,
                    "step_ms": step_ms(by_k[k]),
                    "exchange_ms": by_k[k].get(EXCHANGE_FIELD, 0.0),
                    "speedup": speedup,
                    "efficiency": speedup * base / k,
                }
            )
    return out


def scaling_at_budget(result: dict) -> list[dict]:
    """The scaling rows that answer "how much faster on K devices": per kernel, scene and N, the setting an
    approximate kernel (a tree) is run at, the fastest within its error budget on the fewest devices
    (`fastest_within_budget`; its accelerations are those of every device count: the domain split is
    bitwise one device's); a kernel without error samples has one setting."""
    fewest = min(result.get("gpu_counts") or [1])
    entries = result.get("fastest_within_budget") or []
    sampled = {(e["kernel"], e.get("scene"), e["n"]) for e in entries}
    chosen = {
        (e["kernel"], e.get("scene"), e["n"]): e["tunables"]
        for e in entries
        if e.get("gpus", fewest) == fewest and e.get("tunables") is not None
    }
    out = []
    for row in result.get("scaling") or []:
        key = (row["kernel"], row.get("scene"), row["n"])
        if key not in sampled or chosen.get(key) == row.get("tunables"):
            out.append(row)
    return out


def format_scaling(result: dict) -> str:
    """The scaling rows at the budget's setting (`scaling_at_budget`) as a table ("" when there are none);
    the JSON's "scaling" has every setting."""
    rows = result.get("scaling_at_budget") or []
    if not rows:
        return ""
    lines = [
        f"{'kernel':<22} {'scene':<10} {'N':>11} {'GPUs':>5} {'step ms':>10} {'exchange ms':>12} "
        f"{'speed-up':>9} {'efficiency':>10}"
    ]
    for r in rows:
        label = " ".join(filter(None, [r["kernel"], format_tunables(r.get("tunables") or {})]))
        lines.append(
            f"{label:<22} {r.get('scene') or '':<10} {r['n']:>11,} {r['gpus']:>5} "
            f"{r['step_ms']:>10.4f} {r['exchange_ms']:>12.4f} {r['speedup']:>9.2f} "
            f"{100 * r['efficiency']:>9.0f}%"
        )
    return (
        "scaling (force + exchange per step against the fewest devices; a tree at the fastest θ within "
        "its budget on the fewest):\n" + "\n".join(lines)
    )
