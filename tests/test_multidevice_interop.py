"""`--gpus N` with CUDA–GL interop, without a GPU: the CPU twin of GPU 0's render target.

The twin's "GPUs" are CPU devices (fp32 `cpu-simd`: float4 positions and float speeds, the GPU buffers'
layout) whose buffers are addressed by pointer, and whose device-to-device copy is a memmove between
those addresses: the real PeerExchange and GpuRenderTarget run over them. The "mapped VBOs" are two host
arrays. What is checked: which device copies which rows where, that the VBOs hold the state after each
step (bitwise the single CPU backend's), and that no host read-back happens per frame once the buffers
are attached (the devices' host reads fail). The GPU form: tests/test_cuda_multi.py (gpu-marked).
"""

from __future__ import annotations

import ctypes
from contextlib import contextmanager, nullcontext

import numpy as np
import pytest
from test_multidevice_backend import cloud

from app.backends.base import INTEROP_PATH
from app.backends.cpu import CPUBackend
from app.backends.cpu_multi import CpuDevice
from app.backends.cuda.interop import MappedPointers
from app.backends.cuda.multi import PeerExchange
from app.backends.cuda.multi_interop import GpuRenderTarget
from app.backends.multi import MultiDeviceBackend
from app.core.errors import RuntimeFault
from app.engine.forces import Span
from app.model.physics import Physics
from app.parallel.multidevice import DRIVERS, RenderCopy, render_copies

KERNEL = "cpu-simd"  # fp32: the GPU's float4 / float layout


def address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def memmove(dst: int, src: int, nbytes: int) -> None:
    """The twin's cuMemcpyDtoDAsync."""
    ctypes.memmove(dst, src, nbytes)


# --- the twins ---------------------------------------------------------------------------------------------
class HostReadForbidden(AssertionError):
    pass


class FakeDriver:
    def __init__(self, copies: list):
        self.copies = copies

    def memcpy_dtod_async(self, dst: int, src: int, nbytes: int) -> None:
        self.copies.append(("exchange", dst, src, nbytes))
        memmove(dst, src, nbytes)


class FakeGpu:
    """What PeerExchange asks of a CudaShareDevice's CudaDevice: one ordinal (0: no peer access to
    enable), a scope, a driver."""

    def __init__(self, copies: list):
        self.ordinal, self.scope, self.drv = 0, nullcontext(), FakeDriver(copies)


class TwinGpuDevice(CpuDevice):
    """A CPU device addressed like a GPU's share device: `row_pointer`, `render_rows`, host reads that can
    be forbidden; like the GPUs' (CudaShareDevice), it keeps its state in key order under a domain split."""

    def __init__(self, *args, copies: list, reads: dict):
        super().__init__(*args)
        self.device, self._reads = FakeGpu(copies), reads

    def row_pointer(self, field: str, span: Span) -> int:
        array = getattr(self, field)
        return address(array) + array.strides[0] * span.start

    key_ordered = False  # as the GPU's: rows are bodies until the first take_key_order

    def take_key_order(self) -> None:
        super().take_key_order()
        self.key_ordered = True

    def render_rows(self, pos: int, speed: int) -> None:
        """The GPU's: two copies while rows are bodies, else scatter_by_id (row k to the renderer's row
        ids[k]: the renderer's rows are bodies)."""
        n = len(self.ids)
        if not self.key_ordered:
            for dst, field in ((pos, "pos"), (speed, "speed")):
                array = getattr(self, field)
                self.device.drv.copies.append(("render", dst, address(array), array.nbytes))
                memmove(dst, address(array), array.nbytes)
            return
        vbo_pos = np.ctypeslib.as_array((ctypes.c_float * (4 * n)).from_address(pos)).reshape(n, 4)
        vbo_speed = np.ctypeslib.as_array((ctypes.c_float * n).from_address(speed))
        vbo_pos[self.ids] = self.pos
        vbo_speed[self.ids] = self.speed
        self.device.drv.copies.append(("scatter", self.index, pos, speed))

    def rows(self, field, span):
        if self._reads["forbidden"]:
            raise HostReadForbidden(f"host read of {field} rows {span}")
        return super().rows(field, span)


