"""The GPU tree's refit (rebuild_every > 1; kernels/tree/build.cu `tree_refit`, app/backends/cuda/tree.py
`_refit_phases`, docs/tree.md "Refit") against the CPU twin's, gpu-marked.

A domain split keeps the state in the last tree's key order, so a refit takes the rows as they are. Here
both trees get the same evaluations: a build, then positions moved in its key order and refitted three
times, then a build again (R = 4). At every refit the float32 opening and interaction rows of every cell
are the twin's bit for bit (the grown cubes included, counted alike), and so are the interaction lists,
group by group; the accelerations agree to float32 summation order. Through the engine, two devices on
GPU 0 (and two GPUs where there are two) refitting are bitwise one GPU refitting, and R = 4 stays within
the tree's own error of R = 1.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_tree_gpu import CUDA, REPULSION, SOFT, agree, cloud, on_device

from app.backends.cpu_forces import BY_NAME as CPU_RECORDS
from app.backends.cpu_tree_kernels import pack_cells
from app.model.physics import Physics, relative_error
from app.tools.bench import bench_bodies

pytestmark = pytest.mark.gpu  # (skipped where CUDA cannot run: tests/conftest.py)
TUNABLES = dict(group=64, leaf=16, theta=0.6, rebuild_every=4)


@pytest.fixture(scope="module")
def device():
    from app.backends.cuda.device import CudaDevice

    dev = CudaDevice(0)
    yield dev
    dev.close()


def _gpu_domain(device, ev, pos, cuts, prev=None):
    """One domain evaluation (device 0 of `cuts`) of the GPU evaluator on host rows `pos`: the
    accelerations in key order (float64 rows of the walked range, NaN elsewhere), the work, the cuts, and
    after a build its key order."""
    n = pos.shape[0]
    if prev is None:
        acc, (work, aligned) = on_device(device, pos, lambda p, a: ev.evaluate_domain(p, a, n, cuts, 0))
    else:  # the state's last accelerations, which the relative test reads at each body's row
        with device.scope:
            last = device.scratch("tree-test-prev", 16 * n)
            device.drv.memcpy_htod(last, np.ascontiguousarray(prev, np.float32))
        acc, (work, aligned) = on_device(
            device, pos, lambda p, a: ev.evaluate_domain(p, a, n, cuts, 0, prev=int(last))
        )
    with device.scope:
        order = ev._buffers["sorder"][:n].get() if not ev.kept_order else None
    return acc, work, aligned, order


@pytest.mark.parametrize("opening", ["cube", "bmax", "rel"])
@pytest.mark.parametrize("physics", [SOFT, REPULSION], ids=["gravity", "repulsion"])
def test_gpu_refits_are_the_twins_bit_for_bit(device, physics, opening):
    from app.backends.cuda.registry import RECORDS

    record = next(r for r in RECORDS if r.name == "tree")
    ev = record.policy.evaluator(record, device, {})
    ev.set_physics(physics)
    ev.set_tunables(**TUNABLES, opening=opening)
    crec = CPU_RECORDS["cpu-tree"]
    cev = crec.policy.evaluator(crec, physics)
    cev.set_tunables(**TUNABLES, opening=opening)
    n = 20_011
    pos = cloud(n, seed=16)
    rng = np.random.default_rng(5)
    vel = rng.normal(scale=0.3, size=(n, 3))  # fast enough that cubes grow within a few steps
    prev = None  # rel: each body's last acceleration, at its state row (moved with it, as the state's acc)
    if opening == "rel":
        prev = np.zeros((n, 4), np.float32)
        prev[:, :3] = rng.normal(size=(n, 3)) * 10.0 ** rng.uniform(-1, 2, (n, 1))
    cuts = [0, n // 2, n]  # device 0 of two: half the groups
    trace_factor = 1.0 if physics.h else float(np.float32(physics.softening**2))
    grown = []
    for evaluation in range(5):
        got, work, aligned, order = _gpu_domain(device, ev, pos, cuts, prev)
        cacc = np.full((n, 4), np.nan, np.float32)
        cwork, caligned = cev.evaluate_domain(pos.copy(), cacc, cuts, 0, prev=prev)
        refit = evaluation % 4 != 0
        assert ev.kept_order == cev.kept_order == refit, evaluation
        assert ev.since_build == cev.since_build == evaluation % 4
        assert aligned == caligned
        tree = cev.last_tree
        ncell = tree.ncell
        assert ev.levels[-1] == ncell
        mac = ev._buffers["mac"][: 4 * ncell].get().reshape(ncell, 4)
        pack = ev._buffers["pack"][: 12 * ncell].get().reshape(ncell, 12)
        want = pack_cells(tree.com, tree.mass, tree.quad, tree.trace, np.float32, trace_factor)
        rows = tree.mac(0.6, "cube" if opening == "rel" else opening)
        assert np.array_equal(mac.view(np.uint32), rows.view(np.uint32)), evaluation
        assert np.array_equal(pack.view(np.uint32), want.view(np.uint32)), evaluation
        gpu, cpu = ev.last_groups(), cev.last_groups()
        for key in ("nbody", "ncell", "nactive"):
            assert np.array_equal(gpu[key][: len(cpu[key])], cpu[key]), (evaluation, key)
        assert (work.interactions, work.body_cell) == (cwork.interactions, cwork.body_cell)
        assert ev.last_grown == cev.last_grown
        grown.append(cev.last_grown)
        lo, hi = aligned[0], aligned[1]
        agree(got[lo:hi], cacc[lo:hi, :3].astype(np.float64))
        if not refit:  # the devices move their state into the build's key order (take_key_order)
            assert np.array_equal(order, tree.order)
            pos, vel = pos[order], vel[order]
            prev = None if prev is None else prev[order]
        # the integrator's drift, in key order
        pos = pos.copy()
        pos[:, :3] = (pos[:, :3].astype(np.float64) + 0.01 * vel).astype(np.float32)
    assert grown[0] == grown[4] == 0 and 0 < grown[1] <= grown[2] <= grown[3]  # cubes grow, then rebuilt


def _trajectory(every, k=1, steps=9, gpus=None, opening="cube"):
    """Positions (load order) after `steps` steps of the tree at rebuild_every = `every`, and each step's
    evaluators' evaluations since their build: one GPU (the CUDA backend), k devices on GPU 0 (the
    engine's run, single driver), or `gpus` = "all" through --gpus (peer exchange)."""
    from app.backends.cuda.multi import gpu_devices, make_exchange
    from app.backends.multi import multi_backend_class
    from app.parallel.multidevice import MultiDeviceRun

    bodies, physics = bench_bodies(3001), Physics(softening=0.01, dt=1e-3)
    if k > 1:
        run = MultiDeviceRun(gpu_devices([0] * k), k, "single", make_exchange=make_exchange)
        try:
            run.load(bodies, physics, "tree")
            for d in run.devices:
                d.evaluator.set_tunables(rebuild_every=every, opening=opening)
            run.integrator.invalidate()
            since = []
            for _ in range(steps):
                run.step(1)
                since.append([d.evaluator.since_build for d in run.devices])
            return run.in_body_order(run.gathered("pos"))[:, :3].astype(np.float64), since
        finally:
            run.close()
    backend = CUDA() if gpus is None else multi_backend_class(CUDA, gpus, "single", "peer")()
    try:
        backend.load(bodies, physics, "tree")
        backend.set_tunables(rebuild_every=every, opening=opening)
        since = []
        for _ in range(steps):
            backend.step(1)
            since.append([d.evaluator.since_build for d in backend._run.devices])
        return backend.state().pos, since
    finally:
        backend.close()


