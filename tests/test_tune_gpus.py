"""`tune --gpus K` and `best` under `--gpus K` (issue 23 item 4): the cache's tuning per device count, the
migration of a schema-1 cache, `best` reading the tuning on K GPUs or falling back with one warning, the
CLI, and the tune loop over a stand-in K-device backend. CPU only: the cache, the policy and the tuner's
loop are plain Python; the GPU side is tests/test_cuda_multi.py (`best` under --gpus reading the tuning).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from app.backends.cuda import evaluator, heuristic, registry, tune
from app.backends.cuda import tuning_cache as cache
from app.backends.cuda.evaluator import CudaEvaluator
from app.cli import main
from app.core.errors import ConfigError
from app.core.paths import ROOT
from app.engine.timing import StepTimings, device_entries
from app.parallel.decomposition import of as decomposition_of

RECORDS = {r.name: r for r in registry.RECORDS}
H200 = SimpleNamespace(name="NVIDIA H200", driver_version="580.159.04", compute_capability=(9, 0), sms=132)
TUNE_JSON = ROOT / "bench" / "results" / "h200-2026-11-23-tune.json"  # a schema-1 tune result
ONE = [{"n": 65536, "variant": "register-blocked", "tunables": {"k": 2, "block_size": 64, "slices": 16}}]
TWO = [{"n": 65536, "variant": "atomics-n3l", "tunables": {"ki": 4, "chunk": 8}, "split": "pairs"}]


def _hash() -> str:
    """The kernel sources' hash now (not at import: a kernel edited meanwhile makes a cache stale)."""
    return cache.source_hash(registry.RECORDS)


@pytest.fixture(autouse=True)
def empty_cache(tmp_path, monkeypatch):
    """No tuning cache unless a test writes one, and nothing said yet about K devices."""
    monkeypatch.setenv("NBODY_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(evaluator, "_SAID_FOR_DEVICES", {})


def _result(best, gpus=None, **over):
    """A tune result as run_tune returns it (`gpus` None: one without the field, as schema 1 wrote)."""
    data = {
        "schema": cache.SCHEMA,
        "gpu": H200.name,
        "driver": H200.driver_version,
        "source_hash": _hash(),
        "best": best,
        "measurements": [],
    }
    if gpus is not None:
        data["gpus"] = gpus
    return {**data, **over}


def _file():
    return json.loads(cache.cache_path(H200.name, H200.driver_version).read_text())


# --- the cache: a tuning per device count -----------------------------------------------------------------
def test_the_cache_keeps_a_tuning_per_device_count():
    path = cache.write_cache(_result(TWO, gpus=2))
    assert cache.write_cache(_result(ONE, gpus=1)) == path  # one file per GPU and driver
    assert cache.read_cache(H200.name, H200.driver_version, _hash())[0]["best"] == ONE
    assert cache.read_cache(H200.name, H200.driver_version, _hash(), gpus=2)[0]["best"] == TWO
    data = _file()
    assert data["schema"] == "nbody-live-tune/2" and list(data["tunings"]) == ["1", "2"]
    assert data["gpu"] == H200.name and data["source_hash"] == _hash()
    found, why = cache.read_cache(H200.name, H200.driver_version, _hash(), gpus=4)
    assert found is None and "no tuning on 4 GPUs" in why and "tuned on 1 GPU, 2 GPUs" in why

    newer = [{**TWO[0], "n": 1 << 20}]
    cache.write_cache(_result(newer, gpus=2))  # a tune on 2 GPUs replaces that tuning only
    assert cache.read_cache(H200.name, H200.driver_version, _hash(), gpus=2)[0]["best"] == newer
    assert cache.read_cache(H200.name, H200.driver_version, _hash())[0]["best"] == ONE

    cache.write_cache(_result(ONE, gpus=1, source_hash="0" * 64))  # other sources: the rest is stale
    assert list(_file()["tunings"]) == ["1"]
    assert cache.read_cache(H200.name, H200.driver_version, _hash(), gpus=2)[0] is None


def test_lookup_per_device_count():
    cache.write_cache(_result(ONE))
    cache.write_cache(_result(TWO, gpus=2))
    assert cache.lookup(65536, H200, registry.RECORDS)[0]["variant"] == "register-blocked"
    assert cache.lookup(65536, H200, registry.RECORDS, 2)[0]["variant"] == "atomics-n3l"
    entry, why = cache.lookup(4096, H200, registry.RECORDS, 2)
    assert entry is None and why.startswith("no tuned N near N = 4,096 on 2 GPUs (NVIDIA H200)")


@pytest.mark.parametrize(
    "tunings, match",
    [
        ({}, "not a table of tune results"),
        ({"2": {"gpus": 3, "best": []}}, "measured on 3 GPUs, filed under 2"),
        ({"1": {"best": [{"n": "x"}]}}, "'best' is not a list"),
        ({"2": {"gpus": 0, "best": []}}, "device count >= 1"),
    ],
)
def test_a_bad_file_of_schema_2_is_corrupt(tunings, match):
    path = cache.cache_path(H200.name, H200.driver_version)
    path.parent.mkdir(parents=True)
    path.write_text(
        json.dumps(
            {
                "schema": cache.SCHEMA,
                "gpu": H200.name,
                "driver": H200.driver_version,
                "source_hash": _hash(),
                "tunings": tunings,
            }
        )
    )
    data, why = cache.read_cache(H200.name, H200.driver_version, _hash())
    assert data is None and "corrupt" in why and match in why


# --- migration from schema 1 ------------------------------------------------------------------------------
def _old_cache():
    """A cache file as `nbody-live tune` wrote it before tunings per device count (schema 1)."""
    old = json.loads(TUNE_JSON.read_text())
    assert old["schema"] == cache.SCHEMA_1 and "gpus" not in old and "tunings" not in old
    old.update(source_hash=_hash(), driver=H200.driver_version)
    old.pop("path", None)
    path = cache.cache_path(H200.name, H200.driver_version)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(old))
    return old


