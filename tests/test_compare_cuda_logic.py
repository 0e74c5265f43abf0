"""One GPU's side of A/B and the error colours (app/backends/cuda/compare.py) without a GPU: the real
CudaCompare over a stand-in CuPy (numpy arrays whose `.data.ptr` names them in a table of "device
memory"), a stand-in GPU whose rows are in a tree's key order (`ids`: the body in each row) and evaluators
that sum in float64 on the host. What it pins is the host-side logic the GPU tests cannot isolate: which rows
are read for A and B, the scatter of every per-body value to its body's place, the pieces of the exact sum,
the colours' buffer and its host copy. tests/test_compare_gpu.py runs the same class on a real GPU."""

from __future__ import annotations

from contextlib import nullcontext
from types import SimpleNamespace

import numpy as np
import pytest

from app.backends.cuda import compare as cuda_compare
from app.engine.compare import ABCompare
from app.engine.error_colours import ExactErrors, error_positions
from app.engine.forces import KernelRecord, Span
from app.model.physics import Physics, accelerations, relative_errors
from app.parallel.multidevice import rows_holding

PHYS = Physics(softening=0.05, dt=1e-3)
N = 300
MEMORY: dict[int, np.ndarray] = {}  # "device pointer" -> the array there


class DevArray(np.ndarray):
    """A numpy array standing in for a CuPy one: `.data.ptr` names it in MEMORY, `.get()` copies it."""

    @property
    def data(self):
        MEMORY[id(self)] = self
        return SimpleNamespace(ptr=id(self))

    def get(self):
        return np.array(self)

    def max(self, *args, **kwargs):
        return _dev(np.max(np.asarray(self), *args, **kwargs))


def _dev(x) -> DevArray:
    return np.asarray(x).view(DevArray)


def _wrap(fn):
    return lambda *args, **kwargs: _dev(
        fn(*(np.asarray(a) if isinstance(a, DevArray) else a for a in args), **kwargs)
    )


def fake_cupy():
    def ndarray(shape, dtype, memptr):
        return MEMORY[memptr.ptr].view(dtype).reshape(shape).view(DevArray)

    cuda = SimpleNamespace(
        UnownedMemory=lambda ptr, size, owner: SimpleNamespace(ptr=int(ptr)),
        MemoryPointer=lambda memory, offset: SimpleNamespace(ptr=memory.ptr + offset),
        Device=lambda ordinal: nullcontext(),
        get_current_stream=lambda: SimpleNamespace(synchronize=lambda: None),
    )
    names = ("sqrt", "mean", "maximum", "where", "isfinite", "clip", "log10", "median", "percentile")
    return SimpleNamespace(
        cuda=cuda,
        ndarray=ndarray,
        zeros=lambda shape, dtype: np.zeros(shape, dtype).view(DevArray),
        asarray=lambda x: _dev(np.asarray(x)),
        linalg=SimpleNamespace(norm=_wrap(np.linalg.norm)),
        float32=np.float32,
        float64=np.float64,
        int32=np.int32,
        int64=np.int64,
        **{name: _wrap(getattr(np, name)) for name in names},
    )


class FakeEvent:
    def record(self):
        pass

    def synchronize(self):
        pass

    def query(self):
        return True

    def time_since(self, other):
        return 1.5  # ms


class FakeEvaluator:
    """A record "on the GPU": float64 sums on the host over the rows at the pointers it is given."""

    def __init__(self, record):
        self.record, self.prepared, self.calls = record, [], []

    def active(self, n, devices=1):
        return self.record, {}

    def prepare(self, n):
        self.prepared.append(n)

    def evaluate(self, pos, acc, targets: Span, sources: Span, stream=None):
        p, a = MEMORY[pos], MEMORY[acc]
        assert sources == Span.all(p.shape[0])
        rows = slice(targets.start, targets.stop)
        a[rows, :3] = accelerations(p[:, :3], p[:, 3], PHYS, targets=rows).astype(a.dtype)
        self.calls.append(targets)


def _register(array: np.ndarray) -> int:
    MEMORY[id(array)] = array
    return id(array)


