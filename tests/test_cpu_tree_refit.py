"""`cpu-tree`'s refit (rebuild_every > 1; app/backends/cpu_tree.py `refit`, cpu_tree_kernels.py
`refit_cubes`, docs/tree.md "Refit"): the default is bitwise today's, a refit of unmoved bodies is bitwise
the build, moved bodies stay within the error budget against float64, and every cell's opening cube holds
its current bodies (with a control where it does not)."""

from __future__ import annotations

import numpy as np
import pytest
from test_cpu_backend import plummer_like
from test_cpu_tree import RECORD, SOFT, cloud

from app.backends import cpu_tree
from app.backends import cpu_tree_kernels as k
from app.core.errors import ConfigError
from app.engine.forces import Span
from app.model.physics import Physics, accelerations, relative_errors

ALL = Span.all


def evaluator(physics=SOFT, **tunables):
    ev = RECORD.policy.evaluator(RECORD, physics)
    ev.set_tunables(**tunables)
    return ev


def run(ev, pos) -> np.ndarray:
    acc = np.full(pos.shape, np.nan, pos.dtype)
    ev.evaluate(pos, acc, ALL(pos.shape[0]), ALL(pos.shape[0]))
    return acc


def moved(pos: np.ndarray, vel: np.ndarray, t: float) -> np.ndarray:
    out = pos.copy()
    out[:, :3] = (pos[:, :3].astype(np.float64) + t * vel).astype(np.float32)
    return out


def test_the_tunable_is_the_same_on_the_twin_and_the_gpu_tree():
    from app.backends.cuda.registry import RECORDS as GPU_RECORDS

    tree = next(r for r in GPU_RECORDS if r.name == "tree")
    for record in (RECORD, tree):  # the adaptive rule capped at 16 by default: docs/tree.md
        assert record.default_tunables()["rebuild_every"] == 16
        assert record.tunable("rebuild_every").values == (1, 2, 4, 8, 16)
        assert record.default_tunables()["rebuild_rule"] == "adaptive"
        assert record.tunable("rebuild_rule").options == ("fixed", "adaptive")
        assert record.default_tunables()["opening"] == "rel"  # docs/tree.md, "Why `rel` is the default"
        assert record.tunable("opening").options == ("cube", "bmax", "rel")
        assert record.default_tunables()["alpha"] == "auto"  # docs/tree.md, "alpha's default"
        assert record.tunable("alpha").by_n == ((0, 0.001), (1_048_576, 0.002), (8_388_608, 0.003))
    with pytest.raises(ConfigError, match=r"cpu-tree.rebuild_every: 3 is not one of 1, 2, 4, 8, 16"):
        RECORD.validate_tunables({"rebuild_every": 3})


def test_rebuild_every_1_is_bitwise_a_fresh_build_at_every_evaluation():
    bodies = plummer_like(3000, seed=4)
    pos = bodies.pos4(np.float32)
    ev = evaluator(rebuild_every=1)
    for t in (0.0, 0.01, 0.03):
        p = moved(pos, bodies.vel, t)
        got = run(ev, p)
        assert ev.since_build == 0
        # today's evaluation: a new evaluator at the defaults, so a build
        fresh = run(evaluator(), p)
        assert np.array_equal(got, fresh, equal_nan=True)
        tree = cpu_tree.build(p, 16)
        assert np.array_equal(ev.last_tree.mac(0.5), tree.mac(0.5))


@pytest.mark.parametrize(
    "physics",
    [SOFT, Physics(softening=0.0), Physics(softening=0.05, model="gravity-repulsion", repulsion=0.1)],
    ids=["gravity", "eps0", "repulsion"],
)
def test_a_refit_of_unmoved_bodies_is_bitwise_the_build(physics):
    pos = cloud(4000, seed=2)
    ev = evaluator(physics, rebuild_every=4)
    first = run(ev, pos)
    built = ev.last_tree
    groups = ev.last_groups()
    second = run(ev, pos.copy())
    assert ev.since_build == 1 and ev.last_grown == 0
    refitted = ev.last_tree
    assert refitted is not built and refitted.order is built.order  # the topology is the build's
    for name in ("offset", "side", "mass", "com", "quad", "trace", "x", "y", "z", "m"):
        assert np.array_equal(getattr(refitted, name), getattr(built, name)), name
    assert np.array_equal(refitted.mac(0.5), built.mac(0.5))
    assert np.array_equal(second, first, equal_nan=True)
    for name, v in ev.last_groups().items():
        assert np.array_equal(v, groups[name]), name


