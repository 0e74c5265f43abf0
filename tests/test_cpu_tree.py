"""`cpu-tree` (app/backends/cpu_tree.py, docs/tree.md): keys, tree, moments, walk and work counts.

The registry walk (tests/test_registry.py) and the force seam (tests/test_force_seam.py) also check the
record: float64 agreement within its error budget for both models and N = 1, 2, 31, 1000, and a span of
targets getting bitwise the rows of the full evaluation.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from test_cpu_backend import plummer_like

from app.backends import cpu_tree
from app.backends import cpu_tree_kernels as k
from app.backends.cpu import CPUBackend
from app.backends.cpu_forces import BY_NAME
from app.core.errors import ConfigError
from app.core.paths import KERNELS
from app.engine.forces import Span
from app.model.physics import Physics, accelerations, relative_errors

RECORD = BY_NAME["cpu-tree"]
SOFT = Physics(softening=0.01)


def cloud(n: int, seed: int = 0) -> np.ndarray:
    return plummer_like(n, seed).pos4(np.float32)


def evaluate(pos, physics=SOFT, targets=None, sources=None, **tunables):
    """(acc rows as float64 (N, 3), ForceWork, evaluator); rows outside the targets stay NaN."""
    evaluator = RECORD.policy.evaluator(RECORD, physics)
    evaluator.set_tunables(**tunables)
    n = pos.shape[0]
    acc = np.full(pos.shape, np.nan, pos.dtype)
    work = evaluator.evaluate(pos, acc, targets or Span.all(n), sources or Span.all(n))
    return acc[:, :3].astype(np.float64), work, evaluator


def reference(pos, physics=SOFT):
    p = pos.astype(np.float64)
    return accelerations(p[:, :3], p[:, 3], physics)


def errors(got, ref) -> dict[str, float]:
    """{'max': .., 'p99': ..} of the per-body relative errors (what ErrorBudget.judge reads)."""
    rel = relative_errors(got, ref)
    return {"max": float(rel.max()), "p99": float(np.percentile(rel, 99))}


# --- keys ------------------------------------------------------------------------------------------------
def slow_key(ix: int, iy: int, iz: int) -> int:
    key = 0
    for b in range(20, -1, -1):  # from the top: one octant (x y z bits) per level
        key = (key << 3) | (((ix >> b) & 1) << 2) | (((iy >> b) & 1) << 1) | ((iz >> b) & 1)
    return key


def test_keys_are_morton_order():
    xyz = np.random.default_rng(1).normal(size=(300, 3))
    lo, size = k.bounding_cube(xyz)
    ijk = k.integer_coords(xyz, lo, size)
    keys = k.morton_keys(xyz, lo, size)
    assert keys.dtype == np.int64 and (keys >= 0).all()
    assert (ijk >= 0).all() and (ijk < 2**21).all()
    assert np.array_equal(ijk, np.floor((xyz - lo) / size * 2**21).astype(np.int64))
    assert [slow_key(*map(int, c)) for c in ijk] == keys.tolist()
    # sorted keys = Z order: the sequence of octants from the root down, compared lexicographically
    octants = [tuple(int(key >> (3 * (20 - lv))) & 7 for lv in range(21)) for key in keys.tolist()]
    order = np.argsort(keys, kind="stable")
    assert [octants[i] for i in order] == sorted(octants)


def test_keys_clamp_and_never_nan():
    lo, size = np.zeros(3), 1.0
    xyz = np.array([[-5.0, 0.5, 2.0], [np.nan, np.inf, -np.inf], [1e300, 0.0, 0.999999999]])
    ijk = k.integer_coords(xyz, lo, size)
    assert ijk.tolist() == [[0, 2**20, 2**21 - 1], [0, 2**21 - 1, 0], [2**21 - 1, 0, 2**21 - 1]]
    keys = k.morton_keys(xyz, lo, size)
    assert (keys >= 0).all() and keys.max() <= 2**63 - 1
    # the cube of one point, of an escaped body, of an infinity
    for pts in (np.ones((5, 3)), np.vstack([np.zeros((5, 3)), [[1e6, 0, 0]]]), np.array([[0, 0, np.inf]])):
        lo, size = k.bounding_cube(pts)
        assert np.isfinite(lo).all() and np.isfinite(size) and size > 0
        assert (k.integer_coords(pts, lo, size) < 2**21).all()


# --- tree and moments ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tree():
    return cpu_tree.build(cloud(3000, seed=7).astype(np.float64), leaf=16)


def test_tree_structure(tree):
    assert tree.count[0] == 3000 and tree.level[0] == 0
    assert (np.diff(tree.keys) >= 0).all()
    for c in range(tree.ncell):
        s, e = tree.start[c], tree.start[c] + tree.count[c]
        lv = tree.level[c]
        assert (tree.keys[s:e] >> (3 * (21 - lv)) == tree.prefix[c]).all(), "a cell is a key prefix"
        if tree.nchild[c] == 0:
            assert tree.count[c] <= 16 or lv == 21
        else:
            kids = range(tree.child[c], tree.child[c] + tree.nchild[c])
            assert tree.count[c] > 16 and sum(tree.count[j] for j in kids) == tree.count[c]
            assert all(tree.level[j] == lv + 1 and tree.prefix[j] >> 3 == tree.prefix[c] for j in kids)
            assert tree.start[tree.child[c]] == s
        # every body lies in its cell's cube
        half = tree.side[c] / 2 * (1 + 1e-9)
        centre = tree.lo + tree.offset[c]
        assert (np.abs(tree.x[s:e] - centre[0]) <= half).all()
        assert (np.abs(tree.z[s:e] - centre[2]) <= half).all()


def _bodies(tree, c):
    """The positions (k, 3) and masses (k,) of cell c's bodies in float64 (the tree's float32 values)."""
    s = slice(tree.start[c], tree.start[c] + tree.count[c])
    return np.array([tree.x[s], tree.y[s], tree.z[s]], np.float64).T, tree.m[s].astype(np.float64)


def test_masses_and_centres_of_mass_sum_to_the_totals_at_every_level(tree):
    """The float32 moments (the GPU's) within a few float32 roundings of float64 sums over the same bodies:
    masses to 1e-6, centres of mass to 1e-6 of their cell's side (measured 2e-7 and 2e-7)."""
    x, m = _bodies(tree, 0)
    total, first = m.sum(), m @ x
    mass, com = tree.mass.astype(np.float64), tree.com.astype(np.float64)
    for lv in range(int(tree.level.max()) + 1):
        # the cells of a level and the leaves above it partition the bodies
        cut = (tree.level == lv) | ((tree.level < lv) & (tree.nchild == 0))
        assert tree.count[cut].sum() == 3000
        assert mass[cut].sum() == pytest.approx(total, rel=1e-6)
        assert np.allclose(mass[cut] @ com[cut], first, rtol=0, atol=1e-6 * total * tree.side[0])
    for c in range(tree.ncell):  # and each cell's are its bodies'
        x, m = _bodies(tree, c)
        assert mass[c] == pytest.approx(m.sum(), rel=1e-6)
        assert np.abs(com[c] - m @ x / m.sum()).max() <= 1e-6 * tree.side[c]


def test_a_far_off_cloud_keeps_its_centres_of_mass_to_float32_precision():
    """Summed relative to a point of the cell, the centres of mass of a cloud 1,000 units off the origin
    stay within 1.5 float32 units of |com| (measured 0.97; float32 sums of m x over a leaf: 3.6)."""
    pos = cloud(3000, seed=7)
    pos[:, :3] += np.float32(1000.0)
    tree = cpu_tree.build(pos, leaf=16)
    for c in range(tree.ncell):
        x, m = _bodies(tree, c)
        com = m @ x / m.sum()
        assert (np.abs(tree.com[c] - com) <= 1.5 * np.spacing(np.abs(com).astype(np.float32))).all(), c


def test_quadrupoles_match_a_direct_sum(tree):
    for c in range(tree.ncell):
        x, m = _bodies(tree, c)
        d = x - m @ x / m.sum()
        r2 = np.einsum("ij,ij->i", d, d)
        q = 3 * np.einsum("i,ij,ik->jk", m, d, d) - np.eye(3) * (m @ r2)
        want = np.array([q[0, 0], q[1, 1], q[2, 2], q[0, 1], q[0, 2], q[1, 2]])
        scale = tree.mass[c] * tree.side[c] ** 2
        assert np.allclose(tree.quad[c], want, rtol=0, atol=1e-6 * scale)  # float32: measured 6e-8
        assert tree.trace[c] == pytest.approx(m @ r2, rel=1e-6, abs=1e-6 * scale)
        assert abs(tree.quad[c, :3].astype(np.float64).sum()) <= 1e-6 * scale  # traceless


def _moments_in_numpy_float32(tree):
    """`moments` again, one numpy float32 scalar operation at a time in kernels/tree/build.cu's order:
    what the GPU computes, written without numba (so a float64 promotion or a fused operation in the
    numba kernel would show as a difference)."""
    f32 = np.float32
    mass = np.zeros(tree.ncell, f32)
    com = np.zeros((tree.ncell, 3), f32)
    m2 = np.zeros((tree.ncell, 6), f32)
    pairs = ((0, 0), (1, 1), (2, 2), (0, 1), (0, 2), (1, 2))
    for c in range(tree.ncell - 1, -1, -1):
        if tree.nchild[c] == 0:
            idx = range(tree.start[c], tree.start[c] + tree.count[c])
            pts = [(np.array([tree.x[b], tree.y[b], tree.z[b]]), tree.m[b]) for b in idx]
            two = [(p, w, None) for p, w in pts]
        else:
            idx = range(tree.child[c], tree.child[c] + tree.nchild[c])
            pts = [(com[k], mass[k]) for k in idx]
            two = [(com[k], mass[k], m2[k]) for k in idx]
        ref, mt, s = pts[0][0], f32(0), np.zeros(3, f32)
        for p, w in pts:
            mt = f32(mt + w)
            s = s + w * (p - ref)
        if mt != 0:
            centre = ref + s / mt
        else:
            weights = [f32(1)] * len(pts) if tree.nchild[c] == 0 else [f32(tree.count[k]) for k in idx]
            s = np.zeros(3, f32)
            for (p, _), w in zip(pts, weights, strict=True):
                s = s + w * (p - ref)
            centre = ref + s / f32(tree.count[c])
        q = np.zeros(6, f32)
        for p, w, own in two:
            d = p - centre
            for j, (a, b) in enumerate(pairs):
                term = w * d[a] * d[b]
                q[j] = q[j] + (own[j] + term if tree.nchild[c] else term)
        mass[c], com[c], m2[c] = mt, centre, q
    return mass, com, m2


def test_moments_are_the_gpus_float32_operations():
    pos = cloud(500, seed=15)
    pos[-5:, :3] = np.float32(4.0) + np.arange(15, dtype=np.float32).reshape(5, 3) * np.float32(0.01)
    pos[-5:, 3] = 0.0  # massless cells far off: the mean position
    tree = cpu_tree.build(pos, leaf=8)
    assert (tree.mass == 0).sum() >= 1
    mass, com, m2 = _moments_in_numpy_float32(tree)
    trace = (m2[:, 0] + m2[:, 1]) + m2[:, 2]
    assert tree.mass.dtype == tree.com.dtype == tree.quad.dtype == np.float32
    assert np.array_equal(tree.mass, mass) and np.array_equal(tree.com, com)
    assert np.array_equal(tree.trace, trace)
    assert np.array_equal(tree.quad[:, 3:], np.float32(3) * m2[:, 3:])
    assert np.array_equal(tree.quad[:, :3], np.float32(3) * m2[:, :3] - trace[:, None])


# --- the walk --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "physics",
    [SOFT, Physics(softening=0.0), Physics(softening=0.01, model="gravity-repulsion", repulsion=1e-3)],
    ids=["soft", "eps0", "repulsion"],
)
def test_small_theta_is_all_pairs(physics):
    pos = cloud(1500, seed=2)
    got, work, _ = evaluate(pos, physics, theta=1e-9)
    assert work.interactions == work.pair_equivalent == 1500**2 and work.body_cell == 0
    worst = errors(got, reference(pos, physics))["max"]
    assert worst < 2e-5, worst  # float32 rounding only (cpu-simd's budget is 1e-4)


