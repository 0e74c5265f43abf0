"""`best` is the CUDA default kernel (issue 14 item 4): its measured heuristic, its log line, its fallbacks,
and the tuner's noise-robust choice. CPU only: the policy, the table and the tuner's ranking are plain
Python, so they are tested here on stand-in device facts; the GPU acceptance is bench/best_default.sh.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from types import SimpleNamespace

import pytest

from app.backends.cuda import heuristic, registry, tune
from app.backends.cuda import tuning_cache as cache
from app.backends.cuda.policies import BestPolicy
from app.cli import main
from app.core.paths import ROOT
from app.engine.forces import with_role

RECORDS = {r.name: r for r in registry.RECORDS}
TUNE_JSON = ROOT / "bench" / "results" / "h200-2026-11-23-tune.json"
H200 = SimpleNamespace(name="NVIDIA H200", driver_version="580.159.04", compute_capability=(9, 0), sms=132)
H100 = SimpleNamespace(
    name="NVIDIA H100 80GB HBM3", driver_version="580.159.04", compute_capability=(9, 0), sms=132
)
UNKNOWN = SimpleNamespace(name="Some Future GPU", driver_version="999.1", compute_capability=(12, 3), sms=8)


@pytest.fixture(autouse=True)
def empty_cache(tmp_path, monkeypatch):
    """No tuning cache unless a test writes one (the user's own cache must not decide a test)."""
    monkeypatch.setenv("NBODY_CACHE_DIR", str(tmp_path / "cache"))


def _table_with_cc(tmp_path, cc="9.0"):
    """The committed table with its H200 family also matching compute capability `cc`."""
    table = json.loads(heuristic.TABLE.read_text())
    for family in table["families"]:
        family["compute_capability"] = cc
    path = tmp_path / "table.json"
    path.write_text(json.dumps(table))
    return path


def _write_cache(best):
    """A valid tuning cache for the stand-in H200 (what `nbody-live tune` writes)."""
    cache.write_cache(
        {
            "schema": cache.SCHEMA,
            "gpu": H200.name,
            "driver": H200.driver_version,
            "source_hash": cache.source_hash(registry.RECORDS),
            "best": best,
            "measurements": [],
        }
    )


# --- the default ------------------------------------------------------------------------------------------
def test_best_is_the_cuda_default_and_cpu_keeps_its_own():
    from app.backends import backend_class
    from app.backends.cpu_forces import DEFAULT_KERNEL as CPU_DEFAULT

    assert registry.DEFAULT_KERNEL == "best"
    assert backend_class("cuda").record(registry.DEFAULT_KERNEL).name == "best"  # class level: no GPU
    assert CPU_DEFAULT == "cpu-simd"
    # what tune checks fp32 sums against, and the live force error's exact sum, did not move
    baseline, exact = (with_role(registry.RECORDS, role).name for role in ("baseline", "exact"))
    assert baseline == exact == "shared"


def test_scene_and_cli_defaults_leave_the_kernel_to_the_backend():
    from app.cli import build_parser
    from app.scene import Scene

    assert Scene().run.kernel == "auto"  # -> the backend's DEFAULT_KERNEL at load
    args = build_parser().parse_args(["run"])
    assert getattr(args, "kernel", None) is None


# --- the table --------------------------------------------------------------------------------------------
def test_the_table_loads_and_every_pick_is_an_existing_kernel_configuration():
    table = heuristic.load_table(registry.RECORDS)
    assert table["families"], "the committed table has no GPU family"
    for family in table["families"]:
        for pick in family["picks"]:
            rec = RECORDS[pick["variant"]]
            assert rec.tuned, pick
            assert rec.validate_tunables(pick["tunables"]) == pick["tunables"], pick


def test_the_table_is_what_update_heuristic_makes_from_the_committed_tune():
    """The committed picks are data from the committed tune result, not hand-written."""
    tune_result = json.loads(TUNE_JSON.read_text())
    made = heuristic.family_from_tune(tune_result, registry.RECORDS, heuristic.shown(TUNE_JSON))
    family = next(f for f in heuristic.load_table(registry.RECORDS)["families"] if f["gpu"] == made["gpu"])
    assert family["picks"] == made["picks"] and family["from"] == "bench/results/h200-2026-11-23-tune.json"
    assert [p["n"] for p in family["picks"]] == sorted(e["n"] for e in tune_result["best"])


@pytest.mark.parametrize(
    "n, expect",
    [
        (4096, 4096),
        (1, 4096),
        (8191, 4096),
        (8192, 4096),
        (8193, 16384),
        (100_000, 131072),
        (500_000, 1048576),
        (10**8, 1048576),
    ],
)
def test_nearest_n_in_log_space(n, expect):
    picks = [{"n": m} for m in (16384, 4096, 65536, 1048576, 131072)]
    assert heuristic.nearest(picks, n)["n"] == expect


def test_family_by_name_then_compute_capability(tmp_path):
    table = heuristic.load_table(registry.RECORDS, _table_with_cc(tmp_path))
    assert heuristic.family_for(table, H200)["gpu"] == "NVIDIA H200"
    assert heuristic.family_for(table, H100)["gpu"] == "NVIDIA H200"  # same architecture
    assert "like NVIDIA H100" in heuristic.describe_family(heuristic.family_for(table, H100), H100)
    assert heuristic.family_for(table, UNKNOWN) is None


@pytest.mark.parametrize(
    "text, match",
    [
        ("{broken", "not valid JSON"),
        (json.dumps({"schema": "other"}), "not a `best` heuristic table"),
        (
            json.dumps(
                {
                    "schema": heuristic.SCHEMA,
                    "families": [
                        {"gpu": "X", "picks": [{"n": 4096, "variant": "warp-drive", "tunables": {}}]}
                    ],
                }
            ),
            "'warp-drive' is not a kernel",
        ),
        (
            json.dumps(
                {
                    "schema": heuristic.SCHEMA,
                    "families": [
                        {
                            "gpu": "X",
                            "picks": [{"n": 4096, "variant": "register-blocked", "tunables": {"k": 5}}],
                        }
                    ],
                }
            ),
            "register-blocked.k: 5",
        ),
        (json.dumps({"schema": heuristic.SCHEMA, "families": [{"gpu": "X", "picks": []}]}), "non-empty"),
    ],
)
def test_a_bad_table_is_a_clear_error(tmp_path, text, match):
    path = tmp_path / "table.json"
    path.write_text(text)
    with pytest.raises(heuristic.HeuristicTableError, match=match) as info:
        heuristic.load_table(registry.RECORDS, path)
    assert str(path) in str(info.value)


# --- what `best` runs, and the one log line ---------------------------------------------------------------
def test_without_a_cache_best_runs_the_heuristic_pick():
    rec, tun, source, warning = RECORDS["best"].policy.resolve(RECORDS, H200, 131072)
    family = next(f for f in heuristic.load_table(registry.RECORDS)["families"] if f["gpu"] == H200.name)
    pick = heuristic.nearest(family["picks"], 131072)
    assert (rec.name, tun) == (pick["variant"], rec.with_tunables(pick["tunables"]))
    assert source.startswith("heuristic from kernels/best_heuristic.json for NVIDIA H200 (no tuning cache")
    assert source.endswith("run `nbody-live tune` to tune)") and warning is None


def test_bench_without_a_cache_does_not_tune(monkeypatch):
    """What bench's `best` rows run comes from resolve(), which never measures."""

    def no_tuning(*_a, **_k):
        raise AssertionError("best started a tune")

    monkeypatch.setattr(tune, "run_tune", no_tuning)
    for n in (16384, 131072, 1048576):
        assert RECORDS["best"].policy.resolve(RECORDS, H200, n)[2].startswith("heuristic from")


def test_a_valid_cache_wins_over_the_heuristic():
    entry = {
        "n": 131072,
        "variant": "register-blocked",
        "tunables": {"block_size": 64, "k": 2, "slices": 8},
        "interactions_per_s": 2e12,
        "median_ms": 7.0,
    }
    _write_cache([entry])
    rec, tun, source, warning = RECORDS["best"].policy.resolve(RECORDS, H200, 131072)
    assert rec.name == "register-blocked" and tun == entry["tunables"]
    assert source == "tuned cache for NVIDIA H200" and warning is None


def test_an_unknown_gpu_runs_the_safe_pick():
    rec, tun, source, warning = RECORDS["best"].policy.resolve(RECORDS, UNKNOWN, 131072)
    assert rec.name == registry.SAFE_PICK and tun == rec.default_tunables()
    assert source.startswith("safe pick for Some Future GPU, a GPU kernels/best_heuristic.json does not know")
    assert "run `nbody-live tune` to tune" in source and warning is None


def test_a_corrupt_table_falls_back_to_the_safe_pick_with_a_warning(tmp_path):
    bad = tmp_path / "table.json"
    bad.write_text("{broken")
    rec, tun, source, warning = BestPolicy(registry.SAFE_PICK, table=bad).resolve(RECORDS, H200, 4096)
    assert rec.name == registry.SAFE_PICK and source.startswith("safe pick for NVIDIA H200")
    assert warning and str(bad) in warning and "not valid JSON" in warning and "restore it" in warning


def _resolve_logged(caplog, facts, n=65536, table=None):
    from app.backends.cuda.evaluator import CudaEvaluator

    record = RECORDS["best"]
    if table is not None:
        record = dataclasses.replace(record, policy=BestPolicy(registry.SAFE_PICK, table))
    ev = CudaEvaluator(record, SimpleNamespace(facts=facts), RECORDS)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="app"):
        ev.active(n)
        ev.active(n)  # resolved once per N: no second line
        ev.forget()  # a load forgets the resolutions (the cache is read again) ...
        ev.active(n)  # ... and resolves again: the same line is not said twice
    return [r for r in caplog.records if r.getMessage().startswith("best")]