class FakeGLBuffers:
    """Two host arrays standing in for the mapped VBOs (GLBuffers' interface)."""

    def __init__(self, capacity: int):
        self.pos = np.full((capacity, 4), np.nan, np.float32)
        self.speed = np.full(capacity, np.nan, np.float32)
        self.is_mapped, self.maps, self.registered = False, 0, True
        self.last_map_ms, self.last_unmap_ms = 0.0, 0.0

    def capacity(self) -> int:
        return len(self.speed)

    @contextmanager
    def mapped_for(self, n: int):
        assert self.registered and not self.is_mapped
        if n > len(self.speed):
            raise RuntimeFault(f"the GL buffers hold {len(self.speed)} positions but N = {n}")
        self.is_mapped, self.maps = True, self.maps + 1
        self.last_map_ms = 0.01 * self.maps  # distinct per frame: the step must report this frame's
        try:
            yield MappedPointers(address(self.pos), self.pos.nbytes, address(self.speed), self.speed.nbytes)
        finally:
            self.is_mapped = False
            self.last_unmap_ms = 0.02 * self.maps

    def unregister(self) -> None:
        self.registered = False


class CountingScope:
    def __init__(self):
        self.depth = 0

    def __enter__(self):
        self.depth += 1

    def __exit__(self, *exc):
        self.depth -= 1


class TwinGpus:
    """A device kind (app/backends/multi.py) of TwinGpuDevices, with the real PeerExchange and render
    target."""

    what = "twin GPUs"
    default_kernel = KERNEL

    def __init__(self, capacity_slack: int = 0):
        self.copies, self.reads = [], {"forbidden": False}
        self.targets: list[GpuRenderTarget] = []
        self.slack = capacity_slack

    def count(self) -> int:
        return 4

    def all_count(self) -> int:
        return 4

    def names(self, k):
        return [f"twin{i}" for i in range(k)]

    def why_not(self, record):
        return None if record.precision == "fp32" else "fp32 only"

    def check_exchange(self, name):
        pass

    def factory(self, k):
        def make(bodies, physics, kernel, shares):
            return [
                TwinGpuDevice(i, kernel, physics, bodies, share, copies=self.copies, reads=self.reads)
                for i, share in enumerate(shares)
            ]

        return make

    def exchange(self, name):
        return PeerExchange

    def gl_target(self, position_vbo, speed_vbo, devices, n, whole=False, ordinal=0):
        target = GpuRenderTarget(FakeGLBuffers(n + self.slack), CountingScope(), self._copy)
        if devices:
            target.publish(devices, n, whole)
        self.targets.append(target)
        return target

    def _copy(self, dst, src, nbytes):
        self.copies.append(("render", dst, src, nbytes))
        memmove(dst, src, nbytes)


def twin_backend(k: int, driver: str = "threads", kind: TwinGpus | None = None) -> MultiDeviceBackend:
    fields = {
        "base": CPUBackend,
        "name": "cpu",
        "kind": kind or TwinGpus(),
        "k": k,
        "driver": driver,
        "exchange": "peer",
    }
    cls = type("TwinMulti", (MultiDeviceBackend,), fields)
    return cls()


def single_cpu(bodies, physics, steps: int, kernel: str = KERNEL):
    cpu = CPUBackend()
    cpu.load(bodies, physics, kernel)
    if steps:
        cpu.step(steps)
    pos4, speed = cpu.host_render_arrays()
    return np.array(pos4, dtype=np.float32), np.array(speed, dtype=np.float32)