class Scene:
    """Bodies in load order, the GPU's rows in a key order (row r holds body ids[r]), A's a(x) in it."""

    def __init__(self, seed: int = 2):
        rng = np.random.default_rng(seed)
        self.pos = np.zeros((N, 4), np.float32)
        self.pos[:, :3] = rng.normal(size=(N, 3))
        self.pos[:, 3] = 1.0 / 256  # exact in float32
        self.ids = rng.permutation(N).astype(np.int32)
        exact = accelerations(self.pos[:, :3].astype(np.float64), self.pos[:, 3].astype(np.float64), PHYS)
        # A: the exact sum off by a known relative error per body, from 1e-6 to 1e-2
        self.off = 10.0 ** rng.uniform(-6, -2, N)
        self.acc_a = exact * (1 + self.off[:, None])
        rows = {
            "pos": np.ascontiguousarray(self.pos[self.ids]),
            "acc": np.zeros((N, 4), np.float32),
            "ids": self.ids.copy(),
        }
        rows["acc"][:, :3] = self.acc_a[self.ids]
        self.rows = rows
        self.gpu = SimpleNamespace(
            n=N, fp64=False, key_ordered=True, ptr={k: _register(v) for k, v in rows.items()}
        )
        self.exact = exact
        self.a_float = rows["acc"][np.argsort(self.ids), :3].astype(np.float64)  # A as the GPU holds it


@pytest.fixture
def scene(monkeypatch):
    monkeypatch.setattr(cuda_compare, "cupy_module", fake_cupy)
    MEMORY.clear()
    s = Scene()
    records = [
        KernelRecord(
            name="fp64", doc="reference", backend="cuda", precision="fp64", roles=frozenset({"reference"})
        ),
        KernelRecord(name="tree", doc="B", backend="cuda", precision="fp32"),
    ]
    evaluators = {r.name: FakeEvaluator(r) for r in records}
    run = SimpleNamespace(
        ensure_acc=lambda: None,
        devices=[s.gpu],
        state_rows=lambda bodies: rows_holding(bodies, s.ids.astype(np.int64)),
    )
    device = SimpleNamespace(scope=nullcontext(), ordinal=0, drv=SimpleNamespace(Event=FakeEvent))
    backend = SimpleNamespace(
        device=device, n=N, gl_buffers=None, evaluator=evaluators.__getitem__, kernels=lambda: records
    )
    s.ops = cuda_compare.CudaCompare(backend, lambda: run)
    s.evaluators = evaluators
    yield s
    MEMORY.clear()


def test_b_reads_the_state_rows_and_its_sample_and_colours_are_each_bodys(scene):
    ops = scene.ops
    assert ops.evaluate_other("tree") == 1.5  # the events' time
    assert scene.evaluators["tree"].prepared == [N]  # loaded before its first timed evaluation
    b_load = accelerations(scene.pos[:, :3].astype(np.float64), scene.pos[:, 3].astype(np.float64), PHYS)
    b_float = b_load.astype(np.float32).astype(np.float64)  # B is fp32: its rows are float32
    rows = np.array([0, 5, 17, 299])  # bodies, load order
    a, b = ops.sample(rows)
    np.testing.assert_array_equal(a, scene.a_float[rows])
    np.testing.assert_allclose(b, b_float[rows], rtol=1e-12)
    stats = ops.colour_other()
    errors = relative_errors(scene.a_float, b_float)
    np.testing.assert_allclose(ops.paint(), error_positions(errors), atol=1e-6)  # load order
    assert stats["median"] == pytest.approx(float(np.median(errors)), rel=1e-9)
    assert stats["p99"] == pytest.approx(float(np.percentile(errors, 99)), rel=1e-9)
    ops.clear_colours()
    assert not ops.paint().any()


def test_an_fp64_b_reads_the_float_rows_promoted_and_ab_takes_the_numbers(scene):
    ab = ABCompare(k=1000)
    ab.kernel_b = "fp64"
    r = ab.tick(scene.ops, ("shared",), 0.5, N)
    expect = relative_errors(scene.a_float, accelerations(scene.pos[:, :3], scene.pos[:, 3], PHYS))
    assert r.b_ms == 1.5 and r.k == N and r.median == pytest.approx(float(np.median(expect)), rel=1e-9)
    assert r.median == pytest.approx(float(np.median(scene.off)), rel=1e-3)  # A's planted error


def test_the_exact_sum_in_pieces_over_a_snapshot_colours_each_body(scene):
    ops = scene.ops
    exact = ExactErrors()
    exact.rows = 64
    while exact.tick(ops, ("shared",), 0.5) is None:
        scene.rows["pos"][:] += 1.0  # the state moves on between pieces: the snapshot does not
    calls = scene.evaluators["fp64"].calls
    assert [c.start for c in calls][:2] == [0, 64] and sum(c.count for c in calls) == N
    errors = relative_errors(scene.a_float, scene.exact)
    np.testing.assert_allclose(ops.paint(), error_positions(errors), atol=1e-6)
    assert exact.latest.median == pytest.approx(float(np.median(errors)), rel=1e-9)
    assert exact.latest.cost_ms == pytest.approx(1.5 * len(calls))
