"""GpuState (app/backends/cuda/state.py), the one GPU state class of CudaBackend and CudaShareDevice,
over a fake device whose "device memory" is host memory: allocations are numpy buffers addressed by
pointer and the driver's copies are memmoves. What it pins: the layout (float4 rows with the mass in w,
float speeds, int32 ids), rows by span read and written at the right addresses, positions and speeds
read from elsewhere (the GL buffers), the updates' row pointers, allocations kept or replaced, and the
out-of-memory message naming the GPU and the N that fits. tests/test_cuda.py and test_cuda_multi.py run
it on a GPU."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import numpy as np
import pytest

from app.backends.cuda import state as state_module
from app.backends.cuda.state import GpuState
from app.bodies import Bodies
from app.errors import RuntimeFault
from app.forces import Span


class HostAlloc:
    def __init__(self, nbytes: int, freed: list):
        self.buf = np.zeros(nbytes, np.uint8)
        self.freed = freed

    def __int__(self) -> int:
        return self.buf.__array_interface__["data"][0]

    def free(self) -> None:
        self.freed.append(int(self))


class HostGpu:
    def __init__(self, free_bytes: int = 2**30):
        self.freed: list[int] = []
        self.allocs: list[HostAlloc] = []

        def alloc(nbytes):
            a = HostAlloc(nbytes, self.freed)
            self.allocs.append(a)
            return a

        def htod(dst, src):
            src = np.ascontiguousarray(src)
            ctypes.memmove(int(dst), src.__array_interface__["data"][0], src.nbytes)

        def dtoh(dst, src):
            ctypes.memmove(dst.__array_interface__["data"][0], int(src), dst.nbytes)

        self.drv = SimpleNamespace(mem_alloc=alloc, mem_get_info=lambda: (free_bytes, 2**34),
                                   memcpy_htod=htod, memcpy_dtoh=dtoh, MemoryError=MemoryError)
        self.facts = SimpleNamespace(name="Fake GPU")


def bodies(n: int) -> Bodies:
    rng = np.random.default_rng(3)
    return Bodies.from_arrays(rng.normal(size=(n, 3)), rng.normal(size=(n, 3)), rng.uniform(1, 2, n))


def test_upload_lays_out_float4_rows_speeds_and_ids_and_reads_rows_back():
    b = bodies(10)
    state = GpuState(HostGpu())
    state.allocate(10, ("pos", "vel", "acc", "speed", "ids"))
    state.upload(b)
    pos = state.rows("pos", Span.all(10))
    assert pos.dtype == np.float32 and pos.shape == (10, 4)
    assert np.array_equal(pos, b.pos4(np.float32))  # the mass in w
    assert np.array_equal(state.rows("vel", Span(3, 4))[:, :3], b.vel[3:7].astype(np.float32))
    speed = np.linalg.norm(b.vel4(np.float32)[:, :3], axis=1).astype(np.float32)
    assert np.array_equal(state.rows("speed", Span(2, 5)), speed[2:7])
    ids = state.rows("ids", Span.all(10))
    assert ids.dtype == np.int32 and np.array_equal(ids, np.arange(10))
    state.set_rows("vel", Span(4, 2), np.full((2, 4), 7.0, np.float32))
    vel = state.rows("vel", Span.all(10))
    assert np.all(vel[4:6] == 7.0) and np.array_equal(vel[:4, :3], b.vel[:4].astype(np.float32))
    assert state.row_pointer("speed", Span(5, 1)) == state.pointer("speed") + 4 * 5


def test_positions_and_speeds_elsewhere_are_written_and_read_there():
    """CudaBackend under interop: the state holds vel and acc; pos and speed are the mapped GL buffers."""
    b = bodies(6)
    state = GpuState(HostGpu())
    state.allocate(6, ("vel", "acc"))
    gl_pos, gl_speed = np.zeros((6, 4), np.float32), np.zeros(6, np.float32)
    at = (gl_pos.__array_interface__["data"][0], gl_speed.__array_interface__["data"][0])
    state.upload(b, *at)
    assert np.array_equal(gl_pos, b.pos4(np.float32)) and gl_speed.any()
    assert np.array_equal(state.rows("pos", Span(1, 3), at[0]), gl_pos[1:4])
    assert not state.holds("pos") and state.holds("vel")


def test_the_updates_address_the_rows_of_their_span(monkeypatch):
    made = []
    monkeypatch.setattr(state_module, "Fp32Ops", lambda device, force, n, *ptrs: made.append((n, ptrs)))
    state = GpuState(HostGpu())
    state.allocate(8)
    state.ops(None, Span(3, 5))
    n, (pos, vel, acc, speed) = made[0]
    assert n == 5
    fields = ("pos", "vel", "acc", "speed")
    assert (pos, vel, acc, speed) == tuple(state.row_pointer(f, Span(3, 5)) for f in fields)
    state.ops(None, Span(2, 4), pos=0x10000, speed=0x20000)  # the mapped buffers' bases
    assert made[1][1][0] == 0x10000 + 16 * 2 and made[1][1][3] == 0x20000 + 4 * 2


def test_allocations_are_kept_for_the_same_n_and_fields_and_replaced_otherwise():
    gpu = HostGpu()
    state = GpuState(gpu)
    state.allocate(8)
    first = state.pointer("pos")
    state.allocate(8)
    assert state.pointer("pos") == first and not gpu.freed
    state.allocate(9)
    assert first in gpu.freed and state.n == 9
    state.free()
    assert state.n == 0 and not state.holds("vel")


def test_out_of_memory_names_the_gpu_and_the_n_that_fits():
    state = GpuState(HostGpu(free_bytes=52 * 1000), name="GPU 1 (Fake GPU)")
    said = r"out of GPU memory: N = 2,000 bodies need .* on GPU 1 \(Fake GPU\) but only .* MiB are free; "
    with pytest.raises(RuntimeFault, match=said + r"at most N ≈ 950 fits"):
        state.allocate(2000)
    assert state.n == 0 and not state.holds("pos")
