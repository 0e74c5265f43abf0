"""The trees' opening tests (`opening` = cube | bmax; app/backends/cpu_tree_kernels.py opening_rows, the
CPU twin of kernels/tree/build.cu tree_pack): b_max bounds every body of its cell after a build and after
a refit, and the bmax test needs less work for a smaller error than the cube test on a collision
(bench/tree_mac_study.py measures how much at 1M: docs/tree.md). The GPU's rows equal these bit for bit
(tests/test_tree_gpu.py, tests/test_tree_gpu_refit.py)."""

from __future__ import annotations

import numpy as np
import pytest

from app.backends import cpu_tree
from app.backends.cpu import CPUBackend
from app.bench import bench_bodies
from app.forces import Span
from app.physics import Physics, accelerations, relative_errors


def _pos4(n: int, scene: str) -> tuple[np.ndarray, np.ndarray]:
    bodies = bench_bodies(n, scene=scene)
    pos4 = np.empty((n, 4))
    pos4[:, :3], pos4[:, 3] = bodies.pos, bodies.mass
    return pos4, bodies.mass


def _farthest(tree) -> np.ndarray:
    """float64: the largest distance from each cell's float32 centre of mass to one of its bodies."""
    xyz = np.stack([tree.x, tree.y, tree.z], axis=1).astype(np.float64)
    out = np.empty(tree.ncell)
    for c in range(tree.ncell):
        s, e = tree.start[c], tree.start[c] + tree.count[c]
        out[c] = np.sqrt(((xyz[s:e] - tree.com[c].astype(np.float64)) ** 2).sum(axis=1).max())
    return out


def test_bmax_bounds_every_body_of_its_cell_after_a_build_and_a_refit():
    pos4, _ = _pos4(6000, "collision")
    built = cpu_tree.build(pos4, 8)
    assert built.bmax.dtype == np.float32
    slack = 1 + 2.0 ** -20  # the opening test multiplies r_open by 1 + 2^-19
    assert (_farthest(built) <= built.bmax.astype(np.float64) * slack).all()
    rng = np.random.default_rng(2)
    moved = pos4.copy()
    moved[:, :3] += rng.normal(scale=0.05, size=(6000, 3))  # bodies leave their cells' cubes
    refitted, grown = cpu_tree.refit(built, moved)
    assert grown > 0
    assert (_farthest(refitted) <= refitted.bmax.astype(np.float64) * slack).all()
    rows = refitted.mac(0.5, "bmax")
    r_open = np.sqrt(rows[:, 3].astype(np.float64))
    assert (r_open >= refitted.bmax / 0.5).all() and np.array_equal(rows[:, :3], refitted.com)
    with pytest.raises(ValueError, match="opening must be 'cube' or 'bmax'"):
        built.mac(0.5, "sphere")


def test_bmax_needs_less_work_for_a_smaller_error_than_the_cube_on_a_collision():
    """32,768 bodies of the bench's collision, as bench_bodies makes them: bmax at theta 0.4 walks fewer
    interactions than cube at 0.6 and has the smaller 99th-percentile error (the study at this size:
    1,237 against 1,426 a body, p99 7.9e-4 against 9.7e-4)."""
    n = 32768
    pos4, mass = _pos4(n, "collision")
    physics = Physics(softening=0.01, dt=0.001)
    rows = np.sort(np.random.default_rng(7).choice(n, size=2048, replace=False))
    exact = accelerations(pos4[:, :3], mass, physics, targets=rows)
    record = CPUBackend.record("cpu-tree")
    got = {}
    for opening, theta in (("cube", 0.6), ("bmax", 0.4)):
        ev = record.policy.evaluator(record, physics)
        ev.set_tunables(theta=theta, opening=opening, rebuild_every=1)
        acc = np.zeros((n, 4), np.float32)
        work = ev.evaluate(pos4.astype(np.float32), acc, Span.all(n), Span.all(n))
        p99 = float(np.percentile(relative_errors(acc[rows, :3].astype(np.float64), exact), 99))
        got[opening] = (work.interactions / n, p99)
    assert got["bmax"][0] < 0.9 * got["cube"][0], got
    assert got["bmax"][1] < got["cube"][1] <= 1e-3, got
