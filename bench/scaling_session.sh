#!/usr/bin/env bash
# Issue 23's calls on a two-GPU machine (nvidia-h100-x2 / nvidia-h200-x2): one and two GPUs in the same run.
#
#   source .kit/setup.sh && bash bench/scaling_session.sh [tests|suite|quick|scaling|view|mpi-tree|mpi|all]
#
# tests    the gpu tests of the multi-device path and the tree (two-GPU tests included), then the whole gpu
#          suite when `all`
# suite    the whole gpu suite (-x; log in $OUT/gpu-suite.log): carry .devdata and set NBODY_SHARED_DATA so
#          that nothing skips
# quick    1M only, 3 timed steps: the tree (Plummer θ 0.6), best and shared on 1 and 2 GPUs (~1 minute)
# scaling  the acceptance bench: the tree (Plummer and collision, θ 0.45 / 0.5 / 0.6) at 1M, 8M and 16M,
#          best and shared at 1M, each on 1 and 2 GPUs; JSON + PNG named <gpu>x2-<day>-scaling
# view     the viewer headless at 8M with the tree on 1 GPU and on --gpus 2 (per-frame CSVs), and at 1M
# mpi-tree the tree at θ 0.6, 1M and 8M, Plummer and collision: one process, then 2 MPI ranks with a GPU
#          each, in one call (JSONs <tag>-mpi-tree-ranks{1,2}; the committed MPI tree figures)
# refit    the refit's gpu tests, then the tree under rebuild_rule=adaptive (cap 16) on 1 and 2 GPUs at 1M and 8M,
#          Plummer and collision, θ 0.45 / 0.5 / 0.6 (JSON <tag>-adaptive; compare with `scaling`, a build
#          every step, from the same machine)
# opening  the opening tests' gpu tests (tree, refit), then the tree under opening = cube and bmax at θ 0.45 to
#          0.6 and under rel at α 0.001 to 0.004, on one GPU, 1M and 8M, Plummer and collision (JSONs
#          <tag>-opening and <tag>-rel; docs/tree.md step 5)
# mpi      2 MPI ranks, a GPU each (MPICH from the carried .whl/): their gpu tests, then the bench of the
#          tree at 1M and 8M and best at 1M (compare with the one-GPU rows of `scaling` from the same machine),
#          and the rank-0 viewer at 1M with the tree beside one process (per-frame CSVs)
# Results land in $OUT (the device tool brings them back).
set -uo pipefail
what=${1:-all}
source "$(dirname "$0")/device_env.sh"  # out, gpu, day, clocks; PYTHONPATH, headless
export NCCL_NVLS_ENABLE=0  # the device page: never NVLink multicast on these machines
count=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
tag="${gpu}x${count}-${day}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv | tee "$out/gpu.txt"
nvidia-smi topo -m 2>/dev/null | head -8 | tee -a "$out/gpu.txt"

if [[ $what == tests || $what == all ]]; then
    timeout 400 python3 -m pytest -q -m gpu -p no:xvfb -p no:cacheprovider tests/test_cuda_multi.py \
        tests/test_tree_gpu.py 2>&1 | tee "$out/multi-tests.log" | grep -E "passed|failed|^FAILED|^ERROR" | tail -30
fi
if [[ $what == suite ]]; then
    timeout 560 python3 -m pytest -q -m gpu -p no:xvfb -p no:cacheprovider -x --durations=10 tests 2>&1 \
        | tee "$out/gpu-suite.log" | grep -E "passed|failed|^FAILED|^ERROR" | tail -30
fi
if [[ $what == quick || $what == all ]]; then
    echo "clocks before: $(clocks)"
    python3 -m app bench --backend cuda --kernels tree,best,shared --n 1048576 --tunable opening=cube --tunable theta=0.6 \
        --gpus 1,2 --warmup 2 --repeats 3 --error-sample 1024 --no-progress \
        --json "$out/$tag-quick.json" 2>&1 | tail -30
fi
if [[ $what == scaling || $what == all ]]; then
    echo "clocks before: $(clocks)"
    python3 -m app bench --backend cuda --kernels tree,best,shared --n 1048576,8388608,16777216 \
        --scene plummer,collision --tunable opening=cube --tunable theta=0.45,0.5,0.6 --gpus 1,2 --max-seconds 40 --no-progress \
        --json "$out/$tag-scaling.json" --plot "$out/$tag-scaling.png" 2>&1 | tail -60
    echo "clocks after: $(clocks)"
