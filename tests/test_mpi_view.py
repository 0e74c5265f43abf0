"""The viewer and bench under `mpiexec` on CPU ranks: rank 0 draws and drives, every rank computes.

Every job has a timeout, so a hang (a rank left waiting in a collective) fails instead of stalling CI:
- the panel's changes (reset, pause, kernel switches to the tree and back, theta, dt, softening, a
  single step) reach every rank: each rank's fingerprints after every change are the same, and the final
  state is bitwise that of one process doing the same (tests/mpi_view_job.py);
- `run --headless --frames K` ends every rank with status 0 and prints the per-rank split;
- `bench` on ranks writes one JSON with the rank count and each rank's force and exchange time;
- closing rank 0's window (a window manager's close, under Xvfb) ends every rank with status 0;
- a non-finite body pauses rank 0's viewer naming the body and its rank, as one process's viewer pauses
  naming the body, while the other ranks follow on; every rank then ends with status 0.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from test_mpi import MPIEXEC, ROOT, job_env, nbody
from test_mpi import pytestmark as pytestmark  # skipped where the MPI extra is missing, as test_mpi

VIEW_JOB = ROOT / "tests" / "mpi_view_job.py"
JOB_TIMEOUT_S = 180


def view_job(out, *options, launcher=()) -> subprocess.CompletedProcess:
    env = job_env()
    return subprocess.run(
        [*launcher, sys.executable, str(VIEW_JOB), str(out), *options],
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
        env=env,
        cwd=ROOT,
    )


@pytest.mark.parametrize("ranks", [2, 3])
def test_panel_changes_reach_every_rank_at_the_same_step(ranks, tmp_path):
    one, many = tmp_path / "one", tmp_path / "many"
    one.mkdir(), many.mkdir()
    done = view_job(one)
    assert done.returncode == 0, done.stderr
    done = view_job(many, launcher=(MPIEXEC, "-n", str(ranks)))
    assert done.returncode == 0, done.stderr
    prints = [json.loads((many / f"rank{r}.json").read_text())["fingerprints"] for r in range(ranks)]
    # the start, the reset's bodies (the start again), tree, theta, dt, fp64, softening: on every rank
    assert len(prints[0]) == 7 and prints[0][0] == prints[0][1] and len(set(prints[0])) == 6
    assert all(p == prints[0] for p in prints[1:])
    a, b = np.load(one / "state.npz"), np.load(many / "state.npz")
    assert float(a["time"]) == float(b["time"]) > 0
    assert np.array_equal(a["pos"], b["pos"]) and np.array_equal(a["vel"], b["vel"])


@pytest.mark.parametrize("ranks", [2, 3])
def test_a_nan_body_pauses_rank_0s_viewer_naming_the_body_and_its_rank(ranks, tmp_path):
    from mpi_view_job import NAN_BODY, NAN_FRAMES

    one, many = tmp_path / "one", tmp_path / "many"
    one.mkdir(), many.mkdir()
    done = view_job(one, "--nan")
    assert done.returncode == 0, done.stderr
    done = view_job(many, "--nan", launcher=(MPIEXEC, "-n", str(ranks)))
    assert done.returncode == 0, done.stderr
    assert all((many / f"rank{r}.json").exists() for r in range(ranks))  # every rank followed to the end
    body = NAN_BODY
    alone, together = (json.loads((d / "nan.json").read_text()) for d in (one, many))
    assert alone["paused"] and f"at body {body} after step 0" in alone["message"]
    assert together["paused"] and f"at body {body} on rank {ranks - 1} after step 1 " in together["message"]
    assert together["time_at_pause"] == together["time_after"] > 0  # nothing stepped while paused
    assert NAN_FRAMES > 2


RUN = ("run", "plummer", "--n", 301, "--backend", "cpu", "--headless", "--size", "160x90")


@pytest.mark.parametrize("ranks", [2, 3])
def test_headless_run_on_ranks_ends_every_rank(ranks, tmp_path):
    done = nbody(
        *RUN,
        "--frames",
        12,
        "--gather-every",
        3,
        "--timings",
        tmp_path / "t.csv",
        launcher=(MPIEXEC, "-n", str(ranks)),
        timeout=JOB_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("drew 12 frames") == 1  # rank 0 alone speaks
    line = next(ln for ln in done.stdout.splitlines() if "MPI ranks (median ms per rank)" in ln)
    force = re.search(r"force ([\d. /]+),", line).group(1).split(" / ")
    assert line.startswith(f"{ranks} MPI ranks") and len(force) == ranks and "imbalance" in line
    assert len((tmp_path / "t.csv").read_text().splitlines()) == 1 + 12


def test_gather_every_without_mpiexec_is_a_usage_error():
    done = nbody(*RUN, "--frames", 2, "--gather-every", 3)
    assert done.returncode == 2 and "--gather-every applies to MPI runs" in done.stderr


@pytest.mark.parametrize("ranks", [2, 3])
def test_bench_on_ranks_writes_the_split(ranks, tmp_path):
    out = tmp_path / "bench.json"
    done = nbody(
        "bench",
        "--backend",
        "cpu",
        "--kernels",
        "cpu-fp64",
        "--n",
        "301,600",
        "--warmup",
        1,
        "--repeats",
        3,
        "--json",
        out,
        "--no-progress",
        launcher=(MPIEXEC, "-n", str(ranks)),
        timeout=JOB_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(f"wrote {out}") == 1 and f"{ranks} ranks (median ms per rank)" in done.stdout
    result = json.loads(out.read_text())
    assert result["ranks"] == ranks and f"{ranks} MPI ranks" in result["device"]["name"]
    for row in result["results"]:
        assert row["status"] == "ok" and row["ranks"] == ranks
        assert len(row["rank_force_median_ms"]) == ranks == len(row["rank_exchange_median_ms"])
        assert all(v > 0 for v in row["rank_force_median_ms"]) and row["rank_imbalance"] >= 0
        assert row["median_ms"] >= max(row["rank_force_median_ms"]) * 0.5  # the slowest rank's, per step
        assert row["interactions"] == row["n"] ** 2  # every rank's share counted once


@pytest.mark.gl
@pytest.mark.skipif(
    not (shutil.which("xdotool") and shutil.which("Xvfb")),
    reason="needs xdotool and Xvfb (Debian: apt-get install xdotool xvfb)",
)
def test_closing_rank_0s_window_ends_every_rank(tmp_path):
    import os

    from test_window import send_wm_delete
    from xwindow import Demo

    display = os.environ.get("DISPLAY")
    if not display:
        pytest.skip("no $DISPLAY: pytest-xvfb did not start Xvfb (or ran with --no-xvfb)")
    demo = Demo(tmp_path, display, launcher=(MPIEXEC, "-n", "2"))
    try:
        demo.wait_until_drawing()
        assert "rank 0 of 2 MPI ranks" in demo.title()
        send_wm_delete(int(demo.window), display)
        rc = demo.wait(timeout=60)
    finally:
        demo.stop()
    assert rc == 0, demo.output()
    assert demo.frames_drawn() > 0 and "2 MPI ranks (median ms per rank)" in demo.output(), demo.output()
