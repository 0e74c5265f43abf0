"""MPI ranks on the CPU backend (mpi4py + the MPICH wheel of the `mpi` extra; `make test` installs it).

Each job runs under `mpiexec` with a timeout, so a hang fails instead of stalling CI: 2 and 3 ranks
(uneven shares) must give accelerations and a 100-step fp64 trajectory bitwise equal to one process's;
a rank that raises must end the whole job with a non-zero status and a line naming the rank and the
cause; a rank killed outright is reported by the launcher (its PID and signal) and ends the job too.
Both within 30 s of starting, Python and numba start-up included.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from app.backends.cpu import CPUBackend
from app.physics import Physics

ROOT = Path(__file__).resolve().parent.parent
MPIEXEC = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not found: pip install 'nbody-live[mpi]'")
JOB = ROOT / "tests" / "mpi_job.py"


def mpirun(ranks: int, *args, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.run([MPIEXEC, "-n", str(ranks), sys.executable, str(JOB), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def one_process():
    import mpi_job

    backend = CPUBackend()
    try:
        backend.load(mpi_job.cloud(), Physics(softening=0.02, dt=2e-3), "cpu-fp64")
        acc = backend.accelerations()
        backend.step(mpi_job.STEPS)
        state = backend.state()
    finally:
        backend.close()
    return acc, state.pos, state.vel


@pytest.mark.parametrize("ranks", [2, 3])
def test_ranks_step_bitwise_like_one_process(ranks, tmp_path):
    out = tmp_path / "job.npz"
    done = mpirun(ranks, out)
    assert done.returncode == 0, done.stderr
    got = np.load(out)
    acc, pos, vel = one_process()
    assert np.array_equal(got["acc"], acc)
    assert np.array_equal(got["pos"], pos) and np.array_equal(got["vel"], vel)


def test_a_rank_that_raises_ends_the_job_naming_it(tmp_path):
    start = time.monotonic()
    done = mpirun(2, tmp_path / "job.npz", "--fail-at", 5, timeout=60)
    assert done.returncode != 0 and time.monotonic() - start < 30
    assert "rank 1 of 2: RuntimeError: injected failure at step 5" in done.stderr
    assert not (tmp_path / "job.npz").exists()


def test_a_killed_rank_ends_the_job(tmp_path):
    start = time.monotonic()
    done = mpirun(2, tmp_path / "job.npz", "--die-at", 5, timeout=60)
    assert done.returncode != 0 and time.monotonic() - start < 30
    said = done.stdout + done.stderr  # the launcher's word: a killed process cannot speak for itself
    assert "BAD TERMINATION" in said and "signal 9" in said
    assert not (tmp_path / "job.npz").exists()
