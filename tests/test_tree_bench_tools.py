"""The tree bench tools: bench/tree_table.py (the markdown table docs/tree.md quotes from a tree bench JSON)
and bench/tree_walk_variants.py (the walk variants it compiles)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import tree_table  # noqa: E402


def row(theta, step, p99, status="ok"):
    return {
        "kernel": "tree",
        "scene": "plummer",
        "n": 1024,
        "tunables": {"theta": theta},
        "status": status,
        "step_median_ms": step,
        "interactions": 1024 * 300,
        "stages_median_ms": dict.fromkeys(tree_table.STAGES, 0.25),
        "error": {"median": p99 / 4, "p99": p99, "max": p99 * 3},
    }


RUN = {
    "results": [
        row(0.5, 9.0, 4e-4),
        row(0.7, 5.0, 2e-3),
        {"kernel": "best", "scene": "plummer", "n": 1024, "median_ms": 416.2, "status": "ok"},
        {"kernel": "best", "scene": "plummer", "n": 8192, "median_ms": None, "status": "skipped: too slow"},
    ],
    "fastest_within_budget": [
        {
            "kernel": "tree",
            "scene": "plummer",
            "n": 1024,
            "tunables": {"theta": 0.5},
            "step_median_ms": 9.0,
            "p99": 4e-4,
        }
    ],
}


def test_the_fastest_setting_within_the_budget_is_bold_and_only_it():
    text = tree_table.table(RUN)
    rows = [ln for ln in text.splitlines() if ln.startswith("| plummer")]
    assert len(rows) == 2
    assert "**theta=0.5**" in rows[0] and "**9.00**" in rows[0] and "**4.0e-04**" in rows[0]
    assert "**" not in rows[1] and "| 5.00 |" in rows[1] and "| 300 |" in rows[1]


def test_other_kernels_are_listed_with_their_time_or_why_not():
    text = tree_table.table(RUN)
    assert "`best` · plummer · N = 1,024: 416.2 ms" in text
    assert "N = 8,192: skipped: too slow" in text


def test_an_unreadable_file_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert tree_table.main([str(bad)]) == 2
    assert "cannot read" in capsys.readouterr().err
    good = tmp_path / "run.json"
    good.write_text(json.dumps(RUN))
    assert tree_table.main([str(good)]) == 0


def test_walk_variants_rewrite_the_walk_as_it_is_today():
    import tree_walk_variants

    text = (Path(__file__).resolve().parent.parent / "kernels" / "tree" / "walk.cu").read_text()
    out = tree_walk_variants.variant_source(text, 8, 5)
    assert "#define TREE_WARPS 8" in out and "#define TREE_WARPS 4" not in out
    entries = text.count(tree_walk_variants.LAUNCH_BOUNDS) + text.count(tree_walk_variants.G64_BOUNDS)
    assert entries >= 3 and out.count("__launch_bounds__(32 * TREE_WARPS, 5)") == entries
    uncapped = tree_walk_variants.variant_source(text, 4, 0)  # every group size's kernels, groups of 64 too
    assert uncapped.count(tree_walk_variants.LAUNCH_BOUNDS) == entries and "TREE_WARPS, " not in uncapped


def refit_row(every, ms, devices=1, p99=5e-4):
    r = {
        "kernel": "tree",
        "scene": "plummer",
        "n": 1 << 20,
        "status": "ok",
        "median_ms": ms,
        "tunables_used": {"theta": 0.6, "rebuild_every": every},
        "error": {"p99": p99},
    }
    if devices > 1:
        r["devices_median_ms"] = {f"{k} GPU": ms for k in range(devices)}
        r["exchange_median_ms"] = 0.04
    return r


def test_the_refit_plot_draws_each_device_count_and_the_p99_and_refuses_what_it_cannot(tmp_path, capsys):
    import numpy as np
    import refit_plot
    from matplotlib.colors import to_rgb
    from PIL import Image

    from app.tools.bench_plot import COLORS

    results = [
        refit_row(1, 7.6),
        refit_row(4, 7.0),
        refit_row(1, 4.6, 2),
        refit_row(4, 4.0, 2),
        {"kernel": "best", "scene": "plummer", "n": 1 << 20, "status": "ok", "median_ms": 416.0},
    ]
    rows = refit_plot.refit_rows(results)
    assert list(rows) == [("plummer", 0.6, 1 << 20)] and sorted(rows[("plummer", 0.6, 1 << 20)]) == [1, 2]
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"results": results, "device": {"name": "GPU"}, "date": "today"}))
    png = tmp_path / "refit.png"
    assert refit_plot.main([str(path), "--png", str(png)]) == 0
    pixels = np.asarray(Image.open(png).convert("RGB")).reshape(-1, 3).astype(int)
    want = np.array([round(255 * c) for c in to_rgb(COLORS[0])])
    assert (np.abs(pixels - want).sum(axis=1) < 30).sum() > 500  # the series' lines and markers are drawn
    assert refit_plot.main([str(path), "--png", str(tmp_path / "no" / "refit.png")]) == 2
    path.write_text(json.dumps({"results": results[-1:]}))
    assert refit_plot.main([str(path), "--png", str(png)]) == 2
    assert "no tree rows with rebuild_every" in capsys.readouterr().err


def test_the_refit_cost_model_and_the_accumulated_excess_rule():
    import tree_refit_growth as g

    curve = [0.0, 0.1, 0.3, 0.6, 1.0]  # the walk's growth k evaluations after the build
    assert g.fixed_cost(curve, 1, 0.2) == pytest.approx(1.2)  # a build every step: the walk plus the build
    assert g.fixed_cost(curve, 2, 0.2) == pytest.approx((0.2 + 1.0 + 1.1) / 2)
    assert g.excess_rule_cycle(curve, 0.2) == 3  # 0.1 < 0.2 <= 0.1 + 0.3: the third evaluation builds
    assert g.excess_rule_cycle(curve, 0.05) == 2
    assert g.excess_rule_cycle([0.0, 0.01, 0.01], 0.5) == 3  # never reached: the curve's end
    # predicted: after refit 1, 2 x 0.1 - 0 = 0.2 >= (0.2 + 0.1) / 2: evaluation 2 builds (the best cycle)
    assert g.marginal_rule_cycle(curve, 0.2) == 2
    assert g.marginal_rule_cycle(curve, 0.5) == 3  # 0.2 < 0.3; then 0.5 >= (0.5 + 0.4) / 3
    assert g.marginal_rule_cycle([0.0, 0.01, 0.01], 0.5) == 3
    lines = g.cost_lines(curve, 0.2)
    assert "rebuild_every =  2: 0.958" in lines[2]
    assert "accumulated excess >= b: a build every 3 evaluations, " in lines[-3]
    assert "predicted growth >= mean extra cost: a build every 2 evaluations, " in lines[-2]
    assert lines[-1].startswith("  best fixed cycle on this curve: 2,")  # 0.958 against 1.0 at 3


def test_the_refit_growth_probe_runs_end_to_end(capsys):
    import tree_refit_growth as g

    assert g.main(["--scene", "plummer", "--n", "2048", "--steps", "2", "--theta", "0.6"]) == 0
    out = capsys.readouterr().out
    rows = [ln for ln in out.splitlines() if ln[:2].strip().isdigit()]
    assert [int(r.split()[0]) for r in rows] == [1, 2]
    assert "rebuild_every =  2:" in out and "accumulated excess >= b" in out


def test_the_splat_plot_stacks_each_stage_and_refuses_what_it_cannot(tmp_path, capsys):
    import numpy as np
    import splat_plot
    from PIL import Image

    row = {"n": 1 << 20, "method": "binned", "width": 1920, "height": 1080, "gpu_ms": 0.2, "wall_ms": 0.7}
    rows = [
        {**row, "ms": {"clear": 0.02, "accumulate": 0.13, "histogram": 0.03, "tonemap": 0.03}},
        {
            **row,
            "method": "direct",
            "ms": {"clear": 0.02, "accumulate": 0.31, "histogram": 0.03, "tonemap": 0.03},
        },
    ]
    path = tmp_path / "splat.json"
    path.write_text(json.dumps({"device": "GPU 0", "scene": "collision", "rows": rows}))
    png = tmp_path / "splat.png"
    assert splat_plot.main([str(path), "--png", str(png)]) == 0
    pixels = np.asarray(Image.open(png).convert("RGB")).reshape(-1, 3).astype(int)
    orange = np.array([0xE0, 0x70, 0x2A])  # the accumulate stage: the tallest part of both bars
    assert (np.abs(pixels - orange).sum(axis=1) < 30).sum() > 2000
    assert splat_plot.main([str(path), "--png", str(tmp_path / "no" / "splat.png")]) == 2
    path.write_text(json.dumps({"rows": []}))
    assert splat_plot.main([str(path), "--png", str(png)]) == 2
    assert "not a splat_cost JSON with rows" in capsys.readouterr().err


def test_the_splat_cost_bench_refuses_an_unwritable_output_before_any_work(tmp_path, capsys):
    import splat_cost

    assert splat_cost.main(["--out", str(tmp_path / "no" / "cost.json")]) == 2  # no GPU was asked for
    assert "cannot write the results" in capsys.readouterr().err
    assert [splat_cost.size_arg(t) for t in ("1M", "16m", "512K", "1000")] == [
        1 << 20,
        1 << 24,
        1 << 19,
        1000,
    ]