def test_a_schema_1_cache_stays_valid_as_the_tuning_on_one_gpu():
    old = _old_cache()
    data, why = cache.read_cache(H200.name, H200.driver_version, _hash())
    assert why == "" and data["best"] == old["best"]
    assert cache.read_cache(H200.name, H200.driver_version, _hash(), gpus=2)[0] is None
    rec, tun, source, warning = RECORDS["best"].policy.resolve(RECORDS, H200, 131072)
    pick = cache.choose(old["best"], 131072)
    assert (rec.name, source, warning) == (pick["variant"], "tuned cache for NVIDIA H200", None)
    assert tun == rec.with_tunables(pick["tunables"])

    cache.write_cache(_result(TWO, gpus=2))  # the next tune writes schema 2 and keeps the old tuning
    data = _file()
    assert data["schema"] == cache.SCHEMA and list(data["tunings"]) == ["1", "2"]
    assert data["tunings"]["1"] == old  # whole, as it was measured
    assert cache.read_cache(H200.name, H200.driver_version, _hash())[0]["best"] == old["best"]


def test_update_heuristic_takes_one_gpu_s_tuning_and_refuses_k_gpus():
    old = json.loads(TUNE_JSON.read_text())
    source = "tune.json"
    assert heuristic.family_from_tune(old, registry.RECORDS, source)["picks"][0]["n"] == 4096  # schema 1
    assert (
        heuristic.family_from_tune({**old, "schema": cache.SCHEMA, "gpus": 1}, registry.RECORDS, source)[
            "gpu"
        ]
        == "NVIDIA H200"
    )
    with pytest.raises(heuristic.HeuristicTableError, match="a tuning on 2 GPUs.*without --gpus"):
        heuristic.family_from_tune({**old, "schema": cache.SCHEMA, "gpus": 2}, registry.RECORDS, source)
    cache.write_cache(_result(ONE, gpus=1, compute_capability="9.0"))
    cache.write_cache(_result(TWO, gpus=2))
    family = heuristic.family_from_tune(_file(), registry.RECORDS, source)  # the cache file: its one-GPU part
    assert [p["variant"] for p in family["picks"]] == ["register-blocked"]
    assert family["compute_capability"] == "9.0"


