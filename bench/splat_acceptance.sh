#!/usr/bin/env bash
# Issue 24's acceptance run on the lent GPU machine, in three parts (one device call each; everything
# lands in $OUT, named <gpu>-<day>-...):
#
#   source .kit/setup.sh && bash bench/splat_acceptance.sh tests     # the splat gpu tests (~30 s)
#   source .kit/setup.sh && bash bench/splat_acceptance.sh viewer    # per-frame CSVs, sprites vs splat
#   source .kit-rec/setup.sh && bash bench/splat_acceptance.sh record  # 1080p recordings, twice at 1M
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
    for n in 1048576 8388608; do
        runs=$([ "$n" = 1048576 ] && echo "1 2" || echo "1")
        for i in $runs; do
            file="$out/$gpu-$day-collision-$n-splat-$i.mp4"
            python3 -m app record collision --n "$n" --kernel tree --size 1920x1080 --fps 60 --seconds 4 \
                --set render.style=splat --no-progress --out "$file" >"$out/record-$n-$i.txt" 2>&1
            echo "N=$n run $i rc $?: $(tail -1 "$out/record-$n-$i.txt")"
        done
    done
    a="$out/$gpu-$day-collision-1048576-splat-1.mp4"
    b="$out/$gpu-$day-collision-1048576-splat-2.mp4"
    cmp -s "$a" "$b" && echo "1M: the two recordings are byte-identical" || echo "1M: the recordings DIFFER"
    sha256sum "$a" "$b" && rm -f "$b"
    ;;
*)
    echo "splat_acceptance.sh: unknown part '$part': tests | viewer | record" >&2
    exit 2
    ;;
esac
