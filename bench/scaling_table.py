"""The scaling tables of docs/multi-gpu.md and docs/distributed.md, from the committed JSONs of one machine:

    python3 bench/scaling_table.py bench/results/h100x2-2026-11-25-scaling.json \
        [--ranks bench/results/h100x2-2026-11-25-mpi2.json]

One row per kernel, scene and N at the setting the bench's scaling_at_budget keeps (a tree: the fastest θ
within p99 <= 1e-3 on one device): the step (force + exchange, ms) on the fewest devices, on each larger
count, and with --ranks the MPI job's step at the same setting (the slowest rank's force plus the largest
exchange, app/scaling_plot.ranks_step_ms), each with its speed-up. Markdown on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.tools.bench import series_key  # noqa: E402
from app.tools.scaling_plot import ranks_step_ms  # noqa: E402


def table(result: dict, ranks: dict | None = None) -> str:
    counts = sorted(result.get("gpu_counts") or [1])
    rows: dict[tuple, dict[int, dict]] = {}
    for r in result.get("scaling_at_budget") or []:
        rows.setdefault(series_key(r), {})[r["gpus"]] = r
    mpi = {series_key(r): r for r in (ranks or {}).get("results", []) if r.get("status") == "ok"}
    head = ["kernel", "scene", "N", "setting", f"{counts[0]} GPU ms"]
    for k in counts[1:]:
        head += [f"{k} GPUs ms", "×"]
    if ranks:
        head += [f"{ranks.get('ranks', 2)} ranks ms", "×"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (kernel, scene, n, setting), by_k in rows.items():
        base = by_k[counts[0]]["step_ms"]
        cells = [kernel, scene or "", f"{n:,}", setting or "its own", f"{base:.2f}"]
        for k in counts[1:]:
            r = by_k.get(k)
            cells += [f"{r['step_ms']:.2f}", f"**{r['speedup']:.2f}**"] if r else ["-", "-"]
        if ranks:
            r = mpi.get((kernel, scene, n, setting))
            cells += [f"{ranks_step_ms(r):.2f}", f"**{base / ranks_step_ms(r):.2f}**"] if r else ["-", "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scaling", type=Path, help="a `bench --gpus 1,2` JSON")
    ap.add_argument("--ranks", type=Path, help="a `bench` JSON run under mpiexec on the same machine")
    args = ap.parse_args(argv)
    try:
        result = json.loads(args.scaling.read_text())
        ranks = json.loads(args.ranks.read_text()) if args.ranks else None
    except (OSError, ValueError) as e:
        print(f"scaling_table: {e}", file=sys.stderr)
        return 2
    print(table(result, ranks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
