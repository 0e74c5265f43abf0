"""One GPU's state: the buffers every GPU of a run keeps, and what is done to them.

Each GPU of a run (multi.py, CudaShareDevice: the single-GPU backend's one GPU, each GPU of `--gpus K`,
each MPI rank's GPU) holds its bodies in a `GpuState`: float4 positions [x, y, z, m], velocities and
accelerations, float speeds (|v|, what the renderer colours by), a domain split's key-ordered
accelerations `sacc`, and the body in each row, `ids` (int32). The fp64 record adds a double state,
`pos64`, `vel64` and `acc64` (dvec4 rows), beside the float rows its updates keep current for drawing
and the non-finite check (kernels/fp64.cu). It allocates them (one out-of-memory message naming N and
what fits, errors.out_of_memory), uploads a `Bodies`, reads and writes rows, gathers sampled rows on the
device, and makes the integrator's element-wise updates (state_ops.py) over a span of rows.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from app.backends.cuda.errors import out_of_memory
from app.backends.cuda.force_sample import gather_rows
from app.backends.cuda.state_ops import BYTES_PER_BODY, Fp32Ops, Fp64Ops
from app.core.errors import StateOutOfMemory
from app.engine.forces import Span
from app.model.bodies import Bodies, speeds

# bytes per row on the device, and (values per row, dtype) of a row on the host
ROW_BYTES = {
    "pos": 16,
    "vel": 16,
    "acc": 16,
    "speed": 4,
    "sacc": 16,
    "ids": 4,
    "pos64": 32,
    "vel64": 32,
    "acc64": 32,
}
HOST_ROWS = {
    "pos": (4, np.float32),
    "vel": (4, np.float32),
    "acc": (4, np.float32),
    "speed": (1, np.float32),
    "sacc": (4, np.float32),
    "ids": (1, np.int32),
    "pos64": (4, np.float64),
    "vel64": (4, np.float64),
    "acc64": (4, np.float64),
}
STATE = ("pos", "vel", "acc", "speed")  # what every state holds
FP64 = ("pos64", "vel64", "acc64")  # the fp64 record's double state


class GpuState:
    """The device buffers of one GPU's bodies (see the module docstring). Every call that touches the
    device expects the GPU's context current (the owner's `device.scope`)."""

    def __init__(self, device, name: str | None = None):
        """`name`: the GPU as an out-of-memory message names it (default: its model)."""
        self.device = device
        self.name = name
        self.n = 0
        self._alloc: dict[str, Any] = {}  # pycuda DeviceAllocations (pycuda ships no type stubs)

    # --- memory ----------------------------------------------------------------------------------
    def allocate(self, n: int, fields=STATE) -> None:
        """Buffers of `fields` for n bodies (kept when they already are); the old ones are freed first.
        Raises StateOutOfMemory (a RuntimeFault) with the N that fits when the GPU has too little
        free memory."""
        fields = tuple(fields)
        if self._alloc and self.n == n and set(self._alloc) == set(fields):
            return
        held = self.n * BYTES_PER_BODY
        self.free()
        self._add(n, fields, held)
        self.n = n

    def extend(self, fields) -> None:
        """Buffers of `fields` besides those held, for the same n (the double state of a switch to fp64);
        StateOutOfMemory as `allocate`, the rows held kept."""
        self._add(self.n, tuple(f for f in fields if f not in self._alloc), 0)

    def _add(self, n: int, fields: tuple, held: int) -> None:
        drv = self.device.drv
        need = sum(ROW_BYTES[f] for f in fields) * n
        free, _total = drv.mem_get_info()
        if need > free:
            raise self._oom(n, need, free, held)
        added = []
        try:
            for field in fields:
                self._alloc[field] = drv.mem_alloc(max(ROW_BYTES[field] * n, 16))
                added.append(field)
        except drv.MemoryError as e:
            for field in added:
                self._alloc.pop(field).free()
            free, _total = drv.mem_get_info()
            raise self._oom(n, need, free, 0) from e

    def _oom(self, n: int, need: int, free: int, held: int) -> StateOutOfMemory:
        # (out_of_memory builds the `error` class it is given; its return type names their base)
        return cast(
            StateOutOfMemory,
            out_of_memory(
                n,
                need,
                free,
                self.name or self.device.facts.name,
                BYTES_PER_BODY,
                held=held,
                error=StateOutOfMemory,
            ),
        )

    def holds(self, field: str) -> bool:
        return field in self._alloc

    def free(self) -> None:
        for alloc in self._alloc.values():
            alloc.free()
        self._alloc.clear()
        self.n = 0

    # --- addresses -------------------------------------------------------------------------------
    def pointer(self, field: str) -> int:
        return int(self._alloc[field])

    def row_pointer(self, field: str, span: Span) -> int:
        """The device address of `span`'s first row of `field`."""
        return self.pointer(field) + ROW_BYTES[field] * span.start

    # --- host <-> device -------------------------------------------------------------------------
    def upload(self, bodies: Bodies) -> None:
        """The bodies' positions (with their masses), velocities and speeds as float32 rows; the double
        state (when held) exactly; ids (when held) the rows' own indices: rows are bodies until a domain
        split re-sorts them. The acceleration rows (acc, sacc) are zeroed: a run has no last acceleration
        yet, and the tree's relative opening test reads them (zero: the geometric test), where memory
        left by an earlier run would make the first step depend on it."""
        drv = self.device.drv
        for field in ("acc", "sacc"):
            if self.holds(field):
                drv.memset_d32(self.pointer(field), 0, ROW_BYTES[field] * self.n // 4)
        vel4 = np.ascontiguousarray(bodies.vel4(np.float32))
        drv.memcpy_htod(self.pointer("pos"), np.ascontiguousarray(bodies.pos4(np.float32)))
        drv.memcpy_htod(self.pointer("vel"), vel4)
        drv.memcpy_htod(self.pointer("speed"), speeds(vel4))
        if self.holds("ids"):
            drv.memcpy_htod(self.pointer("ids"), np.arange(self.n, dtype=np.int32))
        if self.holds("pos64"):
            self._set_double(bodies.pos, bodies.vel, bodies.mass)

    def promote(self, mass: np.ndarray) -> None:
        """The double state from the float rows (positions and velocities promoted; `mass`, float64 in
        row order, exact): a switch to the fp64 record goes on from the float32 state."""
        everyone = Span.all(self.n)
        pos, vel = self.rows("pos", everyone), self.rows("vel", everyone)
        self._set_double(pos[:, :3].astype(np.float64), vel[:, :3].astype(np.float64), mass)

    def _set_double(self, pos, vel, mass) -> None:
        p = np.zeros((self.n, 4), dtype=np.float64)
        p[:, :3], p[:, 3] = pos, mass
        v = np.zeros((self.n, 4), dtype=np.float64)
        v[:, :3] = vel
        self.device.drv.memcpy_htod(self.pointer("pos64"), p)
        self.device.drv.memcpy_htod(self.pointer("vel64"), v)

    def rows(self, field: str, span: Span) -> np.ndarray:
        """A host copy of rows `span` of `field` ((count, 4) or (count,))."""
        width, dtype = HOST_ROWS[field]
        out = np.empty((span.count, width) if width > 1 else span.count, dtype=dtype)
        if span.count:
            self.device.drv.memcpy_dtoh(out, self.row_pointer(field, span))
        return out

    def set_rows(self, field: str, span: Span, values) -> None:
        if span.count:
            self.device.drv.memcpy_htod(self.row_pointer(field, span), np.ascontiguousarray(values))

    def rows_at(self, field: str, rows: np.ndarray) -> np.ndarray:
        """The float4 rows `rows` of `field`, gathered on the device behind its queued work."""
        return gather_rows(self.device, self.pointer(field), self.n, rows)

    # --- the integrator's updates ----------------------------------------------------------------
    def ops(self, force, span: Span) -> Fp32Ops:
        """The element-wise updates (kernels/integrate.cu) on rows `span`, with `force` as the StateOps'
        force."""
        return Fp32Ops(self.device, force, span.count, *(self.row_pointer(f, span) for f in STATE))

    def ops64(self, force) -> Fp64Ops:
        """The fp64 record's updates (kernels/fp64.cu) on every row: the double state, and the float rows
        drawn and checked."""
        everyone = Span.all(self.n)
        return Fp64Ops(
            self.device,
            force,
            self.n,
            *(self.pointer(f) for f in FP64),
            *(self.row_pointer(f, everyone) for f in ("pos", "vel", "speed")),
        )
