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

This module is the sweep over the rows (scene x N x kernel x setting) and its result; its pieces, each
re-exported here for its importers: bench_row.py (one row timed, the row's fields), bench_machine.py (the
git commit, the device facts, the reference lines), bench_report.py (the JSON, the table), bench_scaling.py
(`bench --gpus`: the speed-up between device counts).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import platform
import sys
from dataclasses import dataclass, field
from typing import Any

from app.core.errors import ConfigError
from app.engine.forces import KernelRecord, format_tunables
from app.engine.timing import FLOPS_PER_INTERACTION
from app.model.bodies import Bodies
from app.model.ics import BENCH_SCENE, bench_bodies
from app.model.physics import Physics
from app.tools.bench_machine import (
    CUDA_SAMPLES_H200,
    DEFAULT_GPU_FP32_LIMIT,
    device_info,
    git_commit,
    reference_lines,
)
from app.tools.bench_report import (
    compare_kernel,
    format_table,
    load_json,
    print_table,
    row_label,
    write_json,
)
from app.tools.bench_row import (
    DEVICES_FIELD,
    EQUIVALENT_FIELD,
    EXCHANGE_FIELD,
    GFLOPS_FIELD,
    STAGES_FIELD,
    WALK_TFLOPS_FIELD,
    cycle_mean,
    rank_medians,
    sample_error,
    stage_medians,
    time_one,
    walk_tflops,
)
from app.tools.bench_scaling import format_scaling, scaling_at_budget, scaling_rows, series_key, step_ms

__all__ = [  # what this module defines, and what its importers take from it that the pieces define
    "CUDA_SAMPLES_H200",
    "DEFAULT_ERROR_SAMPLE",
    "DEFAULT_GPU_FP32_LIMIT",
    "DEFAULT_SCENE",
    "DEVICES_FIELD",
    "EQUIVALENT_FIELD",
    "ERROR_REFERENCE",
    "EXCHANGE_FIELD",
    "GFLOPS_FIELD",
    "SCHEMA",
    "STAGES_FIELD",
    "WALK_TFLOPS_FIELD",
    "bench_bodies",
    "check_scene",
    "compare_kernel",
    "cycle_mean",
    "device_info",
    "format_scaling",
    "format_table",
    "git_commit",
    "load_json",
    "print_table",
    "rank_medians",
    "reference_lines",
    "row_label",
    "run_bench",
    "run_scaling",
    "scaling_at_budget",
    "scaling_rows",
    "series_key",
    "stage_medians",
    "step_ms",
    "walk_tflops",
    "write_json",
]

SCHEMA = "nbody-live-bench/1"
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
    on_row=None,
    done_rows: list[dict] | None = None,
) -> dict:
    """Time the force launch of every kernel at every N (see the module doc); returns the JSON-ready
    result, its "complete" false until the last row. `on_row(result)` is called after every row (the
    command writes its JSON there, so an interrupted run keeps what it measured); `done_rows`, the rows
    of an interrupted run of the same plan, are kept and not run again (`bench --resume`).
    `scenes`: app.model.ics generators whose seeded bodies are timed, one set of rows per scene;
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
    result = _result_head(
        backend_cls, physics, seed, scenes, tunables, warmup, repeats, max_seconds, error_sample
    )
    reason = backend_cls.why_not()
    plan = [
        (scene, int(n), name, setting)
        for scene in scenes
        for n in ns
        for name in kernels
        for setting in settings.get(name, [{}])
    ]
    if done_rows:
        plan = resumed_plan(plan, done_rows)
        result["results"] = list(done_rows)
        result["resumed_rows"] = len(done_rows)
    result["complete"] = False
    approximate = {name for name, rec in records.items() if rec.approximate}
    sampled = sum(error_sample > 0 and name in approximate for _, _, name, _ in plan)
    bar = _progress(len(plan) + sampled, progress and reason is None)
    sweep = _Sweep(
        backend_cls=backend_cls,
        reason=reason,
        records=records,
        approximate=approximate,
        physics=physics,
        warmup=warmup,
        repeats=repeats,
        max_seconds=max_seconds,
        error_sample=error_sample,
        seed=seed,
        bar=bar,
    )
    try:
        sweep.open(result)
        for scene, n, name, setting in plan:
            result["results"].append(sweep.row(scene, n, name, setting, result))
            if on_row is not None:
                on_row(result)
    finally:
        sweep.close()
    result["complete"] = True
    result["fastest_within_budget"] = fastest_within_budget(result["results"])
    return result


def row_key(scene: str, n: int, kernel: str, tunables: dict) -> tuple:
    """What names a row of a bench's plan: its scene, N, kernel and tunable setting."""
    return (scene, int(n), kernel, json.dumps(tunables, sort_keys=True, default=str))