def test_the_refit_rebuilds_every_rebuild_every_evaluations_and_when_the_sources_change():
    bodies = plummer_like(2000, seed=6)
    pos = bodies.pos4(np.float32)
    ev = evaluator(rebuild_every=4)
    since = []
    for i in range(9):
        run(ev, moved(pos, bodies.vel, 1e-3 * i))
        since.append(ev.since_build)
    assert since == [0, 1, 2, 3, 0, 1, 2, 3, 0]
    run(ev, pos[:1500])  # other sources: a build
    assert ev.since_build == 0
    run(ev, pos[:1500])
    assert ev.since_build == 1
    ev.set_tunables(leaf=32)  # a new leaf: a build
    run(ev, pos[:1500])
    assert ev.since_build == 0


def cube_excess(tree) -> float:
    """The largest distance (float64, in units of the key cube) by which a body lies outside its cell's
    opening cube (centre lo + offset, side), over every cell; <= 0 when every cube holds its bodies."""
    p = np.column_stack([tree.x, tree.y, tree.z]).astype(np.float64) - tree.lo
    worst = -np.inf
    for c in range(tree.ncell):
        s, n = tree.start[c], tree.count[c]
        d = np.abs(p[s : s + n] - tree.offset[c]).max() - 0.5 * tree.side[c]
        worst = max(worst, d)
    return worst / tree.size


def radius_excess(tree, theta: float) -> float:
    """The largest (|x - X| - bound) / bound over cells and their bodies, bound = |X - centre| + sqrt(3)/2
    side: the distance of a body from its cell's centre of mass that the opening radius r_open = side/theta
    + |X - centre| is built on (r_open >= bound for theta <= 2/sqrt(3)); <= 0 when every body is within."""
    p = np.column_stack([tree.x, tree.y, tree.z]).astype(np.float64)
    com = tree.com.astype(np.float64)
    centre = tree.lo + tree.offset
    worst = -np.inf
    for c in range(tree.ncell):
        s, n = tree.start[c], tree.count[c]
        bound = np.linalg.norm(com[c] - centre[c]) + np.sqrt(3) / 2 * tree.side[c]
        far = np.linalg.norm(p[s : s + n] - com[c], axis=1).max()
        worst = max(worst, (far - bound) / bound)
    assert np.sqrt(tree.mac(theta)[:, 3].astype(np.float64)).min() > 0
    return worst


def test_the_refit_cubes_and_radii_bound_every_body_of_their_cell_and_a_stale_cube_does_not():
    bodies = plummer_like(3000, seed=8)
    pos = bodies.pos4(np.float32)
    built = cpu_tree.build(pos, 16)
    assert cube_excess(built) <= 2.0**-50  # the build: the key cells hold their bodies (float64 keys)
    for t in (0.02, 0.2, 1.0):  # the bodies moved about 0.005, 0.05, 0.24 (the smallest cell: 0.16)
        p = moved(pos, bodies.vel, t)
        tree, grown = cpu_tree.refit(built, p)
        assert grown > 0
        assert cube_excess(tree) <= 0.0, t
        assert radius_excess(tree, 0.5) <= 1e-6, t  # float32 centres of mass: a relative 1e-6 of slack
        # the r_open rows: the grown side and offset, so r_open covers the bound for theta <= 2/sqrt(3)
        r_open = np.sqrt(tree.mac(1.0)[:, 3].astype(np.float64))
        bound = (
            np.linalg.norm(tree.com.astype(np.float64) - (tree.lo + tree.offset), axis=1)
            + np.sqrt(3) / 2 * tree.side
        )
        assert (r_open >= bound * (1 - 1e-6)).all()
        # the control: the moments refitted but the cubes left as built. It must fail the same checks
        stale = cpu_tree.Tree(**{**tree.__dict__, "offset": built.offset, "side": built.side})
        assert cube_excess(stale) > 0.0
        if t >= 0.2:  # the radius bound has the corners' slack: a body must move off more than a face
            assert radius_excess(stale, 0.5) > 1e-6


def test_refit_cubes_grow_only_the_cells_whose_bodies_left_them():
    pos = cloud(2000, seed=3)
    built = cpu_tree.build(pos, 16)
    p = pos[built.order].copy()  # sorted, so that body b of the build is row b here
    b = int(built.start[built.ncell - 1])  # the first body of the last cell (a leaf)
    p[b, 0] += np.float32(1.01 * built.side[built.ncell - 1])  # out of its leaf's cube, in x
    tree, grown = cpu_tree.refit(cpu_tree.Tree(**{**built.__dict__, "order": np.arange(2000)}), p)
    holds = [c for c in range(built.ncell) if built.start[c] <= b < built.start[c] + built.count[c]]
    changed = np.flatnonzero((tree.side != built.side) | (tree.offset != built.offset).any(axis=1))
    assert set(changed) <= set(holds) and built.ncell - 1 in changed and grown == changed.size
    assert cube_excess(tree) <= 0.0
    assert k.REFIT_TOL * built.size < 1e-9 * built.side.min() * 2.0**21


