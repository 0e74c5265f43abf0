"""app.engine.timing's pure pieces: the History rings the panel plots and its live medians (no GL, no GPU)."""

from __future__ import annotations

import numpy as np

from app.render.frames import History


def test_history_window_is_the_last_seconds_oldest_first_across_the_wrap():
    h = History(("a", "b"), capacity=8)
    for i in range(13):  # wraps: only the newest 8 are kept
        h.push(i * 0.5, a=float(i), b=-float(i))
    t, d = h.window(2.0)
    assert t.tolist() == [4.0, 4.5, 5.0, 5.5, 6.0]
    assert d["a"].tolist() == [8.0, 9.0, 10.0, 11.0, 12.0] and (d["b"] == -d["a"]).all()
    t, d = h.window(100.0, ("b",))
    assert t.size == 8 and list(d) == ["b"] and d["b"][0] == -5.0


def test_history_recent_medians_and_unset_fields():
    h = History(("a", "b"), capacity=16)
    assert h.recent_medians(5) == {"a": 0.0, "b": 0.0}
    for i, v in enumerate((1.0, 100.0, 2.0, 3.0)):
        h.push(float(i), a=v)  # b is not given: it reads 0
    assert h.recent_medians(3) == {"a": 3.0, "b": 0.0}  # median of 100, 2, 3
    assert h.recent_medians(100)["a"] == 2.5
    t, d = h.window(0.0)
    assert t.tolist() == [3.0] and np.array_equal(d["a"], [3.0])


def test_stage_entries_round_trip_in_stage_order_with_extra_stages_last():
    from app.engine.timing import StepTimings, stage_entries, stages_of

    extra = {"timings_lagged": 1.0, **stage_entries({"gather": 0.5, "walk": 3.0, "keys": 0.25, "sort": 1.0})}
    assert extra["stage:walk"] == 3.0 and "stage:timings_lagged" not in extra
    assert list(stages_of(extra).items()) == [("keys", 0.25), ("sort", 1.0), ("walk", 3.0), ("gather", 0.5)]
    t = StepTimings(kernel="k", steps=2, n=100, interactions=3000, force_evals=3, extra=extra)
    assert t.stages == stages_of(extra) and t.interactions_per_body == 10.0
    assert StepTimings(kernel="k", steps=0, n=100).interactions_per_body == 0.0
    assert not StepTimings("k", 1, 1).stages
