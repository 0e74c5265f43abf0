"""The GPU tree (`tree`, app/backends/cuda/tree.py, kernels/tree/) against its CPU twin `cpu-tree`.

docs/tree.md specifies one algorithm; the GPU build evaluates the float64 cube and keys and the float32
moments and opening rows as the twin does, operation by operation without FMA contraction, and both walks
make the same float32 opening test, so both accept the same cells: the rows are equal bit for bit, the
interaction lists group by group, and the accelerations agree to float32 summation order: the lists are
summed in another order (batches of 32 from a stack), which on ~6,000 terms with cancellation moves the
worst body by 5e-5 (ε = 0.01) to 1.2e-4 (ε = 0, close pairs unsoftened), measured at N = 20,011: 2e-4 on
the worst body and 1e-5 rms, five times below the tree's own error.
Also: spans, θ -> 0 against all-pairs, the degenerate inputs of issue 11, body identity through the
backend's steps, and a million bodies.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
from test_cpu_backend import plummer_like

from app.backends import backend_class
from app.backends.cpu_forces import BY_NAME as CPU_RECORDS
from app.core.errors import RuntimeFault
from app.engine.forces import Span
from app.model.physics import Physics, accelerations, relative_errors

CUDA = backend_class("cuda")
pytestmark = pytest.mark.gpu  # (skipped where CUDA cannot run: tests/conftest.py)
SOFT = Physics(softening=0.01)
REPULSION = Physics(softening=0.05, model="gravity-repulsion", repulsion=0.1)


@pytest.fixture(scope="module")
def device():
    from app.backends.cuda.device import CudaDevice

    dev = CudaDevice(0)
    yield dev
    dev.close()


def gpu_tree(device, pos, physics=SOFT, targets=None, sources=None, acc=None, **tunables):
    """(acc rows float64 (N, 3), ForceWork, evaluator); rows outside the targets stay NaN (or `acc`'s,
    float32 rows of last accelerations that the relative test reads)."""
    from app.backends.cuda.registry import RECORDS

    record = next(r for r in RECORDS if r.name == "tree")
    ev = record.policy.evaluator(record, device, {})
    ev.set_physics(physics)
    ev.set_tunables(**tunables)
    out, work = _evaluate_with(device, ev, pos, targets, sources, acc)
    return out, work, ev


def cpu_tree(pos, physics=SOFT, targets=None, sources=None, last=None, **tunables):
    record = CPU_RECORDS["cpu-tree"]
    ev = record.policy.evaluator(record, physics)
    ev.set_tunables(**tunables)
    n = pos.shape[0]
    acc = np.full((n, 4), np.nan, np.float32) if last is None else np.array(last, np.float32)
    work = ev.evaluate(
        np.ascontiguousarray(pos, np.float32), acc, targets or Span.all(n), sources or Span.all(n)
    )
    return acc[:, :3].astype(np.float64), work, ev


def cloud(n, seed=0):
    return plummer_like(n, seed).pos4(np.float32)


def agree(gpu, cpu, tol=2e-4):
    rel = relative_errors(gpu, cpu)
    rms = np.sqrt(np.mean(rel**2))
    assert rel.max() <= tol and rms <= tol / 20, (rel.max(), rms)


@pytest.mark.parametrize(
    "physics", [SOFT, Physics(softening=0.0), REPULSION], ids=["soft", "eps0", "repulsion"]
)
@pytest.mark.parametrize("group,leaf,theta", [(64, 16, 0.5), (32, 8, 0.7), (64, 32, 0.3), (128, 16, 0.6)])
def test_gpu_tree_matches_the_cpu_tree(device, physics, group, leaf, theta):
    pos = cloud(20_011, seed=3)
    tun = dict(group=group, leaf=leaf, theta=theta)
    got, work, ev = gpu_tree(device, pos, physics, **tun)
    ref, cwork, cev = cpu_tree(pos, physics, **tun)
    assert ev.levels[-1] == cev.last_tree.ncell  # the same cells
    assert (work.interactions, work.body_cell) == (cwork.interactions, cwork.body_cell)
    assert work.pair_equivalent == 20_011**2
    agree(got, ref)


@pytest.mark.parametrize("opening", ["cube", "bmax", "rel"])
@pytest.mark.parametrize("scene", ["plummer", "far-off-clump"])
@pytest.mark.parametrize("physics", [SOFT, REPULSION], ids=["gravity", "repulsion"])
def test_gpu_cells_and_lists_are_the_twins_bit_for_bit(device, physics, scene, opening):
    """The float32 opening rows (com, r_open^2) and interaction rows of every cell are the twin's bit for
    bit, and so are the interaction lists, group by group (issue 25: a float32 opening test that keeps the
    comparison exact), under either opening test (bmax: the bound cell_moments computes). far-off-clump: a
    cloud 30 units off the origin with a dense clump, so that cells go below level 15, where a float32 cube
    could not place their centres. rel: both walks read the same last accelerations (the twin's, from a
    bmax evaluation), and the relative rows [M b_max^3, guard^2] are the twin's too."""
    from app.backends.cpu_tree_kernels import pack_cells, relative_rows

    pos = cloud(20_011, seed=16)
    if scene == "far-off-clump":
        rng = np.random.default_rng(16)
        pos[:2000, :3] = pos[0, :3] + rng.normal(scale=2e-4, size=(2000, 3)).astype(np.float32)
        pos[:, :3] += np.float32(30.0)
    tun = dict(group=64, leaf=16, theta=0.6, opening=opening)
    last = None
    if opening == "rel":
        last = np.zeros((pos.shape[0], 4), np.float32)
        last[:, :3], bwork, _ = cpu_tree(pos, physics, **{**tun, "opening": "bmax"})
    _, work, ev = gpu_tree(device, pos, physics, acc=last, **tun)
    _, cwork, cev = cpu_tree(pos, physics, last=last, **tun)
    if opening == "rel":  # a fresh evaluator's first walk is the cube test's; the second reads `last`
        _, work = _evaluate_with(device, ev, pos, acc=last)
        cacc = np.array(last, np.float32)
        cwork = cev.evaluate(
            np.ascontiguousarray(pos, np.float32), cacc, Span.all(pos.shape[0]), Span.all(pos.shape[0])
        )
    tree = cev.last_tree
    n = tree.ncell
    if opening == "rel":  # the relative test ran: other lists than the cube's and bmax's
        _, cube_work, _ = cpu_tree(pos, physics, **{**tun, "opening": "cube"})
        assert cwork.interactions not in (bwork.interactions, cube_work.interactions)
        rel = ev._buffers["rel"][: 2 * n].get().reshape(n, 2)
        assert np.array_equal(rel.view(np.uint32), relative_rows(tree.mass, tree.bmax).view(np.uint32))
    assert ev.levels[-1] == n and (scene == "plummer" or tree.level.max() >= 15)
    mac = ev._buffers["mac"][: 4 * n].get().reshape(n, 4)
    pack = ev._buffers["pack"][: 12 * n].get().reshape(n, 12)
    trace_factor = 1.0 if physics.h else float(np.float32(physics.softening**2))
    want = pack_cells(tree.com, tree.mass, tree.quad, tree.trace, np.float32, trace_factor)
    rows = tree.mac(0.6, "cube" if opening == "rel" else opening)
    assert np.array_equal(mac.view(np.uint32), rows.view(np.uint32))
    assert np.array_equal(pack.view(np.uint32), want.view(np.uint32))
    gpu, cpu = ev.last_groups(), cev.last_groups()
    for key in ("start", "nbody", "ncell", "nactive"):
        assert np.array_equal(gpu[key], cpu[key]), key
    assert (work.interactions, work.body_cell) == (cwork.interactions, cwork.body_cell)


