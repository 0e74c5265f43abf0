#!/usr/bin/env bash
# The viewer at large N on the lent GPU machine: `run` headless (EGL, CUDA-GL interop, panel shown) with
# the tree at 1M, 8M and 16M, once per draw setting, one per-frame CSV each (frame, force, draw, ...).
# Prints the median and mean frame (the mean counts the stalls a median hides), the worst frame, force and
# draw per run; everything lands in $OUT.
#
#   source .kit/setup.sh && bash bench/viewer_scale.sh [NS] [FRAMES]
#
# Draw settings compared (render.min_sprite, render.draw_limit; app/render/particles.py): the sprite pass
# is fill-bound on GH100, whose few graphics units make a million 3-px sprites cost milliseconds.
set -uo pipefail
ns=${1:-1048576,8388608,16777216}
frames=${2:-60}
source "$(dirname "$0")/device_env.sh"  # out, gpu, day, clocks; PYTHONPATH, headless
settings=(${DRAW_SETTINGS:-"min_sprite=3,draw_limit=0" "min_sprite=1,draw_limit=0" "min_sprite=1,draw_limit=2097152"})
for n in ${ns//,/ }; do
    for s in "${settings[@]}"; do
        sets=()
        for kv in ${s//,/ }; do sets+=(--set "render.$kv"); done
        tag=$(echo "$s" | tr ',=' '-_')
        csv="$out/$gpu-$day-run-$n-tree-$tag-frames.csv"
        before=$(clocks)
        t0=$EPOCHREALTIME
        python3 -m app -q run plummer --n "$n" --backend cuda --kernel tree --tunable theta=0.6 \
            --steps-per-frame 1 --headless --frames "$frames" "${sets[@]}" --timings "$csv" \
            >"$out/run-$n-$tag.txt" 2>&1
        rc=$?
        python3 - "$csv" "$n" "$s" "$rc" "$t0" "$EPOCHREALTIME" <<'PY'
import csv, statistics, sys
path, n, s, rc, t0, t1 = sys.argv[1:]
try:
    rows = list(csv.DictReader(open(path)))[5:]  # the first frames hold compiles and the first build
except OSError as e:
    rows = []
med = lambda k: statistics.median(float(r[k]) for r in rows) if rows else float("nan")
# the median frame hides a stall every few seconds (a diagnostic's launch, a force-error sample); the mean
# frame over the same rows is what a viewer's wall clock shows
mean = statistics.mean(float(r["frame_ms"]) for r in rows) if rows else float("nan")
worst = max((float(r["frame_ms"]) for r in rows), default=float("nan"))
print(f"N={int(n):>9,} {s:<32} frames {len(rows):3d}  frame {med('frame_ms'):7.2f} ms"
      f" ({1e3 / med('frame_ms') if rows else 0:5.1f} fps)  mean {mean:7.2f} ms ({1e3 / mean if rows else 0:5.1f} fps)"
      f"  worst {worst:7.1f} ms  force {med('force_ms'):7.2f}"
      f"  draw {med('draw_ms'):6.2f} ms  wall {float(t1) - float(t0):5.1f} s  rc {rc}")
if rows and "step_host_ms" in rows[0]:  # host time: queuing the steps (and a tree's reads), the draw
    print(f"    host: step {med('step_host_ms'):.2f} ms, particle pass {med('draw_host_ms'):.2f} ms, the rest"
          f" (panel, swap, events) {med('frame_ms') - med('step_host_ms') - med('draw_host_ms'):.2f} ms")
PY
        echo "    clocks before: $before; after: $(clocks)"
        [ "$rc" -eq 0 ] || tail -3 "$out/run-$n-$tag.txt"
    done
done
