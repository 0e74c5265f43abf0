#!/usr/bin/env bash
# Issue 16's one-GPU acceptance on the lent GPU machine: two MPI ranks sharing its GPU give one process's
# accelerations within the fp32 budget and a NaN put into rank 1's share on the GPU is reported by rank 1
# naming the body (tests/test_mpi.py -m gpu), and the headless viewer on 2 ranks draws with rank 0
# rendering (its per-frame CSV lands in $OUT).
#
#   source .kit/setup.sh && bash bench/mpi_gpu.sh
#
# The image has no MPICH: carry the wheels (.whl/, as the device README says: mpi4py and mpich, cp312);
# bench/mpi_env.sh installs them.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"  # out, gpu, day, clocks; PYTHONPATH, headless
source "$(dirname "$0")/mpi_env.sh"
timeout 30 mpiexec -n 2 python3 -c "from mpi4py import MPI; print(MPI.COMM_WORLD.rank, MPI.Get_library_version()[:24])"
timeout 180 python3 -m pytest -q -p no:xvfb -p no:cacheprovider tests/test_mpi.py -m gpu 2>&1 | tee "$out/mpi-gpu-tests.log" | tail -3
timeout 90 mpiexec -n 2 python3 -m app -q run plummer --n 65536 --backend cuda --headless --frames 300 \
    --timings "$out/$gpu-$day-run-65536-mpi2-frames.csv" 2>&1 | tail -4