def test_error_falls_with_theta():
    pos = cloud(4000, seed=3)
    ref = reference(pos)
    rows = []
    for theta in (0.9, 0.7, 0.5, 0.3):
        got, work, _ = evaluate(pos, theta=theta)
        rows.append({**errors(got, ref), "interactions": work.interactions})
    for coarse, fine in zip(rows, rows[1:], strict=False):  # the max is one body: monotone only end to end
        assert fine["p99"] < coarse["p99"], rows
        assert fine["interactions"] > coarse["interactions"], rows
    assert rows[-1]["max"] < rows[0]["max"] / 10, rows
    assert not RECORD.error_budget.judge(rows[2]), rows  # the default theta = 0.5


@pytest.mark.parametrize("leaf", [8, 64])
@pytest.mark.parametrize("group", [16, 128])
def test_tunables_keep_the_budget(leaf, group):
    """Smaller groups have smaller boxes, so a cell is accepted nearer to them: at θ = 0.5 group 16 and
    leaf 8 give p99 1.1e-3 here; θ = 0.45 keeps every combination within the budget."""
    pos = cloud(2000, seed=4)
    got, _, _ = evaluate(pos, leaf=leaf, group=group, theta=0.45)
    assert not RECORD.error_budget.judge(errors(got, reference(pos)))


