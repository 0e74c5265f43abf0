"""The `bench` command's engine: force-kernel throughput per kernel and N, as JSON (app.tools.bench_plot draws
it).

For each scene x N x kernel x tunable setting (one row each): the scene's seeded bodies (app.model.ics;
default the Plummer sphere), `warmup` untimed steps, then `repeats` single steps whose force time the backend
measured itself (CUDA events around the force launch on the GPU, perf_counter on the CPU); the median is
reported as interactions/s, the interactions being what the force evaluator counted
(StepTimings.interactions: N² for an all-pairs kernel, body-body plus body-cell for a tree), and GFLOP/s
by the 20-flops-per-interaction convention of GPU Gems 3 and the CUDA samples, and the median full step
(force + integrate) as `step_median_ms`. A kernel that evaluates fewer pairs than N² also gets the
"equivalent all-pairs" rate (StepTimings.pair_equivalent over the same time) in a field and a column of
its own, and its body-cell count; a kernel that reports its time split per stage (StepTimings.stages: a
tree's keys, sort, build, moments, walk) gets the median of each stage in `stages_median_ms`. With the
leapfrog's cached acceleration every step is exactly one force launch. A method whose work repeats over a
cycle of steps (KernelRecord.period_tunable: the tree's rebuild_every R, a build and R - 1 refits) is
timed in whole cycles: each of the `repeats` samples is the mean step of R consecutive steps.

Tunable lists sweep (app.tools.bench_sweep: one row per value, recorded in the row's `tunables`). After its
timing, a row of an approximate kernel (a tree) samples its force error: the median, p99 and max relative
error of K random targets against the exact all-pairs sum on the same device (`error`), and per scene
and N the fastest setting within the p99 budget is named (`fastest_within_budget`). Rows that cannot run
(over max_n, out of memory, failed compile, over `max_seconds`) are recorded with the reason, never
dropped.

    result = run_bench(CudaBackend, ["tree", "best"], [1048576], scenes=["plummer", "collision"],
                       tunables={"theta": [0.5, 0.7]}, max_seconds=60)
    write_json(result, "bench/results/h200.json")   # app.tools.bench_plot.plot(result, ...) draws it
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from app.core.errors import ConfigError
from app.core.paths import ROOT
from app.engine.forces import format_tunables
from app.engine.timing import FLOPS_PER_INTERACTION, StepTimings, imbalance, ranks_of, rate
from app.model.bodies import Bodies
from app.model.ics import BENCH_SCENE, bench_bodies
from app.model.physics import Physics

SCHEMA = "nbody-live-bench/1"
GFLOPS_FIELD = f"gflops_at_{FLOPS_PER_INTERACTION}_flops_per_interaction"
# rows of kernels that evaluate fewer pairs than N_targets x N_sources (a tree) also carry the all-pairs
# work of the same answer over the same time, under this name: never mistaken for interactions/s
EQUIVALENT_FIELD = "equivalent_all_pairs_interactions_per_s"
# the force evaluation's split per stage (a tree: keys, sort, build, moments, walk), median ms per step
STAGES_FIELD = "stages_median_ms"
# a tree's walk: its FP32 throughput, flops counted per interaction kind (KernelRecord.walk_flops, kept in
# the row as "walk_flops") over the median walk stage, and its fraction of the device's FP32 peak (rows
# with stages: one device)
WALK_TFLOPS_FIELD = "walk_tflops"
DEVICES_FIELD = "devices_median_ms"  # several devices: each device's own force time (median)
EXCHANGE_FIELD = "exchange_median_ms"  # several devices: the position exchange of one step (median)
# DESIGN.md: 12 FP32 instructions per interaction, 128 lanes x 132 SMs x 1.98 GHz (H100/H200).
DEFAULT_GPU_FP32_LIMIT = 128 / 12 * 132 * 1.98e9
# DESIGN.md: the NVIDIA CUDA-samples nbody kernel on a lent H200 (fp32, block 256), interactions/s.
CUDA_SAMPLES_H200 = {4096: 120e9, 16384: 495e9, 65536: 1409e9, 131072: 1461e9, 1048576: 1575e9}
DEFAULT_SCENE = BENCH_SCENE
# targets whose force error an approximate kernel's row samples after its timing (0: none)
DEFAULT_ERROR_SAMPLE = 4096
ERROR_REFERENCE = (
    "relative acceleration error |a - a_exact| / |a_exact| "
    "(app.model.physics.relative_errors) of `error_sample` random targets; a_exact = the "
    "all-pairs sum over every source in the kernel's precision on the same device "
    "(Backend.force_error_sample: `shared` on CUDA, cpu-simd's kernel on the CPU; under "
    "--gpus on device 0)"
)


# --- initial conditions ---------------------------------------------------------------------------------
# --- machine facts ----------------------------------------------------------------------------------------
def git_commit() -> dict:
    def run(*args):
        try:
            out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    # A stated commit wins: a copied checkout may come without .git, or with a stale one.
    if os.environ.get("NBODY_GIT_COMMIT"):
        return {"commit": os.environ["NBODY_GIT_COMMIT"], "dirty": None}
    commit = run("rev-parse", "HEAD")
    status = run("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def device_info(backend) -> dict:
    """The backend's own device facts (Backend.device_info), or its name alone."""
    try:
        info = backend.device_info()
    except Exception as e:  # facts are nice to have; the numbers still count
        return {"name": f"unknown ({e})"}
    return (
        dict(info)
        if info is not None
        else {"name": f"unknown ({backend.name} says nothing)", "backend": backend.name}
    )