fi
if [[ $what == refit ]]; then
    timeout 300 python3 -m pytest -q -m gpu -p no:xvfb -p no:cacheprovider tests/test_tree_gpu_refit.py \
        tests/test_tree_gpu.py 2>&1 | tee "$out/refit-tests.log" | grep -E "passed|failed|^FAILED|^E " | tail -12
    python3 -m app bench --backend cuda --kernels tree --n 1048576,8388608 --scene plummer,collision \
        --tunable opening=cube --tunable theta=0.45,0.5,0.6 --tunable rebuild_every=16 --tunable rebuild_rule=adaptive --gpus 1,2 \
        --max-seconds 40 --no-progress --json "$out/$tag-adaptive.json" 2>&1 | grep -A24 "^scaling"
fi
if [[ $what == opening ]]; then
    timeout 300 python3 -m pytest -q -m gpu -p no:xvfb -p no:cacheprovider tests/test_tree_gpu.py \
        tests/test_tree_gpu_refit.py 2>&1 | tee "$out/opening-tests.log" | grep -E "passed|failed|^FAILED|^E " | tail -12
    python3 -m app bench --backend cuda --kernels tree --n 1048576,8388608 --scene plummer,collision \
        --tunable theta=0.45,0.5,0.55,0.6 --tunable opening=cube,bmax --gpus 1 --max-seconds 40 --no-progress \
        --json "$out/$tag-opening.json" 2>&1 | grep -E "fastest within"
    python3 -m app bench --backend cuda --kernels tree --n 1048576,8388608 --scene plummer,collision \
        --tunable opening=rel --tunable alpha=0.001,0.002,0.003,0.004 --gpus 1 --max-seconds 40 --no-progress \
        --json "$out/$tag-rel.json" 2>&1 | grep -E "fastest within"
fi
if [[ $what == mpi-tree ]]; then
    source "$(dirname "$0")/mpi_env.sh"
    for r in 1 2; do
        launch=(); [[ $r == 2 ]] && launch=(mpiexec -n 2)
        timeout 140 "${launch[@]}" python3 -m app bench --backend cuda --kernels tree --n 1048576,8388608 \
            --scene plummer,collision --tunable opening=cube --tunable theta=0.6 --warmup 2 --repeats 5 --no-progress \
            --json "$out/$tag-mpi-tree-ranks$r.json" 2>&1 | grep -E "^tree" | head -8
    done
fi
if [[ $what == mpi ]]; then
    source "$(dirname "$0")/mpi_env.sh"
    timeout 300 python3 -m pytest -q -p no:xvfb -p no:cacheprovider tests/test_mpi.py -m gpu 2>&1 \
        | tee "$out/mpi-gpu-tests.log" | grep -E "passed|failed|^FAILED|^E " | tail -12
    timeout 300 mpiexec -n 2 python3 -m app bench --backend cuda --kernels tree,best --n 1048576,8388608 \
        --scene plummer,collision --tunable opening=cube --tunable theta=0.45,0.5,0.6 --max-seconds 40 --no-progress \
        --json "$out/$tag-mpi2.json" 2>&1 | tail -40
    for r in 1 2; do
        launch=(); [[ $r == 2 ]] && launch=(mpiexec -n 2)
        timeout 120 "${launch[@]}" python3 -m app -q run plummer --n 1048576 --frames 120 --headless \
            --backend cuda --kernel tree --tunable opening=cube --tunable theta=0.6 --steps-per-frame 1 \
            --timings "$out/$tag-run-1048576-tree-ranks$r-frames.csv" 2>&1 | tail -3
    done
    python3 bench/frames_compare.py "$out/$tag-run-1048576-tree-ranks1-frames.csv" \
        "$out/$tag-run-1048576-tree-ranks2-frames.csv" 2>&1 | tail -6
fi
if [[ $what == view || $what == all ]]; then
    for n in 8388608 1048576; do
        for g in 1 2; do
            python3 -m app -q run plummer --n $n --frames 60 --headless --backend cuda --kernel tree \
                --tunable opening=cube --tunable theta=0.6 --steps-per-frame 1 --gpus $g \
                --timings "$out/$tag-run-$n-tree-gpus$g-frames.csv" 2>&1 | tail -2
        done
    done
    python3 bench/frames_compare.py "$out/$tag-run-8388608-tree-gpus1-frames.csv" \
        "$out/$tag-run-8388608-tree-gpus2-frames.csv" 2>&1 | tail -8
fi
