"""MPI ranks on the CPU backend (mpi4py + the MPICH wheel of the `mpi` extra; `make test` installs it).

Each job runs under `mpiexec` with a timeout, so a hang fails instead of stalling CI: 2 and 3 ranks
(uneven shares) must give accelerations and a 100-step fp64 trajectory bitwise equal to one process's;
a rank that raises must end the whole job with a non-zero status and a line naming the rank and the
cause; a rank killed outright is reported by the launcher (its PID and signal) and ends the job too.
Both within 30 s of starting, Python and numba start-up included. A NaN put into a body of rank 1 is found
by the ranks' agreed check within check_every steps and ends the job with one line from rank 1 naming
the body and the rank, as one process names the body; a clean run never reports one.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from app.backends.cpu import CPUBackend
from app.engine.forces import Span
from app.engine.integrator import CHECK_EVERY
from app.model.physics import Physics
from app.parallel.multidevice import split

ROOT = Path(__file__).resolve().parent.parent
MPIEXEC = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
# an mpiexec on PATH is not enough: without mpi4py (the extra) it is some other MPI's launcher, e.g. the GPU
# image's Open MPI, which refuses to run as root
HAVE_MPI4PY = importlib.util.find_spec("mpi4py") is not None
pytestmark = pytest.mark.skipif(
    MPIEXEC is None or not HAVE_MPI4PY, reason="mpiexec or mpi4py not found: pip install 'nbody-live[mpi]'"
)
JOB = ROOT / "tests" / "mpi_job.py"


def job_env() -> dict[str, str]:
    """The environment of an MPI job: the checkout importable; and where the launcher is Open MPI's (the
    GPU image's /usr/bin/mpiexec, with its own mpi4py) and the tests run as root there, Open MPI's two
    variables that let it (MPICH, the `mpi` extra's, ignores them)."""
    return {
        **os.environ,
        "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    }


def mpirun(ranks: int, *args, timeout: float = 120) -> subprocess.CompletedProcess:
    env = job_env()
    return subprocess.run(
        [MPIEXEC, "-n", str(ranks), sys.executable, str(JOB), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


def one_process(
    kernel: str = "cpu-fp64",
    tunables: dict | None = None,
    cadence: list | None = None,
    physics: Physics | None = None,
):
    """One CPU backend through the job's steps (one call; with `cadence`, a step() call per step and each
    step's evaluations since the tree's build appended to it)."""
    import mpi_job

    backend = CPUBackend()
    try:
        backend.load(mpi_job.cloud(), physics or Physics(softening=0.02, dt=2e-3), kernel)
        if tunables:
            backend.set_tunables(**tunables)
        acc = backend.accelerations()
        if cadence is None:
            backend.step(mpi_job.STEPS)
        else:
            for _ in range(mpi_job.STEPS):
                backend.step(1)
                cadence.append(backend.evaluator().since_build)
        state = backend.state()
    finally:
        backend.close()
    return acc, state.pos, state.vel


@pytest.mark.parametrize("ranks", [2, 3])
def test_ranks_step_bitwise_like_one_process(ranks, tmp_path):
    out = tmp_path / "job.npz"
    done = mpirun(ranks, out)
    assert done.returncode == 0, done.stderr
    assert "NonFiniteState" not in done.stderr  # 100 steps: 12 agreed checks, none reporting
    got = np.load(out)
    acc, pos, vel = one_process()
    assert np.array_equal(got["acc"], acc)
    assert np.array_equal(got["pos"], pos) and np.array_equal(got["vel"], vel)


@pytest.mark.parametrize("ranks", [2, 3])
def test_ranks_split_the_tree_by_domains_bitwise_like_one_process(ranks, tmp_path):
    """cpu-tree over ranks (app/parallel/decomposition.py, domains): every rank builds the whole tree, walks
    its key range, the ranges are all-gathered and every rank integrates every body, keeping the state in the
    tree's key order (every rank the same rows): read back in load order, bitwise one process."""
    out = tmp_path / "job.npz"
    done = mpirun(ranks, out, "--kernel", "cpu-tree")
    assert done.returncode == 0, done.stderr
    got = np.load(out)
    acc, pos, vel = one_process("cpu-tree")
    assert np.array_equal(got["acc"], acc)
    assert np.array_equal(got["pos"], pos) and np.array_equal(got["vel"], vel)
    ids = got["ids"]
    assert bool(got["ids_agree"]) and np.array_equal(np.sort(ids), np.arange(pos.shape[0]))
    assert not np.array_equal(ids, np.arange(pos.shape[0]))  # really re-sorted


@pytest.mark.parametrize("ranks", [2, 3])
def test_ranks_refit_the_tree_under_the_adaptive_rule_bitwise_like_one_process(ranks, tmp_path, monkeypatch):
    """cpu-tree with rebuild_rule = adaptive over ranks: each rank walks its key range, the ranks sum their
    interaction counts every step (one allreduce) so that every rank decides the same builds: the ranks'
    cadence is one process's, early builds included, and so is the trajectory, bitwise."""
    import mpi_job

    from app.engine import refit_cadence

    monkeypatch.setattr(refit_cadence, "BUILD_COST", mpi_job.ADAPTIVE_BUILD_COST)  # as the job does
    out = tmp_path / "job.npz"
    done = mpirun(ranks, out, "--kernel", "cpu-tree", "--adaptive")
    assert done.returncode == 0, done.stderr
    got = np.load(out)
    cadence: list[int] = []
    acc, pos, vel = one_process("cpu-tree", mpi_job.ADAPTIVE, cadence, mpi_job.FAST)
    assert bool(got["since_agree"]) and list(got["since"]) == cadence
    builds = [k for k, s in enumerate(cadence) if s == 0]
    assert len(builds) > mpi_job.STEPS // 16 + 1  # the rule built before the cap of 16, more than once
    assert np.array_equal(got["pos"], pos) and np.array_equal(got["vel"], vel)


@pytest.mark.parametrize("ranks", [2, 3])
def test_ranks_split_newton3_by_pairs_within_rounding_of_one_process(ranks, tmp_path):
    """cpu-n3l over ranks (pairs): each rank a slice of the pair tiles, the partial sums reduce-scattered
    onto the shares (Reduce_scatter): one process's float64 accelerations within the rounding of another
    summation order, and its trajectory after 100 steps as closely."""
    out = tmp_path / "job.npz"
    done = mpirun(ranks, out, "--kernel", "cpu-n3l")
    assert done.returncode == 0, done.stderr
    got = np.load(out)
    acc, pos, vel = one_process("cpu-n3l")
    assert np.abs(got["acc"] - acc).max() <= 1e-13 * np.abs(acc).max()
    assert np.abs(got["pos"] - pos).max() <= 1e-12 * np.abs(pos).max()


def test_a_rank_that_raises_ends_the_job_naming_it(tmp_path):
    start = time.monotonic()
    done = mpirun(2, tmp_path / "job.npz", "--fail-at", 5, timeout=60)
    assert done.returncode != 0 and time.monotonic() - start < 30
    assert "rank 1 of 2: RuntimeError: injected failure at step 5" in done.stderr
    assert not (tmp_path / "job.npz").exists()


def rank_share(ranks: int, rank: int, n: int | None = None) -> Span:
    """Rank `rank`'s share of `n` bodies (mpi_job's N unless given) among `ranks` ranks."""
    import mpi_job

    return split(mpi_job.N if n is None else n, [1.0] * ranks)[rank]


def nonfinite_lines(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in done.stderr.splitlines() if "NonFiniteState" in line]


@pytest.mark.parametrize("ranks", [2, 3])
def test_a_nan_body_on_rank_1_is_reported_by_it_naming_the_body_at_the_check(ranks, tmp_path):
    import mpi_job

    start = time.monotonic()
    done = mpirun(ranks, tmp_path / "job.npz", "--nan-at", CHECK_EVERY - 1, "--euler", timeout=60)
    took = time.monotonic() - start
    body = mpi_job.middle_of_share(rank_share(ranks, 1))
    assert done.returncode != 0 and took < 30, done.stderr
    said = nonfinite_lines(done)
    assert len(said) == 1, done.stderr  # every rank raised it; the rank that holds the body says it
    assert said[0].startswith(
        f"nbody-live: rank 1 of {ranks}: NonFiniteState: non-finite position or "
        f"velocity at body {body} on rank 1 after step {CHECK_EVERY} (t = "
    )
    assert "lower dt or raise the softening" in said[0] and "Traceback" not in done.stderr
    assert not (tmp_path / "job.npz").exists()


def test_a_nan_spread_by_the_leapfrog_is_reported_at_the_next_check(tmp_path):
    """Injected three steps into the first interval: by the check every body is bad (each force sums over
    every position), so the first bad body, 0 on rank 0, is named at step check_every."""
    done = mpirun(2, tmp_path / "job.npz", "--nan-at", 3, timeout=60)
    assert done.returncode != 0
    said = nonfinite_lines(done)
    assert len(said) == 1 and f"at body 0 on rank 0 after step {CHECK_EVERY} (t" in said[0], done.stderr
    assert said[0].startswith("nbody-live: rank 0 of 2: ")


def test_a_killed_rank_ends_the_job(tmp_path):
    start = time.monotonic()
    done = mpirun(2, tmp_path / "job.npz", "--die-at", 5, timeout=60)
    assert done.returncode != 0 and time.monotonic() - start < 30
    said = done.stdout + done.stderr  # the launcher's word: a killed process cannot speak for itself
    assert "BAD TERMINATION" in said and "signal 9" in said
    assert not (tmp_path / "job.npz").exists()


# --- the real command under mpiexec -------------------------------------------------------------------------
def nbody(*args, launcher=(), timeout: float = 120) -> subprocess.CompletedProcess:
    env = job_env()
    return subprocess.run(
        [*launcher, sys.executable, "-m", "app", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


SIMULATE = (
    "simulate",
    "plummer",
    "--n",
    301,
    "--steps",
    100,
    "--backend",
    "cpu",
    "--kernel",
    "cpu-fp64",
    "--softening",
    0.02,
    "--log-every",
    10,
)


@pytest.mark.parametrize("ranks", [2, 3])
def test_simulate_on_ranks_writes_what_one_process_writes(ranks, tmp_path):
    one = nbody(*SIMULATE, "--out", tmp_path / "one.npz", "--log", tmp_path / "one.csv")
    many = nbody(
        *SIMULATE,
        "--out",
        tmp_path / "many.npz",
        "--log",
        tmp_path / "many.csv",
        launcher=(MPIEXEC, "-n", str(ranks)),
    )
    assert one.returncode == 0 and many.returncode == 0, many.stderr
    assert f"on {ranks} ranks" in many.stdout and many.stdout.count("steps of N=301") == 1  # rank 0 speaks
    a, b = np.load(tmp_path / "one.npz"), np.load(tmp_path / "many.npz")
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)  # original order, bitwise
    rows = [line.split(",")[:-1] for line in (tmp_path / "one.csv").read_text().splitlines()]
    assert rows == [line.split(",")[:-1] for line in (tmp_path / "many.csv").read_text().splitlines()]
    assert len(rows) == 12  # header, step 0, then every 10 steps (the last column is each run's timing)


def test_an_unwritable_output_ends_every_rank_with_one_line(tmp_path):
    done = nbody(*SIMULATE, "--out", "/nonexistent/x.npz", launcher=(MPIEXEC, "-n", "2"), timeout=60)
    assert done.returncode != 0
    assert "rank 0 of 2: RuntimeFault: cannot write snapshot /nonexistent/x.npz" in done.stderr
    assert "Traceback" not in done.stderr


def test_ranks_with_different_arguments_are_refused_at_start(tmp_path):
    first = [sys.executable, "-m", "app", *map(str, SIMULATE), "--out", str(tmp_path / "a.npz")]
    second = [sys.executable, "-m", "app", *map(str, SIMULATE), "--out", str(tmp_path / "b.npz")]
    env = job_env()
    done = subprocess.run(
        [MPIEXEC, "-n", "1", *first, ":", "-n", "1", *second],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=ROOT,
    )
    assert done.returncode != 0 and "rank 1 differs from rank 0 in argv" in done.stderr
    assert not (tmp_path / "a.npz").exists() and not (tmp_path / "b.npz").exists()


@pytest.mark.parametrize("fast", [1, 0])
def test_bench_max_seconds_is_decided_by_rank_0s_clock(tmp_path, fast):
    """Issue 28: under MPI, bench's --max-seconds was read from each rank's own clock. With rank 1's clock
    1,000 times fast (tests/mpi_clock_job.py) rank 1 stopped its steps while rank 0 went on, and the job
    hung in the steps' collectives. Rank 0's clock decides for every rank now: the job ends, every row
    timed as rank 0 saw it (rank 0's fast clock: every row stopped, on every rank)."""
    out = tmp_path / "b.json"
    done = subprocess.run(
        [MPIEXEC, "-n", "2", sys.executable, str(ROOT / "tests" / "mpi_clock_job.py"), str(fast), "bench"]
        + [
            "--backend",
            "cpu",
            "--kernels",
            "cpu-fp64",
            "--n",
            "256,512",
            "--warmup",
            "2",
            "--repeats",
            "5",
            "--error-sample",
            "0",
        ]
        + ["--no-progress", "--max-seconds", "2", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=90,
        env=job_env(),
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    rows = json.loads(out.read_text())["results"]
    if fast == 1:
        assert [(r["n"], r["status"]) for r in rows] == [(256, "ok"), (512, "ok")], rows
    else:
        assert rows[0]["status"] == "skipped" and "stopped after 1 of 7 steps" in rows[0]["reason"], rows
        assert rows[1]["status"] == "skipped", rows


def test_info_reports_the_mpi_and_how_positions_travel():
    done = nbody("info")
    assert done.returncode == 0, done.stderr
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("MPI: "))
    assert "mpi4py 4." in line and "MPICH" in line and "mpiexec /" in line and "CUDA-aware:" in line


# --- GPU ranks (on the GPU machine: two ranks sharing its one GPU) ------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["shared", "best", "atomics-n3l", "tree"])  # targets, pairs, domains
def test_two_gpu_ranks_give_one_ranks_accelerations_within_the_budget(tmp_path, kernel):
    """Two ranks (each takes the GPU of its local rank, round robin: one GPU shared, or a GPU each), split
    as the record says and exchanging GPU to GPU through CUDA IPC (cuda/ipc.py): the accelerations of one
    CUDA process within the record's fp32 budget; the tree's bitwise, and its positions after 5 steps too."""
    from app.backends import backend_class
    from app.model.physics import relative_errors
    from app.tools.bench import bench_bodies

    n, out = 65536, tmp_path / "gpu-ranks.npz"
    job = ROOT / "tests" / "mpi_gpu_job.py"
    env = job_env()
    done = subprocess.run(
        [MPIEXEC, "-n", "2", sys.executable, str(job), str(out), kernel, str(n), "--steps", "5"],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    backend = backend_class("cuda")()
    try:
        import mpi_gpu_job

        backend.load(bench_bodies(n), mpi_gpu_job.PHYSICS, kernel)
        one = backend.accelerations()
        budget = backend.record(kernel).error_budget
        backend.step(5)
        pos = backend.state().pos
    finally:
        backend.close()
    got = np.load(out)
    rel = relative_errors(got["acc"], one)
    assert not budget.judge({"max": float(rel.max()), "p99": float(np.percentile(rel, 99))}), kernel
    if kernel == "tree":  # every rank builds the same tree and walks its key range as one GPU does
        assert np.array_equal(got["acc"], one) and np.array_equal(got["pos"], pos)


@pytest.mark.gpu
def test_a_nan_body_on_gpu_rank_1_is_reported_by_it_naming_the_body(tmp_path):
    """Two GPU ranks (sharing the one GPU): each checks its share with the GPU kernel (cuda/nonfinite.py)
    every check_every steps, and a NaN put into rank 1's share on its GPU ends the job at the next check
    with rank 1's line naming the body, as on CPU ranks."""
    import mpi_job

    n = 4096
    job = ROOT / "tests" / "mpi_gpu_job.py"
    start = time.monotonic()
    done = subprocess.run(
        [
            MPIEXEC,
            "-n",
            "2",
            sys.executable,
            str(job),
            str(tmp_path / "x.npz"),
            "shared",
            str(n),
            "--nan-at",
            str(CHECK_EVERY - 1),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=job_env(),
        cwd=ROOT,
    )
    took = time.monotonic() - start
    body = mpi_job.middle_of_share(rank_share(2, 1, n))
    assert done.returncode != 0 and took < 120, done.stderr[-2000:]
    said = nonfinite_lines(done)
    assert len(said) == 1, done.stderr[-2000:]
    assert said[0].startswith(
        "nbody-live: rank 1 of 2: NonFiniteState: non-finite position or velocity at "
        f"body {body} on rank 1 after step {CHECK_EVERY} (t = "
    ), said[0]
