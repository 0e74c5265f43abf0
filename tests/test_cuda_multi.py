"""Several GPUs through the multi-device driver, on whatever GPUs the machine has (gpu-marked).

On a one-GPU machine two devices share GPU 0: the driver, both drivers' threading, and the peer-copy
exchange (a same-device copy there) run for real. Accelerations of every fp32 record through the driver
equal the single-device path's; one-span shares are bitwise where the record's summation order does not
depend on the span (tests/test_cuda_seam.py says which).
"""

from __future__ import annotations

import numpy as np
import pytest

from app.backends import backend_class
from app.backends.cuda import registry
from app.bench import bench_bodies
from app.multidevice import DRIVERS, MultiDeviceRun
from app.physics import Physics, relative_error

CUDA = backend_class("cuda")
REASON = CUDA.why_not()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=f"CUDA unavailable: {REASON}")]
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
@pytest.mark.parametrize("kernel", [r.name for r in registry.RECORDS if r.precision == "fp32"
                                    and (r.max_n is None or r.max_n >= N)])
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


def test_fp64_is_refused_with_a_message():
    from app.errors import ConfigError

    with pytest.raises(ConfigError, match="fp32 records only"):
        _run("fp64", "single").load(bench_bodies(64), Physics(), "fp64")