# --- which device copies which rows where (pure) -----------------------------------------------------------
def test_positions_come_whole_from_device_0_and_speeds_from_each_owner():
    shares = [Span(0, 5), Span(5, 0), Span(5, 7), Span(12, 3)]
    assert render_copies(shares) == [
        RenderCopy(0, "pos", Span(0, 15)),
        RenderCopy(0, "speed", Span(0, 5)),
        RenderCopy(2, "speed", Span(5, 7)),
        RenderCopy(3, "speed", Span(12, 3)),
    ]
    assert render_copies([Span(0, 0)]) == []
    one = render_copies([Span(0, 9)])
    assert one == [RenderCopy(0, "pos", Span(0, 9)), RenderCopy(0, "speed", Span(0, 9))]


def test_render_target_copies_each_slice_to_its_rows_inside_gpu0s_scope_and_mapping():
    bodies, physics = cloud(11), Physics()
    kind = TwinGpus()
    shares = [Span(0, 4), Span(4, 0), Span(4, 7)]
    devices = kind.factory(3)(bodies, physics, KERNEL, shares)
    for i, device in enumerate(devices):  # every device's buffers differ: a copy from the wrong one shows
        device.pos[:] += 100.0 * i
        device.speed[:] = np.arange(11, dtype=np.float32) + 1000.0 * i
    gl, scope, seen = FakeGLBuffers(16), CountingScope(), []

    def copy(dst, src, nbytes):
        seen.append((dst, src, nbytes, scope.depth, gl.is_mapped))
        memmove(dst, src, nbytes)

    kind.reads["forbidden"] = True
    GpuRenderTarget(gl, scope, copy).publish(devices, 11)
    assert [(d, s, b) for d, s, b, _, _ in seen] == [
        (address(gl.pos), address(devices[0].pos), 16 * 11),
        (address(gl.speed), address(devices[0].speed), 4 * 4),
        (address(gl.speed) + 4 * 4, address(devices[2].speed) + 4 * 4, 4 * 7),
    ]
    assert all(depth == 1 and mapped for *_, depth, mapped in seen)
    assert not gl.is_mapped and scope.depth == 0
    assert np.array_equal(gl.pos[:11], devices[0].pos)
    assert np.array_equal(gl.speed[:4], devices[0].speed[:4])
    assert np.array_equal(gl.speed[4:11], devices[2].speed[4:])
    assert np.isnan(gl.speed[11:]).all()  # rows past N untouched


def test_too_small_buffers_are_a_fault_and_leave_them_unmapped():
    bodies = cloud(20)
    devices = TwinGpus().factory(1)(bodies, Physics(), KERNEL, [Span(0, 20)])
    gl = FakeGLBuffers(10)
    with pytest.raises(RuntimeFault, match="N = 20"):
        GpuRenderTarget(gl, CountingScope(), memmove).publish(devices, 20)
    assert not gl.is_mapped


# --- the backend: VBOs hold the state after each step, no host read per frame ----------------------------
@pytest.mark.parametrize("kernel", [KERNEL, "cpu-tree"])  # targets; domains (every device holds all rows)
@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("k", [1, 3])
def test_vbos_hold_the_single_device_state_after_every_step_without_host_reads(k, driver, kernel):
    bodies, physics = cloud(), Physics(softening=0.02, dt=2e-3)
    kind = TwinGpus()
    backend = twin_backend(k, driver, kind)
    try:
        backend.load(bodies, physics, kernel)
        assert backend.data_path == f"host upload from {k} twin GPUs"
        assert backend.attach_gl_buffers(7, 8)
        assert backend.data_path == f"{INTEROP_PATH} on GPU 0 from {k} twin GPUs"
        gl = backend.gl_buffers
        want_pos, want_speed = single_cpu(bodies, physics, 0, kernel)
        assert np.array_equal(gl.pos, want_pos) and np.array_equal(gl.speed, want_speed)  # filled on attach
        kind.reads["forbidden"] = True  # from here a host read fails the step (a DeviceFault)
        done = 0
        for steps in (1, 4, 5):
            kind.copies.clear()
            timings = backend.step(steps)
            done += steps
            assert (timings.map_ms, timings.unmap_ms) == (gl.last_map_ms, gl.last_unmap_ms) != (0.0, 0.0)
            want_pos, want_speed = single_cpu(bodies, physics, done, kernel)
            assert np.array_equal(gl.pos, want_pos), f"positions after {done} steps"
            assert np.array_equal(gl.speed, want_speed), f"speeds after {done} steps"
            renders = [c for c in kind.copies if c[0] in ("render", "scatter")]
            if kernel == "cpu-tree":  # a domain split: device 0 holds every body, in key order: one scatter
                assert [c[:2] for c in renders] == [("scatter", 0)]
            else:  # every position from device 0, each share's speeds from its device
                assert len(renders) == 1 + k and {c[0] for c in renders} == {"render"}
        assert not gl.is_mapped
        drawn = "scatter" if kernel == "cpu-tree" else "render"
        assert {c[0] for c in kind.copies} == ({drawn, "exchange"} if k > 1 else {drawn})
    finally:
        kind.reads["forbidden"] = False
        backend.close()
    assert not kind.targets[-1].gl.registered  # close() unregistered GPU 0's buffers


