"""One GPU's side of A/B and of the error colours (app/engine/compare.py CompareOps), in device buffers.

- B: `backend.evaluator(name)` (the backend's evaluator of that record, not the run's, with the run's
  physics and the tunables set for it) over the state's own position rows when the precisions match (float4
  rows for an fp32 B: an fp64 run keeps them current for drawing; the double rows for an fp64 B on an fp64
  run), else over a converted copy, into a scratch acceleration buffer kept between evaluations (the GPU
  tree's relative opening test reads its last rows there); timed by CUDA events around the evaluation on
  the GPU's legacy stream, read at once (A/B waits for its GPU once per evaluation: it reads B's sampled
  rows back anyway). Each record's kernels are compiled and loaded (`prepare`) before its first timed
  evaluation, so that no compile lands between its events.
- A: the run's cached a(x) (`acc`, float4 rows; `acc64` for the fp64 record), made current first
  (MultiDeviceRun.ensure_acc), read in place.
- The exact sum: the record in the role "reference" (fp64, float64 throughout) over a float64 snapshot of
  the positions (the double state, or the float rows promoted exactly), a span of targets per piece,
  against A's a(x) snapshotted with them.
- Rows: the state's rows are bodies until a tree's domain split keeps them in key order; then `ids` (the
  body in each row, int32 on the device) scatters every per-body value to its body's place, so the colour
  buffer is in load order, as the renderer's buffers are (multi_interop.py: render_rows).
- The colours: float32 (N,) on the device (CuPy, the same arithmetic as error_colours.error_positions).
  With CUDA-GL interop `paint()` maps the renderer's buffers and copies them into the speed VBO on the
  device (after each step's copies there: one more map / unmap and 4 N bytes a frame, no host round
  trip); without it the host copy, read back once per change, is what the renderer uploads.

Everything runs on the legacy stream of the GPU's primary context, behind the run's queued work, as the
live force error's sample does (force_sample.py). Nothing here writes the state or the run's evaluators.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import numpy as np

from app.backends.cuda.tree_memory import cupy_module
from app.engine.clocks import EventTimer
from app.engine.error_colours import ERROR_HI, ERROR_LO
from app.engine.forces import Span, with_role


class CudaCompare:
    """CompareOps over a CudaBackend (`backend.compare_ops()`); `run()` returns its loaded
    MultiDeviceRun (one GPU: its device 0 holds every row)."""

    def __init__(self, backend, run: Callable):
        self.backend = backend
        self.device = backend.device  # the run's GPU: the same primary context as its CudaShareDevice's
        self._run = run
        self.cp = cupy_module()
        with self.device.scope:
            self._timer = EventTimer(self.device.drv)
        self._buffers: dict[str, Any] = {}  # CuPy arrays by name
        self._other_of: tuple | None = None  # (record, N, precision) of the scratch's rows
        self._prepared: set[tuple[str, int]] = set()  # (record, N) whose kernels are loaded
        self._snapshot_ids = None  # the exact sum's snapshot: the body in each row (None: rows are bodies)
        self._snapshot_n = 0
        self._host: np.ndarray | None = None  # the colours' host copy (no interop), None: read it again

    # --- helpers -----------------------------------------------------------------------------------
    def _scope(self):
        """The GPU's context current, for pycuda and CuPy alike."""
        stack = ExitStack()
        stack.enter_context(self.device.scope)
        stack.enter_context(self.cp.cuda.Device(self.device.ordinal))
        return stack

    def _view(self, ptr: int, n: int, dtype):
        """(n, 4) rows of `dtype` at device pointer `ptr` (memory the state owns), as a CuPy array."""
        cp = self.cp
        nbytes = 4 * n * np.dtype(dtype).itemsize
        memory = cp.cuda.UnownedMemory(int(ptr), max(nbytes, 1), self.device)
        return cp.ndarray((n, 4), dtype, cp.cuda.MemoryPointer(memory, 0))

    def _buffer(self, name: str, shape: tuple, dtype, zero: bool = False):
        """A CuPy array kept under `name`, made again (zeroed) when its shape or dtype changes."""
        cp = self.cp
        buf = self._buffers.get(name)
        if buf is None or buf.shape != shape or buf.dtype != np.dtype(dtype):
            buf = self._buffers[name] = cp.zeros(shape, dtype)
        elif zero:
            buf.fill(0)
        return buf

    def _gpu(self):
        """The run's GPU (a CudaShareDevice) with its a(x) current."""
        run = self._run()
        run.ensure_acc()
        return run.devices[0]

    def _acc_a(self, gpu, rows=None):
        """A's a(x), float64 (N, 3) in state order, or only the state rows `rows` (a CuPy index array)."""
        acc = (
            self._view(gpu.ptr["acc64"], gpu.n, np.float64)
            if gpu.fp64
            else self._view(gpu.ptr["acc"], gpu.n, np.float32)
        )
        return (acc if rows is None else acc[rows])[:, :3].astype(self.cp.float64)

    def _positions(self, gpu, precision: str, name: str) -> int:
        """A device pointer to the state's positions in `precision`: its own rows, or a converted copy."""
        if precision != "fp64":
            return gpu.ptr["pos"]  # (an fp64 run keeps its float rows current for drawing)
        if gpu.fp64:
            return gpu.ptr["pos64"]
        copy = self._buffer(name, (gpu.n, 4), np.float64)
        copy[...] = self._view(gpu.ptr["pos"], gpu.n, np.float32)  # float32 promoted exactly
        return int(copy.data.ptr)

    def _ids(self, gpu):
        """The body in each state row (int64, a copy), or None while rows are bodies."""
        if not gpu.key_ordered:
            return None
        cp = self.cp
        memory = cp.cuda.UnownedMemory(int(gpu.ptr["ids"]), max(4 * gpu.n, 1), self.device)
        return cp.ndarray((gpu.n,), cp.int32, cp.cuda.MemoryPointer(memory, 0)).astype(cp.int64)

    def _prepare(self, evaluator, n: int) -> None:
        key = (evaluator.record.name, n)
        if key not in self._prepared:
            evaluator.prepare(n)
            self._prepared.add(key)

    def _timed(self, evaluator, pos: int, acc: int, targets: Span, n: int) -> float:
        """One evaluation over all n sources, ms between CUDA events around it (waits for them)."""
        self.cp.cuda.get_current_stream().synchronize()  # CuPy's copies before the pycuda launches
        start = self._timer.start()
        evaluator.evaluate(pos, acc, targets, Span.all(n))
        self._timer.stop("compare", start)
        return float(self._timer.collect().get("compare", 0.0))

    # --- B -----------------------------------------------------------------------------------------
    def evaluate_other(self, name: str) -> float:
        evaluator = self.backend.evaluator(name)
        precision = evaluator.active(self.backend.n)[0].precision  # (`best`: the record it runs)
        gpu = self._gpu()
        n = gpu.n
        with self._scope():
            self._prepare(evaluator, n)
            pos = self._positions(gpu, precision, "other-pos64")
            dtype = np.float64 if precision == "fp64" else np.float32
            fresh = self._other_of != (name, n, precision)  # another B: its tree starts geometric
            out = self._buffer("other-acc", (n, 4), dtype, zero=fresh)
            self._other_of = (name, n, precision)
            return self._timed(evaluator, pos, int(out.data.ptr), Span.all(n), n)

    def _other(self, rows=None):
        """B's accelerations of the latest evaluation, as _acc_a's."""
        if self._other_of is None or self._other_of[1] != self.backend.n:
            raise RuntimeError("A/B: no evaluation of B at this N yet (evaluate_other first)")
        acc = self._buffers["other-acc"]
        return (acc if rows is None else acc[rows])[:, :3].astype(self.cp.float64)

    def sample(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        gpu = self._gpu()  # (first: an evaluation of a(x) may re-sort the rows)
        state_rows = self._run().state_rows(np.asarray(rows, dtype=np.int64))
        with self._scope():
            idx = self.cp.asarray(state_rows)
            return self._acc_a(gpu, idx).get(), self._other(idx).get()

    def colour_other(self) -> dict[str, float]:
        gpu = self._gpu()
        with self._scope():
            return self._colour(self._acc_a(gpu), self._other(), self._ids(gpu), gpu.n)

    # --- the exact sum -----------------------------------------------------------------------------
    def _reference(self):
        return self.backend.evaluator(with_role(self.backend.kernels(), "reference").name)

    def exact_begin(self) -> int:
        gpu = self._gpu()
        n = gpu.n
        with self._scope():
            pos = self._buffer("exact-pos", (n, 4), np.float64)
            rows = (
                self._view(gpu.ptr["pos64"], n, np.float64)
                if gpu.fp64
                else self._view(gpu.ptr["pos"], n, np.float32)
            )
            pos[...] = rows  # a snapshot: the state moves on between the pieces
            self._buffer("exact-acc-a", (n, 3), np.float64)[...] = self._acc_a(gpu)
            self._buffer("exact", (n, 4), np.float64, zero=True)
            self._snapshot_ids, self._snapshot_n = self._ids(gpu), n
            self._prepare(self._reference(), n)
        return n

    def exact_piece(self, targets: Span) -> float:
        n = self._snapshot_n
        if "exact-pos" not in self._buffers or not n:
            raise RuntimeError("exact sum: exact_begin first")
        with self._scope():
            pos, out = self._buffers["exact-pos"], self._buffers["exact"]
            return self._timed(self._reference(), int(pos.data.ptr), int(out.data.ptr), targets, n)

    def colour_exact(self) -> dict[str, float]:
        with self._scope():
            exact = self._buffers["exact"][:, :3]
            return self._colour(self._buffers["exact-acc-a"], exact, self._snapshot_ids, self._snapshot_n)

    # --- the colours -------------------------------------------------------------------------------
    def _colour(self, approx, ref, ids, n: int) -> dict[str, float]:
        """Per-body relative errors (app.model.physics.relative_errors' floor) into the colour buffer, in
        load order; their median, p99 and max."""
        cp = self.cp
        diff = cp.linalg.norm(approx - ref, axis=1)
        mag = cp.linalg.norm(ref, axis=1)
        floor = 1e-3 * cp.sqrt(cp.mean(mag * mag))
        errors = diff / cp.maximum(mag, cp.maximum(floor, 1e-300))
        e = cp.where(cp.isfinite(errors), errors, ERROR_HI)
        lo = math.log10(ERROR_LO)
        t = ((cp.log10(cp.clip(e, ERROR_LO, ERROR_HI)) - lo) / (math.log10(ERROR_HI) - lo)).astype(cp.float32)
        colours = self._buffer("colours", (n,), np.float32)
        if ids is None:
            colours[...] = t
        else:
            colours[ids] = t
        self._host = None
        return {
            "median": float(cp.median(errors).get()),
            "p99": float(cp.percentile(errors, 99).get()),
            "max": float(errors.max().get()),
        }

    def clear_colours(self) -> None:
        with self._scope():
            self._buffer("colours", (self.backend.n,), np.float32, zero=True)
        self._host = None

    def paint(self) -> np.ndarray | None:
        n = self.backend.n
        colours = self._buffers.get("colours")
        if colours is None or colours.shape != (n,):
            self.clear_colours()
            colours = self._buffers["colours"]
        gl = self.backend.gl_buffers
        if gl is None:  # the renderer uploads from the host: one read-back per change
            if self._host is None:
                with self._scope():
                    self._host = colours.get()
            return self._host
        with self._scope():
            self.cp.cuda.get_current_stream().synchronize()  # CuPy's writes before the copy and the unmap
            with gl.mapped_for(n) as mapped:
                self.device.drv.memcpy_dtod_async(mapped.speed, int(colours.data.ptr), 4 * n)
        return None

    def close(self) -> None:
        with self.device.scope:
            self._buffers.clear()
            self._timer.release()
        self._snapshot_ids = None
