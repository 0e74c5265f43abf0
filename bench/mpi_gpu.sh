#!/usr/bin/env bash
# Issue 16's one-GPU acceptance on the lent GPU machine: two MPI ranks sharing its GPU give one process's
# accelerations within the fp32 budget and a NaN put into rank 1's share on the GPU is reported by rank 1
# naming the body (tests/test_mpi.py -m gpu), and the headless viewer on 2 ranks draws with rank 0
# rendering (its per-frame CSV lands in $OUT).
#
#   source .kit/setup.sh && bash bench/mpi_gpu.sh
#
# The image has no MPICH: carry the wheels (.whl/, as the device README says: mpi4py and mpich, cp312).
# `pip install --target` leaves the mpich wheel's bin/ and lib/ (its data files) behind, and the image's
# /usr/bin/mpiexec is Open MPI's, which refuses to run as root and is not the library mpi4py loads; so the
# wheel is unpacked and its bin/ and lib/ put first on PATH and LD_LIBRARY_PATH.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"  # out, gpu, day, clocks; PYTHONPATH, headless
wheels=${WHEELS:-.whl}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$wheels"/mpi4py-*.whl
rm -rf /tmp/mpich && python3 -m zipfile -e "$wheels"/mpich-*.whl /tmp/mpich
mpich=$(echo /tmp/mpich/mpich-*.data/data)
chmod +x "$mpich"/bin/*
export PATH=$mpich/bin:$PATH LD_LIBRARY_PATH=$mpich/lib:${LD_LIBRARY_PATH:-}
export PYTHONPATH=/tmp/site:$PYTHONPATH
echo "mpiexec: $(command -v mpiexec)"
timeout 30 mpiexec -n 2 python3 -c "from mpi4py import MPI; print(MPI.COMM_WORLD.rank, MPI.Get_library_version()[:24])"
timeout 180 python3 -m pytest -q -p no:xvfb -p no:cacheprovider tests/test_mpi.py -m gpu 2>&1 | tee "$out/mpi-gpu-tests.log" | tail -3
timeout 90 mpiexec -n 2 python3 -m app -q run plummer --n 65536 --backend cuda --headless --frames 300 \
    --timings "$out/$gpu-$day-run-65536-mpi2-frames.csv" 2>&1 | tail -4