def test_work_counts():
    n = 3000
    pos = cloud(n, seed=5)
    _, work, _ = evaluate(pos)
    assert work.pair_equivalent == n * n and work.evaluations == 1
    assert 0 < work.body_cell < work.interactions < n * n
    _, part, _ = evaluate(pos, targets=Span(100, 200), sources=Span(0, 2500))
    assert part.pair_equivalent == 200 * 2500 and 0 < part.interactions <= 200 * 2500


def test_spans_agree_with_the_full_evaluation():
    n = 2000
    pos = cloud(n, seed=6)
    full, _, _ = evaluate(pos, group=32)
    for targets in (Span(0, 1), Span(13, 700), Span(1999, 1), Span(64, 64)):
        got, _, _ = evaluate(pos, targets=targets, group=32)
        rows = targets.as_slice()
        assert np.array_equal(got[rows], full[rows])
        outside = np.ones(n, bool)
        outside[rows] = False
        assert np.isnan(got[outside]).all()
    # targets outside the sources: keyed on their own, still within the budget
    targets, sources = Span(1500, 500), Span(0, 1500)
    got, _, _ = evaluate(pos, targets=targets, sources=sources)
    p = pos.astype(np.float64)
    mass = np.concatenate([p[:1500, 3], np.zeros(500)])
    ref = accelerations(np.vstack([p[:1500, :3], p[1500:, :3]]), mass, SOFT, targets=slice(1500, None))
    assert not RECORD.error_budget.judge(errors(got[1500:], ref))


