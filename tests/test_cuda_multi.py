"""Several GPUs through the multi-device driver, on whatever GPUs the machine has (gpu-marked).

On a one-GPU machine two devices share GPU 0: the driver, both drivers' threading, and the peer-copy
exchange (a same-device copy there) run for real. Accelerations of every fp32 record through the driver
equal the single-device path's; one-span shares are bitwise where the record's summation order does not
depend on the span (tests/test_cuda_seam.py says which). Through the Backend `--gpus` makes: K = 1 is
bitwise the single-device path for every fp32 record, NCCL runs with a one-GPU communicator, asking for
more GPUs than exist exits 2, and an out-of-memory names the GPU. A NaN body in either share of two devices
on GPU 0 is found by its device at the next check (waiting, and read later without a wait), and `--gpus 1`
raises the one-GPU NonFiniteState naming the body and the GPU. The tree's live force error sample
(`--gpus 1`, and two devices on GPU 0) is the single-GPU backend's within float32 rounding. With an
NVIDIA EGL context (gl-marked): GPU 0's interop VBOs hold the state after steps (`--gpus 1`, and two
devices' slices on GPU 0), and the headless viewer's frame CSV has its map/unmap times. With two GPUs or
more, every exchange and driver is checked against one GPU (skipped on one).

    make test PYTEST_ARGS='tests/test_cuda_multi.py -v'
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import gl_vbo, read_gl

from app.backends import backend_class
from app.backends.cuda import registry
from app.model.physics import Physics, relative_error
from app.parallel.multidevice import DRIVERS, MultiDeviceRun
from app.tools.bench import bench_bodies

CUDA = backend_class("cuda")
REASON = CUDA.why_not()
pytestmark = pytest.mark.gpu  # (skipped where CUDA cannot run: tests/conftest.py)
N = 3001


def _single(bodies, physics, kernel, steps=0):
    backend = CUDA()
    try:
        backend.load(bodies, physics, kernel)
        if steps:
            backend.step(steps)
            return backend.state().pos
        return backend.accelerations()
    finally:
        backend.close()


def _run(kernel: str, driver: str, k: int = 2):
    from app.backends.cuda.multi import gpu_devices, make_exchange

    return MultiDeviceRun(gpu_devices([0] * k), k, driver, make_exchange=make_exchange)


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize(
    "kernel",
    [r.name for r in registry.RECORDS if r.precision == "fp32" and (r.max_n is None or r.max_n >= N)],
)
def test_driver_accelerations_equal_the_single_device_path(kernel, driver):
    bodies, physics = bench_bodies(N), Physics(softening=0.01)
    run = _run(kernel, driver)
    try:
        run.load(bodies, physics, kernel)
        got = run.accelerations()
    finally:
        run.close()
    worst, _ = relative_error(got, _single(bodies, physics, kernel))
    assert worst <= 1e-5, f"{kernel} via {driver}: {worst:.3g}"


@pytest.mark.parametrize("driver", DRIVERS)
def test_driver_steps_like_one_device(driver):
    bodies, physics = bench_bodies(N), Physics(softening=0.01, dt=1e-3)
    run = _run("shared", driver)
    try:
        run.load(bodies, physics, "shared")
        run.step(20)
        pos = run.gathered("pos")[:, :3].astype(np.float64)
        assert run.ops.exchange_count == 20
    finally:
        run.close()
    assert np.array_equal(pos, _single(bodies, physics, "shared", steps=20))


# --- the decompositions (app/parallel/decomposition.py) on the GPU: domains for the tree, pairs for Newton 3
# -----
@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("k", [1, 2, 3])
def test_tree_domains_on_gpu0_are_bitwise_one_gpu(k, driver):
    """K devices on GPU 0 each build the whole tree and walk their key range: the accelerations and a
    5-step trajectory are bitwise the single-GPU tree's (the same tree, the same walk per group), and the
    work counted over the devices is one GPU's."""
    from app.parallel.decomposition import DOMAINS

    bodies, physics = bench_bodies(N), Physics(softening=0.01, dt=1e-3)
    run = _run("tree", driver, k)
    try:
        run.load(bodies, physics, "tree")
        assert run.decomposition is DOMAINS
        acc = run.accelerations()
        work = run.step(5)  # five evaluations: the first step starts from the cached a(x)
        pos = run.in_body_order(run.gathered("pos"))[:, :3].astype(np.float64)  # rows are in key order
    finally:
        run.close()
    single = CUDA()
    try:
        single.load(bodies, physics, "tree")
        want = single.accelerations()
        one = single.step(5)
        want_pos = single.state().pos
    finally:
        single.close()
    assert np.array_equal(acc, want) and np.array_equal(pos, want_pos)
    assert (work.interactions, work.pair_equivalent) == (one.interactions, 5 * N * N)


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("k", [2, 3])
def test_pair_slices_on_gpu0_sum_to_one_gpu(k, driver):
    """atomics-n3l over K devices on GPU 0: each a slice of the pair tiles, the partial sums reduced onto
    each share: within float32 rounding of one GPU, N^2 interactions counted once over the devices."""
    from app.parallel.decomposition import PAIRS

    bodies, physics = bench_bodies(N), Physics(softening=0.01)
    run = _run("atomics-n3l", driver, k)
    try:
        run.load(bodies, physics, "atomics-n3l")
        assert run.decomposition is PAIRS
        run.ops.force()
        work = run.ops.finish()
        got = run.gathered("acc")[:, :3].astype(np.float64)
    finally:
        run.close()
    assert (work.interactions, work.pair_equivalent) == (N * N, N * N)
    worst, _ = relative_error(got, _single(bodies, physics, "atomics-n3l"))
    assert worst <= 1e-5, f"atomics-n3l over {k} devices: {worst:.3g}"