def test_stages_and_groups(device):
    from app.backends.cpu_tree import group_starts

    pos = cloud(10_000, seed=4)
    _, work, ev = gpu_tree(device, pos, group=64)
    _, _, cev = cpu_tree(pos, group=64)
    groups = ev.last_groups()
    t = cev.last_tree
    assert np.array_equal(groups["start"], group_starts(t.start, t.count, t.nchild, 64))
    assert groups["nactive"].sum() == 10_000 and (np.diff(groups["start"]) <= 64).all()
    assert (
        int((groups["nactive"].astype(np.int64) * (groups["nbody"] + groups["ncell"])).sum())
        == work.interactions
    )
    stages = ev.stage_ms()
    assert list(stages) == ["keys", "sort", "build", "moments", "walk"]
    assert all(v > 0 for v in stages.values())
    assert ev.stage_ms() == dict.fromkeys(stages, 0.0)  # reset by reading


def test_small_theta_is_all_pairs(device):
    pos = cloud(3000, seed=5)
    got, work, _ = gpu_tree(device, pos, theta=1e-9)
    p = pos.astype(np.float64)
    ref = accelerations(p[:, :3], p[:, 3], SOFT)
    assert relative_errors(got, ref).max() <= 1e-4  # the fp32 all-pairs budget: 1.3e-5 measured
    assert work.interactions == work.pair_equivalent and work.body_cell == 0


