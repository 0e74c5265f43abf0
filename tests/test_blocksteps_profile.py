"""bench/blocksteps_profile.py's host side (docs/blocksteps.md, "What bounds the speed-up", quotes its
summary): the bounds from per-substep rows, the t = 0 bound from a level histogram, the plot, and bad
input refused before any GPU is touched. The profile itself needs a GPU (it ran on the device)."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import blocksteps_profile as bp  # noqa: E402


def row(mode, step, active, walk, build, force, wall, interactions):
    stages = dict.fromkeys(bp.BUILD_STAGES, build / len(bp.BUILD_STAGES))
    return {
        "mode": mode,
        "max_step": step,
        "tick": 1,
        "active": active,
        "wall_ms": wall,
        "force_ms": force,
        **stages,
        "walk": walk,
        "interactions": interactions,
    }


# max step 1 is the one-time costs' (left out); in max step 2 block evaluates 1,000 + 500 targets with
# 3,000 + 2,000 interactions per target against shared's 2 x 1,000 at 3,000 each
ROWS = [
    row("block", 1, 1000, 4.0, 1.0, 6.0, 500.0, 3_000_000),
    row("block", 2, 1000, 4.0, 1.0, 5.5, 7.0, 3_000_000),
    row("block", 2, 500, 3.0, 1.0, 4.5, 6.0, 1_000_000),
    row("shared", 1, 1000, 4.0, 1.0, 6.0, 500.0, 3_000_000),
    row("shared", 2, 1000, 4.0, 1.0, 5.5, 7.0, 3_000_000),
    row("shared", 2, 1000, 4.0, 1.0, 5.5, 7.0, 3_000_000),
]


def test_the_summary_gives_the_bounds_from_the_rows_after_max_step_1(capsys):
    bp.summarise(ROWS)
    out = capsys.readouterr().out
    assert "max step 1 left out" in out
    assert "block : 0.01 s in 2 substeps, 6.50 ms a substep" in out
    assert "(walk 3.50, build 1.00, force rest 0.50, outside 1.50)" in out  # block's halves of 7 + 6
    assert "as measured (synchronised): 1.08x" in out  # 14 / 13 ms
    assert "targets 1.33x fewer, interactions 1.50x fewer" in out  # 2,000 / 1,500 and 6e6 / 4e6
    # block's walk at shared's 8 ms per 6e6 interactions: 13 - 7 + 4e6 * 8 / 6e6 = 11.33 ms; 14 / 11.33
    assert "walk at shared's rate per interaction: 1.24x" in out
    assert "other than the walk are 43% of a shared substep" in out  # (14 - 8) / 14


def test_the_t0_bound_and_the_clamp_warning(capsys):
    bp._say_levels("block", [0, 0, 10, 40, 30, 20, 0], 6)
    out = capsys.readouterr().out
    assert "targets bound 2.16x" in out  # 2^5 / (0.1 * 4 + 0.4 * 8 + 0.3 * 16 + 0.2 * 32)
    assert "warning" not in out
    bp._say_levels("block", [0, 0, 10, 40, 30, 20, 5], 6)
    assert "clamped" in capsys.readouterr().out  # bodies at L: the criterion wanted finer


def test_replot_draws_the_csv(tmp_path):
    path = tmp_path / "p.csv"
    with path.open("w", newline="") as f:
        out = csv.DictWriter(f, bp.FIELDS)
        out.writeheader()
        out.writerows(ROWS)
    png = tmp_path / "p.png"
    assert bp.main(["--replot", "--csv", str(path), "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "extra, said",
    [
        (["--ics", "{tmp}/absent.tipsy"], "is not a file"),
        (["--ics", "{tmp}/garbage.dat"], "garbage.dat"),
        (["--scene", "no-such-scene"], "no-such-scene"),
        (["--softening", "0"], "--softening"),
        (["--replot"], "not a file"),
    ],
)
def test_bad_input_is_refused_before_the_gpu(tmp_path, capsys, extra, said):
    (tmp_path / "garbage.dat").write_bytes(b"not a snapshot at all\x00\x01")
    args = [a.replace("{tmp}", str(tmp_path)) for a in extra]
    assert bp.main(["--csv", str(tmp_path / "out.csv"), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("blocksteps_profile: ") and said in err
    assert not (tmp_path / "out.csv").exists()