# --- degenerate inputs -----------------------------------------------------------------------------------
@pytest.mark.parametrize("softening", [0.0, 0.01])
def test_one_and_two_bodies(softening):
    physics = Physics(softening=softening)
    one = np.array([[0.3, -0.2, 0.1, 1.0]], np.float32)
    got, work, _ = evaluate(one, physics)
    assert np.array_equal(got, np.zeros((1, 3))) and work.pair_equivalent == 1
    two = np.array([[0.0, 0.0, 0.0, 1.0], [1.0, 0.5, 0.0, 2.0]], np.float32)
    got, work, _ = evaluate(two, physics)
    assert np.allclose(got, reference(two, physics), rtol=1e-6) and work.interactions == 4


@pytest.mark.parametrize("softening", [0.0, 0.01])
def test_all_bodies_at_one_point(softening):
    pos = np.tile(np.array([[1.5, -2.0, 0.25, 0.01]], np.float32), (100, 1))
    got, work, ev = evaluate(pos, Physics(softening=softening), leaf=8)
    assert np.isfinite(got).all() and np.abs(got).max() == 0.0  # every pair at distance 0
    tree = ev.last_tree
    assert tree.level.max() == 21 and tree.ncell == 22  # one chain of single children down to level 21
    assert work.interactions == 100 * 100


