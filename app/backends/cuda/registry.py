"""The CUDA kernel records: one per force variant (REBOUND's integrator-table pattern).

A record's `source` is a file in kernels/ and its `entry` a symbol prefix: every variant file defines
`<entry>_<model>_<self-term>` through NBODY_FORCE_ENTRIES in kernels/common.cuh, with model in
{gravity, repulsion} and self-term in {soft (ε² > 0, branch-free), plain (ε = 0, skips s² = 0)}.
All variants share the integrate kernels of `INTEGRATE_SOURCE`.

To add a variant: write kernels/<name>.cu (include "common.cuh", end with NBODY_FORCE_ENTRIES), add a
record here; tests/test_kernels_compile.py and tests/test_cuda.py pick it up.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.backends.base import KernelRecord

INTEGRATE_SOURCE = "integrate.cu"
DEFAULT_KERNEL = "shared"
BLOCK_SIZES = (64, 128, 256, 512, 1024)

RECORDS: tuple[KernelRecord, ...] = (
    KernelRecord(
        name="naive",
        doc="one thread per body, every source body read from global memory (float4 __ldg)",
        backend="cuda", precision="fp32", source="naive.cu", entry="naive_force", block_size=256,
        tunables={"block_size": BLOCK_SIZES},
        origin="textbook all-pairs loop (the floor every tiled variant is measured against)"),
    KernelRecord(
        name="shared",
        doc="GPU Gems 3 tiled kernel: blockDim-sized float4 tiles in shared memory, one thread per body",
        backend="cuda", precision="fp32", source="shared.cu", entry="shared_force", block_size=256,
        tunables={"block_size": BLOCK_SIZES},
        origin="GPU Gems 3 ch. 31 (Nyland, Harris & Prins 2007); NVIDIA CUDA samples nbody"),
)
BY_NAME = {rec.name: rec for rec in RECORDS}


@dataclass(frozen=True)
class LaunchPolicy:
    """How a force record is launched: dynamic shared memory per thread (bytes) and the block size."""

    shared_bytes_per_thread: int = 0


# Per-source launch needs (the record fields cover the rest).
LAUNCH = {
    "naive.cu": LaunchPolicy(shared_bytes_per_thread=0),
    "shared.cu": LaunchPolicy(shared_bytes_per_thread=16),  # one float4 per thread: the tile
}


def force_symbol(record: KernelRecord, repulsion: bool, soft: bool) -> str:
    return f"{record.entry}_{'repulsion' if repulsion else 'gravity'}_{'soft' if soft else 'plain'}"


def force_symbols(record: KernelRecord) -> list[str]:
    return [force_symbol(record, r, s) for r in (False, True) for s in (True, False)]


def launch_policy(record: KernelRecord) -> LaunchPolicy:
    return LAUNCH.get(record.source or "", LaunchPolicy())