@pytest.mark.parametrize("k", [2, 3])
def test_k_devices_on_gpu0_refitting_are_bitwise_one_gpu_refitting(k):
    one, since = _trajectory(4)
    many, since_k = _trajectory(4, k)
    assert [s[0] for s in since] == [1, 2, 3, 0, 1, 2, 3, 0, 1]  # evaluation 0 is the load's a(x)
    assert since_k == [[s[0]] * k for s in since]
    assert np.array_equal(one, many)
    built, _ = _trajectory(1)
    assert 0 < relative_error(one, built)[0] < 1e-4  # the refit moves the trajectory within the tree's error


def test_the_relative_test_through_the_engine_is_bitwise_on_k_devices_and_near_the_cube_test():
    """opening = rel through the engine: the walk reads the state's last accelerations (at each body's
    sorted source row after a build, at its row after a refit). Two and three devices on GPU 0 are
    bitwise alike, so are one GPU and two where there are two (each pair starts from the same history:
    a(x) depends on the last accelerations), and the trajectory stays within the tree's error of the cube
    test's."""
    from app.backends.cuda.context import device_count

    two = _trajectory(4, 2, opening="rel")[0]
    assert np.array_equal(two, _trajectory(4, 3, opening="rel")[0])
    one, _ = _trajectory(4, opening="rel")
    if device_count() >= 2:
        assert np.array_equal(one, _trajectory(4, gpus="all", opening="rel")[0])
    cube, _ = _trajectory(4)
    assert 0 < relative_error(one, cube)[0] < 1e-4
    assert 0 < relative_error(two, cube)[0] < 1e-4


