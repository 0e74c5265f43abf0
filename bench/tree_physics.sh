#!/usr/bin/env bash
# Issue 11's physics run on the lent GPU machine: a Plummer sphere, 1,000 steps at dt = 1e-3, eps = 0.01,
# with the tree at theta = 0.6 (p99 relative force error <= 1e-3 at 1M on the H200), at N = 1,048,576, and
# at N = 65,536 both the tree and all-pairs fp32 (`best`) from the same initial state (same seed). The
# energy and momentum columns come from simulate's float64 device reduction. Logs land in $OUT.
#
#   source .kit/setup.sh && bash bench/tree_physics.sh [STEPS]
set -uo pipefail
steps=${1:-1000}
source "$(dirname "$0")/device_env.sh"  # out, gpu, day, clocks; PYTHONPATH, headless
common=(--backend cuda --steps "$steps" --dt 1e-3 --softening 0.01 --log-every 100 --no-progress)
run() {  # run LABEL N KERNEL [ARGS...]
    local label=$1 n=$2 kernel=$3
    shift 3
    local before t0=$EPOCHREALTIME
    before=$(clocks)
    python3 -m app -q simulate plummer --n "$n" --kernel "$kernel" "${common[@]}" "$@" \
        --log "$out/$gpu-$day-physics-$label.csv" --out "$out/physics-$label.npz" >"$out/physics-$label.txt" 2>&1
    local rc=$?
    awk -v a="$t0" -v b="$EPOCHREALTIME" -v l="$label" -v rc="$rc" \
        'BEGIN { printf "%-22s wall %7.1f s  rc %d   ", l, b - a, rc }'
    tail -1 "$out/physics-$label.txt"
    echo "    clocks before: $before; after: $(clocks)"
}
run tree-1048576 1048576 tree --tunable opening=cube --tunable theta=0.6
run tree-65536 65536 tree --tunable opening=cube --tunable theta=0.6
run best-65536 65536 best
