"""Energy and momentum of the CUDA backend's state, reduced on the device (kernels/diagnostics.cu).

`launch_diagnostics(backend)` launches three kernels on the state where it lives (the mapped GL vertex
buffer with interop, the plain allocation without; the double buffers when the `fp64` kernel runs):

    diag_moments_<p>     O(N)  kinetic energy, linear and angular momentum, Σ m|v|, Σ m|r||v|
    diag_potential_<p>   O(N²) Σ_{i<j} m_i m_j (-G/s + H/(3 s³)), s² = r² + ε², each pair once
    diag_finalize        one block: the per-block partial sums, added in a fixed order

and copies back ten doubles, never the state, into pinned memory behind an event: the returned
PendingDiagnostics polls (`done()`) or waits (`result()`), so the live viewer never drains the frames
queued on the GPU to read them (a blocking copy there stalled a frame by ~27 ms at N = 65,536 on the
H200). `device_diagnostics(backend)` is launch + wait. Every accumulator is double; the potential sums each
256-body tile per thread in the state's precision first (float for the fp32 kernels), then in double.
The result is deterministic (no atomics). Cost: about half a force evaluation (each pair once, 7 FP32
instructions + 1 rsqrt for gravity), which is why the panel asks only every few frames.

The geometry helpers are pure functions, tested on the CPU; the launches need pycuda and a GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from app.backends.cuda.policies import ceil_div, force_arguments
from app.model.physics import Diagnostics

if TYPE_CHECKING:
    from app.backends.cuda.context import ContextScope

SOURCE = "diagnostics.cu"
BLOCK = 256  # DIAG_BLOCK: the threads of every diagnostics block and the potential's tile length
MOMENTS = 9  # DIAG_MOMENTS: K, Px, Py, Pz, Lx, Ly, Lz, Σ m|v|, Σ m|r||v|
RESULTS = MOMENTS + 1  # DIAG_RESULTS: ... and U
MAX_CHUNKS = 32  # j-chunks per tile row of the potential grid (gridDim.y)
MOMENT_BLOCKS_PER_SM = 4


@dataclass(frozen=True)
class DeviceDiagnostics(Diagnostics):
    """`app.model.physics.Diagnostics` plus the scale angular-momentum drift is judged against."""

    angular_scale: float = math.nan  # Σ m |r| |v|


# --- geometry (pure) -------------------------------------------------------------------------------------
def moment_blocks(n: int, sms: int) -> int:
    """Blocks of the grid-stride O(N) pass: enough to fill the GPU, few partials to add."""
    return max(1, min(ceil_div(max(n, 1), BLOCK), MOMENT_BLOCKS_PER_SM * max(int(sms), 1)))


def potential_plan(n: int) -> tuple[int, int, int]:
    """(tiles, chunk_tiles, chunks): grid = (tiles, chunks), block (ti, c) walks j-tiles
    [max(c * chunk_tiles, ti), min((c + 1) * chunk_tiles, tiles))."""
    tiles = ceil_div(max(n, 1), BLOCK)
    chunk_tiles = max(1, ceil_div(tiles, MAX_CHUNKS))
    return tiles, chunk_tiles, ceil_div(tiles, chunk_tiles)


def tile_pairs(tiles: int, chunk_tiles: int, chunks: int) -> list[tuple[int, int]]:
    """The (i-tile, j-tile) pairs the potential grid visits, in launch order (for tests)."""
    out = []
    for c in range(chunks):
        for ti in range(tiles):
            first = c * chunk_tiles
            out += [(ti, tj) for tj in range(max(first, ti), min(first + chunk_tiles, tiles))]
    return out


def potential_symbol(precision: str, repulsion: bool, soft: bool) -> str:
    """'diag_potential_f32_gravity_soft' etc.; precision is 'f32' or 'f64'."""
    model = "repulsion" if repulsion else "gravity"
    return f"diag_potential_{precision}_{model}_{'soft' if soft else 'plain'}"


def from_results(out: np.ndarray, time: float) -> DeviceDiagnostics:
    """The ten doubles diag_finalize writes, as a Diagnostics."""
    v = [float(x) for x in out]
    return DeviceDiagnostics(
        time=float(time),
        kinetic=v[0],
        potential=v[9],
        momentum=(v[1], v[2], v[3]),
        angular_momentum=(v[4], v[5], v[6]),
        momentum_scale=v[7],
        angular_scale=v[8],
    )


# --- the launches ----------------------------------------------------------------------------------------
@dataclass
class PendingDiagnostics:
    """Device diagnostics in flight: the ten doubles land in `host` (pinned) once `event` completes.

    `host` is the backend's one pinned buffer (allocating pinned memory synchronises the whole device,
    which is the stall this avoids); the next launch first settles this one into its own copy."""

    scope: ContextScope  # the backend's: event calls need its context current
    event: Any  # a pycuda Event (pycuda ships no type stubs)
    host: np.ndarray
    time: float
    _values: np.ndarray | None = None

    def done(self) -> bool:
        if self._values is not None:
            return True
        with self.scope:
            return bool(self.event.query())

    def settle(self) -> None:
        """Wait for the GPU if needed and keep the values (the pinned buffer may then be reused)."""
        if self._values is None:
            with self.scope:
                self.event.synchronize()
            self._values = self.host.copy()

    def result(self) -> DeviceDiagnostics:
        """Waits for the GPU to get there if it has not yet."""
        self.settle()
        assert self._values is not None, "kept by settle()"
        return from_results(self._values, self.time)


def device_diagnostics(backend) -> DeviceDiagnostics:
    """Diagnostics of a loaded CudaBackend's current state, computed on its device (waits for them)."""
    return launch_diagnostics(backend).result()


