#!/usr/bin/env bash
# Real-N timings on the lent GPU machine: at N = 81,920, `validate` of every CUDA kernel (target: < 10 s
# each, reference included) and `simulate --steps 2000 --log-every 100` with the float64 energy on the
# device (target: < 30 s). Prints one line per command with its wall time; everything lands in $OUT.
#
#   source .kit/setup.sh && bash bench/realn.sh [N]
#
# The scene: `collision` scaled by 2 in length so that bodies reach |x| ≈ 20, as in the published galaxy
# set (bonsai model3): separation, radius and pericentre x2 (the live halos reach ~4.5 radii past each
# centre, ~9.4 at scale 1), the softening x2 and a time step that keeps dt / t_dyn about where the preset
# has it (t_dyn ∝ √(R³/M): x2.8). The Kepler orbit and the galaxies' velocities follow from the masses and
# lengths, so no speed is set. (Before the equilibrium galaxies, the scale was 5, impact and speed set.)
set -uo pipefail
n=${1:-81920}
source "$(dirname "$0")/device_env.sh"  # out, gpu, day, clocks; PYTHONPATH, headless
scene=(collision --n "$n" --set initial.separation=12 --set initial.radius=2 --set initial.pericentre=2
       --softening 0.04 --dt 0.005 --backend cuda)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"

timed() {  # timed LABEL TARGET_S COMMAND...: run it, print "LABEL  wall s (target < T s)  rc" and its output
    local label=$1 target=$2
    shift 2
    local t0 rc
    t0=$EPOCHREALTIME
    "$@" >"$out/$label.txt" 2>&1
    rc=$?
    awk -v a="$t0" -v b="$EPOCHREALTIME" -v l="$label" -v t="$target" -v rc="$rc" \
        'BEGIN { printf "%-28s %8.2f s  (target < %s s)  rc %d\n", l, b - a, t, rc }' | tee -a "$out/timings.txt"
    tail -2 "$out/$label.txt"
}

kernels=$(python3 -c "from app.backends import backend_class
print(' '.join(r.name for r in backend_class('cuda').kernels()))")
for k in $kernels; do
    timed "validate-$k" 10 python3 -m app -q validate "${scene[@]}" --kernel "$k"
done
timed "simulate-2000" 30 python3 -m app -q simulate "${scene[@]}" --steps 2000 --log-every 100 \
    --out "$out/realn-final.npz" --log "$out/realn-energy.csv" --no-progress