def reference_lines(gpu: bool, fp32_limit: float | None) -> list[dict]:
    """What a result is compared with, stored in its JSON (`references`) and drawn dashed by the plot:
    `{"label", "interactions_per_s"}` is a constant, `{"label", "points": [[N, rate], ...]}` a series."""
    refs = []
    if fp32_limit:
        refs.append(
            {
                "label": f"FP32 issue limit {fp32_limit / 1e9:,.0f} G/s (12 FP32 instr./interaction)",
                "interactions_per_s": fp32_limit,
            }
        )
    elif gpu:  # the device did not say: DESIGN.md's estimate for the GPUs we are lent
        refs.append(
            {
                "label": f"FP32 issue limit H100/H200 ≈ {DEFAULT_GPU_FP32_LIMIT / 1e9:,.0f} G/s "
                "(12 FP32 instr./interaction)",
                "interactions_per_s": DEFAULT_GPU_FP32_LIMIT,
            }
        )
    if gpu:
        refs.append(
            {
                "label": "CUDA samples nbody, H200 (DESIGN.md)",
                "points": [[n, v] for n, v in sorted(CUDA_SAMPLES_H200.items())],
            }
        )
    return refs


# --- the benchmark ----------------------------------------------------------------------------------------
def _progress(total: int, enabled: bool):
    """A tqdm bar on stderr over the parts of the run (a row's timing; its error sample); disabled, every
    call on it does nothing."""
    from tqdm import tqdm

    return tqdm(total=total, unit="part", file=sys.stderr, leave=False, disable=not enabled)