def launch_diagnostics(backend) -> PendingDiagnostics:
    """Start the diagnostics of a loaded CudaBackend's current state on its device; returns at once.

    Uses the backend's public surface only: `device` (kernels, scratch, pinned memory, scope),
    `state_arrays()` (the state's precision and pointers), `physics`, `n`, `time`, and `diag_pending`,
    where the previous launch waits to be settled before the pinned buffer is reused."""
    dev, n = backend.device, backend.n
    repulsion, soft, eps2, g, h = force_arguments(backend.physics)
    tiles, chunk_tiles, chunks = potential_plan(n)
    n_moments = moment_blocks(n, dev.facts.sms)
    n_potential = tiles * chunks
    previous = backend.diag_pending
    if previous is not None:
        previous.settle()  # its values leave the pinned buffer before this launch overwrites it
    with backend.state_arrays() as (precision, pos, vel):
        fp64 = precision == "fp64"
        prec = "f64" if fp64 else "f32"
        out = dev.pinned("diagnostics", RESULTS, np.float64)
        moments = dev.function(SOURCE, f"diag_moments_{prec}", "PPiP")
        potential = dev.function(
            SOURCE, potential_symbol(prec, repulsion, soft), "PidddiP" if fp64 else "PifddiP"
        )
        finalize = dev.function(SOURCE, "diag_finalize", "PiPiP")
        base = dev.scratch("diagnostics", 8 * (MOMENTS * n_moments + n_potential + RESULTS))
        part_m = base
        part_u = base + 8 * MOMENTS * n_moments
        result = part_u + 8 * n_potential
        moments.prepared_call((n_moments, 1), (BLOCK, 1, 1), pos, vel, n, part_m)
        potential.prepared_call((tiles, chunks), (BLOCK, 1, 1), pos, n, eps2, g, h / 3.0, chunk_tiles, part_u)
        finalize.prepared_call((1, 1), (BLOCK, 1, 1), part_m, n_moments, part_u, n_potential, result)
        dev.drv.memcpy_dtoh_async(out, result)  # stream-ordered after the three kernels: 80 bytes
        event = dev.drv.Event()
        event.record()
    backend.diag_pending = PendingDiagnostics(scope=dev.scope, event=event, host=out, time=backend.time)
    return backend.diag_pending
