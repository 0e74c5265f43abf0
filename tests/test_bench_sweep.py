"""`bench`'s scenes, tunable sweeps, force-error samples and --max-seconds, on the CPU (cpu-tree, small N)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from test_bench import ToyBackend, by

from app.backends import backend_class
from app.backends.base import KernelRecord, StepTimings
from app.cli import main
from app.core.errors import ConfigError
from app.core.values import FloatRange, IntChoice
from app.model.ics import generate
from app.tools import bench
from app.tools.bench_sweep import fastest_within_budget, kernel_settings, summary_lines, sweep_notes

N = 2048


@pytest.fixture(scope="module")
def cpu():
    cls = backend_class("cpu")
    if cls.why_not():
        pytest.skip(f"cpu backend unavailable: {cls.why_not()}")
    return cls


@pytest.fixture(scope="module")
def sweep(cpu):
    """cpu-simd and cpu-tree at one N, two scenes, the tree at three θ: 2 x (1 + 3) rows."""
    return bench.run_bench(
        cpu,
        ["cpu-simd", "cpu-tree"],
        [N],
        warmup=1,
        repeats=2,
        progress=False,
        scenes=["plummer", "collision"],
        tunables={"theta": [0.2, 0.5, 0.9], "opening": ["cube"]},  # θ: the geometric test's
        error_sample=512,
    )


def rows(result, **match):
    return [r for r in result["results"] if all(r.get(k) == v for k, v in match.items())]


def test_a_swept_tunable_gives_one_row_per_value_and_only_to_kernels_that_have_it(sweep):
    assert sweep["tunable_lists"] == {"theta": [0.2, 0.5, 0.9], "opening": ["cube"]}
    assert sweep["scenes"] == ["plummer", "collision"]
    assert len(sweep["results"]) == 8
    for scene in ("plummer", "collision"):
        simd = rows(sweep, kernel="cpu-simd", scene=scene)
        assert len(simd) == 1 and simd[0]["tunables"] == {}  # all-pairs is not swept by θ
        tree = rows(sweep, kernel="cpu-tree", scene=scene)
        assert [r["tunables"]["theta"] for r in tree] == [0.2, 0.5, 0.9]
        for r in tree:  # the value recorded is the value run with; the other tunables at their defaults
            assert r["status"] == "ok" and r["tunables_used"] == {
                "theta": r["tunables"]["theta"],
                "leaf": 16,
                "group": 64,
                "rebuild_every": 16,
                "rebuild_rule": "adaptive",
                "opening": "cube",
                "alpha": 0.001,
            }
            assert r["step_median_ms"] >= r["median_ms"] > 0
    table = bench.format_table(sweep)
    assert "cpu-tree opening=cube theta=0.2 collision" in " ".join(table.split())
    assert "err p99" in table.splitlines()[1]


def test_the_error_sample_is_taken_for_the_tree_and_falls_as_theta_falls(sweep):
    for scene in ("plummer", "collision"):
        assert "error" not in rows(sweep, kernel="cpu-simd", scene=scene)[0]  # exact: nothing to sample
        errs = [r["error"] for r in rows(sweep, kernel="cpu-tree", scene=scene)]
        for e in errs:
            assert e["sample"] == 512 and 0 < e["median"] <= e["p99"] <= e["max"] and e["budget_p99"] == 1e-3
            assert e["within_budget"] == (e["p99"] <= 1e-3)
        p99s, medians = [e["p99"] for e in errs], [e["median"] for e in errs]
        assert p99s == sorted(p99s) and medians == sorted(medians) and p99s[0] < p99s[-1] / 5
    table = bench.format_table(sweep)
    tree_02 = next(
        line for line in table.splitlines() if line.startswith("cpu-tree opening=cube theta=0.2 plummer")
    )
    assert f"{rows(sweep, kernel='cpu-tree', scene='plummer')[0]['error']['p99']:.2e}" in tree_02


def test_the_fastest_setting_within_budget_is_named_per_scene_and_n(sweep):
    entries = sweep["fastest_within_budget"]
    assert [(e["kernel"], e["scene"], e["n"]) for e in entries] == [
        ("cpu-tree", "plummer", N),
        ("cpu-tree", "collision", N),
    ]
    for e in entries:
        tree = rows(sweep, kernel="cpu-tree", scene=e["scene"])
        within = [r for r in tree if r["error"]["p99"] <= 1e-3]
        assert e["tunables"] == min(within, key=lambda r: r["step_median_ms"])["tunables"]
    lines = bench.format_table(sweep).splitlines()
    assert any(
        line.startswith(f"cpu-tree · collision · N = {N:,}: fastest within p99 <= 0.001: opening=cube theta=")
        for line in lines
    )


def test_fastest_within_budget_picks_the_quickest_setting_that_meets_it_or_says_none_did():
    def row(theta, ms, p99, n=1024):
        return {
            "kernel": "t",
            "scene": "plummer",
            "n": n,
            "status": "ok",
            "tunables": {"theta": theta},
            "median_ms": ms - 1,
            "step_median_ms": ms,
            "error": {"p99": p99, "budget_p99": 1e-3},
        }

    result = [
        row(0.3, 20.0, 1e-4),
        row(0.6, 8.0, 9e-4),
        row(0.7, 6.0, 2e-3),
        row(0.5, 9.0, 5e-4),
        row(0.9, 4.0, 4e-3, n=2048),
        row(0.7, 5.0, 2e-3, n=2048),
        {"kernel": "t", "scene": "plummer", "n": 1024, "status": "skipped", "reason": "x"},
    ]
    small, large = fastest_within_budget(result)
    assert small["tunables"] == {"theta": 0.6} and small["step_median_ms"] == 8.0 and small["settings"] == 4
    assert large["tunables"] is None and large["smallest_p99"] == 2e-3
    assert large["smallest_p99_tunables"] == {"theta": 0.7}
    first, second = summary_lines([small, large])
    assert "theta=0.6, step 8.000 ms (p99 9.00e-04; 4 setting(s) measured)" in first
    assert "none of 2 setting(s) met p99 <= 0.001; the smallest p99 was 2.00e-03 (theta=0.7)" in second


def test_fastest_within_budget_is_per_device_count_where_rows_have_one():
    def row(gpus, theta, ms, p99):
        return {
            "kernel": "t",
            "scene": "plummer",
            "n": 1024,
            "gpus": gpus,
            "status": "ok",
            "tunables": {"theta": theta},
            "median_ms": ms - 1,
            "step_median_ms": ms,
            "error": {"p99": p99, "budget_p99": 1e-3},
        }

    one, two = fastest_within_budget(
        [row(1, 0.5, 9.0, 5e-4), row(1, 0.6, 8.0, 9e-4), row(2, 0.5, 4.0, 5e-4), row(2, 0.6, 6.0, 9e-4)]
    )
    assert (one["gpus"], one["tunables"], one["settings"]) == (1, {"theta": 0.6}, 2)
    assert (two["gpus"], two["tunables"], two["step_median_ms"]) == (2, {"theta": 0.5}, 4.0)
    assert summary_lines([two])[0].startswith("t · plummer · N = 1,024 · 2 GPU(s): fastest within")
    plain = fastest_within_budget([{**row(1, 0.5, 9.0, 5e-4), "gpus": None}])
    assert "gpus" not in plain[0] and "GPU" not in summary_lines(plain)[0]


def test_no_error_sample_when_it_is_off(cpu):
    result = bench.run_bench(cpu, ["cpu-tree"], [512], warmup=0, repeats=1, progress=False, error_sample=0)
    assert "error" not in result["results"][0] and result["fastest_within_budget"] == []
    assert "err p99" not in bench.format_table(result)


def test_the_default_scene_is_todays_plummer_sphere_bit_for_bit_and_the_collision_its_generator():
    today = generate("plummer", 700, 42)
    assert np.array_equal(bench.bench_bodies(700).pos, today.pos)
    assert np.array_equal(bench.bench_bodies(700).vel, today.vel)
    assert np.array_equal(bench.bench_bodies(700, 5, "collision").pos, generate("collision", 700, 5).pos)
    with pytest.raises(ConfigError, match="choose from plummer"):
        bench.check_scene("galaxy")


def test_a_scene_that_cannot_make_n_bodies_is_a_skipped_row(cpu):
    result = bench.run_bench(
        cpu, ["cpu-simd"], [1, 64], warmup=0, repeats=1, progress=False, scenes=["collision"]
    )
    one, many = result["results"]
    assert one["status"] == "skipped" and "collision" in one["reason"] and one["scene"] == "collision"
    assert many["status"] == "ok"


def test_kernel_settings_validate_and_name_the_kernels_that_have_a_tunable():
    theta = FloatRange("theta", 0.0, 1.5, 0.5, lo_open=True)
    tree = KernelRecord("tree", "t", "x", tunables=(theta, IntChoice("leaf", (8, 16), 16)))
    other = KernelRecord("other-tree", "t", "x", tunables=(theta,))
    flat = KernelRecord("flat", "f", "x")
    every = [tree, other, flat]
    got = kernel_settings([tree, flat], {"theta": [0.3, 0.3, 1], "leaf": [8, 16]}, every)
    assert got["flat"] == [{}]
    assert got["tree"] == [
        {"theta": 0.3, "leaf": 8},
        {"theta": 0.3, "leaf": 16},
        {"theta": 1.0, "leaf": 8},
        {"theta": 1.0, "leaf": 16},
    ]  # duplicates once
    with pytest.raises(
        ConfigError,
        match=r"none of the selected kernels \(flat\).*kernels with 'theta': "
        r"tree, other-tree",
    ):
        kernel_settings([flat], {"theta": [0.5]}, every)
    with pytest.raises(ConfigError, match="no kernel has it"):
        kernel_settings([tree], {"blocks": [1]}, every)
    with pytest.raises(ConfigError, match=r"tree\.theta: 2 is not in \(0, 1\.5\]"):
        kernel_settings([tree], {"theta": [0.5, 2]}, every)


def test_a_sweep_that_changes_nothing_measured_is_said_before_the_timing(caplog, tmp_path):
    from app.backends.cpu_forces import RECORDS

    tree = next(r for r in RECORDS if r.name == "cpu-tree")
    theta = sweep_notes([tree], {"theta": [0.3, 0.7]})  # under the default opening test, rel
    assert theta == [
        "cpu-tree: theta is swept under opening=rel, which reads it for a run's first step only; add "
        "--tunable opening=cube (or bmax) to compare theta"
    ]
    assert sweep_notes([tree], {"theta": [0.3, 0.7], "opening": ["cube", "bmax"]}) == []
    assert sweep_notes([tree], {"alpha": [0.001, 0.003]}) == []  # rel reads alpha
    assert sweep_notes([tree], {"alpha": [0.001, 0.003], "opening": ["cube"]}) == [
        "cpu-tree: alpha is swept where it is read only when opening is rel (now cube)"
    ]
    assert sweep_notes([tree], {"theta": [0.5]}) == []  # one value: nothing swept
    assert sweep_notes([tree], {"theta": [0.5, 2]}) == []  # refused by kernel_settings, which says why
    out = tmp_path / "b.json"
    args = ["bench", "--backend", "cpu", "--kernels", "cpu-tree", "--n", "256", "--warmup", "1", "--repeats"]
    with caplog.at_level("WARNING", logger="nbody-live"):
        assert main([*args, "1", "--tunable", "theta=0.4,0.8", "--no-progress", "--json", str(out)]) == 0
    said = [r.getMessage() for r in caplog.records]
    assert any("theta is swept under opening=rel" in m for m in said) and out.exists()


def test_bench_cli_usage_errors_exit_2_naming_the_problem(capsys, tmp_path):
    out = tmp_path / "b.json"
    base = ["bench", "--backend", "cpu", "--n", "64", "--json", str(out)]
    assert main([*base, "--kernels", "cpu-simd", "--tunable", "theta=0.5"]) == 2
    assert "kernels with 'theta': cpu-tree" in capsys.readouterr().err
    assert main([*base, "--kernels", "cpu-tree", "--tunable", "theta=0.5,2"]) == 2
    assert "cpu-tree.theta: 2 is not in (0, 1.5]" in capsys.readouterr().err
    assert main([*base, "--kernels", "cpu-tree", "--tunable", "theta=0.5,"]) == 2
    assert "empty value" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main([*base, "--scene", "plummer,galaxy"])
    assert e.value.code == 2 and "galaxy" in capsys.readouterr().err
    assert not out.exists()  # nothing half-written


def test_bench_cli_sweep_writes_json_and_plot(cpu, tmp_path, capsys):
    out, png = tmp_path / "b.json", tmp_path / "b.png"
    assert (
        main(
            [
                "bench",
                "--backend",
                "cpu",
                "--kernels",
                "cpu-tree",
                "--n",
                "512",
                "--scene",
                "plummer,collision",
                "--tunable",
                "theta=0.4,0.8",
                "--error-sample",
                "128",
                "--warmup",
                "1",
                "--repeats",
                "1",
                "--no-progress",
                "--json",
                str(out),
                "--plot",
                str(png),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "cpu-tree theta=0.8" in printed and ("fastest within p99" in printed or "none of 2" in printed)
    back = bench.load_json(out)
    assert back["scenes"] == ["plummer", "collision"] and back["error_sample"] == 128
    assert [(r["scene"], r["tunables"]["theta"]) for r in back["results"]] == [
        ("plummer", 0.4),
        ("plummer", 0.8),
        ("collision", 0.4),
        ("collision", 0.8),
    ]
    assert all(r["error"]["sample"] == 128 for r in back["results"])
    assert len(back["fastest_within_budget"]) == 2 and png.stat().st_size > 0


def test_json_round_trip_keeps_the_new_fields(sweep, tmp_path):
    path = tmp_path / "sweep.json"
    bench.write_json(sweep, path)
    back = bench.load_json(path)
    assert back["results"] == sweep["results"]
    assert back["fastest_within_budget"] == sweep["fastest_within_budget"]
    assert bench.format_table(back) == bench.format_table(sweep)


def test_the_plot_has_an_accuracy_panel_when_rows_sampled_their_error(sweep, tmp_path):
    from PIL import Image

    from app.tools.bench_plot import SIZE_PX_WITH_ERRORS, bench_figure, plot

    fig = bench_figure(sweep)
    rates, accuracy = fig.axes
    labels = [t.get_text() for t in rates.get_legend().get_texts()]
    assert "cpu-tree · collision · opening=cube theta=0.2" in labels and "cpu-simd · plummer" in labels
    assert "cpu-tree · plummer · opening=cube theta=0.9 (equivalent all-pairs)" in labels
    assert (accuracy.get_xscale(), accuracy.get_yscale()) == ("log", "log")
    assert "p99 relative acceleration error (512 random targets" in accuracy.get_xlabel()
    acc_labels = [t.get_text() for t in accuracy.get_legend().get_texts()]
    assert acc_labels[0] == "cpu-tree · plummer · 2Ki" and "p99 budget 0.001" in acc_labels
    assert any(lbl.startswith("cpu-simd · collision · 2Ki (all-pairs: ") for lbl in acc_labels)
    line = next(ln for ln in accuracy.get_lines() if ln.get_label() == "cpu-tree · plummer · 2Ki")
    tree = rows(sweep, kernel="cpu-tree", scene="plummer")
    assert line.get_xdata().tolist() == [r["error"]["p99"] for r in tree]
    assert line.get_ydata().tolist() == [r["step_median_ms"] for r in tree]
    annotations = {t.get_text() for t in accuracy.texts}
    assert {"opening=cube theta=0.2", "opening=cube theta=0.5", "opening=cube theta=0.9"} <= annotations
    img = Image.open(plot(sweep, tmp_path / "sweep.png"))
    assert img.format == "PNG" and img.size == SIZE_PX_WITH_ERRORS


class SlowToy(ToyBackend):
    """Each step takes 50 ms of wall time (the reported force time stays the toy's)."""

    def step(self, steps=1) -> StepTimings:
        time.sleep(0.05)
        return super().step(steps)


def test_max_seconds_skips_a_row_predicted_from_a_smaller_n_by_its_work():
    result = bench.run_bench(
        ToyBackend,
        ["toy-fast", "toy-tree"],
        [16, 1000],
        warmup=2,
        repeats=3,
        progress=False,
        max_seconds=0.05,
    )  # at 16: ~0.01 ms per step
    assert [r["status"] for r in result["results"]] == ["ok", "ok", "skipped", "ok"]
    large = by(result, "toy-fast", 1000)  # all-pairs: x(1000/16)² = x3,906 per step, 0.2 s for 5 steps
    assert large["reason"] == (
        "not run: 5 steps predicted to take 0.2 s (N² from 0.0103 ms per step at N = 16) > --max-seconds 0.05"
    )
    assert result["max_seconds"] == 0.05 and "not run: 5 steps predicted" in bench.format_table(result)
    # a tree (fewer interactions than N²) grows as N log N: x156, 0.008 s predicted, so it runs
    assert by(result, "toy-tree", 1000)["status"] == "ok"


def test_max_seconds_stops_a_row_whose_pace_would_take_too_long():
    result = bench.run_bench(
        SlowToy, ["toy-fast"], [64], warmup=1, repeats=5, progress=False, max_seconds=0.12
    )
    row = result["results"][0]
    assert row["status"] == "skipped" and row["reason"].startswith("stopped after 2 of 6 steps: ")
    fine = bench.run_bench(SlowToy, ["toy-fast"], [64], warmup=0, repeats=2, progress=False, max_seconds=30)
    assert by(fine, "toy-fast", 64)["status"] == "ok"


def test_the_progress_bar_counts_the_error_samples_too(cpu, monkeypatch):
    class Bar:
        def __init__(self, total, enabled):
            self.total, self.done, self.said = total, 0, []

        def set_postfix_str(self, text):
            self.said.append(text)

        def update(self, k):
            self.done += k

        def close(self):
            pass

    bars = []

    def progress(total, enabled):
        bars.append(Bar(total, enabled))
        return bars[-1]

    monkeypatch.setattr(bench, "_progress", progress)
    bench.run_bench(
        cpu,
        ["cpu-simd", "cpu-tree"],
        [256],
        warmup=0,
        repeats=1,
        tunables={"theta": [0.4, 0.8]},
        error_sample=64,
    )
    (bar,) = bars
    assert bar.total == bar.done == 3 + 2  # three timings, two error samples (the tree's rows)
    assert "cpu-tree theta=0.8 plummer N=256: error sample of 64 targets" in bar.said
