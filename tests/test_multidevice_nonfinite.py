"""Non-finite bodies under `--gpus`, without a GPU: every `check_every` steps each device checks its own
share (CPU devices: numpy on the share's rows, the host's form of the GPU kernel) and a bad body is
reported as on one GPU, a NonFiniteState naming the body (its index in the loaded state) and its device.

A NaN spreads to every body within a step or two (each force sums over every position), after which the
first bad body is body 0 on device 0. So the tests that name the injected body inject it in the step
before a check with the euler-damped integrator (its step evaluates the force before it moves the body);
the cadence test injects anywhere and checks when the report comes and that it names a bad row of the
device that holds it. The GPU form is in tests/test_cuda_multi.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_multidevice_async import QueueingGpus
from test_multidevice_backend import cloud
from test_multidevice_interop import KERNEL, twin_backend

from app.backends.cpu import CPUBackend
from app.backends.multi import multi_backend_class
from app.core.errors import NonFiniteState
from app.engine.forces import Span
from app.engine.integrator import CHECK_EVERY
from app.model.physics import Physics
from app.parallel.multidevice import DRIVERS

EULER = Physics(softening=0.02, dt=2e-3, integrator="euler-damped", damping=0.999)
LEAPFROG = Physics(softening=0.02, dt=2e-3)


def cpu_devices_backend(k: int, driver: str):
    return multi_backend_class(CPUBackend, k, driver, "auto")()


def poison(owner, body: int) -> None:
    """A NaN in one velocity component of `body` on `owner`, the DeviceState whose share holds it
    (through its own row access: the same call on GPUs, tests/test_cuda_multi.py)."""
    assert owner.share.start <= body < owner.share.start + owner.share.count
    row = np.array(owner.rows("vel", Span(body, 1)))
    row[0, 1] = np.nan
    owner.set_rows("vel", Span(body, 1), row)


def middle_of_share(backend, device: int) -> int:
    share = backend.shares()[device]
    return share.start + share.count // 2


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("k", [1, 2, 3])
def test_a_nan_body_is_named_with_its_device(k, driver):
    for device in range(k):
        backend = cpu_devices_backend(k, driver)
        try:
            backend.load(cloud(), EULER, "cpu-fp64")
            backend.step(CHECK_EVERY - 1)  # clean: no report
            body = middle_of_share(backend, device)
            poison(backend._run.devices[device], body)
            with pytest.raises(NonFiniteState) as info:
                backend.step(1)  # the check step
        finally:
            backend.close()
        e = info.value
        assert (e.index, e.device, e.step) == (body, device, CHECK_EVERY)
        assert f"body {body} on device {device} (cpu{device}) after step {CHECK_EVERY}" in str(e)


@pytest.mark.parametrize("offset", [0, 3, CHECK_EVERY - 1])
@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("k", [1, 2, 3])
def test_the_report_comes_at_the_next_check_and_names_a_bad_row_of_its_device(k, driver, offset):
    backend = cpu_devices_backend(k, driver)
    try:
        backend.load(cloud(), LEAPFROG, "cpu-simd")
        backend.step(CHECK_EVERY + offset)  # past one clean check
        poison(backend._run.devices[k - 1], middle_of_share(backend, k - 1))
        calls = 0
        with pytest.raises(NonFiniteState) as info:
            for _ in range(2 * CHECK_EVERY):
                calls += 1
                backend.step(1)
        e = info.value
        assert calls == CHECK_EVERY - offset and e.step == 2 * CHECK_EVERY  # the next check, not later
        share = backend.shares()[e.device]
        assert share.start <= e.index < share.start + share.count
        state = backend.state()
        assert not (np.isfinite(state.pos[e.index]).all() and np.isfinite(state.vel[e.index]).all())
    finally:
        backend.close()


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("k", [1, 2, 3])
def test_a_clean_run_never_reports_and_checks_every_share(k, driver, monkeypatch):
    backend = cpu_devices_backend(k, driver)
    checked = []
    try:
        backend.load(cloud(), LEAPFROG, "cpu-simd")
        for device in backend._run.devices:

            def counted(device=device, launch=device.launch_check):
                checked.append(device.name)
                launch()

            monkeypatch.setattr(device, "launch_check", counted)
        for steps in (1, 7, CHECK_EVERY, 13, 3):  # 32 steps: four checks
            backend.step(steps)
    finally:
        backend.close()
    assert sorted(checked) == sorted([f"cpu{i}" for i in range(k)] * 4)


def test_check_every_0_never_checks():
    backend = cpu_devices_backend(2, "single")
    backend.check_every = 0
    try:
        backend.load(cloud(), EULER, "cpu-fp64")
        poison(backend._run.devices[1], middle_of_share(backend, 1))
        backend.step(3 * CHECK_EVERY)  # the NaN spreads; nobody looks
        assert not np.isfinite(backend.state().pos).all()
    finally:
        backend.close()


# --- without a host wait: twin GPUs whose checks are queued like the kernel (test_multidevice_async.py) ---
@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("k", [1, 3])
def test_queued_checks_report_a_step_call_later_at_most_without_a_host_wait(k, driver, seed):
    """While drawing, the check's answer is read once the device got there: in the step() call of the
    check or the next one (the queues are drained between calls, as GL's draw waits for the GPUs), with
    no blocking wait on any device."""
    kind = QueueingGpus(seed)
    backend = twin_backend(k, driver, kind)
    try:
        backend.load(cloud(), EULER, KERNEL)
        assert backend.attach_gl_buffers(7, 8)
        backend.step(CHECK_EVERY - 1)
        kind.streams.drain()
        body = middle_of_share(backend, k - 1)
        poison(backend._run.devices[k - 1], body)
        waits = sum(d.blocking_waits for d in kind.devices)
        reported_at = None
        for call in range(1, 3):
            try:
                backend.step(1)
            except NonFiniteState as e:
                reported_at, report = call, e
                break
            kind.streams.drain()
        assert sum(d.blocking_waits for d in kind.devices) == waits
    finally:
        kind.streams.drain()
        backend.close()
    assert reported_at in (1, 2), "not reported within one step() call after the check"
    assert (report.index, report.device) == (body, k - 1)  # the check step's answer, read late


# --- the viewer: paused on the last good frame, as with one GPU ---------------------------------------------
@pytest.mark.gl
def test_the_viewer_pauses_naming_the_body_and_device():
    from test_render import H, W

    from app.render import gl_setup
    from app.render.canvas import Viewer
    from app.scene import RunSettings, Scene

    backend = cpu_devices_backend(2, "threads")
    backend.check_every = 1
    backend.load(cloud(), EULER, "cpu-fp64")
    try:
        gl_setup.configure(headless=True)
        viewer = Viewer(
            Scene(name="nan", run=RunSettings(steps_per_frame=1)), backend, size=(W, H), headless=True
        )
    except Exception as e:  # noqa: BLE001 - no GL here
        backend.close()
        pytest.skip(f"no headless GL context: {type(e).__name__}: {e}")
    try:
        viewer.advance()
        body = middle_of_share(backend, 1)
        poison(backend._run.devices[1], body)
        viewer.advance()
        assert viewer.paused and viewer.stats.paused
        assert f"body {body} on device 1 (cpu1)" in viewer.stats.extra["message"]
        t = backend.time
        viewer.advance()  # stays paused: no exception, nothing stepped
        viewer.render_to_array()
        assert backend.time == t
    finally:
        viewer.close()
        backend.close()


@pytest.mark.parametrize("k", [1, 2])
def test_under_a_domain_split_the_bad_body_is_named_by_its_load_order_index(k):
    """The tree keeps the state in key order: rows are not bodies. A NaN in a row (on every device's copy,
    as a real blow-up is: every device integrates every row) is reported as the body that row holds, in
    load order, by the device whose share the row is in after the next re-sort."""
    from app.parallel.decomposition import DOMAINS

    backend = cpu_devices_backend(k, "single")
    try:
        backend.load(cloud(), EULER, "cpu-tree")
        backend.step(CHECK_EVERY - 1)
        run = backend._run
        assert run.decomposition is DOMAINS and run.ids is not None
        row = next(r for r in range(backend.n) if run.ids[r] != r)  # a row that holds another body
        body = int(run.ids[row])
        for device in run.devices:
            values = np.array(device.rows("vel", Span(row, 1)))
            values[0, 1] = np.nan
            device.set_rows("vel", Span(row, 1), values)
        with pytest.raises(NonFiniteState) as info:
            backend.step(1)
        now = int(np.flatnonzero(run.ids == body)[0])  # where the re-sort put it
        shares = backend.shares()
    finally:
        backend.close()
    e = info.value
    assert e.index == body and e.step == CHECK_EVERY
    assert shares[e.device].start <= now < shares[e.device].stop  # its row's owner reports it
    assert f"body {body} on device {e.device}" in str(e)
