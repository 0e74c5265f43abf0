"""Energy and momentum of the CUDA backend's state, reduced on the device (kernels/diagnostics.cu).

`launch_diagnostics(backend)` launches three kernels on the state where it lives (the mapped GL vertex
buffer with interop, the plain allocation without; the double buffers when the `fp64` kernel runs):

    diag_moments_<p>     O(N)  kinetic energy, linear and angular momentum, Σ m|v|, Σ m|r||v|
    diag_potential_<p>   O(N²) Σ_{i<j} m_i m_j (-G/s + H/(3 s³)), s² = r² + ε², each pair once
    diag_finalize        one block: the per-block partial sums, added in a fixed order

and copies back ten doubles, never the state, into pinned memory behind an event: the returned
PendingDiagnostics polls (`done()`) or waits (`result()`), so the live viewer never drains the frames
queued on the GPU to read them (a blocking copy there stalled a frame by ~27 ms at N = 65,536 on the
H200). `device_diagnostics(backend)` is launch + wait.

A live sample (`slice_pairs`, the viewer's) cuts the O(N²) potential into slices of i-tiles of about
`live_slice_pairs(n)` pairs, one queued each time `done()` finds the GPU through the last, so a frame
carries a few per cent of the potential instead of all of it: in one launch it stalled the frame it
landed in by ~200 ms at 1M bodies and ~52 s at 16M (H200, bench/results/h200-2026-11-26-run-*-frames.csv:
frames 1 and 31). The slices read a copy of the positions taken at the launch, so the sample is of one
state, and every block still writes its own partial: the sliced sum is the one-launch sum, bit for bit.

Every accumulator is double; the potential sums each 256-body tile per thread in the state's precision
first (float for the fp32 kernels), then in double. The result is deterministic (no atomics). Cost: about
half an all-pairs force evaluation (each pair once, 7 FP32 instructions + 1 rsqrt for gravity).

The geometry helpers are pure functions, tested on the CPU; the launches need pycuda and a GPU.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from time import perf_counter
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
# j-chunks per tile row of the potential grid (gridDim.y). 256, not fewer: a live slice holds only a few
# i-tiles at large N (4 of 65,536 at 16M), and its blocks are those tiles x the chunks, so 32 chunks left
# ~130 blocks for 132 SMs; the cost is the partials, tiles x 256 doubles (134 MB at 16M, 8 MB at 1M)
MAX_CHUNKS = 256
MOMENT_BLOCKS_PER_SM = 4
# A live slice: about N x 1,024 pairs; a sample then spans ~N / 2,048 slices (512 at 1M). Not below 2^30
# pairs: small N takes its sample in one or two slices. A slice is not cheap: 2^30 float64 pair terms are
# ~3e10 FP64 operations, 1 ms at an H100's FP64 peak and likely two or three in practice (estimated, not
# measured alone), a large share of the tree's 6.8 ms force at 1M, and one ran in every frame whose done()
# found the last one through. So the later slices are paced: the next one waits until the last one's GPU
# time (its own events) is at most LIVE_GPU_SHARE of the wall time since it was queued.
LIVE_PAIRS_PER_BODY = 1024
LIVE_MIN_PAIRS = 1 << 30
LIVE_GPU_SHARE = 0.05
# A live sample whose potential would span more slices (frames) than this leaves the potential out: past
# ~4M bodies an exact energy takes thousands of frames (8,192 at 16M, a quarter of an hour at 9 fps) and
# each of them ~6 ms of the GPU (H200, 16M: 117 ms frames against 111 for 9 fps), so the panel shows the
# momenta's drift there, every sample, and says why the energy's is not; `simulate` computes it.
LIVE_MAX_SLICES = 2048


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


def live_slice_pairs(n: int) -> int:
    """The pairs of one live slice of the potential at N bodies (LIVE_PAIRS_PER_BODY says why)."""
    return max(int(n) * LIVE_PAIRS_PER_BODY, LIVE_MIN_PAIRS)


def live_potential(n: int) -> bool:
    """Whether a live sample at N bodies computes the potential (LIVE_MAX_SLICES says why not)."""
    return len(potential_slices(n, live_slice_pairs(n))) <= LIVE_MAX_SLICES


def potential_slices(n: int, pairs: int | None = None) -> list[tuple[int, int]]:
    """The i-tile ranges [t0, t1) of the potential grid, in order, each of at least `pairs` pair terms
    (the last one the rest; i-tile ti holds (tiles - ti) x BLOCK² of them, the upper triangle); one range
    for all when `pairs` is None."""
    tiles = potential_plan(n)[0]
    if pairs is None:
        return [(0, tiles)]
    per_tile = (tiles - np.arange(tiles, dtype=np.int64)) * BLOCK * BLOCK
    ends = np.cumsum(per_tile)
    cuts, start, done = [], 0, 0
    while start < tiles:  # the first tile whose running total reaches `pairs` past the last cut
        end = int(np.searchsorted(ends, done + max(int(pairs), 1))) + 1
        end = min(max(end, start + 1), tiles)
        cuts.append((start, end))
        start, done = end, int(ends[end - 1])
    return cuts


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
    which is the stall this avoids); the next launch first settles this one into its own copy. `rest`:
    the launches not queued yet (a live sample's later potential slices, then the finalize and the copy),
    one queued by each `done()` that finds the GPU through the previous ones."""

    scope: ContextScope  # the backend's: event calls need its context current
    event: Any  # a pycuda Event (pycuda ships no type stubs)
    host: np.ndarray
    time: float
    rest: list[Callable[[], None]] = field(default_factory=list)
    slices: int = 1  # the potential's slices in all
    note: str = ""  # why the potential was left out (a live sample at large N), else ""
    # pacing (a live sample's later slices): `started`, an event recorded before the launch in flight, times
    # it against `event`; the next waits until that time is at most `share` of the wall time (`clock`, s)
    started: Any = None
    share: float = 1.0
    clock: Callable[[], float] = perf_counter
    _values: np.ndarray | None = None
    _next_at: float | None = None  # when the next launch may go, once the one in flight is through

    @property
    def progress(self) -> float:
        """The share of the launches queued so far, 0 .. 1."""
        return 1.0 - len(self.rest) / (self.slices + 1)

    def done(self) -> bool:
        if self._values is not None:
            return True
        with self.scope:
            if not self.event.query():
                return False
            if not self.rest:
                return True
            if self.started is not None and self.share < 1.0:
                now = self.clock()
                if self._next_at is None:  # the launch in flight is through: its cost sets the pause
                    cost_s = self.started.time_till(self.event) * 1e-3
                    self._next_at = now + cost_s * (1.0 / self.share - 1.0)
                if now < self._next_at:
                    return False
                self._next_at = None
                self.started.record()
            self.rest.pop(0)()
            self.event.record()
            return False

    def settle(self) -> None:
        """Queue what is left, wait for the GPU if needed and keep the values (the pinned buffer may then
        be reused)."""
        if self._values is None:
            with self.scope:
                while self.rest:
                    self.rest.pop(0)()
                self.event.record()
                self.event.synchronize()
            self._values = self.host.copy()

    def result(self) -> DeviceDiagnostics:
        """Waits for the GPU to get there if it has not yet."""
        self.settle()
        assert self._values is not None, "kept by settle()"
        d = from_results(self._values, self.time)
        return dataclasses.replace(d, potential=math.nan) if self.note else d


