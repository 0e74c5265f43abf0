# Sourced by the device scripts that run MPI jobs (bench/mpi_gpu.sh, bench/scaling_session.sh): MPICH's
# wheel and mpi4py from the carried wheels (.whl/, as the device README says: mpi4py and mpich, cp312).
# The image has no MPICH: `pip install --target` leaves the mpich wheel's bin/ and lib/ (its data files)
# behind, and the image's /usr/bin/mpiexec is Open MPI's, which refuses to run as root and is not the
# library mpi4py loads; so the wheel is unpacked and its bin/ and lib/ put first on PATH and
# LD_LIBRARY_PATH.
wheels=${WHEELS:-.whl}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$wheels"/mpi4py-*.whl
rm -rf /tmp/mpich && python3 -m zipfile -e "$wheels"/mpich-*.whl /tmp/mpich
mpich=$(echo /tmp/mpich/mpich-*.data/data)
chmod +x "$mpich"/bin/*
export PATH=$mpich/bin:$PATH LD_LIBRARY_PATH=$mpich/lib:${LD_LIBRARY_PATH:-}
export PYTHONPATH=/tmp/site:$PYTHONPATH
echo "mpiexec: $(command -v mpiexec)"