def run_bench(
    backend_cls,
    kernels: list[str],
    ns: list[int],
    warmup: int = 3,
    repeats: int = 10,
    progress: bool = True,
    physics: Physics | None = None,
    seed: int = 42,
    scenes: list[str] | tuple[str, ...] = (DEFAULT_SCENE,),
    tunables: dict[str, list] | None = None,
    error_sample: int = DEFAULT_ERROR_SAMPLE,
    max_seconds: float | None = None,
) -> dict:
    """Time the force launch of every kernel at every N (see the module doc); returns the JSON-ready
    result. `scenes`: app.model.ics generators whose seeded bodies are timed, one set of rows per scene;
    `tunables`: {name: [values]} swept (app.tools.bench_sweep); `error_sample`: targets sampled for the force
    error of approximate kernels (0: none); `max_seconds`: a row whose warm-up and timed steps would take
    longer is skipped with the reason (predicted from a smaller N, or stopped while running)."""
    from app.tools.bench_sweep import fastest_within_budget, kernel_settings

    physics = physics or Physics(integrator="leapfrog")
    repeats = max(int(repeats), 1)
    warmup = max(int(warmup), 0)
    scenes = list(scenes)
    records = {rec.name: rec for rec in backend_cls.kernels()}
    settings = kernel_settings(
        [records[k] for k in kernels if k in records], tunables or {}, records.values()
    )  # ConfigError before any work
    for scene in scenes:
        check_scene(scene)
    result = {
        "schema": SCHEMA,
        "backend": backend_cls.name,
        "ranks": backend_cls.ranks,
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "git": git_commit(),
        "python": platform.python_version(),
        "host": platform.node(),
        "device": {},
        "physics": physics.as_dict(),
        "seed": seed,
        "scenes": scenes,
        "tunable_lists": dict(tunables or {}),
        "warmup": warmup,
        "repeats": repeats,
        "max_seconds": max_seconds,
        "statistic": "median",
        "timing": backend_cls.timing,
        "error_sample": int(error_sample),
        "error_reference": ERROR_REFERENCE,
        "flops_per_interaction": FLOPS_PER_INTERACTION,
        "fp32_issue_limit_interactions_per_s": None,
        "references": [],
        "results": [],
    }
    reason = backend_cls.why_not()
    plan = [
        (scene, int(n), name, setting)
        for scene in scenes
        for n in ns
        for name in kernels
        for setting in settings.get(name, [{}])
    ]
    approximate = {name for name, rec in records.items() if rec.approximate}
    sampled = sum(error_sample > 0 and name in approximate for _, _, name, _ in plan)
    bar = _progress(len(plan) + sampled, progress and reason is None)
    backend = None
    bodies_of = _BodiesCache(seed)
    try:
        if reason is None:
            backend = backend_cls()
            result["device"] = device_info(backend)
            result["fp32_issue_limit_interactions_per_s"] = result["device"].get(
                "fp32_issue_limit_interactions_per_s"
            )
        limit = result["fp32_issue_limit_interactions_per_s"]
        result["references"] = reference_lines(backend_cls.memory == "device", limit)
        for scene, n, name, setting in plan:
            rec = records.get(name)
            entry = {"kernel": name, "scene": scene, "n": n, "tunables": dict(setting)}
            label = " ".join(filter(None, [name, format_tunables(setting), scene, f"N={n:,}"]))
            bar.set_postfix_str(f"{label}: timing")
            why = _why_not_run(backend_cls, reason, rec, name, n)
            period = rec.period(setting) if rec is not None else 1
            if why is None and max_seconds is not None:
                why = _predicted_over(result["results"], entry, warmup + repeats * period, max_seconds)
            if why is None:
                try:
                    bodies = bodies_of(scene, n)
                except ConfigError as e:  # e.g. a collision needs two bodies
                    why = f"scene {scene!r} at N = {n:,}: {e}"
            if why is not None:
                entry.update(status="skipped", reason=why)
            else:
                entry.update(
                    _time_one(backend, rec, bodies, physics, setting, warmup, repeats, max_seconds, period)
                )
                peak = result["device"].get("fp32_peak_tflops")
                if peak and entry.get(WALK_TFLOPS_FIELD):
                    entry["walk_fp32_peak_fraction"] = entry[WALK_TFLOPS_FIELD] / peak
                entry.update(_how_split(backend))
            bar.update(1)
            if error_sample > 0 and name in approximate:
                if entry["status"] == "ok":
                    bar.set_postfix_str(f"{label}: error sample of {min(error_sample, n):,} targets")
                    entry["error"] = _error_sample(backend, error_sample, seed)
                bar.update(1)
            result["results"].append(entry)
    finally:
        bar.close()
        if backend is not None:
            backend.close()
    result["fastest_within_budget"] = fastest_within_budget(result["results"])
    return result


def _how_split(backend) -> dict:
    """Several devices: how the row ran, as the loaded backend says (its kernel's split and the driver
    `auto` resolved to); {} for one device."""
    info = device_info(backend)
    return {key: info[key] for key in ("split", "gpu_driver") if key in info and "gpus" in info}


def check_scene(scene: str) -> str:
    """`scene` when it is an app.model.ics generator; ConfigError naming the generators otherwise."""
    from app.model.ics import GENERATORS

    if scene not in GENERATORS:
        raise ConfigError(f"--scene {scene!r}: not a generator; choose from {', '.join(GENERATORS)}")
    return scene


class _BodiesCache:
    """The bodies of the latest (scene, N), made once for all the kernels and settings timed on them
    (the rows run scene by scene, N by N); the previous set is dropped, so 8M bodies are held once."""

    def __init__(self, seed: int):
        self.seed, self.key, self.bodies = seed, None, None

    def __call__(self, scene: str, n: int) -> Bodies:
        if self.key != (scene, n):
            self.key, self.bodies = None, None  # let the previous set go before the next is made
            self.bodies, self.key = bench_bodies(n, self.seed, scene), (scene, n)
        return self.bodies