def test_best_under_gpus_runs_its_pick_with_the_pick_s_decomposition():
    """`best` resolves on each device to the record it picks for this N; the run splits as that record
    says (atomics-n3l at 1M: pairs), so a second GPU is not a copy of the first."""
    from app.parallel.decomposition import of

    bodies, physics = bench_bodies(N), Physics(softening=0.01)
    run = _run("best", "threads", 2)
    try:
        run.load(bodies, physics, "best")
        picked = run.devices[0].evaluator.record
        assert picked.name != "best" and run.decomposition is of(picked)
    finally:
        run.close()


def test_best_under_gpus_2_reads_the_tuning_on_2_gpus(tmp_path, monkeypatch, caplog):
    """`--gpus 2` (two devices on GPU 0 where there is one GPU): `best` on every device runs the cache's
    tuning on 2 GPUs, split as that record says; without one, the one-GPU pick and one warning naming
    `nbody-live tune --gpus 2` (said once for both devices)."""
    import logging

    from app.backends.cuda import evaluator
    from app.backends.cuda import tuning_cache as cache
    from app.backends.cuda.context import device_facts
    from app.backends.cuda.multi import GpuDevices, gpu_devices
    from app.backends.multi import multi_backend_class

    monkeypatch.setenv("NBODY_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(evaluator, "_SAID_FOR_DEVICES", {})
    monkeypatch.setattr(GpuDevices, "count", staticmethod(lambda: max(2, _gpu_count())))
    monkeypatch.setattr(GpuDevices, "factory", staticmethod(lambda k: gpu_devices([0] * k)))
    facts, records = device_facts(0), {r.name: r for r in registry.RECORDS}
    bodies, physics = bench_bodies(N), Physics(softening=0.01)
    one_gpu = records["best"].policy.resolve(records, facts, N)[0]
    backend = multi_backend_class(CUDA, 2, "threads", "auto")()
    try:
        with caplog.at_level(logging.INFO, logger="app"):
            backend.load(bodies, physics, "best")
        assert [d.evaluator.record.name for d in backend._run.devices] == [one_gpu.name] * 2
        warned = [
            r.getMessage()
            for r in caplog.records
            if r.levelno == logging.WARNING and r.getMessage().startswith("best")
        ]
        assert len(warned) == 1 and "nbody-live tune --gpus 2" in warned[0], warned

        cache.write_cache(
            {
                "schema": cache.SCHEMA,
                "gpu": facts.name,
                "driver": facts.driver_version,
                "source_hash": cache.source_hash(registry.RECORDS),
                "gpus": 2,
                "best": [
                    {"n": N, "variant": "multi-thread-per-body", "tunables": {"q": 8, "block_size": 128}}
                ],
            }
        )
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="app"):
            backend.load(bodies, physics, "best")
        assert [d.evaluator.record.name for d in backend._run.devices] == ["multi-thread-per-body"] * 2
        assert backend.split_name == "targets"
        assert any(
            r.getMessage().startswith(
                f"best: tuned cache for {facts.name} on 2 GPUs: N = 3,001 -> "
                "multi-thread-per-body block_size=128 q=8"
            )
            for r in caplog.records
        )
        worst, _ = relative_error(backend.accelerations(), _single(bodies, physics, "shared"))
        assert worst <= 1e-4
    finally:
        backend.close()


