#!/usr/bin/env bash
# Issue 24's acceptance run on the lent GPU machine, in three parts (one device call each; everything
# lands in $OUT, named <gpu>-<day>-...):
#
#   source .kit/setup.sh && bash bench/splat_acceptance.sh tests     # the splat gpu tests (~30 s)
#   source .kit/setup.sh && bash bench/splat_acceptance.sh viewer    # per-frame CSVs, sprites vs splat
#   source .kit-rec/setup.sh && bash bench/splat_acceptance.sh record  # 1080p recordings, twice at 1M;
#                                   then 1M and 8M at alpha 0.001, the default before it followed N
#
# `record` encodes video: it needs the PyAV wheel (../shared/device-kit-av, 34 MB) carried as .kit-av. The
# full kit (27 MB) and the tree together with it pass the 64 MiB carry limit, so carry a copy of the kit
# without imgui-bundle (record draws no panel) as .kit-rec:
#   mkdir .kit-rec && cp -r .kit/debs .kit/setup.sh .kit-rec/ && mkdir .kit-rec/wheels \
#     && cp .kit/wheels/*.whl .kit-rec/wheels/ && rm .kit-rec/wheels/imgui_bundle*
#   cp -r ../shared/device-kit-av .kit-av     (both listed in .git/info/exclude)
# NS (viewer sizes) and FRAMES override the defaults.
set -uo pipefail
part=${1:?"tests | viewer | record"}
source "$(dirname "$0")/device_env.sh"  # out, gpu, day, clocks; PYTHONPATH, headless
export NBODY_RESULTS=$out NCCL_NVLS_ENABLE=0
case "$part" in
tests)
    python3 -m pytest -q -p no:xvfb -p no:cacheprovider tests/test_splat_gpu.py tests/test_splat_view_gpu.py \
        >"$out/$gpu-$day-splat-gpu-tests.txt" 2>&1
    tail -1 "$out/$gpu-$day-splat-gpu-tests.txt"
    python3 bench/splat_cost.py --sizes 1M,8M,16M --out "$out/$gpu-$day-splat-cost.json" --png-dir "$out"
    python3 bench/splat_plot.py "$out/$gpu-$day-splat-cost.json" --png "$out/$gpu-$day-splat-cost.png"
    ;;
viewer)
    DRAW_SETTINGS="style=sprites style=splat" bash "$(dirname "$0")/viewer_scale.sh" \
        "${NS:-1048576,8388608,16777216}" "${FRAMES:-60}"
    ;;
record)
    # a first recording on a fresh machine compiles the kernels inside its timed frames: one short
    # recording first, thrown away, so that every figure below is of warm caches
    python3 -m app record collision --n 1048576 --kernel tree --size 1920x1080 --fps 60 --seconds 0.5 \
        --no-progress --out /tmp/warmup.mp4 >"$out/record-warmup.txt" 2>&1
    echo "warm-up rc $?: $(tail -1 "$out/record-warmup.txt")"
    ngpus=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
    for n in 1048576 8388608; do
        runs=$([ "$n" = 1048576 ] && echo "1 2" || echo "1")
        for g in 1 2; do
            [ "$g" -le "$ngpus" ] || continue
            for i in $runs; do
                tag=$([ "$g" = 1 ] && echo "$i" || echo "gpus$g-$i")
                file="$out/$gpu-$day-collision-$n-splat-$tag.mp4"
                python3 -m app record collision --n "$n" --kernel tree --size 1920x1080 --fps 60 --seconds 4 \
                    --gpus "$g" --set render.style=splat --no-progress --out "$file" >"$out/record-$n-$tag.txt" 2>&1
                echo "N=$n GPUs $g run $i rc $? clocks $(clocks): $(tail -1 "$out/record-$n-$tag.txt")"
            done
        done
    done
    # the same 1M command under the geometric opening test the tree took by default before 2026-11-27
    python3 -m app record collision --n 1048576 --kernel tree --size 1920x1080 --fps 60 --seconds 4 \
        --tunable opening=cube --set render.style=splat --no-progress --out /tmp/cube.mp4 \
        >"$out/record-1048576-cube.txt" 2>&1
    echo "N=1048576 opening=cube rc $?: $(tail -1 "$out/record-1048576-cube.txt")"
    # and at alpha 0.001, the relative test's default at every N before alpha's auto (session 26)
    for n in 1048576 8388608; do
        python3 -m app record collision --n "$n" --kernel tree --size 1920x1080 --fps 60 --seconds 4 \
            --tunable alpha=0.001 --set render.style=splat --no-progress --out /tmp/alpha-0.001.mp4 \
            >"$out/record-$n-alpha-0.001.txt" 2>&1
        echo "N=$n alpha=0.001 rc $?: $(tail -1 "$out/record-$n-alpha-0.001.txt")"
    done
    a="$out/$gpu-$day-collision-1048576-splat-1.mp4"
    b="$out/$gpu-$day-collision-1048576-splat-2.mp4"
    cmp -s "$a" "$b" && echo "1M: the two recordings are byte-identical" || echo "1M: the recordings DIFFER"
    for c in "$out"/*1048576-splat-gpus2-*.mp4; do  # a recording does not depend on the number of GPUs
        [ -e "$c" ] || continue
        cmp -s "$a" "$c" && echo "$(basename "$c"): the same bytes as one GPU's" || echo "$(basename "$c") DIFFERS"
    done
    sha256sum "$a" "$b" "$out"/*gpus2-*.mp4 2>/dev/null
    rm -f "$b" "$out"/*gpus2-*.mp4 "$out"/*8388608*.mp4  # one 1M file comes back: the device tool's limits
    ;;
*)
    echo "splat_acceptance.sh: unknown part '$part': tests | viewer | record" >&2
    exit 2
    ;;
esac