def test_a_body_escaping_to_1e6():
    pos = cloud(500, seed=8)
    pos[17, :3] = (1e6, -3.0, 2.0)
    got, _, ev = evaluate(pos)
    assert np.isfinite(got).all()
    assert (ev.last_tree.keys >= 0).all()
    rel = relative_errors(got, reference(pos))
    assert np.percentile(rel, 99) <= RECORD.error_budget.p99_rel


# --- the record and the backend --------------------------------------------------------------------------
def test_record_tunables():
    assert RECORD.default_tunables() == {
        "theta": 0.5,
        "leaf": 16,
        "group": 64,
        "rebuild_every": 16,
        "rebuild_rule": "adaptive",
        "opening": "rel",
        "alpha": "auto",  # 0.001 below 1M bodies (test_alpha_by_n.py)
    }
    with pytest.raises(ConfigError, match=r"cpu-tree.theta"):
        RECORD.validate_tunables({"theta": 0.0})
    with pytest.raises(ConfigError, match=r"cpu-tree.leaf: 12 is not one of 8, 16, 32, 64"):
        RECORD.validate_tunables({"leaf": 12})
    assert RECORD.error_budget.p99_rel == 1e-3


def test_backend_steps_with_the_tree():
    backend = CPUBackend()
    bodies = plummer_like(1000, seed=9)
    backend.load(bodies, Physics(softening=0.01, dt=1e-3), kernel="cpu-tree")
    backend.set_tunables(theta=0.9)
    timings = backend.step(5)
    assert timings.kernel == "cpu-tree" and timings.interactions < timings.pair_equivalent
    assert timings.pair_equivalent % 1000**2 == 0 and timings.pair_equivalent >= 5 * 1000**2
    state = backend.state()
    assert np.isfinite(state.pos).all()
    assert np.abs(state.pos - bodies.pos).max() < 0.05
    backend.close()


@pytest.mark.parametrize(
    "physics",
    [Physics(softening=0.05), Physics(softening=0.05, model="gravity-repulsion", repulsion=0.1)],
    ids=["gravity", "repulsion"],
)
def test_one_accepted_cell_is_a_quadrupole(physics):
    """A compact cluster seen from a massless target at distance D: the cell is accepted as a whole
    (one body-cell interaction), and its error against the direct sum falls like (size / D)^3 (the
    octupole: monopole + quadrupole are exact to second order) where a monopole alone falls like ^2."""
    rng = np.random.default_rng(11)
    cluster = rng.uniform(-0.1, 0.1, size=(200, 3)) * [1.0, 0.6, 0.3]  # flattened: a real quadrupole
    direction = np.array([0.48, -0.6, 0.64])
    mass = rng.uniform(0.5, 1.5, 200) / 200
    errs = []
    for dist in (1.5, 3.0):
        pos = np.zeros((201, 4), np.float32)
        pos[:200, :3] = cluster
        pos[:200, 3] = mass
        pos[200, :3] = dist * direction  # mass 0
        got, work, _ = evaluate(pos, physics, targets=Span(200, 1), sources=Span(0, 200), theta=0.5)
        assert work.interactions == work.body_cell == 1 and work.pair_equivalent == 200
        p = pos.astype(np.float64)
        ref = accelerations(p[:, :3], p[:, 3], physics, targets=slice(200, 201))[0]
        errs.append(np.linalg.norm(got[200] - ref) / np.linalg.norm(ref))
    # measured (gravity): 1.5e-5 then 1.8e-6, a ratio of 8 (third order); a monopole alone: 1.8e-3, 4.5e-4
    assert errs[0] < 1e-4 and errs[0] / errs[1] > 6.0, errs


# --- the opening test: float32, the GPU's bit for bit, never more permissive than exact arithmetic ----------
def _other_orders(d):
    """d_box^2 of the float32 differences d (3,) as a compiler free to fuse or reorder could evaluate it:
    each FMA contraction of (dx dx + dy dy) + dz dz, and the other summation orders."""
    f32, f64 = np.float32, np.float64
    sq = d * d

    def fma(a, b, c):  # a b + c rounded once (a b of two float32 is exact in float64)
        return f32(f64(a) * f64(b) + f64(c))

    return [
        fma(d[0], d[0], sq[1]) + sq[2],
        fma(d[1], d[1], sq[0]) + sq[2],
        fma(d[2], d[2], sq[0] + sq[1]),
        fma(d[2], d[2], fma(d[0], d[0], sq[1])),
        fma(d[2], d[2], fma(d[1], d[1], sq[0])),
        (sq[0] + sq[2]) + sq[1],
        (sq[1] + sq[2]) + sq[0],
    ]


