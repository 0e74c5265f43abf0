"""bench/galaxy_equilibrium.py (docs/galaxies.md's numbers): a short cpu-tree run writes its checkpoints, the
table and the plot; --replot redraws them; bad input is one line and exit status 2."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "galaxy_equilibrium.py"


def run(*args, cwd=ROOT):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )


def test_a_short_run_writes_rows_table_and_plot(tmp_path):
    prefix = tmp_path / "disk"
    done = run(
        "--n",
        "4096",
        "--time",
        "0.1",
        "--every",
        "0.05",
        "--backend",
        "cpu",
        "--kernel",
        "cpu-tree",
        "--out",
        str(prefix),
    )
    assert done.returncode == 0, done.stderr
    with open(f"{prefix}.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [round(float(r["time"]), 6) for r in rows] == [0.0, 0.05, 0.1]
    assert {"r50", "r90", "rms_z", "sigma_R", "q_min", "virial_disk", "virial_halo"} <= set(rows[0])
    table = Path(f"{prefix}.txt").read_text()
    assert table == done.stdout and "sigma_R" in table and "2K/|W| halo" in table
    assert Path(f"{prefix}.png").stat().st_size > 10_000
    assert done.stderr.count("\nt ") + done.stderr.startswith("t ") >= 3  # a line per checkpoint
    Path(f"{prefix}.png").unlink()
    again = run("--replot", str(prefix))
    assert again.returncode == 0 and again.stdout == table and Path(f"{prefix}.png").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--scene", "nosuch", "--out", "x"], "nosuch"),
        (["--scene", "plummer", "--n", "64", "--out", "x"], "no component 'disk'"),
        (["--replot", "missing/prefix"], "no such file to replot"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    done = run(*args, cwd=tmp_path)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_out_is_required():
    done = run("--n", "64")
    assert done.returncode == 2 and "--out PREFIX is required" in done.stderr
