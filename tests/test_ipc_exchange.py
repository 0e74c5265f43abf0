"""The CUDA IPC exchange of GPU ranks on one node (app/backends/cuda/ipc.py), without a GPU or MPI.

K "ranks" are threads of this process, each with a twin GPU device: a CPU device whose buffers are
addressed by pointer, whose "IPC handle" is its buffer's address (opened by every other rank, as
cuIpcOpenMemHandle gives a pointer into another GPU's memory), whose device-to-device copy is a memmove
and whose `add_rows` adds rows at an address. The communicator gives each rank its rank, an allgather and a
barrier. The real IpcExchange runs over them: after a gather every rank holds every share's rows, after a
reduce-scatter each rank's share holds the sum of every rank's partial rows (own first, then rank order),
after gather_sorted every rank holds every key range; a rank whose key ranges differ is a fault, and each
exchange waits at two barriers (the twin counts them). The GPU form: tests/test_mpi.py -m gpu (two GPU
ranks, a GPU each: one process's accelerations; the tree bitwise).
"""

from __future__ import annotations

import ctypes
import threading
from contextlib import nullcontext

import numpy as np
import pytest
from test_multidevice import cloud

from app.backends.cpu_multi import CpuDevice
from app.backends.cuda.ipc import IpcExchange
from app.core.errors import RuntimeFault
from app.engine.forces import Span
from app.model.physics import Physics
from app.parallel.multidevice import split

N = 301


def address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


class Comm:
    """K ranks' communicator over threads: rank, size, allgather, Barrier (counted)."""

    def __init__(self, shared: dict, rank: int):
        self.shared, self.rank, self.size = shared, rank, shared["size"]

    def allgather(self, obj):
        slots = self.shared["slots"]
        slots[self.rank] = obj
        self.shared["barrier"].wait()
        out = list(slots)
        self.shared["barrier"].wait()  # nobody overwrites a slot before everyone read them
        return out

    def Barrier(self):  # noqa: N802 - mpi4py's name
        self.shared["barriers"][self.rank] += 1
        self.shared["barrier"].wait()


class OpenedHandle:
    def __init__(self, handle: bytearray):
        self.pointer, self.closed = int.from_bytes(bytes(handle), "little"), False

    def __int__(self):
        return self.pointer

    def close(self):
        self.closed = True


class Driver:
    @staticmethod
    def mem_get_ipc_handle(pointer: int) -> bytes:
        return int(pointer).to_bytes(64, "little")

    IPCMemoryHandle = OpenedHandle

    @staticmethod
    def memcpy_dtod_async(dst: int, src: int, nbytes: int) -> None:
        ctypes.memmove(dst, src, nbytes)


class Gpu:
    """What IpcExchange asks of a CudaShareDevice's CudaDevice: a scope, a driver, scratch memory."""

    def __init__(self):
        self.scope, self.drv, self._scratch = nullcontext(), Driver(), {}

    def scratch(self, key: str, nbytes: int) -> int:
        buf = self._scratch.get(key)
        if buf is None or buf.nbytes < nbytes:
            buf = self._scratch[key] = np.zeros(max(nbytes, 16), np.uint8)
        return address(buf)


class TwinRank(CpuDevice):
    """A CPU device (fp32: the GPU buffers' float4 / float rows) addressed like a CudaShareDevice."""

    ROW = {"pos": 16, "vel": 16, "acc": 16, "sacc": 16, "speed": 4}

    def __init__(self, *args):
        super().__init__(*args)
        self.device = Gpu()
        self.ptr = {field: address(getattr(self, field)) for field in self.ROW}

    def row_bytes(self, field: str) -> int:
        return self.ROW[field]

    def row_pointer(self, field: str, span: Span) -> int:
        return self.ptr[field] + self.ROW[field] * span.start

    def add_rows(self, field: str, span: Span, part: int) -> None:
        rows = getattr(self, field)[span.as_slice()]
        add = np.ctypeslib.as_array((ctypes.c_float * (4 * span.count)).from_address(part))
        rows[:, :3] += add.reshape(span.count, 4)[:, :3]


def on_ranks(k: int, work) -> list:
    """work(rank, comm, device) on k threads at once; their results (a rank's exception re-raised)."""
    shared = {
        "size": k,
        "slots": [None] * k,
        "barrier": threading.Barrier(k, timeout=10),
        "barriers": [0] * k,
    }
    bodies, shares = cloud(N), split(N, [1.0] * k)
    results, errors = [None] * k, [None] * k

    def run(rank):
        try:
            device = TwinRank(rank, "cpu-simd", Physics(softening=0.02), bodies, shares[rank])
            exchange = IpcExchange(Comm(shared, rank), shares, device, host=None)
            opened = list(exchange._opened.values())
            assert len(opened) == (k - 1) * 5  # every other rank's five buffers
            results[rank] = work(rank, exchange, device)
            exchange.close()
            assert all(h.closed for h in opened)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors[rank] = e
            shared["barrier"].abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first = next(
        (e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)),
        next((e for e in errors if e is not None), None),
    )
    if first is not None:
        raise first
    results.append(shared["barriers"])
    return results


def marked(rank: int, rows: int, width: int = 4) -> np.ndarray:
    """Rows that say which rank wrote them."""
    return np.arange(rows * width, dtype=np.float32).reshape(rows, width) + 1000.0 * (rank + 1)


@pytest.mark.parametrize("k", [2, 3])
def test_gather_gives_every_rank_every_share(k):
    def work(rank, exchange, device):
        s = device.share
        device.pos[s.as_slice()] = marked(rank, s.count)
        exchange.gather([device], "pos")
        return device.pos.copy()

    *copies, barriers = on_ranks(k, work)
    want = np.concatenate([marked(r, s.count) for r, s in enumerate(split(N, [1.0] * k))])
    assert all(np.array_equal(c, want) for c in copies)
    assert barriers == [2] * k  # every rank's rows written before the copies, read before they change


@pytest.mark.parametrize("k", [2, 3])
def test_reduce_scatter_sums_every_ranks_partial_rows_onto_each_share(k):
    def work(rank, exchange, device):
        device.acc[:] = marked(rank, N)
        exchange.reduce_scatter([device], "acc")
        return device.acc[device.share.as_slice()].copy()

    *mine, _barriers = on_ranks(k, work)
    for rank, (got, s) in enumerate(zip(mine, split(N, [1.0] * k), strict=True)):
        want = marked(rank, N)[s.as_slice(), :3].copy()
        for other in range(k):
            if other != rank:
                want += marked(other, N)[s.as_slice(), :3]
        assert np.array_equal(got[:, :3], want)


@pytest.mark.parametrize("k", [2, 3])
def test_gather_sorted_gives_every_rank_every_key_range(k):
    cuts = [0, 97, 230, N][:k] + [N]  # key ranges that are not the shares

    def work(rank, exchange, device):
        device.domain_cuts = cuts
        lo, hi = cuts[rank], cuts[rank + 1]
        device.sacc[lo:hi] = marked(rank, hi - lo)
        exchange.gather_sorted([device])
        return device.sacc.copy()

    *copies, _barriers = on_ranks(k, work)
    want = np.concatenate([marked(r, cuts[r + 1] - cuts[r]) for r in range(k)])
    assert all(np.array_equal(c, want) for c in copies)


def test_ranks_that_disagree_about_their_key_ranges_are_a_fault():
    def work(rank, exchange, device):
        device.domain_cuts = [0, 100 + rank, N]  # as if each had built another tree
        exchange.gather_sorted([device])

    with pytest.raises(RuntimeFault, match="disagree about their key ranges"):
        on_ranks(2, work)