def test_the_walk_evaluates_the_opening_test_in_ieee_float32(monkeypatch):
    """The walk is compiled with fastmath, yet its opening test (box_accepts, the GPU's `accepted`) must be
    IEEE float32 in the written order. One target far from 64 sources, where every fused or reordered
    evaluation of d_box^2 gives another float32 than the written one: with the root's r_open^2 set to the
    written value the root is opened (the test is strict); one float32 unit below, it is accepted."""
    rng = np.random.default_rng(13)
    pos = np.zeros((65, 4), np.float32)
    pos[:64, :3] = rng.uniform(-0.1, 0.1, (64, 3))
    pos[:64, 3] = 1 / 64
    tree = cpu_tree.build(pos[:64], leaf=16)
    com = tree.com[0]
    for _ in range(20_000):
        target = (com + rng.uniform(1.0, 2.0, 3)).astype(np.float32)
        d = target - com  # the group's box is the target, beyond the centre of mass on every axis
        written = (d[0] * d[0] + d[1] * d[1]) + d[2] * d[2]
        if all(v != written for v in _other_orders(d)):
            break
    else:
        pytest.fail("no target separates the orders of evaluation")
    pos[64, :3] = target
    works = []
    for r2 in (written, np.nextafter(written, np.float32(0))):
        rows = tree.mac(0.5)
        rows[0, 3] = r2
        monkeypatch.setattr(cpu_tree.Tree, "mac", lambda self, theta, opening="cube", rows=rows: rows)
        works.append(evaluate(pos, targets=Span(64, 1), sources=Span(0, 64), theta=0.5)[1])
    assert works[0].interactions > 1  # the root opened
    assert works[1].interactions == works[1].body_cell == 1  # the root accepted


@pytest.mark.parametrize("theta", [0.3, 0.7, 1.2])
def test_the_float32_test_accepts_no_cell_that_exact_arithmetic_opens(theta):
    """Every group and cell of a tree over a cloud 30 units off the origin with a dense clump (cells below
    level 15): where the float32 test accepts, the exact test accepts too (float64, r_open = side / theta +
    |com - centre| of the same float32 centre of mass, no slack); the slack opens few more cells."""
    rng = np.random.default_rng(14)
    pos = cloud(3000, seed=14)
    pos[:300, :3] = pos[0, :3] + rng.normal(scale=2e-4, size=(300, 3)).astype(np.float32)
    pos[:, :3] += np.float32(30.0)
    tree = cpu_tree.build(pos, leaf=8)
    assert tree.level.max() >= 15
    rows = tree.mac(theta)
    com = tree.com.astype(np.float64)
    r_exact = tree.side / theta + np.linalg.norm(com - (tree.lo + tree.offset), axis=1)
    xyz = np.stack([tree.x, tree.y, tree.z], axis=1)
    gstart = cpu_tree.group_starts(tree.start, tree.count, tree.nchild, 32)
    zero = np.float32(0.0)
    accepted = only_exact = 0
    for a, b in zip(gstart[:-1], gstart[1:], strict=True):
        lo, hi = xyz[a:b].min(axis=0), xyz[a:b].max(axis=0)
        d = np.maximum(np.maximum(lo - rows[:, :3], zero), rows[:, :3] - hi)  # float32, box_accepts' order
        fp32 = (d[:, 0] * d[:, 0] + d[:, 1] * d[:, 1]) + d[:, 2] * d[:, 2] > rows[:, 3]
        exact = (np.maximum(np.maximum(lo - com, 0.0), com - hi) ** 2).sum(axis=1) > r_exact**2
        assert not (fp32 & ~exact).any(), np.flatnonzero(fp32 & ~exact)
        accepted += int(fp32.sum())
        only_exact += int((exact & ~fp32).sum())
    assert accepted > 1000 and only_exact <= 1e-3 * accepted, (accepted, only_exact)


