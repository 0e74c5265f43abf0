"""MPI ranks on one node, a GPU each: rows move GPU to GPU through CUDA IPC instead of host memory.

MpiExchange hands MPI host arrays (the image's Open MPI 4.1 reports no CUDA support to mpi4py; whether
MPICH's wheel could take device pointers was not checked), so it stages every exchange through the host:
at 8M bodies a domain split's all-gather of 128 MB of accelerations that way would take longer than the
half-walk it serves. Ranks on one node can do
without MPI for the data: each rank exports its device buffers once (cuIpcGetMemHandle), the handles are
all-gathered through MPI at load, and every rank opens the others' (cuIpcOpenMemHandle: a pointer into
the other GPU's memory, read over NVLink with peer access). An exchange is then

    every rank: wait for its own queued work   -> MPI barrier   (every rank's rows are written)
    every rank: pull the rows it needs from the others' buffers (device-to-device copies; for a
                reduce-scatter, each partial added to its share)
    every rank: wait for its copies            -> MPI barrier   (nobody rewrites rows still being read)

Two host waits and two barriers per exchange, and the bytes of the peer copies (DESIGN.md's peer copy of
64 MB on NV18: 188 µs; the ranks' exchange measured 0.08–0.28 ms at 1M–8M, bench/results/*-mpi2.json).
The same operations as every exchange (gather, reduce_scatter, gather_sorted: app/parallel/decomposition.py);
`gather_to_root` (a snapshot on rank 0, rare) goes through the host as before.

Used by `RankRun` when every rank of the job is on this node (`CudaShareDevice.rank_exchange`); ranks on
several nodes exchange through MpiExchange (host memory), one log line says so.
"""

from __future__ import annotations

import time
from typing import Any

from app.engine.forces import Span
from app.parallel.decomposition import agreed_ranges

EXPORTED = ("pos", "acc", "sacc", "vel", "speed")  # the device buffers other ranks read


class IpcExchange:
    name = "cuda-ipc"

    def __init__(self, comm, shares: list[Span], device, host):
        """`host`: the MPI exchange through host memory, for what goes to rank 0's host (gather_to_root)."""
        self.comm, self.shares, self.device = comm, list(shares), device
        self.n = sum(s.count for s in self.shares)
        self.ms = 0.0
        self._host = host
        drv = device.device.drv
        with device.device.scope:
            mine = {field: bytes(drv.mem_get_ipc_handle(device.ptr[field])) for field in EXPORTED}
        every = comm.allgather(mine)
        self._opened: dict[tuple[int, str], Any] = {}  # pycuda IPC handles (no stubs)
        with device.device.scope:
            for rank, handles in enumerate(every):
                if rank != comm.rank:
                    for field, handle in handles.items():
                        self._opened[(rank, field)] = drv.IPCMemoryHandle(bytearray(handle))

    @staticmethod
    def moves_rows(devices) -> bool:
        return True

    def _base(self, rank: int, field: str) -> int:
        if rank == self.comm.rank:
            return int(self.device.ptr[field])
        return int(self._opened[(rank, field)])

    def _settled(self) -> None:
        """This rank's queued work done, then every rank's (the barrier)."""
        self.device.synchronize()
        self.comm.Barrier()

    def _start(self) -> float:
        """This rank's queued work (its force) done, then every rank's; the exchange's clock starts in
        between, so that it measures the wait for the other ranks and the copies, not this rank's force."""
        self.device.synchronize()
        t = time.perf_counter()
        self.comm.Barrier()
        return t

    def _pull(self, field: str, spans: list[Span]) -> None:
        """Rows spans[r] of `field` from rank r's buffer into this rank's, for every other rank r."""
        t = self._start()
        size = self.device.row_bytes(field)
        drv = self.device.device.drv
        with self.device.timed("exchange"):
            for rank, span in enumerate(spans):
                if rank != self.comm.rank and span.count:
                    drv.memcpy_dtod_async(
                        self.device.row_pointer(field, span),
                        self._base(rank, field) + size * span.start,
                        size * span.count,
                    )
        self._settled()
        self.ms += (time.perf_counter() - t) * 1e3

    def gather(self, devices, field: str) -> None:
        """Every rank's share rows of `field` into every rank's copy."""
        self._pull(field, self.shares)

    def gather_sorted(self, devices) -> None:
        """domains: every rank's key range of 'sacc' into every rank's (the ranges checked to agree)."""
        self._pull("sacc", agreed_ranges(self.comm, self.device))

    def reduce_scatter(self, devices, field: str) -> None:
        """pairs: this rank's share rows of `field` += each other rank's partial rows there, in rank order."""
        t = self._start()
        device, span = self.device, self.device.share
        size = device.row_bytes(field)
        drv = device.device.drv
        with device.timed("exchange"):
            if span.count:
                slot = device.device.scratch("reduce-slot", size * span.count)
                for rank in range(self.comm.size):
                    if rank != self.comm.rank:  # stream order: each add reads the slot before the next copy
                        drv.memcpy_dtod_async(
                            slot, self._base(rank, field) + size * span.start, size * span.count
                        )
                        device.add_rows(field, span, slot)
        self._settled()
        self.ms += (time.perf_counter() - t) * 1e3

    def gather_to_root(self, device, field: str):
        return self._host.gather_to_root(device, field)

    def close(self) -> None:
        with self.device.device.scope:
            for handle in self._opened.values():
                handle.close()
        self._opened.clear()
