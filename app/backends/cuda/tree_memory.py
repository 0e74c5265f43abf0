"""The first layer of the GPU tree's evaluator (TreeEvaluator, tree.py, is built in layers, a module each:
memory, build, walk, refit, then the evaluator's contract): its device buffers, CuPy arrays kept by name
and grown by half again (`_buf`), the memory they need at N (`bytes_per_body`; an N that cannot fit is
refused before any work, with all-pairs' message), and a phase's context on the device (`_on`). CuPy
(`cupy_module`) allocates the buffers and sorts the keys."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import numpy as np

from app.backends.cuda.errors import out_of_memory
from app.backends.cuda.state_ops import BYTES_PER_BODY
from app.backends.cuda.tree_kernels import CELL_LANES
from app.core.errors import RuntimeFault
from app.engine.forces import ForceEvaluator
from app.engine.refit_cadence import CadencedTree

GROWTH = 1.5  # _buf allocates half again over what is asked, so that a slowly growing N reuses it


def cupy_module():
    try:
        import cupy
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise RuntimeFault(
            "the GPU tree needs CuPy for its device sort: pip install cupy-cuda13x "
            "(make run installs it on a machine with an NVIDIA GPU)"
        ) from e
    return cupy


class TreeMemory(CadencedTree, ForceEvaluator):
    """The tree evaluator's buffers and the memory they need. Each layer declares the state it uses;
    TreeEvaluator.__init__ (tree.py) sets it."""

    device: Any  # the CudaDevice
    _buffers: dict[str, Any]  # CuPy device arrays by name (`_buf`)

    def _require_memory(self, n: int) -> None:
        """Refuse an N whose tree buffers cannot fit, before any work, with all-pairs' message."""
        need, free, held = self._memory(n)
        if need > free + held:
            raise self._out_of_memory(n)

    def _memory(self, n: int) -> tuple[int, int, int]:
        """(bytes the buffers need at N = n, bytes free, bytes the buffers hold now). `_buf` allocates
        half again over the count (GROWTH); free counts the bytes CuPy's pool holds unused."""
        cp = cupy_module()
        held = sum(int(b.nbytes) for b in self._buffers.values())
        free = int(self.device.drv.mem_get_info()[0]) + int(cp.get_default_memory_pool().free_bytes())
        return int(GROWTH * self.bytes_per_body(n) * n), free, held

    def _out_of_memory(self, n: int) -> RuntimeFault:
        need, free, held = self._memory(n)
        per_body = GROWTH * self.bytes_per_body(n) + BYTES_PER_BODY  # the tree's and the state's
        return out_of_memory(
            n, need, free, self.device.facts.name, per_body, what="the tree's buffers", held=held
        )

    def bytes_per_body(self, n: int) -> int:
        """Device bytes per source body this evaluator allocates at N = n (buffers as sized for n)."""
        leaf = int(self._tunables["leaf"])
        cells = cell_capacity(n, leaf) / max(n, 1)
        per_body = 8 + 8 + 8 + 16 + 4  # keys, sorted keys, sort order (int64), sorted body, order (int32)
        # ints, octant edges, mass/com/m2 (float32), mac, pack, links; a refit's boxes and cubes
        per_cell = 4 * 5 + 4 * CELL_LANES + 4 * (1 + 3 + 6) + 16 + 48 + 16
        if int(self._tunables.get("rebuild_every", 1)) > 1:
            per_cell += 4 * 6 + 8 * 4
        per_group = 3 * 4 / int(self._tunables["group"])  # at least one group per `group` bodies
        # + 12: the group marks, their prefix sum and the group starts (sized for a group per body)
        return int(round(per_body + 12 + per_cell * cells + per_group))

    def _buf(self, key: str, count: int, dtype, keep: int = 0):
        """A CuPy device array of at least `count` elements kept under `key` (grown by half again, the
        first `keep` elements carried over)."""
        cp = cupy_module()
        buf = self._buffers.get(key)
        if buf is None or buf.size < count or buf.dtype != np.dtype(dtype):
            new = cp.empty(max(int(count), 1) + (int(count) >> 1), dtype=dtype)  # GROWTH
            if buf is not None and keep:
                new[:keep] = buf[:keep]
            buf = self._buffers[key] = new
        return buf

    @contextmanager
    def _on(self, stream, n: int):
        """One phase on this device: its context, CuPy's device and the stream current; an allocation
        past _require_memory's estimate (the sort's scratch) gives the same message."""
        cp = cupy_module()
        on_stream = cp.cuda.ExternalStream(int(stream.handle)) if stream is not None else cp.cuda.Stream.null
        with self.device.scope, cp.cuda.Device(self.device.ordinal), on_stream:
            try:
                yield
            except cp.cuda.memory.OutOfMemoryError as e:
                cp.get_default_memory_pool().free_all_blocks()
                raise self._out_of_memory(n) from e


def cell_capacity(n: int, leaf: int) -> int:
    return 64 + 4 * (int(n) // max(int(leaf), 1) + 1)
