"""The markdown table of a tree bench run (`bench --kernels tree,...` JSON), as docs/tree.md quotes it:
one row per tree setting, the full step, the stage split, the interactions per body and the sampled
error percentiles; the fastest setting within the budget per scene and N in bold (the run's
`fastest_within_budget`), then the other kernels' medians.

    python3 bench/tree_table.py bench/results/h200-DATE-tree.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

STAGES = ("keys", "sort", "build", "moments", "walk")


def setting(row: dict) -> str:
    items = sorted(row["tunables"].items())
    return " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in items)


def fastest(run: dict) -> set[tuple]:
    """(kernel, scene, n, setting) of each group's fastest setting within the budget."""
    out = set()
    for f in run.get("fastest_within_budget", []):
        if f.get("tunables") is not None and f.get("within_budget", True):
            out.add((f["kernel"], f["scene"], f["n"], setting(f)))
    return out


def table(run: dict) -> str:
    best = fastest(run)
    head = (
        "| scene | N | setting | step ms | "
        + " | ".join(STAGES)
        + " | interactions / body | p50 | p99 | max |"
    )
    lines = [head, "|---|---:|---|---:|" + "---:|" * len(STAGES) + "---:|---:|---:|---:|"]
    others = []
    for r in run["results"]:
        if r["kernel"] != "tree":
            status = f"{r['median_ms']:.1f} ms" if r.get("median_ms") else r.get("status", "?")
            others.append(f"- `{r['kernel']}` · {r['scene']} · N = {r['n']:,}: {status}")
            continue
        if r.get("status") != "ok":
            lines.append(f"| {r['scene']} | {r['n']:,} | {setting(r)} | {r.get('status')} |")
            continue
        mark = "**" if (r["kernel"], r["scene"], r["n"], setting(r)) in best else ""
        st, err = r["stages_median_ms"], r["error"]
        step, p99 = f"{mark}{r['step_median_ms']:.2f}{mark}", f"{mark}{err['p99']:.1e}{mark}"
        stages = " | ".join(f"{st[s]:.2f}" for s in STAGES)
        lines.append(
            f"| {r['scene']} | {r['n']:,} | {mark}{setting(r)}{mark} | {step} | {stages} | "
            f"{r['interactions'] / r['n']:,.0f} | {err['median']:.1e} | {p99} | {err['max']:.1e} |"
        )
    return "\n".join(lines + [""] + others)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("json", type=Path, help="a bench JSON with tree rows (bench --json)")
    args = p.parse_args(argv)
    try:
        run = json.loads(args.json.read_text())
    except (OSError, ValueError) as e:
        print(f"tree_table: cannot read {args.json}: {e}", file=sys.stderr)
        return 2
    print(table(run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
