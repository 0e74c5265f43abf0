"""The force seam (app/engine/forces.py), record by record: a range of targets against a range of sources.

- Targets [i0, i0 + ni) against all sources give bitwise the matching rows of the full evaluation, and
  no other row of acc is written.
- Against a sub-range of sources, the targets' accelerations agree with the float64 reference computed on
  those sources alone, within the record's error budget; so does the full evaluation.

The checks take an `evaluate(pos, targets, sources) -> (N, 3) float64` for one record and one physics:
`pos` is the (N, 4) [x, y, z, m] host array in the record's precision; the callable evaluates into an acc
filled with NaN (on its device) and returns all N rows. The CPU records come from `cpu_evaluate`. CUDA
records join through a `gpu`-marked parametrisation that builds their callable (upload pos, evaluate on
the device, download acc) and calls the same `check_slices` / `check_reference`.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_cpu_backend import plummer_like

from app.backends.cpu import CPUBackend
from app.engine.forces import ErrorBudget, ForceEvaluator, KernelRecord, Span
from app.model.physics import Physics, accelerations, relative_errors

N = 1000
TARGETS = (Span(0, 1), Span(7, 333), Span(999, 1), Span(0, N))  # ranges that are multiples of nothing
SOURCES = (Span(0, N), Span(0, 1), Span(7, 333), Span(999, 1), Span(500, 500))
PHYSICS = {
    "gravity-soft": Physics(softening=0.01),
    "gravity-eps0": Physics(softening=0.0),  # the self term (and only it) must be skipped
    "repulsion-soft": Physics(softening=0.01, model="gravity-repulsion", repulsion=1e-4),
}
DTYPES = {"fp32": np.float32, "fp64": np.float64}


def cloud(n: int, seed: int, dtype) -> np.ndarray:
    """(n, 4) [x, y, z, m] of a seeded Plummer-like cloud in `dtype`."""
    return plummer_like(n, seed).pos4(dtype)


def reference(pos: np.ndarray, physics: Physics, targets: Span, sources: Span) -> np.ndarray:
    """Float64 accelerations of pos[targets] due to pos[sources] alone: the targets ride along after the
    sources as massless bodies, which pull on nothing."""
    pos = pos.astype(np.float64)
    tgt, src = pos[targets.as_slice()], pos[sources.as_slice()]
    mass = np.concatenate([src[:, 3], np.zeros(targets.count)])
    return accelerations(
        np.vstack([src[:, :3], tgt[:, :3]]), mass, physics, targets=slice(sources.count, None)
    )


def within(budget: ErrorBudget, got: np.ndarray, ref: np.ndarray) -> list[str]:
    rel = relative_errors(got, ref)  # the max, and the 99th percentile for a budget that has one (a tree)
    return budget.judge({"max": float(rel.max()), "p99": float(np.percentile(rel, 99))})


# --- the checks every record passes (the hook for other backends) -----------------------------------------
def check_slices(evaluate, pos: np.ndarray, physics: Physics, budget: ErrorBudget) -> None:
    n = pos.shape[0]
    full = evaluate(pos, Span.all(n), Span.all(n))
    for targets in TARGETS:
        rows = targets.as_slice()
        others = np.ones(n, bool)
        others[rows] = False
        for sources in SOURCES:
            what = f"targets [{targets.start}, {targets.stop}) on sources [{sources.start}, {sources.stop})"
            got = evaluate(pos, targets, sources)
            assert np.isnan(got[others]).all(), f"{what}: rows outside the targets were written"
            if sources == Span.all(n):
                assert np.array_equal(got[rows], full[rows]), f"{what}: not the rows of the full evaluation"
            problems = within(budget, got[rows], reference(pos, physics, targets, sources))
            assert not problems, f"{what}: {'; '.join(problems)}"


def check_reference(evaluate, pos: np.ndarray, physics: Physics, budget: ErrorBudget) -> None:
    everyone = Span.all(pos.shape[0])
    problems = within(budget, evaluate(pos, everyone, everyone), reference(pos, physics, everyone, everyone))
    assert not problems, "; ".join(problems)


# --- the CPU records --------------------------------------------------------------------------------------
def cpu_evaluate(record: KernelRecord, physics: Physics):
    evaluator = record.policy.evaluator(record, physics)
    assert isinstance(evaluator, ForceEvaluator) and evaluator.record is record

    def evaluate(pos, targets, sources):
        acc = np.full(pos.shape, np.nan, pos.dtype)
        evaluator.evaluate(pos, acc, targets, sources)
        return acc[:, :3].astype(np.float64)

    return evaluate


CPU_RECORDS = [pytest.param(rec, id=rec.name) for rec in CPUBackend.kernels()]


@pytest.mark.parametrize("physics", list(PHYSICS))
@pytest.mark.parametrize("record", CPU_RECORDS)
def test_cpu_slices(record, physics):
    pos = cloud(N, seed=3, dtype=DTYPES[record.precision])
    check_slices(cpu_evaluate(record, PHYSICS[physics]), pos, PHYSICS[physics], record.error_budget)


@pytest.mark.parametrize("n", [1, 2, 31, N])
@pytest.mark.parametrize("physics", list(PHYSICS))
@pytest.mark.parametrize("record", CPU_RECORDS)
def test_cpu_record_within_its_error_budget(record, physics, n):
    pos = cloud(n, seed=n, dtype=DTYPES[record.precision])
    check_reference(cpu_evaluate(record, PHYSICS[physics]), pos, PHYSICS[physics], record.error_budget)


@pytest.mark.parametrize("record", CPU_RECORDS)
def test_cpu_policy_matches_the_record(record):
    assert np.dtype(record.policy.dtype) == np.dtype(DTYPES[record.precision])
    evaluator = record.policy.evaluator(record, Physics())
    pos, acc = cloud(10, seed=1, dtype=evaluator.dtype), np.zeros((10, 4), evaluator.dtype)
    with pytest.raises(ValueError, match="targets"):
        evaluator.evaluate(pos, acc, Span(5, 6), Span.all(10))
    with pytest.raises(ValueError, match="sources"):
        evaluator.evaluate(pos, acc, Span.all(10), Span(-1, 3))