def _why_not_run(backend_cls, reason: str | None, rec, name: str, n: int) -> str | None:
    if reason is not None:
        return reason
    if rec is None:
        return f"{name!r} is not a {backend_cls.name} kernel"
    why = backend_cls.kernel_why_not(name)
    if why is None and rec.max_n is not None and n > rec.max_n:
        why = f"N = {n:,} is over this kernel's max_n {rec.max_n:,}"
    return why


def _predicted_over(done: list[dict], entry: dict, steps: int, max_seconds: float) -> str | None:
    """Why a row is not started: the same kernel, scene and settings measured at a smaller N, scaled by
    its work, would take more than `max_seconds` for its warm-up and timed steps. None when it fits or
    nothing smaller ran. The work of an all-pairs row grows as N²; that of a row that counted fewer
    interactions than N² (a tree) as N log N, which the trees' measured growth stays under (x5.1 to x8.3
    from 1M to 8M on the H200, against x9.2), so a tree is predicted long rather than short."""
    smaller = [
        r
        for r in done
        if r.get("status") == "ok"
        and r["n"] < entry["n"]
        and all(r.get(k) == entry[k] for k in ("kernel", "scene", "tunables"))
    ]
    if not smaller:
        return None
    base = max(smaller, key=lambda r: r["n"])
    ratio = entry["n"] / base["n"]
    if "pair_equivalent" in base:
        growth, law = ratio * math.log(entry["n"]) / math.log(max(base["n"], 2)), "N log N"
    else:
        growth, law = ratio**2, "N²"
    predicted = steps * base["step_median_ms"] * 1e-3 * growth
    if predicted <= max_seconds:
        return None
    return (
        f"not run: {steps} steps predicted to take {predicted:,.1f} s ({law} from "
        f"{base['step_median_ms']:.3g} ms per step at N = {base['n']:,}) > --max-seconds {max_seconds:g}"
    )


def _time_one(
    backend,
    rec,
    bodies: Bodies,
    physics: Physics,
    setting: dict,
    warmup: int,
    repeats: int,
    max_seconds: float | None,
    period: int = 1,
) -> dict:
    """One row: `warmup` untimed steps, then `repeats` samples of `period` single steps each (a method
    whose work repeats over a cycle, KernelRecord.period_tunable: each sample is the mean step of one
    whole cycle, so that the build of a tree refitted between builds counts at its share)."""
    from app.core.errors import RuntimeFault

    try:
        backend.load(bodies, physics, kernel=rec.name)
        if rec.tunables:  # all of them: the defaults, then the row's values (none left from an earlier row)
            backend.set_tunables(**rec.with_tunables(setting))
    except (RuntimeFault, MemoryError) as e:
        return {"status": "skipped", "reason": f"load failed: {e}"}
    total = warmup + repeats * period
    steps, cycle = [], []
    start = time.perf_counter()
    try:
        for done in range(1, total + 1):
            t0 = time.perf_counter()
            timings = backend.step(1)
            if done > warmup:
                cycle.append(timings)
                if len(cycle) == period:
                    steps.append(cycle_mean(cycle))
                    cycle = []
            now = time.perf_counter()
            why = _running_over(done, total, now - start, now - t0, max_seconds)
            if why is not None:
                return {"status": "skipped", "reason": why}
    except Exception as e:  # recorded, not hidden: the other kernels still run
        return {"status": "failed", "reason": f"{type(e).__name__}: {e}"}
    samples = [float(t.force_ms) for t in steps]
    median = statistics.median(samples)
    if median <= 0:
        return {"status": "failed", "reason": "the backend reported no force time", "samples_ms": samples}
    # what one step's force evaluation did, as its evaluator counted it (a tree's work varies by step)
    interactions = statistics.median_low(t.interactions for t in steps)
    if interactions <= 0:
        return {"status": "failed", "reason": "the backend counted no interactions", "samples_ms": samples}
    ips = rate(interactions, median)
    row = {
        "status": "ok",
        "median_ms": median,
        "min_ms": min(samples),
        "max_ms": max(samples),
        "samples_ms": samples,
        # the full step: the force evaluation (a tree: keys, sort, build, moments, walk) plus the integrator
        "step_median_ms": statistics.median(float(t.force_ms + t.integrate_ms) for t in steps),
        "tunables_used": backend.tunables(),
        "interactions": interactions,
        "interactions_per_s": ips,
        GFLOPS_FIELD: ips * FLOPS_PER_INTERACTION * 1e-9,
    }
    pairs = statistics.median_low(t.pair_equivalent for t in steps)
    if pairs != interactions:
        row["pair_equivalent"] = pairs
        row[EQUIVALENT_FIELD] = rate(pairs, median)
        row["body_cell"] = statistics.median_low(t.body_cell for t in steps)
    stages = stage_medians([t.stages for t in steps])
    if stages:
        row[STAGES_FIELD] = stages
    if rec.walk_flops and stages.get("walk", 0) > 0 and "body_cell" in row:
        row[WALK_TFLOPS_FIELD] = walk_tflops(rec.walk_flops, interactions, row["body_cell"], stages["walk"])
        row["walk_flops"] = list(rec.walk_flops)
    devices = stage_medians([t.devices for t in steps])  # several devices: each one's force time
    if devices:
        row[DEVICES_FIELD] = devices
        row[EXCHANGE_FIELD] = statistics.median(t.exchange_ms for t in steps)
    runs = backend.resolved_kernel  # `best`: the variant and tunables it resolved to
    if runs and runs.split()[0] != rec.name:
        row["runs"] = runs
    row.update(rank_medians([ranks_of(t.extra) for t in steps]))
    return row