def test_two_gpus_refitting_are_bitwise_one_gpu_refitting():
    from app.backends.cuda.context import device_count

    if device_count() < 2:
        pytest.skip("needs two GPUs")
    one, _ = _trajectory(4)
    two, since = _trajectory(4, gpus="all")
    assert since[2] == [3, 3] and since[3] == [0, 0]
    assert np.array_equal(one, two)


def _collision_cadence(k: int, rule: str, steps: int = 12):
    """Positions (load order) and each step's evaluations since the build of a fast collision (dt 0.02)
    under rebuild_every 16 and `rule`: one GPU (k = 1, the CUDA backend) or k devices on GPU 0."""
    from app.backends.cuda.multi import gpu_devices, make_exchange
    from app.parallel.multidevice import MultiDeviceRun

    bodies, physics = bench_bodies(4096, scene="collision"), Physics(softening=0.02, dt=0.02)
    tunables = dict(rebuild_every=16, rebuild_rule=rule)
    if k == 1:
        backend = CUDA()
        try:
            backend.load(bodies, physics, "tree")
            backend.set_tunables(**tunables)
            since = []
            for _ in range(steps):
                backend.step(1)
                since.append(backend._run.devices[0].evaluator.since_build)
            return backend.state().pos, since
        finally:
            backend.close()
    run = MultiDeviceRun(gpu_devices([0] * k), k, "single", make_exchange=make_exchange)
    try:
        run.load(bodies, physics, "tree")
        for d in run.devices:
            d.evaluator.set_tunables(**tunables)
        run.integrator.invalidate()
        since = []
        for _ in range(steps):
            run.step(1)
            cadences = {d.evaluator.since_build for d in run.devices}
            assert len(cadences) == 1  # every device builds the same tree
            since.append(cadences.pop())
        return run.in_body_order(run.gathered("pos"))[:, :3].astype(np.float64), since
    finally:
        run.close()


def test_the_adaptive_rule_builds_early_and_k_devices_decide_on_their_summed_counts(monkeypatch):
    from app.engine import refit_cadence

    monkeypatch.setattr(refit_cadence, "BUILD_COST", 0.15)  # 4,096 bodies: the model's fixed cost dwarfs
    one, since = _collision_cadence(1, "adaptive")
    assert 0 in since[1:] and max(since) < 12  # builds well before the cap of 16
    two, since_two = _collision_cadence(2, "adaptive")  # each device counts its key range only
    assert since_two == since and np.array_equal(one, two)
    _, fixed = _collision_cadence(1, "fixed")
    assert fixed == list(range(1, 13))