def test_one_log_line_says_which(caplog, tmp_path):
    lines = _resolve_logged(caplog, H200)
    assert len(lines) == 1 and lines[0].levelno == logging.INFO
    text = lines[0].getMessage()
    assert text.startswith(
        "best: heuristic from kernels/best_heuristic.json for NVIDIA H200 (no tuning cache"
    )
    assert "run `nbody-live tune` to tune): N = 65,536 -> " in text

    _write_cache([{"n": 65536, "variant": "atomics-n3l", "tunables": {"chunk": 8}}])
    lines = _resolve_logged(caplog, H200)
    assert [r.getMessage() for r in lines] == [
        "best: tuned cache for NVIDIA H200: N = 65,536 -> atomics-n3l block_size=128 chunk=8 ki=4"
    ]

    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    lines = _resolve_logged(caplog, UNKNOWN, table=bad)
    assert [r.levelno for r in lines] == [logging.WARNING, logging.INFO]
    assert str(bad) in lines[0].getMessage() and lines[1].getMessage().startswith("best: safe pick for")


# --- regenerating the table -------------------------------------------------------------------------------
def test_update_heuristic_rewrites_one_family_and_keeps_the_others(tmp_path, monkeypatch, capsys):
    table = tmp_path / "best_heuristic.json"
    shutil.copy(heuristic.TABLE, table)
    h200_before = next(f for f in json.loads(table.read_text())["families"] if f["gpu"] == "NVIDIA H200")
    monkeypatch.setattr(heuristic, "TABLE", table)
    other = json.loads(TUNE_JSON.read_text())
    other.update(gpu="NVIDIA H100 80GB HBM3", compute_capability="9.0")
    other["best"] = [{**other["best"][0], "n": 2048}]
    other_json = tmp_path / "h100-tune.json"
    other_json.write_text(json.dumps(other))
    assert main(["tune", "--update-heuristic", str(other_json)]) == 0
    assert f"N =     2,048: {other['best'][0]['variant']}" in capsys.readouterr().out
    families = {f["gpu"]: f for f in heuristic.load_table(registry.RECORDS, table)["families"]}
    assert set(families) == {"NVIDIA H200", "NVIDIA H100 80GB HBM3"}
    assert [p["n"] for p in families["NVIDIA H100 80GB HBM3"]["picks"]] == [2048]
    assert families["NVIDIA H100 80GB HBM3"]["compute_capability"] == "9.0"
    assert families["NVIDIA H200"] == h200_before