def test_reload_with_the_same_n_keeps_the_vbos_a_new_n_detaches_them():
    bodies, physics = cloud(), Physics(softening=0.02, dt=2e-3)
    kind = TwinGpus()
    backend = twin_backend(2, "single", kind)
    try:
        backend.load(bodies, physics, KERNEL)
        assert backend.attach_gl_buffers(1, 2)
        gl = backend.gl_buffers
        backend.step(3)
        backend.set_physics(Physics(G=2.0, softening=0.02, dt=2e-3))  # in place, on the same devices
        assert backend.gl_buffers is gl and gl.registered
        backend.step(1)
        state = backend.state()
        assert np.array_equal(gl.pos[:, :3], state.pos.astype(np.float32))
        backend.load(cloud(300), physics, KERNEL)  # new N: the renderer resizes and attaches again
        assert backend.gl_buffers is None and not gl.registered
        assert backend.data_path == "host upload from 2 twin GPUs"
        backend.step(1)
        assert backend.attach_gl_buffers(3, 4) and backend.gl_buffers.pos.shape == (300, 4)
    finally:
        backend.close()


def test_cpu_devices_keep_the_host_upload():
    from app.backends.multi import multi_backend_class

    backend = multi_backend_class(CPUBackend, 2, "single", "host")()
    try:
        backend.load(cloud(), Physics(), KERNEL)
        assert backend.attach_gl_buffers(1, 2) is False
        assert backend.data_path == "host upload from 2 CPU devices" and backend.gl_buffers is None
        pos4, speed = backend.host_render_arrays()
        assert pos4.shape == (257, 4) and speed.shape == (257,)
    finally:
        backend.close()


# --- the viewer over the twin: frames drawn without a host read-back -------------------------------------
@pytest.mark.gl
def test_viewer_draws_frames_without_reading_the_devices_back():
    from test_render import FIXED_CAMERA, H, W

    from app.render import gl_setup
    from app.render.canvas import Viewer
    from app.scene import RenderSettings, Scene

    try:
        gl_setup.configure(headless=True)
        kind = TwinGpus()
        backend = twin_backend(2, "threads", kind)
        backend.load(cloud(), Physics(softening=0.02, dt=2e-3), KERNEL)
        scene = Scene(name="test", camera=FIXED_CAMERA, render=RenderSettings(point_size=4.0))
        viewer = Viewer(scene, backend, size=(W, H), headless=True)
    except Exception as e:  # noqa: BLE001 - no GL here
        pytest.skip(f"no headless GL context: {type(e).__name__}: {e}")
    try:
        assert viewer.interop and viewer.stats.data_path.startswith(INTEROP_PATH)
        kind.reads["forbidden"] = True
        for _ in range(3):
            viewer.step_and_render()
        assert viewer.stats.upload_ms == 0.0 and viewer.stats.step.map_ms > 0
        assert backend.gl_buffers.maps == 4  # the fill on attach, then one per frame
    finally:
        kind.reads["forbidden"] = False
        viewer.close()
        backend.close()