def test_error_within_budget_and_falls_with_theta(device):
    pos = cloud(16_384, seed=6)
    p = pos.astype(np.float64)
    ref = accelerations(p[:, :3], p[:, 3], SOFT)
    p99 = []
    for theta in (0.9, 0.7, 0.5, 0.3):
        got, _, ev = gpu_tree(device, pos, theta=theta)
        p99.append(np.percentile(relative_errors(got, ref), 99))
    assert p99 == sorted(p99, reverse=True) and p99[2] <= ev.record.error_budget.p99_rel


def test_target_spans_are_rows_of_the_full_evaluation(device):
    pos = cloud(5000, seed=7)
    full, _, _ = gpu_tree(device, pos)
    for i0, ni in [(0, 1), (17, 1000), (4999, 1), (1234, 3000)]:
        part, work, _ = gpu_tree(device, pos, targets=Span(i0, ni))
        assert np.isnan(np.delete(part, np.s_[i0 : i0 + ni], axis=0)).all()
        assert np.array_equal(part[i0 : i0 + ni], full[i0 : i0 + ni])
    # a span of sources holding the targets: the tree of those sources only, as on the CPU
    got, work, _ = gpu_tree(device, pos, targets=Span(1000, 500), sources=Span(900, 2000))
    ref, cwork, _ = cpu_tree(pos, targets=Span(1000, 500), sources=Span(900, 2000))
    agree(got[1000:1500], ref[1000:1500])
    assert work.interactions == cwork.interactions


@pytest.mark.parametrize("softening", [0.0, 0.01])
def test_degenerate_inputs(device, softening):
    physics = Physics(softening=softening)
    one = np.array([[0.3, -0.2, 0.1, 1.0]], np.float32)
    got, _, _ = gpu_tree(device, one, physics)
    assert np.array_equal(got, np.zeros((1, 3)))
    two = np.array([[0.0, 0.0, 0.0, 1.0], [1.0, 0.5, 0.0, 2.0]], np.float32)
    got, work, _ = gpu_tree(device, two, physics)
    ref = accelerations(two[:, :3].astype(float), two[:, 3].astype(float), physics)
    assert np.allclose(got, ref, rtol=1e-6)
    assert work.interactions == 4
    same = np.tile(np.array([[1.5, -2.0, 0.25, 0.01]], np.float32), (100, 1))
    got, work, ev = gpu_tree(device, same, physics, leaf=8)
    assert np.isfinite(got).all() and np.abs(got).max() == 0.0
    assert len(ev.levels) - 1 == 22 and work.interactions == 100 * 100  # a chain down to level 21


def test_a_body_escaping_to_1e6(device):
    pos = cloud(5000, seed=8)
    pos[17, :3] = (1e6, -3.0, 2.0)
    got, work, _ = gpu_tree(device, pos)
    ref, cwork, _ = cpu_tree(pos)
    assert np.isfinite(got).all() and work.interactions == cwork.interactions
    agree(got, ref)


