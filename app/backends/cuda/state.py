"""One GPU's fp32 state: the buffers every GPU path keeps, and what is done to them.

The single-GPU backend (backend.py, CudaBackend) and each GPU of a multi-GPU run or MPI rank (multi.py,
CudaShareDevice) hold their bodies in a `GpuState`: float4 positions [x, y, z, m], velocities and
accelerations, float speeds (|v|, what the renderer colours by), and what a run asks for besides (a
domain split's key-ordered accelerations `sacc` and the body in each row, `ids`). It allocates them
(one out-of-memory message naming N and what fits, errors.out_of_memory), uploads a `Bodies`, reads and
writes rows, gathers sampled rows on the device, and makes the integrator's element-wise updates
(state_ops.Fp32Ops) over a span of rows.

Positions and speeds may live in the renderer's GL vertex buffers instead (CudaBackend under CUDA–GL
interop): such a state is allocated without them (`allocate(n, fields)` names what it holds), and the
caller passes the mapped pointers where positions or speeds are read or written (`upload`, `ops`).
The fp64 record's double state is CudaBackend's own (it runs on one GPU only).
"""

from __future__ import annotations

import numpy as np

from app.bodies import Bodies
from app.forces import Span

from .errors import out_of_memory
from .force_sample import gather_rows
from .state_ops import BYTES_PER_BODY, Fp32Ops

# bytes per row on the device, and (values per row, dtype) of a row on the host
ROW_BYTES = {"pos": 16, "vel": 16, "acc": 16, "speed": 4, "sacc": 16, "ids": 4}
HOST_ROWS = {"pos": (4, np.float32), "vel": (4, np.float32), "acc": (4, np.float32), "speed": (1, np.float32),
             "sacc": (4, np.float32), "ids": (1, np.int32)}
STATE = ("pos", "vel", "acc", "speed")  # what every state holds (positions and speeds unless in GL buffers)


class GpuState:
    """The device buffers of one GPU's bodies (see the module docstring). Every call that touches the
    device expects the GPU's context current (the owner's `device.scope`)."""

    def __init__(self, device, name: str | None = None):
        """`name`: the GPU as an out-of-memory message names it (default: its model)."""
        self.device = device
        self.name = name
        self.n = 0
        self._alloc: dict[str, object] = {}

    # --- memory ----------------------------------------------------------------------------------
    def allocate(self, n: int, fields=STATE) -> None:
        """Buffers of `fields` for n bodies (kept when they already are); the old ones are freed first.
        Raises RuntimeFault with the N that fits when the GPU has too little free memory."""
        fields = tuple(fields)
        if self._alloc and self.n == n and set(self._alloc) == set(fields):
            return
        drv = self.device.drv
        held = self.n * BYTES_PER_BODY
        self.free()
        need = sum(ROW_BYTES[f] for f in fields) * n
        free, _total = drv.mem_get_info()
        if need > free:
            raise self._oom(n, need, free, held)
        try:
            for field in fields:
                self._alloc[field] = drv.mem_alloc(max(ROW_BYTES[field] * n, 16))
        except drv.MemoryError as e:
            self.free()
            free, _total = drv.mem_get_info()
            raise self._oom(n, need, free, 0) from e
        self.n = n

    def _oom(self, n: int, need: int, free: int, held: int):
        return out_of_memory(n, need, free, self.name or self.device.facts.name, BYTES_PER_BODY, held=held)

    def holds(self, field: str) -> bool:
        return field in self._alloc

    def release(self, field: str) -> None:
        """Free one buffer (positions or speeds moving into the renderer's buffers)."""
        self._alloc.pop(field).free()

    def adopt(self, field: str, alloc) -> None:
        """Keep `alloc` (a device allocation of n rows) as `field` (positions or speeds back from GL)."""
        self._alloc[field] = alloc

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
    def upload(self, bodies: Bodies, pos: int | None = None, speed: int | None = None) -> None:
        """The bodies' positions (with their masses), velocities and speeds as float32 rows; ids (when
        held) the rows' own indices: rows are bodies until a domain split re-sorts them. `pos`, `speed`:
        where those live when not here (the mapped GL buffers)."""
        drv = self.device.drv
        vel4 = np.ascontiguousarray(bodies.vel4(np.float32))
        speeds = np.linalg.norm(vel4[:, :3], axis=1).astype(np.float32)
        drv.memcpy_htod(self.pointer("pos") if pos is None else pos,
                        np.ascontiguousarray(bodies.pos4(np.float32)))
        drv.memcpy_htod(self.pointer("vel"), vel4)
        drv.memcpy_htod(self.pointer("speed") if speed is None else speed, speeds)
        if self.holds("ids"):
            drv.memcpy_htod(self.pointer("ids"), np.arange(self.n, dtype=np.int32))

    def rows(self, field: str, span: Span, at: int | None = None) -> np.ndarray:
        """A host copy of rows `span` of `field` ((count, 4) or (count,)); `at`: the field's base address
        where it does not live here."""
        width, dtype = HOST_ROWS[field]
        out = np.empty((span.count, width) if width > 1 else span.count, dtype=dtype)
        if span.count:
            base = self.pointer(field) if at is None else int(at)
            self.device.drv.memcpy_dtoh(out, base + ROW_BYTES[field] * span.start)
        return out

    def set_rows(self, field: str, span: Span, values) -> None:
        if span.count:
            self.device.drv.memcpy_htod(self.row_pointer(field, span), np.ascontiguousarray(values))

    def rows_at(self, field: str, rows: np.ndarray, at: int | None = None) -> np.ndarray:
        """The float4 rows `rows` of `field`, gathered on the device behind its queued work."""
        return gather_rows(self.device, self.pointer(field) if at is None else int(at), self.n, rows)

    # --- the integrator's updates ----------------------------------------------------------------
    def ops(self, force, span: Span, pos: int | None = None, speed: int | None = None) -> Fp32Ops:
        """The element-wise updates (kernels/integrate.cu) on rows `span`, with `force` as the StateOps'
        force; `pos`, `speed`: the bases of those fields where they do not live here."""
        pos = self.pointer("pos") if pos is None else int(pos)
        speed = self.pointer("speed") if speed is None else int(speed)
        return Fp32Ops(self.device, force, span.count, pos + ROW_BYTES["pos"] * span.start,
                       self.row_pointer("vel", span), self.row_pointer("acc", span),
                       speed + ROW_BYTES["speed"] * span.start)
