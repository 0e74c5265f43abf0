"""Block time steps on one GPU: `BlockOps` (app/engine/blocksteps.py) over device arrays, the GPU tree's
forces.

The scheduler (`BlockSteps`) stays on the host: it owns the levels, picks the active rows of each substep
and asks these ops to drift every body, evaluate the active rows and kick them. As the CPU twin's
`TreeBlockOps`, the state is float64 x and v (here CuPy arrays on the device: drift and kick are a few
bytes per body, memory-bound, so float64 costs a desktop GPU nothing that matters) and the force is the
tree's float32 walk from float32 rows made from x at each substep. The tree builds at every evaluation and
walks only the groups that hold an active row (`TreeEvaluator.evaluate_rows`), so a row's a(x) does not
depend on which rows are active. a(x) is kept in float64 (the float32 walk's values, exact), so the
criterion reads what the twin's reads.

The updates themselves (drift, kick, the walk's float32 rows, a(x) kept, |a|) are kernels/blocksteps.cu,
one launch each, with the twin's float64 arithmetic bit for bit; CuPy's fancy indexing spent four to six
launches on each. With the scheduler's active rows from one comparison, that took 0.65-0.8 ms off a 1M-body
substep and 0.9 ms off a 22k one on an H200 (bench/results/h200-2026-11-26-blocksteps-profile-*.txt).

Not bitwise the twin: the walk sums in another order (docs/tree.md, "What the GPU version must
reproduce"), so trajectories part at float32 rounding; the lists of a substep are the twin's for the same
positions (tests/test_blocksteps_gpu.py).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np

from app.backends.cuda.policies import ceil_div, launch
from app.core.errors import ConfigError
from app.engine.blocksteps import block_tunables
from app.engine.forces import ForceWork, with_role
from app.model.bodies import Bodies
from app.model.physics import Physics

if TYPE_CHECKING:
    from app.backends.cuda.evaluator import GpuEvaluator


SOURCE = "blocksteps.cu"
# entry -> its prepare string (P pointer, i int, d double); tests/test_kernels_compile.py reads the PTX
KERNELS = {
    "block_drift": "PPid",
    "block_kick": "PPPPi",
    "block_pack_rows": "PPPi",
    "block_take_acc": "PPPi",
    "block_acc_norms": "PPPi",
}
THREADS = 256
MAX_BODIES = (2**31 - 1) // 3  # the kernels index the (N, 3) float64 state with 32-bit ints


class CudaBlockOps:
    """BlockOps on one GPU (`device`: an app.backends.cuda.device.CudaDevice) with the `tree` record's
    evaluator at `tunables` (rebuild_every and the relative opening test refused: a(x) must follow from x
    alone, which a resume needs)."""

    def __init__(self, bodies: Bodies, physics: Physics, device, tunables: dict | None = None):
        from app.backends.cuda.registry import RECORDS
        from app.backends.cuda.tree import cupy_module

        tunables = block_tunables(tunables)  # (ConfigError for rebuild_every > 1 or opening = rel)
        self.cp = self.xp = cp = cupy_module()  # xp: the scheduler keeps levels and rows on the device
        self.device = device
        self.physics = physics
        self.n = n = bodies.n
        if n > MAX_BODIES:
            raise ConfigError(f"block steps on a GPU take at most {MAX_BODIES:,} bodies; {n:,} were given")
        record = with_role(RECORDS, "block-steps")
        self.evaluator = record.policy.evaluator(record, device, {})
        self.evaluator.set_physics(physics)
        self.evaluator.set_tunables(**tunables)
        with self.scope():
            self.pos = cp.asarray(np.ascontiguousarray(bodies.pos, np.float64))
            self.vel = cp.asarray(np.ascontiguousarray(bodies.vel, np.float64))
            self.mass = cp.asarray(np.ascontiguousarray(bodies.mass, np.float32))  # the walk's rows' w
            self.acc = cp.zeros((n, 3), np.float64)
            self.rows32 = cp.empty((n, 4), np.float32)  # float32 [x, y, z, m] for the walk
            self.acc32 = cp.zeros((n, 4), np.float32)
        self.time = float(bodies.time)
        # the force error's all-pairs evaluator, made at its first sample
        self._exact: GpuEvaluator | None = None
        self.diag_pending = None  # app.backends.cuda.diagnostics' surface (energy on the device)
        self._mass64 = np.array(bodies.mass, dtype=np.float64)  # the state's own masses, for bodies()

    def scope(self):
        """The device's context and CuPy's device current (CuPy allocates on the current device)."""
        from contextlib import ExitStack

        stack = ExitStack()
        stack.enter_context(self.device.scope)
        stack.enter_context(self.cp.cuda.Device(self.device.ordinal))
        return stack

    def _launch(self, symbol: str, count: int, *args) -> None:
        """kernels/blocksteps.cu's `symbol` over `count` threads, queued on the current stream."""
        if count:
            fn = self.device.function(SOURCE, symbol, KERNELS[symbol])
            launch(fn, (ceil_div(count, THREADS), 1), THREADS, None, *args)

    # --- BlockOps ----------------------------------------------------------------------------------
    def drift_all(self, dt: float) -> None:
        with self.scope():  # x + dt * v, each rounded on its own (as NumpyBlockOps)
            self._launch(
                "block_drift", 3 * self.n, self.pos.data.ptr, self.vel.data.ptr, 3 * self.n, float(dt)
            )
        self.time += dt

    def _rows(self, rows):
        """`rows` on the device as contiguous int64 (the scheduler passes CuPy arrays, xp: then no copy)."""
        return self.cp.ascontiguousarray(self.cp.asarray(rows), dtype=np.int64)

    def _pack_rows(self) -> None:
        """rows32 = float32 [x, y, z, m] from the float64 positions (for the walk and the diagnostics)."""
        self._launch(
            "block_pack_rows", self.n, self.rows32.data.ptr, self.pos.data.ptr, self.mass.data.ptr, self.n
        )

    def force_active(self, rows) -> ForceWork:
        with self.scope():
            rows = self._rows(rows)
            self._pack_rows()
            work = self.evaluator.evaluate_rows(self.rows32.data.ptr, self.acc32.data.ptr, self.n, rows)
            # a(x) of the rows kept in float64 (float32 -> float64: exact)
            self._launch(
                "block_take_acc", rows.size, self.acc.data.ptr, self.acc32.data.ptr, rows.data.ptr, rows.size
            )
        return work

    def kick(self, rows, half_dts) -> None:
        with self.scope():  # v + a * h, each rounded on its own (as NumpyBlockOps)
            rows = self._rows(rows)
            half = self.cp.ascontiguousarray(self.cp.asarray(half_dts), dtype=np.float64)
            if half.shape != rows.shape:
                raise ValueError(f"kick: {half.size} half steps for {rows.size} rows")
            args = (self.vel.data.ptr, self.acc.data.ptr, rows.data.ptr, half.data.ptr, rows.size)
            self._launch("block_kick", rows.size, *args)

    def acc_norms(self, rows):
        """|a| of the rows in numpy's order, sqrt((x² + y²) + z²), on the device."""
        with self.scope():
            rows = self._rows(rows)
            out = self.cp.empty(rows.size, np.float64)
            self._launch(
                "block_acc_norms", rows.size, out.data.ptr, self.acc.data.ptr, rows.data.ptr, rows.size
            )
            return out

    def tidal_norms(self, rows: np.ndarray) -> np.ndarray:
        raise ValueError(
            "criterion 'tidal' needs ||T|| from the walk, which the GPU tree does not compute yet"
        )

    # --- the state ---------------------------------------------------------------------------------
    @contextmanager
    def state_arrays(self):
        """(precision, pos, vel) pointers of float32 [x, y, z, m] / [vx, vy, vz, 0] rows made from the
        float64 state, with the device current: what app.backends.cuda.diagnostics reads (its energy
        sums each tile in float, then in double; enough for drifts far above 1e-7)."""
        cp = self.cp
        with self.scope():
            self._pack_rows()
            vel32 = cp.zeros((self.n, 4), np.float32)
            vel32[:, :3] = self.vel.astype(np.float32)
            yield "fp32", self.rows32.data.ptr, vel32.data.ptr

    # --- the host's view, for a Backend (app/backends/block.py) --------------------------------------
    def synchronize(self) -> None:
        with self.scope():
            self.cp.cuda.Device().synchronize()

    def host_state(self) -> tuple[np.ndarray, np.ndarray]:
        with self.scope():
            return self.pos.get(), self.vel.get()

    def host_acc(self) -> np.ndarray:
        with self.scope():
            return self.acc.get()

    def _fill_render_rows(self, rows, speed, ahead: float) -> None:
        """Write float32 [x, y, z, m] rows (x + v·ahead: a drawing predicted between substeps) and speeds
        into the device arrays `rows` (N, 4) and `speed` (N,), queued on the current stream."""
        rows[:, :3] = (self.pos + ahead * self.vel if ahead else self.pos).astype(np.float32)
        rows[:, 3] = self.mass
        speed[:] = self.cp.sqrt(self.cp.sum(self.vel * self.vel, axis=1)).astype(np.float32)

    def render_arrays(self, ahead: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """The render rows and speeds (`_fill_render_rows`) made on the device and copied to the host:
        20 bytes a body cross to the host, not the 48 of the float64 state."""
        cp = self.cp
        with self.scope():
            rows, speed = cp.empty((self.n, 4), np.float32), cp.empty(self.n, np.float32)
            self._fill_render_rows(rows, speed, ahead)
            return rows.get(), speed.get()

    def write_render_rows(self, pos_ptr: int, speed_ptr: int, ahead: float = 0.0) -> None:
        """The render rows and speeds (`_fill_render_rows`) written into device buffers (the renderer's
        VBOs, mapped: CUDA–GL interop), queued on the current stream; the caller synchronises before
        unmapping."""
        cp = self.cp
        with self.scope():

            def over(ptr: int, shape: tuple[int, ...]):
                nbytes = int(np.prod(shape)) * 4
                memory = cp.cuda.UnownedMemory(int(ptr), nbytes, owner=self)
                return cp.ndarray(shape, np.float32, cp.cuda.MemoryPointer(memory, 0))

            self._fill_render_rows(over(pos_ptr, (self.n, 4)), over(speed_ptr, (self.n,)), ahead)

    def force_error_sample(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(a(x) kept for `rows`, their all-pairs accelerations from the float32 rows the last walk read,
        on this GPU: app/backends/cuda/force_sample.py). a(x) must be current: the rows are then the
        current positions (the last evaluation of a max step follows its last drift)."""
        from app.backends.cuda.force_sample import exact_rows, sample_evaluator
        from app.backends.cuda.registry import RECORDS

        if self._exact is None:
            self._exact = sample_evaluator(self.device, {r.name: r for r in RECORDS}, self.physics)
        rows = np.asarray(rows, dtype=np.int64)
        with self.scope():
            approx = self.acc[self.cp.asarray(rows)].get()
        return approx, exact_rows(self.device, self._exact, self.rows32.data.ptr, self.n, rows)

    def bodies(self) -> Bodies:
        """The state on the host (float64 x and v, the masses, the clock)."""
        with self.scope():
            pos, vel = self.pos.get(), self.vel.get()
        return Bodies.from_arrays(pos, vel, self._mass64, time=self.time)