# --- `best` under --gpus K --------------------------------------------------------------------------------
def test_best_on_k_gpus_reads_the_tuning_on_k_gpus():
    cache.write_cache(_result(ONE))
    cache.write_cache(_result(TWO, gpus=2))
    rec, tun, source, warning = RECORDS["best"].policy.resolve(RECORDS, H200, 65536, 2)
    assert (rec.name, tun) == ("atomics-n3l", rec.with_tunables(TWO[0]["tunables"]))
    assert source == "tuned cache for NVIDIA H200 on 2 GPUs" and warning is None
    rec, _tun, source, warning = RECORDS["best"].policy.resolve(RECORDS, H200, 65536)  # one GPU: as before
    assert (rec.name, source, warning) == ("register-blocked", "tuned cache for NVIDIA H200", None)


@pytest.mark.parametrize("cached", ["one-gpu tuning", "none", "k tuning elsewhere"])
def test_best_on_k_gpus_without_that_tuning_runs_the_one_gpu_pick_and_says_so(cached):
    if cached != "none":
        cache.write_cache(_result(ONE))
    if cached == "k tuning elsewhere":
        cache.write_cache(_result([{**TWO[0], "n": 4096}], gpus=3))
    one = RECORDS["best"].policy.resolve(RECORDS, H200, 65536)
    rec, tun, source, warning = RECORDS["best"].policy.resolve(RECORDS, H200, 65536, 3)
    assert (rec, tun) == one[:2]
    assert source == f"{one[2]}, the one-GPU pick (none tuned on 3 GPUs)"
    assert warning.startswith("best: no tuning on 3 GPUs for N = 65,536 (")
    assert "run `nbody-live tune --gpus 3` to tune on 3 GPUs" in warning
    if cached == "k tuning elsewhere":
        assert "no tuned N near N = 65,536 on 3 GPUs" in warning


def _resolve_on_devices(caplog, k, n=65536):
    """What K devices' evaluators of `best` resolve and log (each device makes its own, as under --gpus)."""
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="app"):
        picks = [
            CudaEvaluator(RECORDS["best"], SimpleNamespace(facts=H200), RECORDS).active(n, k)
            for _ in range(k)
        ]
    return picks, [(r.levelno, r.getMessage()) for r in caplog.records if r.getMessage().startswith("best")]


def test_k_devices_say_the_fallback_once_and_which_tuning_they_run(caplog):
    cache.write_cache(_result(ONE))
    picks, said = _resolve_on_devices(caplog, 2)
    assert [rec.name for rec, _tun in picks] == ["register-blocked"] * 2
    assert [level for level, _text in said] == [logging.WARNING, logging.INFO]  # once for both devices
    assert "nbody-live tune --gpus 2" in said[0][1]
    assert said[1][1] == (
        "best: tuned cache for NVIDIA H200, the one-GPU pick (none tuned on 2 GPUs): "
        "N = 65,536 -> register-blocked block_size=64 k=2 slices=16"
    )
    assert _resolve_on_devices(caplog, 2)[1] == []  # a reload makes new devices: nothing new to say

    cache.write_cache(_result(TWO, gpus=2))
    picks, said = _resolve_on_devices(caplog, 2)
    assert [rec.name for rec, _tun in picks] == ["atomics-n3l"] * 2
    assert said == [
        (
            logging.INFO,
            "best: tuned cache for NVIDIA H200 on 2 GPUs: N = 65,536 -> atomics-n3l "
            "block_size=128 chunk=8 ki=4",
        )
    ]


def test_one_device_ignores_a_tuning_on_several(caplog):
    two = [{"n": 65536, "variant": "multi-thread-per-body", "tunables": {"q": 8, "block_size": 128}}]
    cache.write_cache(_result(two, gpus=2))  # not one GPU's tuning: one GPU runs the heuristic, as before
    ev = CudaEvaluator(RECORDS["best"], SimpleNamespace(facts=H200), RECORDS)
    with caplog.at_level(logging.INFO, logger="app"):
        rec, _tun = ev.active(65536)
    family = heuristic.family_for(heuristic.load_table(registry.RECORDS), H200)
    assert rec.name == heuristic.nearest(family["picks"], 65536)["variant"] != "multi-thread-per-body"
    lines = [r for r in caplog.records if r.getMessage().startswith("best")]
    assert len(lines) == 1 and lines[0].levelno == logging.INFO
    text = lines[0].getMessage()
    assert text.startswith(
        "best: heuristic from kernels/best_heuristic.json for NVIDIA H200 (the tuning cache "
    )
    assert "has no tuning on 1 GPU (tuned on 2 GPUs); run `nbody-live tune` to tune)" in text