def device_diagnostics(backend) -> DeviceDiagnostics:
    """Diagnostics of a loaded CudaBackend's current state, computed on its device (waits for them)."""
    return launch_diagnostics(backend).result()


def launch_diagnostics(backend, slice_pairs: int | None = None) -> PendingDiagnostics:
    """Start the diagnostics of a loaded CudaBackend's current state on its device; returns at once.
    `slice_pairs`: the potential in slices of about that many pairs, the first queued now and each later
    one by the handle's done() (a live sample: `live_slice_pairs(n)`), or none past LIVE_MAX_SLICES of
    them (the handle's `note` says so, its potential NaN); None, in one launch.

    Uses the backend's public surface only: `device` (kernels, scratch, pinned memory, scope),
    `state_arrays()` (the state's precision and pointers), `physics`, `n`, `time`, and `diag_pending`,
    where the previous launch waits to be settled before the pinned buffer is reused."""
    dev, n = backend.device, backend.n
    repulsion, soft, eps2, g, h = force_arguments(backend.physics)
    tiles, chunk_tiles, chunks = potential_plan(n)
    slices = potential_slices(n, slice_pairs)
    note = ""
    if slice_pairs is not None and len(slices) > LIVE_MAX_SLICES:
        note = (
            f"N = {n:,}: the live energy drift is off (an exact sample would span {len(slices):,} frames); "
            "momenta only. `simulate` computes the energy"
        )
        slices = []
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
            SOURCE, potential_symbol(prec, repulsion, soft), "PidddiiiP" if fp64 else "PifddiiiP"
        )
        finalize = dev.function(SOURCE, "diag_finalize", "PiPiP")
        base = dev.scratch("diagnostics", 8 * (MOMENTS * n_moments + n_potential + RESULTS))
        part_m = base
        part_u = base + 8 * MOMENTS * n_moments
        result = part_u + 8 * n_potential
        moments.prepared_call((n_moments, 1), (BLOCK, 1, 1), pos, vel, n, part_m)
        source = pos
        if len(slices) > 1:  # the later slices run after the state has moved on: they read its copy
            row = 32 if fp64 else 16
            source = dev.scratch("diagnostics-pos", row * n)
            dev.drv.memcpy_dtod(source, pos, row * n)

        def potential_slice(t0: int, t1: int) -> None:
            potential.prepared_call(
                (t1 - t0, chunks), (BLOCK, 1, 1), source, n, eps2, g, h / 3.0, chunk_tiles, t0, tiles, part_u
            )

        def finish() -> None:
            summed = n_potential if slices else 0  # (the potential left out: none of its partials)
            finalize.prepared_call((1, 1), (BLOCK, 1, 1), part_m, n_moments, part_u, summed, result)
            dev.drv.memcpy_dtoh_async(out, result)  # stream-ordered after the kernels: 80 bytes

        rest = [functools.partial(potential_slice, *cut) for cut in slices] + [finish]
        started = None
        if len(rest) > 2:  # a sample in slices: paced (LIVE_GPU_SHARE)
            started = dev.drv.Event()
            started.record()
        rest.pop(0)()  # the first slice (or, with none, the finish) now
        if len(rest) == 1:  # one slice: the finish behind it now too
            rest.pop()()
        event = dev.drv.Event()
        event.record()
    backend.diag_pending = PendingDiagnostics(
        scope=dev.scope, event=event, host=out, time=backend.time, rest=rest, slices=len(slices), note=note,
        started=started, share=LIVE_GPU_SHARE if started is not None else 1.0,
    )  # fmt: skip
    return backend.diag_pending
