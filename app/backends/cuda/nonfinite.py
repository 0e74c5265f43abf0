"""The GPU's non-finite check over rows of one device's state: kernels/integrate.cu `first_nonfinite`.

One implementation for the single-GPU backend (every row) and each GPU of `--gpus` (its share's rows):

    check = NonFiniteCheck(device)
    check.launch(pos, vel, Span(start, count))   # queued: a 4-byte flag reset, the kernel over the rows
    bad = check.result(wait=False)                # the first non-finite row (state index), or -1

`launch` queues work on the device's legacy stream and returns. `result(wait=False)` never waits for the
GPU: it reads the flag of an earlier check once the GPU got there (the flag is copied into pinned memory
behind an event, so the answer comes a `step()` call or two after the check ran) and queues the copy of
the newest launched check. `result(wait=True)` reads the newest check at once, waiting for it: for
callers that wait for the step anyway (bench, simulate, an explicit check). Call both inside the
device's scope, never concurrently (the multi-device drivers call `launch` on a device's thread and
`result` after they waited for their threads).
"""

from __future__ import annotations

import numpy as np

from app.backends.cuda.policies import ceil_div
from app.backends.cuda.state_ops import BLOCK, INTEGRATE_SOURCE
from app.engine.forces import Span

INT_MAX = 0x7FFFFFFF  # the flag's "nothing found" (the kernel keeps the minimum bad index)
FLAG = "nonfinite-flag"  # the key of the device flag (scratch) and of its pinned host copy
ROW_BYTES = 16  # float4 positions and velocities


class NonFiniteCheck:
    """The non-finite check of one CudaDevice (see the module docstring)."""

    def __init__(self, device):
        self.device = device
        self._launched: int | None = None  # first row of the newest launched check, its flag not yet copied
        self._copied: int | None = None  # first row of the check whose flag copy is behind `_event`
        self._event = None

    def prepare(self) -> None:
        """Allocate the flag and its pinned copy now (allocating pinned memory synchronises the whole
        device: not while stepping) and drop the checks of an earlier state (their rows are not its rows)."""
        self.device.scratch(FLAG, 4)
        self.device.pinned(FLAG, 1, np.int32)
        self.forget()

    def launch(self, pos: int, vel: int, rows: Span) -> None:
        """Queue the check of `rows` of the float4 arrays at `pos` and `vel` (the state's first rows)."""
        drv = self.device.drv
        flag = self.device.scratch(FLAG, 4)
        drv.memset_d32(flag, INT_MAX, 1)
        if rows.count:
            fn = self.device.function(INTEGRATE_SOURCE, "first_nonfinite", "PPiP")
            offset = ROW_BYTES * rows.start
            fn.prepared_call(
                (ceil_div(rows.count, BLOCK), 1), (BLOCK, 1, 1), pos + offset, vel + offset, rows.count, flag
            )
        self._launched = rows.start

    def result(self, wait: bool) -> int:
        """The first non-finite row a finished check found (an index into the whole state), or -1; with
        `wait` the newest launched check's, waiting for the GPU (see the module docstring)."""
        found = self._take_copy(wait)
        if self._launched is not None and self._event is None:
            self._queue_copy()
            if wait:
                newest = self._take_copy(True)
                found = newest if newest >= 0 else found
        return found

    def forget(self) -> None:
        """Drop the checks launched or in flight."""
        self._launched = self._copied = self._event = None

    def _queue_copy(self) -> None:
        flag = self.device.pinned(FLAG, 1, np.int32)
        self.device.drv.memcpy_dtoh_async(flag, self.device.scratch(FLAG, 4))
        self._event = self.device.drv.Event()
        self._event.record()
        self._copied, self._launched = self._launched, None

    def _take_copy(self, wait: bool) -> int:
        """The copied flag as a state row (-1: clean), once its copy finished (waiting for it with `wait`);
        -1 while it is still on its way."""
        if self._event is None:
            return -1
        assert self._copied is not None, "set with the event (_queue_copy)"
        if wait:
            self._event.synchronize()
        elif not self._event.query():
            return -1
        value = int(self.device.pinned(FLAG, 1, np.int32)[0])
        self._event = None
        return -1 if value == INT_MAX else self._copied + value