# --- non-finite bodies: cuda/nonfinite.py on each share (the CPU form: test_multidevice_nonfinite.py) ---
# The euler-damped step evaluates the force before it moves a NaN body: the next check still names it.
EULER = Physics(softening=0.01, dt=1e-3, integrator="euler-damped", damping=0.999)


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_nan_body_on_one_share_is_found_with_its_device(driver):
    """Two devices on GPU 0: each checks its own share every check_every steps; a clean run finds
    nothing, a NaN put into one body of either share is found by that share's device at the next check."""
    from test_multidevice_nonfinite import poison

    for device in (0, 1):
        run = _run("shared", driver)
        try:
            run.load(bench_bodies(N), EULER, "shared")
            for _ in range(run.check_every + 3):  # one check, clean
                run.step(1)
                assert run.first_nonfinite(wait=True) is None
            run.step(run.check_every - 4)  # the next step checks
            body = run.devices[device].share.start + 17
            poison(run.devices[device], body)
            run.step(1)
            assert run.first_nonfinite(wait=True) == (device, body)
        finally:
            run.close()


@pytest.mark.parametrize("driver", DRIVERS)
def test_the_check_is_read_without_a_host_wait_once_the_gpu_got_there(driver):
    """As while drawing: the first read queues the flag's copy behind an event and waits for nothing
    (None); once the GPU has passed it, the next read has the body."""
    from test_multidevice_nonfinite import poison

    run = _run("shared", driver)
    try:
        run.load(bench_bodies(N), EULER, "shared")
        run.step(run.check_every - 1)
        body = run.devices[1].share.start + 5
        poison(run.devices[1], body)
        run.step(1)
        assert run.first_nonfinite() is None
        for device in run.devices:
            device.synchronize()
        assert run.first_nonfinite() == (1, body)
        assert run.first_nonfinite() is None  # read once
    finally:
        run.close()


@pytest.mark.parametrize("driver", DRIVERS)
def test_gpus_1_reports_a_nan_body_as_one_gpu_does_naming_the_gpu(driver):
    from test_multidevice_nonfinite import poison

    from app.core.errors import NonFiniteState

    backend = _backend(1, driver=driver)
    try:
        backend.load(bench_bodies(N), EULER, "shared")
        backend.step(backend.check_every - 1)
        poison(backend._run.devices[0], 1234)
        with pytest.raises(NonFiniteState) as info:
            backend.step(1)
    finally:
        backend.close()
    e = info.value
    if driver == "auto":  # --gpus 1 with the auto driver is the single-GPU backend: no device to name
        assert isinstance(backend, CUDA) and (e.index, e.device, e.step) == (1234, None, backend.check_every)
    else:
        assert (e.index, e.device, e.step) == (1234, 0, backend.check_every)
        assert "body 1234 on device 0 (GPU 0 (" in str(e)
    assert "lower dt or raise the softening" in str(e)


def test_fp64_is_refused_with_a_message():
    from app.core.errors import ConfigError

    with pytest.raises(ConfigError, match="fp32 records only"):
        _run("fp64", "single").load(bench_bodies(64), Physics(), "fp64")


# --- through the Backend that --gpus makes (app/backends/multi.py) ----------------------------------------
def _backend(k, exchange="auto", driver="threads"):
    from app.backends.multi import multi_backend_class

    return multi_backend_class(CUDA, k, driver, exchange)()


ATOMIC_ORDER = {"atomics-n3l", "best"}  # sums whose last bits follow the order of atomics


def _gpu_count() -> int:
    from app.backends.cuda.context import device_count

    return device_count()


@pytest.mark.parametrize(
    "kernel",
    [r.name for r in registry.RECORDS if r.precision == "fp32" and (r.max_n is None or r.max_n >= N)],
)
def test_gpus_1_gives_the_single_device_accelerations_bitwise(kernel):
    """--gpus 1: the driver over one GPU, one share (every target), the same record: the same sums, bitwise
    where they do not depend on the order in which atomics land (atomics-n3l adds each reaction with an
    atomic, in whatever order the warps run: two runs of one GPU differ in the last bits; `best` may pick
    it), there to float32 rounding."""
    bodies, physics = bench_bodies(N), Physics(softening=0.01)
    backend = _backend(1)
    try:
        backend.load(bodies, physics, kernel)
        got = backend.accelerations()
    finally:
        backend.close()
    want = _single(bodies, physics, kernel)
    if kernel in ATOMIC_ORDER:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max(), err_msg=kernel)
    else:
        assert np.array_equal(got, want), kernel