def test_refitted_accelerations_stay_within_the_budget_against_float64_for_k_evaluations():
    bodies = plummer_like(4096, seed=11)
    physics = Physics(softening=0.01)
    x = bodies.pos.astype(np.float64).copy()
    v = bodies.vel.astype(np.float64).copy()
    m = bodies.mass.astype(np.float64)
    dt = 0.01  # ten times the scene's: the bodies move farther between builds than in a run
    ev = evaluator(physics, rebuild_every=16)
    budget = RECORD.error_budget
    a = None
    grown = []
    for e in range(16):  # one build, 15 refits
        p = np.column_stack([x, m]).astype(np.float32)
        acc = run(ev, p)[:, :3].astype(np.float64)
        assert ev.since_build == e
        grown.append(ev.last_grown)
        ref = accelerations(p[:, :3].astype(np.float64), p[:, 3].astype(np.float64), physics)
        rel = relative_errors(acc, ref)
        assert np.percentile(rel, 99) <= budget.p99_rel and rel.max() <= budget.max_rel, (e, rel.max())
        a = ref if a is None else a
        v += dt * a
        x += dt * v
        a = ref
    assert grown[0] == 0 and grown[-1] > grown[1] > 0  # the cubes did grow: the refit was tested


def test_the_refit_is_an_evaluation_without_keys():
    pos = cloud(3000, seed=1)
    ev = evaluator(rebuild_every=2)
    run(ev, pos)
    ev.stage_ms()
    run(ev, pos)
    stages = ev.stage_ms()
    assert "keys" not in stages and {"sort", "build", "moments", "walk"} <= set(stages)


def _evaluators(backend) -> list:
    """The evaluators a CPU backend steps with: its own, or each device's under the multi-device run."""
    run = getattr(backend, "_run", None)
    return [d.evaluator for d in run.devices] if run is not None else [backend.evaluator()]


def test_a_domain_split_refits_its_rows_in_key_order_bitwise_as_one_device_gathers_them():
    """Under a domain split the devices keep their state in the last tree's key order, so a refit takes
    the rows as they are (`kept_order`, no gather, nothing to re-sort); one CPU backend (no split) gathers
    them through the build's order. Same values in the same order: bitwise the same run, with the same
    cadence (a build at evaluations 0 and 4, refits between)."""
    from app.backends.cpu import CPUBackend
    from app.backends.multi import multi_backend_class
    from app.model.physics import Physics
    from app.tools.bench import bench_bodies

    bodies, physics = bench_bodies(2048), Physics(softening=0.01, dt=1e-3)
    runs, cadences = [], []
    for cls in (CPUBackend, multi_backend_class(CPUBackend, 2, "single")):
        backend = cls()
        try:
            backend.load(bodies, physics, "cpu-tree")
            backend.set_tunables(rebuild_every=4)
            evaluators = _evaluators(backend)
            cadence = []
            for _ in range(6):
                backend.step(1)
                cadence.append([(ev.since_build, ev.kept_order) for ev in evaluators])
            cadences.append(cadence)
            runs.append(backend.state().pos)
        finally:
            backend.close()
    # evaluations 0 (load) and 1-6 (steps): builds at 0 and 4
    assert [c[0][0] for c in cadences[0]] == [1, 2, 3, 0, 1, 2]
    assert not any(kept for c in cadences[0] for _, kept in c)  # no split: a gather, the order rebuilt
    assert cadences[1] == [[(s, s > 0)] * 2 for s in (1, 2, 3, 0, 1, 2)]
    assert np.array_equal(runs[0], runs[1])


def test_new_force_parameters_build_and_keep_the_tunables_while_a_new_dt_keeps_refitting():
    """The refit's cadence is the same on one CPU backend and on K CPU devices (what MPI ranks run), so
    their runs stay bitwise equal through panel changes: new force parameters make the next evaluation
    build (a new evaluator, with the tunables it had), a new dt does not."""
    from app.backends.cpu import CPUBackend
    from app.backends.multi import multi_backend_class
    from app.model.physics import Physics
    from app.tools.bench import bench_bodies

    bodies, physics = bench_bodies(2048), Physics(softening=0.01, dt=1e-3)
    runs = []
    for cls in (CPUBackend, multi_backend_class(CPUBackend, 2, "single")):
        backend = cls()
        try:
            backend.load(bodies, physics, "cpu-tree")
            backend.set_tunables(theta=0.6, rebuild_every=4)
            backend.step(2)
            backend.set_physics(physics.with_(dt=2e-3))
            backend.step(1)
            assert all(ev.since_build == 3 for ev in _evaluators(backend))  # still refitting: the same one
            backend.set_physics(physics.with_(dt=2e-3, softening=0.02))
            backend.step(1)
            assert all(ev.since_build == 1 and ev.tunables["theta"] == 0.6 for ev in _evaluators(backend))
            runs.append(backend.state().pos)
        finally:
            backend.close()
    assert np.array_equal(runs[0], runs[1])