def walk_tflops(flops: tuple[int, int], interactions: int, body_cell: int, walk_ms: float) -> float:
    """TFLOP/s of a tree walk: (body-body x flops[0] + body-cell x flops[1]) per walk_ms."""
    return ((interactions - body_cell) * flops[0] + body_cell * flops[1]) / (walk_ms * 1e-3) * 1e-12


def cycle_mean(steps: list[StepTimings]) -> StepTimings:
    """The mean single step of consecutive single-step timings (a whole cycle of a periodic method):
    every time, count and measured entry averaged (counts rounded to whole interactions)."""
    k = len(steps)
    if k == 1:
        return steps[0]
    extra: dict[str, float] = {}
    for t in steps:
        for key, value in t.extra.items():
            extra[key] = extra.get(key, 0.0) + value / k
    return StepTimings(
        kernel=steps[0].kernel,
        steps=1,
        n=steps[0].n,
        force_ms=sum(t.force_ms for t in steps) / k,
        integrate_ms=sum(t.integrate_ms for t in steps) / k,
        map_ms=sum(t.map_ms for t in steps) / k,
        unmap_ms=sum(t.unmap_ms for t in steps) / k,
        interactions=round(sum(t.interactions for t in steps) / k),
        pair_equivalent=round(sum(t.pair_equivalent for t in steps) / k),
        force_evals=round(sum(t.force_evals for t in steps) / k),
        body_cell=round(sum(t.body_cell for t in steps) / k),
        extra=extra,
    )


def _running_over(
    done: int, total: int, elapsed: float, last: float, max_seconds: float | None
) -> str | None:
    """Why a row stops after `done` of `total` steps: the wall time so far plus the remaining steps at the
    last one's pace exceeds `max_seconds`. The pace is trusted from the second step on (the first may
    include compiling and loading kernels), the elapsed time always."""
    if max_seconds is None or done >= total:
        return None
    projected = elapsed + (total - done) * last if done >= 2 else elapsed
    if projected <= max_seconds:
        return None
    return (
        f"stopped after {done} of {total} steps: {projected:,.0f} s projected (the last step took "
        f"{last:.2f} s) > --max-seconds {max_seconds:g}"
    )


def _error_sample(backend, k: int, seed: int) -> dict:
    """The force error of the state the timed steps left, for K random targets (the same targets for every
    setting of a scene and N: one seed), through the live probe's `measure` (app/engine/force_error.py)."""
    from app.engine.force_error import measure

    try:
        s = measure(backend, k, np.random.default_rng(seed))
    except Exception as e:  # noqa: BLE001 - the timing stands; the row says why it has no error
        return {"sample": 0, "reason": f"{type(e).__name__}: {e}"}
    return {
        "sample": s.k,
        "median": s.median,
        "p99": s.p99,
        "max": s.max,
        "budget_p99": s.budget_p99,
        "within_budget": s.within_budget,
        "ms": s.ms,
    }