def test_backend_steps_keep_identity(device):
    """The tree reorders its copies every step; the state (and so colours, ids, snapshots) does not move:
    after steps with the GPU tree, body i is where the CPU tree put body i."""
    bodies = plummer_like(4000, seed=9)
    physics = Physics(softening=0.01, dt=1e-3)
    runs = []
    for backend, kernel in ((CUDA(), "tree"), (backend_class("cpu")(), "cpu-tree")):
        backend.load(bodies, physics, kernel=kernel)
        t = backend.step(20)
        assert t.interactions < t.pair_equivalent and t.force_evals >= 20
        runs.append(backend.state())
        backend.close()
    assert np.abs(runs[0].pos - runs[1].pos).max() < 1e-5
    assert np.abs(runs[0].pos - bodies.pos).max() > 1e-4  # they moved


@pytest.mark.slow
def test_a_million_bodies(device):
    pos = cloud(1 << 20, seed=10)
    got, work, ev = gpu_tree(device, pos, theta=0.5)
    from app.commands.reference import reference_accelerations

    rows = np.random.default_rng(0).choice(pos.shape[0], 512, replace=False)
    p = pos.astype(np.float64)
    ref = reference_accelerations(p[:, :3], p[:, 3], SOFT, rows, "cuda")
    rel = relative_errors(got[rows], ref)
    assert np.percentile(rel, 99) <= 1e-3 and np.isfinite(got).all()
    assert 1_000 < work.interactions / pos.shape[0] < 20_000


def _normal_bodies(n: int, seed: int = 0):
    """n bodies in a unit gaussian blob (cheap to make at 16M, unlike a Plummer sphere)."""
    from app.model.bodies import Bodies

    rng = np.random.default_rng(seed)
    return Bodies.from_arrays(rng.standard_normal((n, 3)), np.zeros((n, 3)), np.full(n, 1.0 / n))


def test_out_of_memory_names_the_tree_and_what_fits(monkeypatch):
    """Too little free memory for the tree's buffers: all-pairs' message, said before any work, and the
    backend keeps its state."""
    from app.backends.cuda.tree import cupy_module

    pool = cupy_module().get_default_memory_pool()
    gc.collect()
    pool.free_all_blocks()  # CuPy's unused blocks count as free
    backend = CUDA()
    try:
        backend.load(_normal_bodies(64), SOFT, kernel="tree")
        pool.free_all_blocks()
        # A free block inside a chunk that also holds a live array cannot be released: earlier tests can
        # leave megabytes so (2.4 MB after tests/test_blocksteps_gpu.py on an H200, held by two arrays that
        # no Python object refers to), which would cover the few MB a small N's tree needs. At N = 65,536
        # the tree's buffers (about 20 MB) are far beyond them.
        n = 1 << 16
        room = n * 52 * 2  # twice the fp32 state (which fits), a third of the tree's buffers
        assert pool.free_bytes() < room, pool.free_bytes()
        monkeypatch.setattr(backend.device.drv, "mem_get_info", lambda: (room, 80 * 2**30))
        said = r"out of GPU memory: N = 65,536 .*the tree's buffers.*N ≈ [\d,]+ fits"
        with pytest.raises(RuntimeFault, match=said):
            backend.load(_normal_bodies(n), SOFT, kernel="tree")
        monkeypatch.undo()
        assert backend.n == 64
        backend.step(1)
    finally:
        backend.close()


@pytest.mark.slow
def test_out_of_memory_at_16m_with_the_device_nearly_full():
    """A real shortage at N = 16,777,216: the device filled until the state fits but the tree does not."""
    backend = CUDA()
    eaten = []
    try:
        backend.load(_normal_bodies(64), SOFT, kernel="tree")
        drv = backend.device.drv
        n = 1 << 24
        with backend.device.scope:
            leave = n * 52 + (256 << 20)  # the fp32 state (52 B per body) and a little
            while (free := drv.mem_get_info()[0]) > leave + (1 << 30):
                eaten.append(drv.mem_alloc(min(free - leave, 4 << 30)))
        with pytest.raises(RuntimeFault, match=r"out of GPU memory: N = 16,777,216 .*the tree's buffers"):
            backend.load(_normal_bodies(n), SOFT, kernel="tree")
    finally:
        for block in eaten:
            block.free()
        backend.close()