@pytest.mark.parametrize(
    "content, match",
    [
        ("{nope", "not valid JSON"),
        (json.dumps({"schema": "x"}), "not a tune result"),
        (None, "cannot read the tune result"),
    ],
)
def test_update_heuristic_refuses_a_bad_tune_file_and_leaves_the_table(
    tmp_path, monkeypatch, capsys, content, match
):
    table = tmp_path / "best_heuristic.json"
    shutil.copy(heuristic.TABLE, table)
    before = table.read_bytes()
    monkeypatch.setattr(heuristic, "TABLE", table)
    source = tmp_path / "tune.json"
    if content is not None:
        source.write_text(content)
    assert main(["tune", "--update-heuristic", str(source)]) == 2
    assert match in capsys.readouterr().err
    assert table.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["best_heuristic.json"] + (["tune.json"] if content is not None else [])
    )


# --- the tuner's choice at small N ------------------------------------------------------------------------
def test_more_timed_launches_where_launches_are_short():
    assert tune.repeats_for(0.025, 3) == tune.MAX_REPEATS  # N = 4,096 on an H200
    assert tune.repeats_for(0.13, 3) == 50 and tune.repeats_for(1.7, 3) == 12
    assert tune.repeats_for(6.7, 3) == 3  # N = 131,072: already 20 ms
    assert tune.repeats_for(415.0, 3) == 2  # N = 1 Mi: a launch of 0.4 s
    assert tune.repeats_for(0.5, 60) == 60  # never fewer than asked for


