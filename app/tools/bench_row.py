"""One row of the `bench` command (app.tools.bench): a kernel timed on one set of bodies, and the row's
fields.

`time_one` loads the bodies, runs `warmup` untimed steps, then `repeats` samples of `period` single steps
(a method whose work repeats over a cycle, KernelRecord.period_tunable: each sample is the mean step of one
whole cycle, `cycle_mean`), and turns the backend's own StepTimings into the row: median force ms,
interactions/s and GFLOP/s, the full step, the "equivalent all-pairs" rate of a kernel that evaluates fewer
pairs than N², the median of each stage (`stage_medians`), a tree walk's TFLOP/s (`walk_tflops`), several
devices' force and exchange times and MPI ranks' (`rank_medians`). A row that cannot finish says why
(`running_over`: over `max_seconds`; a load or step that failed). `sample_error` is an approximate
kernel's force error after its timing.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from app.engine.timing import FLOPS_PER_INTERACTION, StepTimings, imbalance, ranks_of, rate
from app.model.bodies import Bodies
from app.model.physics import Physics

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


def time_one(
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
    steps = _timed_steps(backend, warmup, repeats, period, max_seconds)
    if isinstance(steps, dict):  # stopped or failed on the way
        return steps
    return _row_of(backend, rec, steps)


def _timed_steps(
    backend, warmup: int, repeats: int, period: int, max_seconds: float | None
) -> list[StepTimings] | dict:
    """The loaded backend's `warmup` untimed steps, then its `repeats` samples (the mean step of `period`
    steps each); or the row that says why the steps stopped (over `max_seconds`, or a step failed)."""
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
            if max_seconds is not None:  # a wall-clock decision: rank 0's under MPI (Backend.lead_says)
                now = time.perf_counter()
                why = backend.lead_says(running_over(done, total, now - start, now - t0, max_seconds))
                if why is not None:
                    return {"status": "skipped", "reason": why}
    except Exception as e:  # recorded, not hidden: the other kernels still run
        return {"status": "failed", "reason": f"{type(e).__name__}: {e}"}
    return steps


def _row_of(backend, rec, steps: list[StepTimings]) -> dict:
    """The row of the timed `steps`: medians, rates and whatever else the backend measured."""
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
        "tunables_used": rec.tunables_at(backend.tunables(), backend.n),  # alpha's auto: its number
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


def running_over(done: int, total: int, elapsed: float, last: float, max_seconds: float | None) -> str | None:
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


def sample_error(backend, k: int, seed: int) -> dict:
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


def rank_medians(per_step: list[dict[str, list[float]]]) -> dict:
    """Under MPI (app.engine.timing.ranks_of of each step): the median force and exchange ms of each rank, and
    the imbalance of the force medians (max / mean - 1); {} for one process. The row's median_ms is the
    slowest rank's force time of each step."""
    if not per_step or not per_step[0]:
        return {}
    out: dict[str, Any] = {"ranks": len(per_step[0]["force"])}
    for part in ("force", "exchange"):
        out[f"rank_{part}_median_ms"] = [float(v) for v in np.median([s[part] for s in per_step], axis=0)]
    out["rank_imbalance"] = imbalance(out["rank_force_median_ms"])
    return out


def stage_medians(per_step: list[dict[str, float]]) -> dict[str, float]:
    """The median of each stage over the timed steps (StepTimings.stages, in stage order); {} when the
    kernel reports none. Medians of parts need not add up to the median of the whole."""
    names = list(dict.fromkeys(name for stages in per_step for name in stages))
    return {name: statistics.median(stages.get(name, 0.0) for stages in per_step) for name in names}
