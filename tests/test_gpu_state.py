"""GpuState (app/backends/cuda/state.py), the one GPU state class of CudaBackend and CudaShareDevice,
over a fake device whose "device memory" is host memory: allocations are numpy buffers addressed by
pointer and the driver's copies are memmoves. What it pins: the layout (float4 rows with the mass in w,
float speeds, int32 ids, the fp64 record's exact dvec4 rows), rows by span read and written at the right
addresses, the double state added to a held one and promoted from its float rows, the updates' row
pointers, allocations kept or replaced, and the out-of-memory message naming the GPU and the N that
fits. tests/test_cuda.py and test_cuda_multi.py run
it on a GPU."""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import numpy as np
import pytest

from app.backends.cuda import state as state_module
from app.backends.cuda.state import GpuState
from app.core.errors import RuntimeFault
from app.engine.forces import Span
from app.model.bodies import Bodies


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

        def memset_d32(dst, value, count):
            words = np.full(count, value, np.uint32)
            ctypes.memmove(int(dst), words.__array_interface__["data"][0], words.nbytes)

        self.drv = SimpleNamespace(
            mem_alloc=alloc,
            mem_get_info=lambda: (free_bytes, 2**34),
            memcpy_htod=htod,
            memcpy_dtoh=dtoh,
            memset_d32=memset_d32,
            MemoryError=MemoryError,
        )
        self.facts = SimpleNamespace(name="Fake GPU")


def bodies(n: int) -> Bodies:
    rng = np.random.default_rng(3)
    return Bodies.from_arrays(rng.normal(size=(n, 3)), rng.normal(size=(n, 3)), rng.uniform(1, 2, n))


def test_upload_lays_out_float4_rows_speeds_and_ids_and_reads_rows_back():
    b = bodies(10)
    state = GpuState(HostGpu())
    state.allocate(10, ("pos", "vel", "acc", "speed", "ids"))
    state.set_rows("acc", Span.all(10), np.full((10, 4), np.nan, np.float32))  # an earlier run's memory
    state.upload(b)
    # no last accelerations: zeros (the tree's relative opening test reads them), not what memory held
    assert np.array_equal(state.rows("acc", Span.all(10)), np.zeros((10, 4), np.float32))
    pos = state.rows("pos", Span.all(10))
    assert pos.dtype == np.float32 and pos.shape == (10, 4)
    assert np.array_equal(pos, b.pos4(np.float32))  # the mass in w
    assert np.array_equal(state.rows("vel", Span(3, 4))[:, :3], b.vel[3:7].astype(np.float32))
    v = b.vel4(np.float32)[:, :3].astype(np.float64)  # |v| of the uploaded float32 velocities, in float64
    speed = np.sqrt((v * v).sum(axis=1)).astype(np.float32)  # (a float32 sum overflows past 1.8e19)
    assert np.array_equal(state.rows("speed", Span(2, 5)), speed[2:7])
    ids = state.rows("ids", Span.all(10))
    assert ids.dtype == np.int32 and np.array_equal(ids, np.arange(10))
    state.set_rows("vel", Span(4, 2), np.full((2, 4), 7.0, np.float32))
    vel = state.rows("vel", Span.all(10))
    assert np.all(vel[4:6] == 7.0) and np.array_equal(vel[:4, :3], b.vel[:4].astype(np.float32))
    assert state.row_pointer("speed", Span(5, 1)) == state.pointer("speed") + 4 * 5


def test_the_double_state_is_uploaded_exactly_and_promoted_from_the_float_rows():
    """The fp64 record's state: exact doubles at load; after a run on the float rows, a switch to fp64
    adds the double rows (the float ones kept) and promotes them, with the exact masses given."""
    b = bodies(6)
    state = GpuState(HostGpu())
    state.allocate(6, ("pos", "vel", "acc", "speed", "pos64", "vel64", "acc64"))
    state.upload(b)
    pos64 = state.rows("pos64", Span.all(6))
    assert (
        pos64.dtype == np.float64
        and np.array_equal(pos64[:, :3], b.pos)
        and np.array_equal(pos64[:, 3], b.mass)
    )
    assert np.array_equal(state.rows("vel64", Span(2, 3))[:, :3], b.vel[2:5])
    floats = GpuState(HostGpu())
    floats.allocate(6)
    floats.upload(b)
    before = floats.pointer("pos")
    floats.extend(("pos64", "vel64", "acc64"))
    assert floats.pointer("pos") == before and floats.holds("acc64")
    mass = np.linspace(1.0, 2.0, 6) / 3.0  # not a float32 value: the promoted masses are these exactly
    floats.promote(mass)
    promoted = floats.rows("pos64", Span.all(6))
    assert np.array_equal(promoted[:, :3], b.pos.astype(np.float32).astype(np.float64))
    assert np.array_equal(promoted[:, 3], mass)


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
    monkeypatch.setattr(state_module, "Fp64Ops", lambda device, force, n, *ptrs: made.append((n, ptrs)))
    state.extend(("pos64", "vel64", "acc64"))
    state.ops64(None)  # every row: the double state, then the float rows it keeps current for drawing
    n, ptrs = made[1]
    assert n == 8 and ptrs == tuple(
        state.pointer(f) for f in ("pos64", "vel64", "acc64", "pos", "vel", "speed")
    )


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