def test_bench_sweeps_the_tree_beside_all_pairs_with_its_error_sample():
    """`bench` on the device: θ sweeps the tree only; each tree row samples its error against the exact
    fp32 all-pairs (`shared`) and the error falls as θ falls; the same CPU-side logic as
    tests/test_bench_sweep.py, on the CUDA backend's force_error_sample and CUDA events."""
    from app.tools import bench

    result = bench.run_bench(
        CUDA,
        ["tree", "shared"],
        [65536],
        warmup=1,
        repeats=3,
        progress=False,
        scenes=["plummer", "collision"],
        tunables={"theta": [0.3, 0.9], "opening": ["cube"]},  # θ's test at every step (rel: the first)
        error_sample=1024,
    )
    for scene in ("plummer", "collision"):
        rows = [r for r in result["results"] if r["scene"] == scene]
        assert [(r["kernel"], r["tunables"]) for r in rows] == [
            ("tree", {"theta": 0.3, "opening": "cube"}),
            ("tree", {"theta": 0.9, "opening": "cube"}),
            ("shared", {}),
        ]
        assert all(r["status"] == "ok" for r in rows), rows
        fine, coarse, exact = rows
        assert "error" not in exact and fine["tunables_used"]["theta"] == 0.3
        assert fine["error"]["sample"] == 1024 and fine["error"]["p99"] < coarse["error"]["p99"] / 3
        assert fine["error"]["p99"] <= 1e-3 and fine[bench.STAGES_FIELD]["walk"] > 0
        assert fine["step_median_ms"] > fine["median_ms"]  # + the integrate kernel
    within = result["fastest_within_budget"]  # θ = 0.3 is within the budget: a setting is always named
    assert [e["scene"] for e in within] == ["plummer", "collision"] and all(e["tunables"] for e in within)


def on_device(device, pos, call, acc=None):
    """(acc rows float64 (N, 3), what `call(pos_ptr, acc_ptr)` returned): `pos` uploaded, acc NaN before
    the call (or the float32 rows `acc`: the last accelerations the relative test reads) and read back
    after it."""
    n = pos.shape[0]
    host = np.full((n, 4), np.nan, np.float32) if acc is None else np.array(acc, np.float32)
    with device.scope:
        p = device.scratch("tree-test-pos", 16 * n)
        a = device.scratch("tree-test-acc", 16 * n)
        device.drv.memcpy_htod(p, np.ascontiguousarray(pos, np.float32))
        device.drv.memcpy_htod(a, host)
        result = call(p, a)
        device.drv.memcpy_dtoh(host, a)
    return host[:, :3].astype(np.float64), result


def _evaluate_with(device, ev, pos, targets=None, sources=None, acc=None):
    """(acc rows float64 (N, 3), ForceWork) of an evaluator on positions `pos` (its buffers and depth
    kept across calls); rows outside the targets stay NaN (or `acc`'s, the last accelerations)."""
    everyone = Span.all(pos.shape[0])
    return on_device(
        device, pos, lambda p, a: ev.evaluate(p, a, targets or everyone, sources or everyone), acc
    )


def test_a_deeper_tree_than_the_last_build_queues_more_levels(device):
    """The build queues as many levels as the last one had (plus two) before it looks: a shallow tree, then
    the 22-level chain, then the shallow tree again, all with one evaluator, match fresh evaluations."""
    shallow = cloud(3000, seed=4)
    chain = np.tile(np.array([[1.5, -2.0, 0.25, 0.01]], np.float32), (100, 1))
    fresh = {}
    for name, pos in (("shallow", shallow), ("chain", chain)):
        got, work, ev = gpu_tree(device, pos, leaf=8)
        fresh[name] = (got, work.interactions, list(ev.levels))
    _, _, ev = gpu_tree(device, shallow, leaf=8)
    for name, pos in (("chain", chain), ("shallow", shallow)):
        got, work = _evaluate_with(device, ev, pos)
        assert list(ev.levels) == fresh[name][2] and work.interactions == fresh[name][1], name
        assert np.array_equal(got, fresh[name][0]), name
    assert len(fresh["chain"][2]) - 1 == 22 and len(fresh["shallow"][2]) - 1 < 12