def test_the_gpu_factory_tells_each_device_how_many_they_are(monkeypatch):
    """What CudaShareDevice passes to `best`: the run's device count (--gpus K: the factory's shares)."""
    from app.backends.cuda import multi
    from app.model.physics import Physics
    from app.parallel.multidevice import split
    from app.tools.bench import bench_bodies

    made = []

    class Recorder:
        def __init__(self, ordinal, kernel, physics, bodies, share, devices=1):
            made.append((ordinal, share.count, devices))

    monkeypatch.setattr(multi, "CudaShareDevice", Recorder)
    shares = split(96, [1.0] * 3)
    multi.gpu_devices([0, 0, 1])(bench_bodies(96), Physics(), "best", shares)
    assert made == [(0, 32, 3), (0, 32, 3), (1, 32, 3)]


# --- the command ------------------------------------------------------------------------------------------
class FakeCuda:
    """The `cuda` backend class as far as `tune`'s command sees it (no GPU here)."""

    name = "cuda"
    memory = "device"  # (Backend.memory: a GPU's)
    uses_all_cores = False

    @classmethod
    def kernels(cls):
        return list(registry.RECORDS)

    @classmethod
    def device_kind(cls):  # (Backend.device_kind: GPUs)
        from app.backends.cuda.multi import KIND

        return KIND


@pytest.fixture
def two_gpus(monkeypatch):
    """`tune` on a machine with two GPUs: run_tune is replaced by a spy recording the class it got."""
    import app.backends
    from app.backends.cuda.multi import GpuDevices

    got = []
    monkeypatch.setattr(app.backends, "select_backend", lambda name: FakeCuda)
    monkeypatch.setattr(GpuDevices, "count", staticmethod(lambda: 2))
    monkeypatch.setattr(tune, "run_tune", lambda cls, ns, **kw: got.append(cls) or {"best": [{}]})
    return got


def test_tune_gpus_is_parsed_and_explained(capsys):
    from app.cli import build_parser

    assert build_parser().parse_args(["tune"]).gpus == "1"
    assert build_parser().parse_args(["tune", "--gpus", "all"]).gpus == "all"
    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--gpus N|all" in text and "the tuning on N GPUs" in text
    assert "plus the exchange that completes it" in text and "nbody-live tune --gpus K" in text


@pytest.mark.parametrize(
    "argv, k", [([], 1), (["--gpus", "1"], 1), (["--gpus", "2"], 2), (["--gpus", "all"], 2)]
)
def test_tune_gpus_times_on_that_many_gpus(two_gpus, argv, k):
    assert main(["tune", "--n", "4096", *argv]) == 0
    (cls,) = two_gpus
    if k == 1:
        assert cls is FakeCuda  # one GPU: without the multi-device driver, as before
    else:
        assert cls.k == k and cls.base is FakeCuda and cls.name == "cuda"


@pytest.mark.parametrize(
    "gpus, said",
    [
        ("3", "--gpus 3: this machine has 2 GPUs; ask for at most 2"),
        ("0", "--gpus = '0': expected a number of devices >= 1, or all"),
    ],
)
def test_tune_with_more_gpus_than_exist_is_one_line_and_exit_2(two_gpus, capsys, gpus, said):
    assert main(["tune", "--gpus", gpus]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0], err
    assert two_gpus == []


# --- the tune loop on K devices (a stand-in backend) ------------------------------------------------------
# Step times (force ms of the slowest device, exchange ms) per variant on K = 1 and 2: register-blocked wins
# on one GPU and scales badly; atomics-n3l (pairs) wins on two; multi-thread-per-body has the fastest force
# on two but a costly exchange; block-template would be fastest on two but is wrong there.
TIMES = {
    1: {
        "register-blocked": (1.0, 0.0),
        "atomics-n3l": (1.2, 0.0),
        "multi-thread-per-body": (1.5, 0.0),
        "block-template": (3.0, 0.0),
        "shared": (2.0, 0.0),
    },
    2: {
        "register-blocked": (0.9, 0.05),
        "atomics-n3l": (0.55, 0.1),
        "multi-thread-per-body": (0.45, 0.5),
        "block-template": (0.3, 0.05),
        "shared": (1.0, 0.05),
    },
}
WRONG_ON = {2: {"block-template"}}
FAKE_GPU = SimpleNamespace(name="Stand-in GPU", driver_version="1.0", compute_capability=(9, 0), sms=132)


