"""The force seam on the GPU: every CUDA record evaluates spans of targets against spans of sources.

For every record of the CUDA registry (walked, so a new variant is covered without touching this file):
- targets [i0, i0 + ni) against all sources give the matching rows of the full evaluation, for spans
  that are not multiples of any block size or tile (bitwise where the kernel's summation order does
  not depend on the span, else within 1e-5, ten times below the fp32 budget: the order of fp32
  partial sums);
- targets against a span of sources agree with the float64 reference on those sources within the
  record's own error budget;
- rows outside the targets are left untouched.
"""

from __future__ import annotations

import numpy as np
import pytest

from app.backends import backend_class
from app.backends.cuda import registry
from app.backends.cuda.policies import N3LPolicy, RegisterBlockedPolicy, StreamsPolicy
from app.core.errors import ConfigError
from app.engine.forces import Span
from app.model.physics import Physics, accelerations, relative_error
from app.tools.bench import bench_bodies

CUDA = backend_class("cuda")
pytestmark = pytest.mark.gpu  # (skipped where CUDA cannot run: tests/conftest.py)

N = 1000
SPANS = [(0, 1), (7, 333), (999, 1), (0, 1000), (129, 257)]
SENTINEL = 12345.0


def _bitwise(rec) -> bool:
    """Records whose per-target summation order does not depend on the span: one thread (or q) per
    target walking every source in order. Register blocking picks its number of source slices from the
    span, the streams variant moves targets between its check-free and its remainder kernel, and
    Newton's third law adds reactions with float atomics, whose order differs from run to run."""
    return not isinstance(rec.policy, RegisterBlockedPolicy | StreamsPolicy | N3LPolicy)


@pytest.fixture(scope="module")
def backend():
    b = CUDA()
    yield b
    b.close()


def _evaluate(backend, name: str, targets: Span, sources: Span) -> np.ndarray:
    """acc rows [0, N) after evaluating `targets` against `sources` into a buffer of sentinels."""
    ev = backend.evaluator(name)
    rec, _tun = ev.active(sources.count)
    dtype = np.float64 if rec.precision == "fp64" else np.float32
    host = np.full((backend.n, 4), SENTINEL, dtype=dtype)
    dev = backend.device
    with backend.state_arrays() as (_precision, pos, _vel):
        acc = dev.scratch("test-seam-acc", host.nbytes)
        dev.drv.memcpy_htod(acc, host)
        ev.evaluate(pos, acc, targets, sources)
        dev.drv.memcpy_dtoh(host, acc)
    return host[:, :3].astype(np.float64)


def _records():
    return [pytest.param(r.name, id=r.name) for r in registry.RECORDS]


@pytest.mark.parametrize("name", _records())
def test_target_spans_equal_the_rows_of_the_full_evaluation(backend, name):
    backend.load(bench_bodies(N), Physics(softening=0.01), kernel=name)
    everyone = Span.all(N)
    full = _evaluate(backend, name, everyone, everyone)
    rec = backend.evaluator(name).active(N)[0]
    for i0, ni in SPANS:
        part = _evaluate(backend, name, Span(i0, ni), everyone)
        rows = slice(i0, i0 + ni)
        outside = np.ones(N, bool)
        outside[rows] = False
        assert (part[outside] == SENTINEL).all(), f"{name}: rows outside [{i0}, {i0 + ni}) were written"
        if _bitwise(rec):
            assert np.array_equal(part[rows], full[rows]), f"{name} [{i0}, {i0 + ni}): not bitwise equal"
        else:
            worst, _ = relative_error(part[rows], full[rows])
            assert worst <= 1e-5, f"{name} [{i0}, {i0 + ni}): {worst:.3g}"


@pytest.mark.parametrize("name", _records())
def test_source_spans_agree_with_float64(backend, name):
    bodies = bench_bodies(N)
    physics = Physics(softening=0.01)
    backend.load(bodies, physics, kernel=name)
    start = backend.state()
    rec = backend.evaluator(name).active(N)[0]
    for (i0, ni), (j0, nj) in [((0, N), (100, 517)), ((300, 200), (250, 700)), ((5, 3), (0, 999))]:
        sources = Span(j0, nj)
        if rec.policy.targets_within_sources and not sources.contains(Span(i0, ni)):
            with pytest.raises(ConfigError, match="must lie within"):
                _evaluate(backend, name, Span(i0, ni), sources)
            continue
        got = _evaluate(backend, name, Span(i0, ni), sources)[i0 : i0 + ni]
        pos = start.pos.astype(np.float32).astype(np.float64) if rec.precision == "fp32" else start.pos
        mass = start.mass.astype(np.float32).astype(np.float64) if rec.precision == "fp32" else start.mass
        both = np.concatenate([pos[i0 : i0 + ni], pos[j0 : j0 + nj]])
        m = np.concatenate([np.zeros(ni), mass[j0 : j0 + nj]])  # targets as massless probes
        ref = accelerations(both, m, physics)[:ni]
        worst, _ = relative_error(got, ref)
        over = rec.error_budget.judge({"max": worst})
        assert not over, f"{name} targets [{i0}, {i0 + ni}) sources [{j0}, {j0 + nj}): {over}"


def test_work_is_counted_by_the_record(backend):
    backend.load(bench_bodies(N), Physics(softening=0.01), kernel="shared")
    t = backend.step(3)
    assert t.interactions == t.pair_equivalent == t.force_evals * N * N and t.force_evals == 4
    backend.load(bench_bodies(N), Physics(softening=0.01), kernel="atomics-n3l")
    with backend.state_arrays() as (_p, pos, _v):
        acc = backend.device.scratch("test-seam-work", 16 * N)
        work = backend.evaluator().evaluate(pos, acc, Span(0, 10), Span.all(N))
    assert work.pair_equivalent == 10 * N and work.interactions == N * N
