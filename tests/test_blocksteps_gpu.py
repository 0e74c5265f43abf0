"""Block time steps on the GPU (app/backends/cuda/blockops.py, TreeEvaluator.evaluate_rows) against the CPU
twin's (app/backends/blocksteps_ops.py TreeBlockOps, CpuTreeEvaluator.evaluate_rows), gpu-marked.

- The GPU tree's walk of active groups: for the same float32 rows, each active row is bitwise the GPU's
  full evaluation, the inactive rows are untouched, and the lists are the twin's group by group.
- The scheduler on GPU ops: over two max steps of a 4,096-body collision the levels, active sets and
  trajectory follow the twin's (the walks sum in another order, so within float32 rounding, not bitwise),
  and a GPU resume from x, v and the levels continues bitwise.
- The ops' own updates (kernels/blocksteps.cu: drift, kick, the walk's float32 rows, a(x) kept, |a|) are
  bitwise the twin's numpy expressions on the same arrays.
- The relative opening test and a refit cadence are refused (a(x) must follow from x alone).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
from test_tree_gpu import cloud, cpu_tree, on_device

from app.backends.blocksteps_ops import TreeBlockOps
from app.core.errors import ConfigError
from app.engine.blocksteps import BlockSteps
from app.engine.forces import Span
from app.model.ics import generate
from app.model.physics import Physics

pytestmark = pytest.mark.gpu  # (skipped where CUDA cannot run: tests/conftest.py)
SOFT = Physics(softening=0.01)


@pytest.fixture(scope="module")
def device():
    from app.backends.cuda.device import CudaDevice

    dev = CudaDevice(0)
    yield dev
    dev.close()


def _gpu_evaluator(device, physics=SOFT, **tunables):
    from app.backends.cuda.registry import RECORDS

    record = next(r for r in RECORDS if r.name == "tree")
    ev = record.policy.evaluator(record, device, {})
    ev.set_physics(physics)
    ev.set_tunables(**{"rebuild_every": 1, "opening": "cube", **tunables})  # block steps' (block_tunables)
    return ev


def test_the_gpu_walks_active_groups_with_the_full_evaluation_s_rows_and_the_twin_s_lists(device):
    n = 20_011
    pos = cloud(n, seed=21)
    rows = np.flatnonzero(np.random.default_rng(2).random(n) < 0.05)
    ev = _gpu_evaluator(device)
    full, _ = on_device(device, pos, lambda p, a: ev.evaluate(p, a, Span.all(n), Span.all(n)))
    part, work = on_device(device, pos, lambda p, a: ev.evaluate_rows(p, a, n, rows))
    assert np.array_equal(part[rows], full[rows])
    untouched = np.setdiff1d(np.arange(n), rows)
    assert np.isnan(part[untouched]).all()
    assert work.pair_equivalent == rows.size * n
    _, _, cev = cpu_tree(pos, rebuild_every=1, opening="cube")
    cacc = np.full((n, 4), np.nan, np.float32)
    cwork = cev.evaluate_rows(np.ascontiguousarray(pos, np.float32), cacc, rows)
    gpu, cpu = ev.last_groups(), cev.last_groups()
    for key in ("start", "nbody", "ncell", "nactive"):
        assert np.array_equal(gpu[key], cpu[key]), key
    assert (work.interactions, work.body_cell) == (cwork.interactions, cwork.body_cell)
    assert gpu["nactive"].sum() == rows.size


def test_the_scheduler_on_gpu_ops_follows_the_twin_and_resumes_bitwise_from_x_v_and_levels(device):
    from app.backends.cuda.blockops import CudaBlockOps

    physics = Physics(dt=1 / 32, softening=0.01)
    bodies = generate("collision", 4096, 5)
    gpu = CudaBlockOps(copy.deepcopy(bodies), physics, device)
    twin = TreeBlockOps(copy.deepcopy(bodies), physics)
    sched_gpu = BlockSteps(physics, max_level=5, eta=0.01)
    sched_cpu = BlockSteps(physics, max_level=5, eta=0.01)
    for _ in range(2):
        sched_gpu.advance(gpu, 1)
        sched_cpu.advance(twin, 1)
        assert not isinstance(sched_gpu.levels, np.ndarray)  # the levels stay on the device (CuPy)
        assert np.mean(sched_gpu.levels.get() == sched_cpu.levels) >= 0.999
    assert np.count_nonzero(sched_gpu.histogram()) >= 2  # levels really differ between bodies
    assert sched_gpu.last.fraction < 0.9
    state = gpu.bodies()
    scale = np.abs(twin.bodies.pos).max()
    assert np.abs(state.pos - twin.bodies.pos).max() <= 1e-5 * scale
    # a resume from x, v and the levels (a(x) recomputed from x) continues bitwise
    checkpoint, saved = sched_gpu.state(), gpu.bodies()
    sched_gpu.advance(gpu, 1)
    fresh = CudaBlockOps(saved, physics, device)
    fresh.force_active(np.arange(4096))
    resumed = BlockSteps.resume(checkpoint, physics, max_level=5, eta=0.01)
    resumed.advance(fresh, 1)
    assert np.array_equal(fresh.bodies().pos, gpu.bodies().pos)
    assert np.array_equal(fresh.bodies().vel, gpu.bodies().vel)
    assert np.array_equal(resumed.levels.get(), sched_gpu.levels.get())
    assert isinstance(checkpoint.levels, np.ndarray)  # a checkpoint's levels are on the host


def test_the_gpu_ops_updates_are_the_twin_s_numpy_expressions_bit_for_bit(device):
    """Each kernel of kernels/blocksteps.cu against the expression NumpyBlockOps / TreeBlockOps evaluate,
    on host copies of the same float64 arrays: equality, not a tolerance (an FMA contraction or another
    summation order would change low bits in a fraction of the rows, which this size catches)."""
    from app.backends.cuda.blockops import CudaBlockOps

    rng = np.random.default_rng(7)
    bodies = generate("collision", 4096, 5)
    bodies.vel[:] = rng.normal(size=bodies.vel.shape) * 1.3  # low bits everywhere
    ops = CudaBlockOps(copy.deepcopy(bodies), SOFT, device)
    pos, vel = ops.host_state()
    ops.drift_all(0.0123)
    pos = pos + 0.0123 * vel
    assert np.array_equal(ops.host_state()[0], pos)

    rows = np.sort(rng.choice(bodies.n, 1500, replace=False))
    before = ops.host_acc()
    ops.force_active(rows)
    rows32 = ops.rows32.get()
    assert np.array_equal(rows32[:, :3], pos.astype(np.float32))
    assert np.array_equal(rows32[:, 3], bodies.mass.astype(np.float32))
    acc, acc32 = ops.host_acc(), ops.acc32.get()
    assert np.array_equal(acc[rows], acc32[rows, :3].astype(np.float64))
    others = np.setdiff1d(np.arange(bodies.n), rows)
    assert np.array_equal(acc[others], before[others])  # rows not evaluated keep their a(x)
    assert np.count_nonzero(acc[rows]) > 0.9 * acc[rows].size

    half = rng.uniform(1e-4, 1e-2, rows.size)
    ops.kick(ops.cp.asarray(rows), ops.cp.asarray(half))
    vel[rows] += acc[rows] * half[:, None]
    assert np.array_equal(ops.host_state()[1], vel)
    assert np.array_equal(ops.acc_norms(rows).get(), np.linalg.norm(acc[rows], axis=1))
    with pytest.raises(ValueError, match="half steps"):
        ops.kick(rows, half[:-1])


def test_gpu_block_ops_refuse_what_would_make_a_of_x_depend_on_history(device):
    from app.backends.cuda.blockops import CudaBlockOps

    bodies = generate("plummer", 512, 3)
    for tunables, named in (
        ({"rebuild_every": 4}, "drop rebuild_every"),
        ({"opening": "rel"}, "use opening=cube or bmax"),
    ):
        with pytest.raises(ConfigError, match=named):
            CudaBlockOps(bodies, SOFT, device, tunables)
    ev = _gpu_evaluator(device, opening="rel")
    with pytest.raises(ConfigError, match="geometric opening test"):
        on_device(device, cloud(512), lambda p, a: ev.evaluate_rows(p, a, 512, np.arange(8)))


def test_the_block_backend_on_a_gpu_resumes_bitwise_and_samples_its_force_error():
    """`--timesteps block` on the cuda backend (app/backends/block.py over CudaBlockOps): 2 + 2 max steps
    from a float64 state taken between them equal 4 straight, bitwise (levels from a(x), a(x) from x);
    the live force error's halves at the synchronised state are within the tree's budget; the render
    rows are the state in float32; kernels other than the tree are refused with the fix."""
    from app.backends import backend_class
    from app.backends.block import block_steps_backend_class

    cls = block_steps_backend_class(backend_class("cuda"))
    physics = Physics(softening=0.01, dt=1 / 32, timesteps="block", block_levels=4, block_eta=0.01)
    a, b = cls(), cls()
    try:
        a.load(generate("collision", 8192, 3), physics)
        timings = a.step(2)
        assert 0 < timings.extra["active_fraction"] < 1 and np.count_nonzero(a.levels_histogram()) >= 2
        mid = a.state()
        a.step(2)
        straight = a.state()
        b.load(mid, physics)
        b.step(2)
        got = b.state()
        assert got.time == straight.time == 4 / 32
        assert np.array_equal(got.pos, straight.pos) and np.array_equal(got.vel, straight.vel)
        approx, exact = a.force_error_sample(np.arange(0, 8192, 8))
        rel = np.linalg.norm(approx - exact, axis=1) / np.linalg.norm(exact, axis=1)
        assert 0 < np.percentile(rel, 99) <= 1e-3, np.percentile(rel, 99)
        rows, speed = a.host_render_arrays()
        assert np.array_equal(rows[:, :3], straight.pos.astype(np.float32))
        assert np.allclose(speed, np.linalg.norm(straight.vel, axis=1), rtol=1e-6)
        with pytest.raises(ConfigError, match="shared time steps run best"):
            a.set_kernel("best")
    finally:
        a.close()
        b.close()


def test_a_gpu_max_step_drawn_in_parts_ends_where_a_whole_one_does():
    """step_parts (run.frames_per_step) on the cuda backend: 4 parts end bitwise where step(1) ends; the
    drawing (x + v·ahead made on the device) moves at every part and at the last one is the state in
    float32; between parts the state is not synchronised."""
    from app.backends import backend_class
    from app.backends.block import block_steps_backend_class

    cls = block_steps_backend_class(backend_class("cuda"))
    physics = Physics(softening=0.01, dt=1 / 32, timesteps="block", block_levels=4, block_eta=0.01)
    a, b = cls(), cls()
    try:
        a.load(generate("collision", 8192, 3), physics)
        a.step(1)
        b.load(generate("collision", 8192, 3), physics)
        drawn = []
        for part in range(4):
            b.step_parts(1, 4)
            assert b.synchronised == (part == 3)
            drawn.append(b.host_render_arrays()[0][:, :3].copy())
        want, got = a.state(), b.state()
        assert np.array_equal(got.pos, want.pos) and np.array_equal(got.vel, want.vel)
        assert all(not np.array_equal(drawn[i], drawn[i + 1]) for i in range(3))
        assert np.array_equal(drawn[-1], want.pos.astype(np.float32))
    finally:
        a.close()
        b.close()


@pytest.mark.gl
def test_gpu_block_steps_write_the_drawn_rows_into_the_vbos(egl_canvas):
    """CUDA–GL interop for block steps: after attach_gl_buffers (a headless NVIDIA EGL context) every step
    and part writes the drawn rows (x + v·ahead, masses, speeds) into the VBOs on the device: inside a
    max step drawn in parts they equal host_render_arrays bitwise, the map and unmap are timed, and the
    data path says so; detached, the renderer is back to uploads."""
    from conftest import gl_vbo, read_gl

    from app.backends import backend_class
    from app.backends.block import HOST_UPLOAD, INTEROP, block_steps_backend_class

    n = 8192
    cls = block_steps_backend_class(backend_class("cuda"))
    physics = Physics(softening=0.01, dt=1 / 32, timesteps="block", block_levels=4, block_eta=0.01)
    backend = cls()
    _pos_vbo, pos_name = gl_vbo(egl_canvas, np.zeros((n, 4), np.float32))
    _speed_vbo, speed_name = gl_vbo(egl_canvas, np.zeros((n, 1), np.float32))
    try:
        backend.load(generate("collision", n, 3), physics)
        assert backend.attach_gl_buffers(pos_name, speed_name) and backend.data_path == INTEROP
        timings = backend.step_parts(3, 8)
        assert not backend.synchronised and timings.map_ms > 0 and timings.unmap_ms > 0
        want_pos, want_speed = backend.host_render_arrays()
        egl_canvas.set_current()
        assert np.array_equal(read_gl(egl_canvas, pos_name, 16 * n).reshape(n, 4), want_pos)
        assert np.array_equal(read_gl(egl_canvas, speed_name, 4 * n), want_speed)
        backend.detach_gl_buffers()
        assert backend.data_path == HOST_UPLOAD
    finally:
        backend.close()


@pytest.mark.gl
def test_the_viewer_draws_block_steps_through_interop(egl_canvas, tmp_path):
    """`run --timesteps block --frames-per-step 4 --headless --timings`: nothing is uploaded from the host
    and every frame maps and unmaps the VBOs."""
    import csv

    from app.cli import main

    out = tmp_path / "frames.csv"
    rc = main(
        [
            "-q",
            "run",
            "collision",
            "--n",
            "8192",
            "--frames",
            "12",
            "--headless",
            "--backend",
            "cuda",
            "--timesteps",
            "block",
            "--dt",
            "0.0625",
            "--frames-per-step",
            "4",
            "--no-panel",
            "--timings",
            str(out),
        ]
    )
    assert rc == 0
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 12
    assert all(float(r["map_ms"]) > 0 and float(r["unmap_ms"]) > 0 for r in rows[1:])
    assert all(float(r["upload_ms"]) == 0.0 for r in rows)
