"""The tree bench tools: bench/tree_table.py (the markdown table docs/tree.md quotes from a tree bench JSON)
and bench/tree_walk_variants.py (the walk variants it compiles)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import tree_table  # noqa: E402


def row(theta, step, p99, status="ok"):
    return {"kernel": "tree", "scene": "plummer", "n": 1024, "tunables": {"theta": theta}, "status": status,
            "step_median_ms": step, "interactions": 1024 * 300,
            "stages_median_ms": dict.fromkeys(tree_table.STAGES, 0.25),
            "error": {"median": p99 / 4, "p99": p99, "max": p99 * 3}}


RUN = {"results": [row(0.5, 9.0, 4e-4), row(0.7, 5.0, 2e-3),
                   {"kernel": "best", "scene": "plummer", "n": 1024, "median_ms": 416.2, "status": "ok"},
                   {"kernel": "best", "scene": "plummer", "n": 8192, "median_ms": None,
                    "status": "skipped: too slow"}],
       "fastest_within_budget": [{"kernel": "tree", "scene": "plummer", "n": 1024, "tunables": {"theta": 0.5},
                                  "step_median_ms": 9.0, "p99": 4e-4}]}


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
    entries = text.count(tree_walk_variants.LAUNCH_BOUNDS)
    assert entries >= 3 and out.count("__launch_bounds__(32 * TREE_WARPS, 5)") == entries
    assert tree_walk_variants.variant_source(text, 4, 0) == text