@pytest.mark.parametrize("driver", DRIVERS)
def test_gpus_1_steps_bitwise_like_one_device_and_reports_its_gpu(driver):
    bodies, physics = bench_bodies(N), Physics(softening=0.01, dt=1e-3)
    backend = _backend(1, driver=driver)
    try:
        backend.load(bodies, physics, "shared")
        timings = [backend.step(5) for _ in range(4)]
        pos = backend.state().pos
    finally:
        backend.close()
    assert np.array_equal(pos, _single(bodies, physics, "shared", steps=20))
    if driver == "auto":  # the single-GPU backend itself: no per-device bars
        assert isinstance(backend, CUDA) and not timings[-1].devices and timings[-1].force_ms > 0
        return
    (device,) = timings[-1].devices
    assert device.startswith("0 GPU 0 (")  # "<index> <CudaDevice.name>"
    assert all(ms > 0 for t in timings for ms in t.devices.values())


def _nccl_or_skip():
    from app.backends.cuda.nccl import load_nccl
    from app.core.errors import ConfigError

    try:
        return load_nccl()
    except ConfigError as e:
        pytest.skip(str(e))


def test_nccl_exchange_with_a_one_gpu_communicator_steps_like_the_peer_exchange():
    """--exchange nccl on one GPU: a one-rank communicator, the broadcast group over the same pointers."""
    _nccl_or_skip()
    bodies, physics = bench_bodies(N), Physics(softening=0.01, dt=1e-3)
    runs = {}
    for exchange in ("nccl", "peer"):
        backend = _backend(1, exchange)
        try:
            backend.load(bodies, physics, "shared")
            assert backend.exchange_name == exchange
            backend.step(20)
            runs[exchange] = backend.state().pos
        finally:
            backend.close()
    assert np.array_equal(runs["nccl"], runs["peer"])


def test_nccl_refuses_two_devices_on_one_gpu():
    from app.backends.cuda.multi import gpu_devices
    from app.backends.cuda.nccl import NcclExchange
    from app.core.errors import ConfigError

    run = MultiDeviceRun(gpu_devices([0, 0]), 2, "single", make_exchange=NcclExchange)
    with pytest.raises(ConfigError, match="NCCL takes one rank per GPU"):
        run.load(bench_bodies(256), Physics(), "shared")
    run.close()


def test_out_of_memory_on_one_gpu_names_it(monkeypatch):
    from app.backends.cuda.context import driver
    from app.core.errors import RuntimeFault

    monkeypatch.setattr(driver(), "mem_get_info", lambda: (1024, 80 * 2**30))  # a full GPU: 1 KiB free
    backend = _backend(1)
    with pytest.raises(
        RuntimeFault,
        match=r"out of GPU memory: N = 3,001 bodies need .* on GPU 0 \(.*\) "
        r"but only 0\.0 MiB are free; at most N ≈ 18 fits",
    ):
        backend.load(bench_bodies(N), Physics(), "shared")
    backend.close()