def resumed_plan(plan: list[tuple], done_rows: list[dict]) -> list[tuple]:
    """The plan's rows that `done_rows` lacks, in plan order; ConfigError when a done row is not in the
    plan (the resumed command asks for other kernels, N, scenes or tunables)."""
    keys = [row_key(*entry) for entry in plan]
    done = {row_key(r["scene"], r["n"], r["kernel"], r.get("tunables", {})) for r in done_rows}
    stray = done - set(keys)
    if stray:
        scene, n, kernel, tunables = sorted(stray)[0]
        raise ConfigError(
            f"--resume: the file has a row this command would not run ({kernel}, {scene}, N = {n:,}, "
            f"tunables {tunables}); give the interrupted run's --kernels, --n, --scene and --tunable"
        )
    return [entry for entry, key in zip(plan, keys, strict=True) if key not in done]


def _result_head(
    backend_cls,
    physics: Physics,
    seed: int,
    scenes: list[str],
    tunables: dict[str, list] | None,
    warmup: int,
    repeats: int,
    max_seconds: float | None,
    error_sample: int,
) -> dict:
    """The result before its rows: what was run, where and how (the device and its references are filled
    in once the backend is open, the rows as they are timed)."""
    return {
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


@dataclass
class _Sweep:
    """The rows of one run_bench, one at a time: the backend class (and why it cannot run, if it cannot),
    its records, how each row is timed and whether its force error is sampled, the bodies the rows share,
    the open backend and the progress bar."""

    backend_cls: Any
    reason: str | None  # why the backend cannot run (every row is skipped with it), or None
    records: dict[str, KernelRecord]
    approximate: set[str]  # the records' names whose rows sample their force error
    physics: Physics
    warmup: int
    repeats: int
    max_seconds: float | None
    error_sample: int
    seed: int
    bar: Any  # the tqdm bar (_progress)
    backend: Any = None  # opened by run_bench when the backend can run
    bodies_of: _BodiesCache = field(init=False)

    def __post_init__(self) -> None:
        self.bodies_of = _BodiesCache(self.seed)

    def open(self, result: dict) -> None:
        """Open the backend (when it can run) and put its device facts and the references in `result`."""
        if self.reason is None:
            self.backend = self.backend_cls()
            result["device"] = device_info(self.backend)
            result["fp32_issue_limit_interactions_per_s"] = result["device"].get(
                "fp32_issue_limit_interactions_per_s"
            )
        limit = result["fp32_issue_limit_interactions_per_s"]
        result["references"] = reference_lines(self.backend_cls.memory == "device", limit)

    def close(self) -> None:
        self.bar.close()
        if self.backend is not None:
            self.backend.close()

    def row(self, scene: str, n: int, name: str, setting: dict, result: dict) -> dict:
        """One row: kernel, scene, N and tunables, then its timing or why it was skipped, then the force
        error of an approximate kernel's row."""
        rec = self.records.get(name)
        entry = {"kernel": name, "scene": scene, "n": n, "tunables": dict(setting)}
        label = " ".join(filter(None, [name, format_tunables(setting), scene, f"N={n:,}"]))
        self.bar.set_postfix_str(f"{label}: timing")
        entry.update(self._timed(rec, entry, setting, result))
        self.bar.update(1)
        if self.error_sample > 0 and name in self.approximate:
            if entry["status"] == "ok":
                self.bar.set_postfix_str(f"{label}: error sample of {min(self.error_sample, n):,} targets")
                entry["error"] = sample_error(self.backend, self.error_sample, self.seed)
            self.bar.update(1)
        return entry

    def _timed(self, rec, entry: dict, setting: dict, result: dict) -> dict:
        """What a row adds to its `entry`: why it is skipped (the backend or the kernel cannot run, over
        max_n, predicted over `max_seconds`, a scene that cannot have N bodies), or its timing with the
        walk's share of the device's FP32 peak and how several devices split it."""
        name, scene, n = entry["kernel"], entry["scene"], entry["n"]
        why = _why_not_run(self.backend_cls, self.reason, rec, name, n)
        period = rec.period(setting) if rec is not None else 1
        if why is None and self.max_seconds is not None:
            steps = self.warmup + self.repeats * period
            why = _predicted_over(result["results"], entry, steps, self.max_seconds)
        if why is None:
            try:
                bodies = self.bodies_of(scene, n)
            except ConfigError as e:  # e.g. a collision needs two bodies
                why = f"scene {scene!r} at N = {n:,}: {e}"
        if why is not None:
            return {"status": "skipped", "reason": why}
        row = time_one(
            self.backend,
            rec,
            bodies,
            self.physics,
            setting,
            self.warmup,
            self.repeats,
            self.max_seconds,
            period,
        )
        peak = result["device"].get("fp32_peak_tflops")
        if peak and row.get(WALK_TFLOPS_FIELD):
            row["walk_fp32_peak_fraction"] = row[WALK_TFLOPS_FIELD] / peak
        row.update(_how_split(self.backend))
        return row


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
        self.seed = seed
        self.key: tuple[str, int] | None = None
        self.bodies: Bodies | None = None

    def __call__(self, scene: str, n: int) -> Bodies:
        if self.key != (scene, n):
            self.key, self.bodies = None, None  # let the previous set go before the next is made
            self.bodies, self.key = bench_bodies(n, self.seed, scene), (scene, n)
        assert self.bodies is not None  # made above for this (scene, N)
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


def run_scaling(
    backend_classes: dict[int, type],
    kernels: list[str],
    ns: list[int],
    on_row=None,
    done_rows: list[dict] | None = None,
    **options,
) -> dict:
    """`run_bench` once per device count ({K: backend class over K devices}); the rows of every run in
    one result, each with its "gpus", its "scaling" rows (scaling_rows) and the fastest setting within
    the error budget per device count. As `run_bench`: `on_row(result)` after every row with every row so
    far ("complete" false), and `done_rows` (each with its "gpus") are kept and not run again."""
    from app.tools.bench_sweep import fastest_within_budget

    parts: list[dict] = []

    def so_far(part: dict, k: int) -> dict:
        for row in part["results"]:
            row["gpus"] = k
        return _merged([*parts, part], list(backend_classes))

    for k, cls in backend_classes.items():
        mine = [r for r in done_rows or [] if r.get("gpus") == k]
        part = run_bench(
            cls,
            kernels,
            ns,
            **options,
            on_row=None if on_row is None else lambda part, k=k: on_row(so_far(part, k)),
            done_rows=mine or None,
        )
        so_far(part, k)
        parts.append(part)
    result = _merged(parts, list(backend_classes))
    result["complete"] = True
    result["scaling"] = scaling_rows(result["results"])
    result["fastest_within_budget"] = fastest_within_budget(result["results"])  # per device count
    result["scaling_at_budget"] = scaling_at_budget(result)
    return result


def _merged(parts: list[dict], gpu_counts: list[int]) -> dict:
    """One result of the per-count runs so far: the first's head, every row, the largest run's device
    (it names every device); complete only when every count's run is."""
    assert parts, "run_scaling: no device counts"
    result = {**parts[0], "results": [row for part in parts for row in part["results"]]}
    result["gpu_counts"] = gpu_counts
    result["complete"] = len(parts) == len(gpu_counts) and all(part["complete"] for part in parts)
    result.pop("fastest_within_budget", None)  # the first count's: run_scaling sets every count's
    resumed = sum(part.get("resumed_rows", 0) for part in parts)
    if resumed:
        result["resumed_rows"] = resumed
    for part in parts:
        if len(part.get("device", {}).get("devices", [])) > len(result["device"].get("devices", [])):
            result["device"] = part["device"]
    return result