def _row(variant, tunables, ms, n=4096):
    return {
        "n": n,
        "variant": variant,
        "tunables": RECORDS[variant].with_tunables(tunables),
        "status": "ok",
        "median_ms": ms,
        "samples_ms": [ms] * 3,
        "interactions": n * n,
        "interactions_per_s": n * n / ms / 1e-3,
    }


def _retime_from(times):
    """A re-timer returning, per configuration, the next of its times (cycling): what a GPU would show."""
    seen = {}

    def retime(row):
        key = (row["variant"], json.dumps(row["tunables"], sort_keys=True))
        seen[key] = seen.get(key, -1) + 1
        values = times[row["variant"], json.dumps(row["tunables"], sort_keys=True)]
        return values[seen[key] % len(values)]

    retime.seen = seen
    return retime


def _key(row):
    return row["variant"], json.dumps(row["tunables"], sort_keys=True)


def test_a_tuned_configuration_within_noise_loses_to_the_defaults():
    """Issue 14: best (a tuned configuration) 695 and register-blocked (its defaults) 757 in one bench."""
    plain = _row("register-blocked", {}, 0.0240)
    tuned = _row("register-blocked", {"slices": 16}, 0.0225)  # looked 6% faster once
    other = _row("atomics-n3l", {}, 0.0300)
    retime = _retime_from(
        {
            _key(plain): [0.0240, 0.0236, 0.0251, 0.0238, 0.0241],
            _key(tuned): [0.0236, 0.0239, 0.0233, 0.0249, 0.0235],
        }
    )
    order = tune.final_order([tuned, plain, other], RECORDS, retime)
    assert order[0] is plain and "defaults" in plain["chosen_because"]
    assert len(plain["round_medians_ms"]) == tune.FINAL_ROUNDS  # other was > 10% behind: not re-timed
    assert "round_medians_ms" not in other


