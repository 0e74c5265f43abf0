"""bench/ab_interleaved.py: variants benched in turn, round after round, and the medians and ranges of
every row (the way to compare changes smaller than the run-to-run spread of the 1M tree on two GPUs).
Over the CPU backend's devices: two checkouts of this code, two rounds, one and two devices."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "ab_interleaved.py"


@pytest.fixture(scope="module")
def ab():
    spec = importlib.util.spec_from_file_location("ab_interleaved", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rounds_alternate_the_variants_and_every_row_is_summarised(ab, tmp_path, capsys):
    other = tmp_path / "other"
    shutil.copytree(ROOT / "app", other / "app", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "kernels", other / "kernels")
    out = tmp_path / "runs"
    bench = [
        "--backend",
        "cpu",
        "--kernels",
        "cpu-simd",
        "--n",
        "512",
        "--gpus",
        "1,2",
        "--warmup",
        "1",
        "--repeats",
        "1",
    ]
    rc = ab.main(
        [
            "--variant",
            f"a={ROOT}",
            "--variant",
            f"b={other}",
            "--rounds",
            "2",
            "--out",
            str(out),
            "--",
            *bench,
        ]
    )
    assert rc == 0
    assert sorted(p.name for p in out.iterdir()) == ["a-1.json", "a-2.json", "b-1.json", "b-2.json"]
    assert json.loads((out / "b-2.json").read_text())["gpu_counts"] == [1, 2]
    printed = capsys.readouterr()
    assert printed.err.splitlines() == [
        "round 1/2: a done",
        "round 1/2: b done",
        "round 2/2: a done",
        "round 2/2: b done",
    ]  # in turn, not all of a then all of b
    lines = printed.out.splitlines()
    assert "cpu-simd plummer N=512 {} x1" in lines and "cpu-simd plummer N=512 {} x2" in lines
    two = lines[lines.index("cpu-simd plummer N=512 {} x2") + 1 :][:2]
    assert all(" ms   speed-up " in line for line in two)  # each variant: its step and its speed-up


def test_speed_ups_are_against_the_fewest_devices_of_the_same_run(ab):
    times = {
        ("t", "p", 8, "{}", 1): 8.0,
        ("t", "p", 8, "{}", 2): 5.0,
        ("t", "p", 8, "{}", 4): 2.0,
        ("s", "p", 8, "{}", 2): 3.0,
        ("s", "p", 8, "{}", 4): 2.0,
    }
    assert ab.speedups(times) == {
        ("t", "p", 8, "{}", 2): 1.6,
        ("t", "p", 8, "{}", 4): 4.0,
        ("s", "p", 8, "{}", 4): 1.5,
    }


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--variant", "x", "--out", "o", "--", "--n", "1"], "NAME=FOLDER"),
        (["--variant", "a=.", "--out", "o", "--", "--n", "1"], "two variants or more"),
        (["--variant", "a=/", "--variant", "b=.", "--out", "o", "--", "--n", "1"], "no app/__main__.py"),
        (
            ["--variant", f"a={ROOT}", "--variant", f"b={ROOT}", "--out", "o", "--", "--json", "x"],
            "without --json",
        ),
    ],
)
def test_bad_arguments_exit_2_saying_what_is_wrong(ab, argv, said, capsys):
    with pytest.raises(SystemExit) as done:
        ab.main(argv)
    assert done.value.code == 2 and said in capsys.readouterr().err


def test_a_failing_run_exits_1_with_its_output(ab, tmp_path, capsys):
    rc = ab.main(
        [
            "--variant",
            f"a={ROOT}",
            "--variant",
            f"b={ROOT}",
            "--rounds",
            "1",
            "--out",
            str(tmp_path),
            "--",
            "--backend",
            "cpu",
            "--kernels",
            "no-such-kernel",
            "--n",
            "64",
        ]
    )
    assert rc == 1 and "no-such-kernel" in capsys.readouterr().err