# --- bench --gpus 1,2: the same benchmark on K devices, and the scaling between them ----------------------
def row_label(row: dict) -> str:
    """'tree theta=0.5', 'best ×2': the kernel, the tunables the row set (nothing for a kernel's own
    settings) and its device count when it has one (`bench --gpus`)."""
    kernel = f"{row['kernel']} ×{row['gpus']}" if "gpus" in row else row["kernel"]
    return " ".join(filter(None, [kernel, format_tunables(row.get("tunables") or {})]))


def step_ms(row: dict) -> float:
    """What scaling compares: the force time of all devices plus the position exchange of one step."""
    return row["median_ms"] + row.get(EXCHANGE_FIELD, 0.0)


def series_key(row: dict) -> tuple:
    """(kernel, scene, N, setting): what a row of one device count is compared with on another."""
    return row["kernel"], row.get("scene"), row["n"], format_tunables(row.get("tunables") or {})


def scaling_rows(rows: list[dict]) -> list[dict]:
    """Per series (kernel, scene, N and the tunables the row set) measured on several device counts:
    speed-up of each count against the smallest (its force + exchange time per step, `step_ms`) and the
    efficiency, speed-up × K_base / K. Rows of other scenes or settings are never compared."""
    ok: dict[tuple, dict[int, dict]] = {}
    for r in rows:
        if r.get("status") == "ok" and "gpus" in r:
            ok.setdefault(series_key(r), {})[r["gpus"]] = r
    out = []
    for (kernel, scene, n, _setting), by_k in ok.items():
        base = min(by_k)
        for k in sorted(by_k):
            speedup = step_ms(by_k[base]) / step_ms(by_k[k])
            out.append(
                {
                    "kernel": kernel,
                    "scene": scene,
                    "n": n,
                    "tunables": dict(by_k[k].get("tunables") or {}),
                    "gpus": k,
                    "baseline_gpus": base,
                    "step_ms": step_ms(by_k[k]),
                    "exchange_ms": by_k[k].get(EXCHANGE_FIELD, 0.0),
                    "speedup": speedup,
                    "efficiency": speedup * base / k,
                }
            )
    return out


def scaling_at_budget(result: dict) -> list[dict]:
    """The scaling rows that answer "how much faster on K devices": per kernel, scene and N, the setting an
    approximate kernel (a tree) is run at, the fastest within its error budget on the fewest devices
    (`fastest_within_budget`; its accelerations are those of every device count: the domain split is
    bitwise one device's); a kernel without error samples has one setting."""
    fewest = min(result.get("gpu_counts") or [1])
    entries = result.get("fastest_within_budget") or []
    sampled = {(e["kernel"], e.get("scene"), e["n"]) for e in entries}
    chosen = {
        (e["kernel"], e.get("scene"), e["n"]): e["tunables"]
        for e in entries
        if e.get("gpus", fewest) == fewest and e.get("tunables") is not None
    }
    out = []
    for row in result.get("scaling") or []:
        key = (row["kernel"], row.get("scene"), row["n"])
        if key not in sampled or chosen.get(key) == row.get("tunables"):
            out.append(row)
    return out


def run_scaling(backend_classes: dict[int, type], kernels: list[str], ns: list[int], **options) -> dict:
    """`run_bench` once per device count ({K: backend class over K devices}); the rows of every run in
    one result, each with its "gpus", its "scaling" rows (scaling_rows) and the fastest setting within
    the error budget per device count."""
    from app.tools.bench_sweep import fastest_within_budget

    result = None
    for k, cls in backend_classes.items():
        part = run_bench(cls, kernels, ns, **options)
        for row in part["results"]:
            row["gpus"] = k
        if result is None:
            result = part
            result["gpu_counts"] = list(backend_classes)
        else:
            result["results"] += part["results"]
            if len(part.get("device", {}).get("devices", [])) > len(result["device"].get("devices", [])):
                result["device"] = part["device"]  # the largest run names every device
    result["scaling"] = scaling_rows(result["results"])
    result["fastest_within_budget"] = fastest_within_budget(result["results"])  # per device count
    result["scaling_at_budget"] = scaling_at_budget(result)
    return result