def test_more_gpus_than_exist_exits_2(tmp_path, capsys):
    from app.cli import main

    k = _gpu_count() + 1
    rc = main(
        [
            "simulate",
            "--n",
            "256",
            "--steps",
            "1",
            "--backend",
            "cuda",
            "--gpus",
            str(k),
            "--out",
            str(tmp_path / "o.npz"),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and f"--gpus {k}: this machine has {k - 1} GPUs" in err, err
    assert not (tmp_path / "o.npz").exists()


# --- the live force error (Backend.force_error_sample; the CPU form: test_multidevice_backend.py) -----------
TREE_PHYSICS = Physics(softening=0.01, dt=1e-3)


def _sample_rows(n: int) -> np.ndarray:
    """Rows over both shares of two devices, their first and last rows included, in no order."""
    return np.array([n - 1, 0, n // 2, n // 2 - 1, 7, 3 * n // 4, n // 4, n - 2, 1, 2 * n // 3])


def _single_sample(state, rows):
    """One GPU's (approx, exact) for `state` with the `tree` (its a(x) evaluated at the sample)."""
    backend = CUDA()
    try:
        backend.load(state, TREE_PHYSICS, "tree")
        return backend.force_error_sample(rows)
    finally:
        backend.close()


def _same_sample(got, want, what: str) -> None:
    for name, g, w in zip(("approx", "exact"), got, want, strict=True):
        assert g.dtype == np.float64 and g.shape == w.shape, (what, name)
        worst, _ = relative_error(g, w)
        assert worst <= 1e-5, f"{what} {name}: {worst:.3g}"  # fp32 rounding: the same sums
    assert 0 < relative_error(*got)[0] < 5e-3, what  # the tree's own error against all-pairs


@pytest.mark.parametrize("driver", DRIVERS)
def test_gpus_1_samples_the_trees_force_error_as_one_gpu(driver):
    """--gpus 1 with the `tree`, after steps (the driver's threads alive): approx = the GPU's cached rows,
    exact = `shared` over all N on GPU 0; both those of the single-GPU backend at the same state."""
    bodies = bench_bodies(N)
    rows = _sample_rows(N)
    backend = _backend(1, driver=driver)
    try:
        backend.load(bodies, TREE_PHYSICS, "tree")
        # a build at every step and the cube test, as the one-GPU sample's fresh a(x) (rel reads the last a)
        backend.set_tunables(rebuild_every=1, opening="cube")
        backend.step(3)
        got = backend.force_error_sample(rows)
        state = backend.state()
        backend.step(1)  # the run goes on after a sample
    finally:
        backend.close()
    _same_sample(got, _single_sample(state, rows), f"--gpus 1 {driver}")


@pytest.mark.parametrize("driver", DRIVERS)
def test_two_devices_on_gpu_0_sample_the_trees_force_error_as_one_gpu(driver):
    """Two devices on GPU 0: each row from the device whose share holds it, exact on device 0."""
    from app.model.bodies import Bodies

    bodies = bench_bodies(N)
    rows = _sample_rows(N)
    run = _run("tree", driver)
    try:
        run.load(bodies, TREE_PHYSICS, "tree")
        for device in run.devices:  # a build at every step and the cube test, as the one-GPU sample's a(x)
            device.evaluator.set_tunables(rebuild_every=1, opening="cube")
        run.step(3)
        assert all(any(d.share.start <= r < d.share.stop for r in rows) for d in run.devices)
        got = run.force_error_sample(rows)
        pos, vel = (run.in_body_order(run.gathered(f))[:, :3].astype(np.float64) for f in ("pos", "vel"))
    finally:
        run.close()
    state = Bodies(pos=pos, vel=vel, mass=bodies.mass.copy())
    _same_sample(got, _single_sample(state, rows), f"two devices on GPU 0, {driver}")


# --- rendering through GPU 0's CUDA-GL interop (app/backends/cuda/multi_interop.py) -------------------------
def _gl_pair(canvas, n: int):
    """Two VBOs (positions, speeds) for n bodies: (the gloo objects, to keep alive; their GL names)."""
    pos_vbo, pos_name = gl_vbo(canvas, np.zeros((n, 4), np.float32))
    speed_vbo, speed_name = gl_vbo(canvas, np.zeros((n, 1), np.float32))
    return (pos_vbo, speed_vbo), (pos_name, speed_name)


@pytest.mark.gl
@pytest.mark.parametrize("driver", DRIVERS)
def test_gpus_1_vbos_hold_the_state_after_steps(egl_canvas, driver):
    """--gpus 1 with a headless NVIDIA EGL context: GPU 0 registers the VBOs, each step() call copies the
    state into them on the GPU; they equal the state read back, bitwise the single-device path's."""
    from app.backends.base import INTEROP_PATH

    bodies, physics = bench_bodies(N), Physics(softening=0.01, dt=1e-3)
    _keep, (pos_name, speed_name) = _gl_pair(egl_canvas, N)
    backend = _backend(1, driver=driver)
    try:
        backend.load(bodies, physics, "shared")
        assert backend.attach_gl_buffers(pos_name, speed_name), backend.data_path
        # (--gpus 1 with the auto driver is the single-GPU backend itself)
        one_gpu = INTEROP_PATH if driver == "auto" else f"{INTEROP_PATH} on GPU 0 from 1 GPUs"
        assert backend.data_path == one_gpu
        assert np.array_equal(read_gl(egl_canvas, pos_name, 16 * N).reshape(N, 4), bodies.pos4(np.float32))
        for _ in range(4):
            timings = backend.step(5)
            assert timings.map_ms > 0 and timings.unmap_ms > 0 and not backend.gl_buffers.is_mapped
        egl_canvas.set_current()
        gl_pos = read_gl(egl_canvas, pos_name, 16 * N).reshape(N, 4)
        gl_speed = read_gl(egl_canvas, speed_name, 4 * N)
        state = backend.state()
        speeds = backend.host_render_arrays()[1]
    finally:
        backend.close()
    assert np.array_equal(gl_pos[:, :3], state.pos.astype(np.float32))
    assert np.array_equal(gl_pos[:, 3], bodies.mass.astype(np.float32))
    assert np.array_equal(gl_speed, speeds)
    assert np.array_equal(gl_pos[:, :3].astype(np.float64), _single(bodies, physics, "shared", steps=20))


@pytest.mark.gl
@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("kernel", ["shared", "tree"])
def test_two_devices_on_gpu_0_copy_their_slices_into_the_vbos(egl_canvas, driver, kernel):
    """Two shares on one GPU: positions whole from device 0, each device's speed rows into their place;
    under the tree's domain split device 0 holds every body in key order, scattered to the bodies' rows."""
    from app.backends.cuda.multi_interop import attach_render_target

    bodies, physics = bench_bodies(N), Physics(softening=0.01, dt=1e-3)
    _keep, (pos_name, speed_name) = _gl_pair(egl_canvas, N)
    run = _run(kernel, driver)
    target = None
    whole = kernel == "tree"
    try:
        run.load(bodies, physics, kernel)
        target = attach_render_target(pos_name, speed_name, run.devices, N, whole)
        assert target is not None
        run.step(10)
        target.publish(run.devices, N, whole)
        egl_canvas.set_current()
        gl_pos = read_gl(egl_canvas, pos_name, 16 * N).reshape(N, 4)
        gl_speed = read_gl(egl_canvas, speed_name, 4 * N)
        if whole:  # re-sorted: the state's rows are not the bodies
            assert not np.array_equal(run.ids, np.arange(N))
        want_pos, want_speed = (run.in_body_order(run.gathered(f)) for f in ("pos", "speed"))
        assert [d.share.count for d in run.devices] == [N // 2 + 1, N // 2]
    finally:
        if target is not None:
            target.close()
        run.close()
    assert np.array_equal(gl_pos, want_pos) and np.array_equal(gl_speed, want_speed)


@pytest.mark.gl
def test_gpus_1_viewer_runs_with_interop_and_times_map_unmap(egl_canvas, tmp_path):
    """`run --gpus 1 --headless --timings`: the frames' CSV has the map/unmap columns, filled on every
    frame, and nothing is uploaded from the host."""
    import csv

    from app.cli import main

    out = tmp_path / "frames.csv"
    rc = main(
        [
            "-q",
            "run",
            "plummer",
            "--n",
            "4096",
            "--frames",
            "30",
            "--headless",
            "--backend",
            "cuda",
            "--gpus",
            "1",
            "--no-panel",
            "--timings",
            str(out),
        ]
    )
    assert rc == 0
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 30 and {"map_ms", "unmap_ms", "upload_ms"} <= set(rows[0])
    assert all(float(r["map_ms"]) > 0 and float(r["unmap_ms"]) > 0 for r in rows[1:])
    assert all(float(r["upload_ms"]) == 0.0 for r in rows)


@pytest.mark.skipif(REASON is not None or _gpu_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("kernel", ["shared", "atomics-n3l", "tree"])  # targets, pairs, domains
@pytest.mark.parametrize("exchange", ["peer", "nccl", "host"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_all_gpus_agree_with_one(exchange, driver, kernel):
    """Several real GPUs (the two-GPU issue's machine): every decomposition, exchange and driver, within
    fp32 rounding of one GPU after 20 steps; bitwise for `shared` (each share sums the same sources in the
    same order) and the tree (every GPU builds the same tree and walks its groups as one GPU does)."""
    if exchange == "nccl":
        _nccl_or_skip()
    bodies, physics = bench_bodies(N), Physics(softening=0.01, dt=1e-3)
    backend = _backend("all", exchange, driver)
    try:
        backend.load(bodies, physics, kernel)
        backend.step(20)
        pos = backend.state().pos
        assert len(backend.step(1).devices) == _gpu_count()
    finally:
        backend.close()
    ref = _single(bodies, physics, kernel, steps=20)
    if kernel in ATOMIC_ORDER:
        assert np.abs(pos - ref).max() <= 1e-5 * np.abs(ref).max()
    else:
        assert np.array_equal(pos, ref), f"{kernel}: {np.abs(pos - ref).max():.3g}"