def test_a_clearly_faster_tuned_configuration_wins():
    plain = _row("register-blocked", {}, 0.0240)
    tuned = _row("register-blocked", {"k": 6}, 0.0220)
    retime = _retime_from({_key(plain): [0.0240], _key(tuned): [0.0215]})
    assert tune.final_order([plain, tuned], RECORDS, retime)[0] is tuned


def test_a_one_off_fast_measurement_does_not_win():
    lucky = _row("multi-thread-per-body", {"q": 32, "block_size": 512}, 0.0200)
    steady = _row("register-blocked", {"k": 6}, 0.0215)
    retime = _retime_from({_key(lucky): [0.0262, 0.0255, 0.0260], _key(steady): [0.0214, 0.0217]})
    order = tune.final_order([lucky, steady], RECORDS, retime)
    assert order[0] is steady and lucky["final_ms"] > steady["final_ms"]


def test_long_launches_are_not_timed_again():
    rows = [_row("atomics-n3l", {"chunk": 16}, 415.6, n=1 << 20), _row("atomics-n3l", {}, 416.2, n=1 << 20)]
    order = tune.final_order(rows, RECORDS, _retime_from({}))  # any re-timing would raise KeyError
    assert order[0] is rows[1] and "within 3%" in rows[1]["chosen_because"]  # the defaults, within noise


# --- the GPU acceptance script ----------------------------------------------------------------------------
def test_the_acceptance_script_parses_and_compares_best_across_two_bench_runs():
    import subprocess

    from app.tools.bench import compare_kernel

    subprocess.run(["bash", "-n", str(ROOT / "bench" / "best_default.sh")], check=True)

    def result(rates):
        return {
            "results": [
                {"kernel": "best", "n": n, "status": "ok", "interactions_per_s": v} for n, v in rates.items()
            ]
            + [{"kernel": "shared", "n": 16384, "status": "ok", "interactions_per_s": 1.0}]
        }

    untuned = result({16384: 1.8e12, 131072: 2.5e12})
    tuned = result({16384: 2.0e12, 131072: 2.5e12, 1048576: 2.6e12})
    rows = compare_kernel(untuned, tuned, "best", [16384, 131072, 1048576])
    assert [r["ratio"] for r in rows] == [pytest.approx(0.9), pytest.approx(1.0), None]


def test_a_bench_row_of_best_says_what_it_ran():
    from app.backends import find_kernel
    from app.engine.timing import StepTimings
    from app.model.physics import Physics
    from app.tools.bench import bench_bodies
    from app.tools.bench_report import detail_lines
    from app.tools.bench_row import time_one

    class Resolving:
        resolved_kernel = "atomics-n3l block_size=128 chunk=16 ki=4"

        def load(self, bodies, physics, kernel):
            self.n = bodies.n

        def tunables(self):
            return {}

        def set_tunables(self, **values):
            pass

        def step(self, steps):
            return StepTimings(
                kernel="best",
                steps=steps,
                n=self.n,
                force_ms=1.0,
                interactions=self.n**2,
                pair_equivalent=self.n**2,
                force_evals=1,
            )

    bodies = bench_bodies(64, seed=1)
    row = time_one(
        Resolving(), find_kernel("best"), bodies, Physics(), {}, warmup=1, repeats=3, max_seconds=None
    )
    assert row["runs"] == Resolving.resolved_kernel
    assert any("runs atomics-n3l" in line for line in detail_lines({**row, "n": 64}))
    Resolving.resolved_kernel = "shared block_size=256"
    assert "runs" not in time_one(
        Resolving(), find_kernel("shared"), bodies, Physics(), {}, warmup=1, repeats=3, max_seconds=None
    )