def format_scaling(result: dict) -> str:
    """The scaling rows at the budget's setting (`scaling_at_budget`) as a table ("" when there are none);
    the JSON's "scaling" has every setting."""
    rows = result.get("scaling_at_budget") or []
    if not rows:
        return ""
    lines = [
        f"{'kernel':<22} {'scene':<10} {'N':>11} {'GPUs':>5} {'step ms':>10} {'exchange ms':>12} "
        f"{'speed-up':>9} {'efficiency':>10}"
    ]
    for r in rows:
        label = " ".join(filter(None, [r["kernel"], format_tunables(r.get("tunables") or {})]))
        lines.append(
            f"{label:<22} {r.get('scene') or '':<10} {r['n']:>11,} {r['gpus']:>5} "
            f"{r['step_ms']:>10.4f} {r['exchange_ms']:>12.4f} {r['speedup']:>9.2f} "
            f"{100 * r['efficiency']:>9.0f}%"
        )
    return (
        "scaling (force + exchange per step against the fewest devices; a tree at the fastest θ within "
        "its budget on the fewest):\n" + "\n".join(lines)
    )


def rank_medians(per_step: list[dict[str, list[float]]]) -> dict:
    """Under MPI (app.engine.timing.ranks_of of each step): the median force and exchange ms of each rank, and
    the imbalance of the force medians (max / mean - 1); {} for one process. The row's median_ms is the
    slowest rank's force time of each step."""
    if not per_step or not per_step[0]:
        return {}
    out = {"ranks": len(per_step[0]["force"])}
    for part in ("force", "exchange"):
        out[f"rank_{part}_median_ms"] = [float(v) for v in np.median([s[part] for s in per_step], axis=0)]
    out["rank_imbalance"] = imbalance(out["rank_force_median_ms"])
    return out


def stage_medians(per_step: list[dict[str, float]]) -> dict[str, float]:
    """The median of each stage over the timed steps (StepTimings.stages, in stage order); {} when the
    kernel reports none. Medians of parts need not add up to the median of the whole."""
    names = list(dict.fromkeys(name for stages in per_step for name in stages))
    return {name: statistics.median(stages.get(name, 0.0) for stages in per_step) for name in names}


# --- output -------------------------------------------------------------------------------------------------
def write_json(result: dict, path) -> None:
    """The results as JSON, written atomically (app.core.outputs); RuntimeFault naming `path` on failure."""
    from app.core.outputs import atomic_write

    with atomic_write(path, "w", "bench results") as f:
        f.write(json.dumps(result, indent=2, default=_json_default) + "\n")


def _json_default(obj):
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, tuple | set):
        return list(obj)
    return str(obj)


def format_table(result: dict) -> str:
    from app.tools.bench_sweep import summary_lines

    dev = result.get("device") or {}
    head = f"{result.get('backend', '?')} on {dev.get('name', '?')}"
    if dev.get("sm_clock_max_mhz"):
        head += f", SM clock max {dev['sm_clock_max_mhz']:.0f} MHz"
    if dev.get("driver_version"):
        head += f", driver {dev['driver_version']}"
    head += f"; medians of {result.get('repeats', '?')} steps"
    rows = result.get("results", [])
    # the "equivalent all-pairs" column only when a kernel evaluated fewer pairs than N² (a tree), the
    # error columns only when a row sampled its force error
    equivalent = any(EQUIVALENT_FIELD in r for r in rows)
    errors = any("p99" in (r.get("error") or {}) for r in rows)
    heads = (
        ["force ms", "step ms", "G inter/s", "GFLOP/s(20)"]
        + (["eq. all-pairs G/s"] if equivalent else [])
        + (["err median", "err p99", "err max"] if errors else [])
    )
    widths = [11, 11, 11, 12] + ([17] if equivalent else []) + ([10, 9, 9] if errors else [])
    labels = [row_label(r) for r in rows]
    label_w = max([16, *map(len, labels)])
    scene_w = max([5, *(len(r.get("scene", DEFAULT_SCENE)) for r in rows)])

    def line(label: str, scene: str, n: str, cells: list[str], note: str = "") -> str:
        text = f"{label:<{label_w}} {scene:<{scene_w}} {n:>10} " + " ".join(
            f"{c:>{w}}" for c, w in zip(cells, widths, strict=True)
        )
        return text + (f"  {note}" if note else "")

    lines = [head, line("kernel", "scene", "N", heads, "note")]
    for label, r in zip(labels, rows, strict=True):
        scene, n = r.get("scene", DEFAULT_SCENE), f"{r['n']:,}"
        if r.get("status") == "ok":
            ips = r["interactions_per_s"]
            step = r.get("step_median_ms")
            cells = [
                f"{r['median_ms']:.4f}",
                "-" if step is None else f"{step:.4f}",
                f"{ips / 1e9:.2f}",
                f"{r[GFLOPS_FIELD]:.1f}",
            ]
            if equivalent:
                cells.append(f"{r[EQUIVALENT_FIELD] / 1e9:.2f}" if EQUIVALENT_FIELD in r else "-")
            err = r.get("error") or {}
            if errors:
                cells += [f"{err[k]:.2e}" for k in ("median", "p99", "max")] if "p99" in err else ["-"] * 3
            note = f"error sample: {err['reason']}" if "reason" in err else ""
            lines.append(line(label, scene, n, cells, note))
            lines += _detail_lines(r)
        else:
            lines.append(line(label, scene, n, ["-"] * len(heads), f"{r.get('status')}: {r.get('reason')}"))
    if any("p99" in (r.get("error") or {}) for r in rows):
        k = max((r["error"]["sample"] for r in rows if "p99" in (r.get("error") or {})), default=0)
        lines.append(
            f"err: relative acceleration error of {k:,} random targets against the exact all-pairs "
            "sum on the same device (step ms = force + integrate)"
        )
    lines += summary_lines(result.get("fastest_within_budget", []))
    return "\n".join(lines)