def test_the_gpu_rounds_r_open_outwards_by_the_same_slack():
    text = (KERNELS / "tree" / "build.cu").read_text()
    value = re.search(r"#define TREE_MAC_SLACK ([0-9.]+)f", text).group(1)
    assert np.float32(value) == k.MAC_SLACK == np.float32(1.0 + 2.0**-19)


def test_the_key_order_is_stable():
    rng = np.random.default_rng(12)
    keys = rng.integers(0, 50, 5000).astype(np.int64)  # many ties
    assert np.array_equal(k.stable_key_order(keys), np.argsort(keys, kind="stable"))
    same = np.zeros(300, np.int64)
    assert np.array_equal(k.stable_key_order(same), np.arange(300))


# --- what the viewer and bench read: the stage split, the memory per body ----------------------------------
def test_stage_ms_splits_the_evaluation_in_order_and_resets():
    from app.engine.forces import STAGES

    pos = cloud(4096, seed=5)
    evaluator = RECORD.policy.evaluator(RECORD, SOFT)
    evaluator.stage_ms()  # nothing yet
    acc = np.zeros_like(pos)
    import time

    t = time.perf_counter()
    evaluator.evaluate(pos, acc, Span.all(4096), Span.all(4096))
    evaluator.evaluate(pos, acc, Span.all(4096), Span.all(4096))
    wall_ms = (time.perf_counter() - t) * 1e3
    stages = evaluator.stage_ms()
    assert tuple(stages) == STAGES and all(v > 0 for v in stages.values()), stages
    assert 0.5 * wall_ms < sum(stages.values()) <= wall_ms, (stages, wall_ms)  # brackets, not guesses
    assert evaluator.stage_ms() == {}  # taken: reset
    # targets outside the sources are keyed and sorted too: their time lands in keys and sort
    evaluator.evaluate(pos, acc, Span(0, 100), Span(100, 3996))
    assert set(evaluator.stage_ms()) == set(STAGES)


def test_backend_step_reports_the_stages_and_body_cell_count():
    from app.engine.forces import STAGES

    backend = CPUBackend()
    backend.load(plummer_like(2048, seed=4), Physics(softening=0.01, dt=1e-3), kernel="cpu-tree")
    timings = backend.step(3)  # the first step also evaluates the leapfrog's initial a(x): 4 evaluations
    assert tuple(timings.stages) == STAGES and all(v > 0 for v in timings.stages.values())
    assert sum(timings.stages.values()) <= timings.force_ms  # inside the force bracket
    assert sum(timings.stages.values()) > 0.5 * timings.force_ms
    assert set(timings.extra) == {f"stage:{s}" for s in STAGES}
    assert 0 < timings.body_cell < timings.interactions
    assert timings.interactions_per_body == timings.interactions / (2048 * timings.force_evals) < 2048
    backend.set_kernel("cpu-simd")
    simd = backend.step(1)
    assert simd.stages == {} and simd.body_cell == 0 and simd.interactions_per_body == 2048
    backend.close()


def test_bytes_per_body_covers_the_tree_arrays():
    n = 16384
    evaluator = RECORD.policy.evaluator(RECORD, SOFT)
    tree = cpu_tree.build(cloud(n, seed=6), leaf=16)
    held = (
        sum(
            a.nbytes
            for a in (
                tree.order,
                tree.keys,
                tree.x,
                tree.y,
                tree.z,
                tree.m,
                tree.start,
                tree.count,
                tree.level,
                tree.prefix,
                tree.child,
                tree.nchild,
                tree.offset,
                tree.side,
                tree.mass,
                tree.com,
                tree.quad,
                tree.trace,
            )
        )
        / n
    )
    estimate = evaluator.bytes_per_body(n)
    assert held < estimate < 3 * held, (held, estimate)  # the tree, plus the evaluation's transient copies
    evaluator.set_tunables(leaf=64)
    assert evaluator.bytes_per_body(n) < estimate  # fewer cells
    simd = BY_NAME["cpu-simd"]
    assert simd.policy.evaluator(simd, SOFT).bytes_per_body(n) is None  # all-pairs holds nothing extra