class FakeGpu:
    """One GPU: the records of the CUDA registry, accelerations -pos (fp64 exactly, fp32 within 1e-6)."""

    name, k, base = "cuda", 1, None  # (Backend's: one device, no wrapped backend)
    loads: list[tuple[int, str]] = []

    def __init__(self):
        self.device = SimpleNamespace(facts=FAKE_GPU)
        self.kernel, self.n, self._tunables = None, 0, {}

    @classmethod
    def kernels(cls):
        return list(registry.RECORDS)

    def load(self, bodies, physics, kernel):
        if kernel not in {r.name for r in self.kernels()}:
            raise ConfigError(f"kernel {kernel!r}: several GPUs run the fp32 records only")
        self.kernel, self.n, self._pos = kernel, bodies.n, bodies.pos.copy()
        FakeGpu.loads.append((self.k, kernel))

    def clear_tunables(self):
        self._tunables = {}

    def set_tunables(self, **values):
        self._tunables = RECORDS[self.kernel].validate_tunables(values)

    def _defaults(self) -> bool:
        rec = RECORDS[self.kernel]
        return rec.with_tunables(self._tunables) == rec.default_tunables()

    def step(self, steps):
        force, exchange = TIMES[self.k][self.kernel]
        force *= 1.0 if self._defaults() else 3.0  # every swept setting: far slower than the defaults
        extra = device_entries(["gpu0", "gpu1"], [force, 0.9 * force], exchange) if self.k > 1 else {}
        return StepTimings(
            kernel=self.kernel,
            steps=steps,
            n=self.n,
            force_ms=force,
            interactions=self.n * self.n,
            extra=extra,
        )

    def accelerations(self):
        exact = -self._pos
        if self.kernel == "fp64":
            return exact
        return exact * (1.01 if self.kernel in WRONG_ON.get(self.k, ()) else 1.000001)

    def close(self):
        pass


class FakeGpus(FakeGpu):
    """Its form over two GPUs, with the fields multi_backend_class gives: `base` and `k`; fp32 only."""

    base, k = FakeGpu, 2

    @classmethod
    def kernels(cls):
        return [r for r in registry.RECORDS if r.precision == "fp32"]


VARIANTS = list(TIMES[1])


def _tune(cls, monkeypatch):
    monkeypatch.setattr(FakeGpu, "loads", [])
    said = []
    result = tune.run_tune(cls, [256], variants=VARIANTS, budget_s=30.0, say=said.append)
    return result, said


def test_tune_on_two_gpus_ranks_force_plus_exchange_and_files_the_tuning_on_two(monkeypatch):
    one, _said = _tune(FakeGpu, monkeypatch)
    assert one["gpus"] == 1 and [e["variant"] for e in one["best"]] == ["register-blocked"]
    assert "split" not in one["best"][0] and "exchange_median_ms" not in one["measurements"][0]

    two, said = _tune(FakeGpus, monkeypatch)
    assert two["gpus"] == 2 and two["path"] == one["path"]
    (entry,) = two["best"]
    assert entry["variant"] == "atomics-n3l" and entry["split"] == "pairs"  # not one GPU's winner
    assert entry["median_ms"] == pytest.approx(0.65) and entry["exchange_median_ms"] == pytest.approx(0.1)
    assert entry["force_median_ms"] == pytest.approx(0.55)
    rows = {
        r["variant"]: r
        for r in two["measurements"]
        if r["status"] == "ok"
        and RECORDS[r["variant"]].with_tunables(r["tunables"]) == RECORDS[r["variant"]].default_tunables()
    }
    assert rows["multi-thread-per-body"]["force_median_ms"] < entry["force_median_ms"]  # faster force ...
    assert rows["multi-thread-per-body"]["median_ms"] > entry["median_ms"]  # ... loses on force + exchange
    assert rows["block-template"]["max_rel_err"] > two["tolerance"]  # the fastest, wrong on 2: not chosen
    assert {r["split"] for r in rows.values()} == {decomposition_of(RECORDS[v]).name for v in rows}
    assert two["references"] == [
        {
            "n": 256,
            "tolerance": tune.TOLERANCE,
            "reference": "fp64",
            "shared_max_rel_err": pytest.approx(1e-6),
        }
    ]
    assert (1, "fp64") in FakeGpu.loads and (2, "fp64") not in FakeGpu.loads  # the reference: one GPU
    assert any(
        line.startswith("N =       256 on 2 GPUs: atomics-n3l") and "(split by pairs)" in line
        for line in said
    ), said

    # the one cache file now holds both, and `best` reads each where it runs
    data = json.loads(Path(two["path"]).read_text())
    assert list(data["tunings"]) == ["1", "2"] and data["tunings"]["2"]["best"] == two["best"]
    policy = RECORDS["best"].policy
    assert policy.resolve(RECORDS, FAKE_GPU, 256)[0].name == "register-blocked"
    rec, _tun, source, warning = policy.resolve(RECORDS, FAKE_GPU, 256, 2)
    assert (rec.name, source, warning) == ("atomics-n3l", "tuned cache for Stand-in GPU on 2 GPUs", None)


