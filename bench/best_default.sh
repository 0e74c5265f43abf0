#!/usr/bin/env bash
# Issue 14 item 4's acceptance on the lent GPU machine: `best` with no tuning cache (the committed picks of
# kernels/best_heuristic.json) must be within 10% of `best` after `nbody-live tune`, at N = 16k, 131k and
# 1M, each side from one bench run. Prints what `best` ran, the two rates and their ratio per N, and exits 1
# if any N is below 0.9. The fresh tune's JSON lands in $OUT: refresh the table from it where you work
# (`nbody-live tune --update-heuristic FILE`) and commit kernels/best_heuristic.json.
#
#   source .kit/setup.sh && bash bench/best_default.sh [BENCH_NS] [BUDGET_S]
#
# About 6 minutes on an H200 with a warm nvcc cache (the tune of five N is most of it).
set -uo pipefail
ns=${1:-16384,131072,1048576}
budget=${2:-90}
source "$(dirname "$0")/device_env.sh"  # out, gpu, day, clocks; PYTHONPATH, headless
# An empty cache folder, so that no tuning cache exists, sharing the compiled kernels (cubins) of the real one.
cubins=$(python3 -c "from app.core.paths import cache_dir; print(cache_dir('cuda'))")
mkdir -p "$cubins"
NBODY_CACHE_DIR=${BEST_CACHE_DIR:-$(mktemp -d)}  # BEST_CACHE_DIR: a later bench can read the same tune
export NBODY_CACHE_DIR
ln -s "$cubins" "$NBODY_CACHE_DIR/cuda"

bench_best() {  # bench_best LABEL: one bench run of `best` at $ns, its log lines and rows
    python3 -m app bench --backend cuda --kernels best --n "$ns" --no-progress \
        --json "$out/$gpu-$day-best-$1.json" 2>&1 | grep -E "best|runs" | tee "$out/best-$1.txt"
}
echo "== best with no tuning cache ($(ls "$NBODY_CACHE_DIR"))"
bench_best untuned
echo "== tune"
python3 -m app tune --n 4096,16384,65536,131072,1048576 --budget-s "$budget" \
    --json "$out/$gpu-$day-tune.json" 2>&1 | tail -7
echo "== best after tune"
bench_best tuned
python3 - "$out/$gpu-$day-best-untuned.json" "$out/$gpu-$day-best-tuned.json" "$ns" <<'PY'
import sys

from app.tools.bench import compare_kernel, load_json

rows = compare_kernel(load_json(sys.argv[1]), load_json(sys.argv[2]), "best",
                      [int(n) for n in sys.argv[3].split(",")])
ok = True
for r in rows:
    good = r["ratio"] is not None and r["ratio"] >= 0.9
    ok &= good
    cells = [f"{v / 1e9:,.0f}" if v else "-" for v in (r["first"], r["second"])]
    ratio = f"{r['ratio']:.3f}" if r["ratio"] else "-"
    print(f"N = {r['n']:>9,}: untuned {cells[0]} / tuned {cells[1]} G interactions/s = {ratio}  "
          + ("ok" if good else "BELOW 0.9"))
print("best without a cache is within 10% of tuned best" if ok else "FAILED: best without a cache is > 10% slower")
sys.exit(0 if ok else 1)
PY