def _detail_lines(r: dict) -> list[str]:
    """Under a row: what it ran (`best`), what its interactions were when not all-pairs, and its time split
    per stage."""
    out = [f"{'':<16}   runs {r['runs']}"] if r.get("runs") else []
    if EQUIVALENT_FIELD in r:
        cells = r.get("body_cell", 0)
        out.append(
            f"{'':<16}   {r['interactions'] / r['n']:,.0f} interactions/body (body-body + body-cell, "
            f"{100 * cells / r['interactions']:.0f}% body-cell): {r['interactions_per_s'] / 1e9:.2f} "
            f"G/s; equivalent all-pairs N²/t {r[EQUIVALENT_FIELD] / 1e9:.2f} G/s"
        )
    if r.get(STAGES_FIELD):
        split = " · ".join(f"{name} {ms:.3f}" for name, ms in r[STAGES_FIELD].items())
        out.append(f"{'':<16}   stages (median ms): {split}")
    if r.get(WALK_TFLOPS_FIELD):
        bb, bc = r["walk_flops"]
        share = r.get("walk_fp32_peak_fraction")
        peak = f", {100 * share:.0f}% of the device's FP32 peak" if share else ""
        out.append(
            f"{'':<16}   walk {r[WALK_TFLOPS_FIELD]:.1f} TFLOP/s FP32 ({bb} flops per body-body, "
            f"{bc} per body-cell){peak}"
        )
    if r.get(DEVICES_FIELD):
        split = " · ".join(f"{name} {ms:.3f}" for name, ms in r[DEVICES_FIELD].items())
        out.append(f"{'':<16}   devices (median force ms): {split}; exchange {r[EXCHANGE_FIELD]:.3f}")
    if r.get("ranks"):
        force = " / ".join(f"{v:.3f}" for v in r["rank_force_median_ms"])
        exchange = " / ".join(f"{v:.3f}" for v in r["rank_exchange_median_ms"])
        out.append(
            f"{'':<16}   {r['ranks']} ranks (median ms per rank): force {force} · exchange {exchange}"
            f" · imbalance {100 * r['rank_imbalance']:.0f}%"
        )
    return out


def print_table(result: dict) -> None:
    print(format_table(result))
    scaling = format_scaling(result)
    if scaling:
        print(scaling)


def load_json(path) -> dict:
    return json.loads(Path(path).read_text())


def compare_kernel(first: dict, second: dict, kernel: str, ns: list[int]) -> list[dict]:
    """`kernel`'s rate at each N in two bench results: [{n, first, second, ratio = first / second}], with
    None where a result has no ok row (bench/best_default.sh: best untuned / best tuned)."""

    def rates(result: dict) -> dict[int, float]:
        return {
            r["n"]: r["interactions_per_s"]
            for r in result.get("results", [])
            if r.get("kernel") == kernel and r.get("status") == "ok"
        }

    a, b = rates(first), rates(second)
    return [
        {
            "n": n,
            "first": a.get(n),
            "second": b.get(n),
            "ratio": a[n] / b[n] if a.get(n) and b.get(n) else None,
        }
        for n in ns
    ]