def test_tune_on_one_gpu_times_the_force_as_before(monkeypatch):
    """K = 1: a step's time is its force time (no exchange), the rows as they were."""
    t = StepTimings(kernel="shared", steps=1, n=4, force_ms=0.7)
    assert tune.step_ms(t) == 0.7
    t2 = StepTimings(
        kernel="shared", steps=1, n=4, force_ms=0.7, extra=device_entries(["a", "b"], [0.7, 0.5], 0.2)
    )
    assert tune.step_ms(t2) == pytest.approx(0.9)
    result, _said = _tune(FakeGpu, monkeypatch)
    assert all(
        set(r) >= {"median_ms", "samples_ms"} and "force_median_ms" not in r
        for r in result["measurements"]
        if r["status"] == "ok"
    )
    assert np.isclose(result["best"][0]["median_ms"], 1.0)


class FakeGpuHere(FakeGpu):
    """FakeGpu as `select_backend("cuda")` gives it to the command (one GPU)."""

    memory, uses_all_cores = FakeCuda.memory, FakeCuda.uses_all_cores

    @classmethod
    def device_kind(cls):
        return FakeCuda.device_kind()


def test_an_interrupted_tune_keeps_the_n_it_finished(tmp_path, capsys, monkeypatch):
    """Issue 28: tune kept nothing when interrupted. SIGTERM (as Ctrl-C) during its second N now ends it
    with one line and 143; --json holds the first N (marked incomplete), and the cache has that N filed
    over the tuning already there, whose other N are kept."""
    import signal

    import app.backends

    monkeypatch.setattr(FakeGpu, "loads", [])
    earlier = tune.run_tune(FakeGpu, [512, 2048], variants=VARIANTS, budget_s=30.0, say=lambda line: None)
    assert [e["n"] for e in earlier["best"]] == [512, 2048]
    from app.backends.cuda.multi import GpuDevices

    monkeypatch.setattr(app.backends, "select_backend", lambda name: FakeGpuHere)
    monkeypatch.setattr(GpuDevices, "count", staticmethod(lambda: 1))
    real, calls = tune._Sweep.at, []

    def at(self, n, *args):
        calls.append(n)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises before this ends
        return real(self, n, *args)

    monkeypatch.setattr(tune._Sweep, "at", at)
    out = tmp_path / "tune.json"
    argv = ["tune", "--n", "256,512,1024", "--variants", ",".join(VARIANTS), "--json", str(out)]
    rc = main(argv)
    err = capsys.readouterr()
    assert rc == 143 and "Traceback" not in err.err, err.err
    assert err.err.strip().splitlines() == [
        f"nbody-live tune: interrupted (SIGTERM); the N finished so far are in {out} (marked incomplete)"
    ]
    assert "interrupted: the tuning of N = 256 is filed in" in err.out
    kept = json.loads(out.read_text())
    assert kept["complete"] is False and [e["n"] for e in kept["best"]] == [256]
    cached = json.loads(Path(earlier["path"]).read_text())["tunings"]["1"]["best"]
    assert [e["n"] for e in cached] == [256, 512, 2048]
    assert cached[1:] == earlier["best"]  # the N this run did not finish: as they were
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
