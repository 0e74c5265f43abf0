"""The CUDA kernel records: one per force variant (REBOUND's integrator-table pattern).

A record's `source` is a file in kernels/ and its `entry` a symbol prefix: every variant file defines
`<entry>_<model>_<self-term>` through NBODY_FORCE_ENTRIES in kernels/common.cuh, with model in
{gravity, repulsion} and self-term in {soft (ε² > 0, branch-free), plain (ε = 0, skips s² = 0)}.
All variants share the integrate kernels of `INTEGRATE_SOURCE`.

To add a variant: write kernels/<name>.cu (include "common.cuh", end with NBODY_FORCE_ENTRIES), add a
record here; tests/test_kernels_compile.py and tests/test_cuda.py pick it up.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from app.backends.base import KernelRecord

INTEGRATE_SOURCE = "integrate.cu"
DEFAULT_KERNEL = "shared"
BLOCK_SIZES = (64, 128, 256, 512, 1024)
SMALL_BLOCKS = (64, 128, 256)
# register-blocked: 0 = choose the number of j-slices from N and the SM count (launch.auto_slices).
SLICES = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
# atomics-n3l: j-tiles per warp task; 0 = choose from N and the SM count (launch.auto_chunk).
CHUNKS = (0, 1, 2, 4, 8, 16, 32, 64)
BEST = "best"

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
    KernelRecord(
        name="gpu5-branchy",
        doc="textbook first port: sqrtf and divides, a per-pair branch skipping self, global loads",
        backend="cuda", precision="fp32", source="gpu5.cu", entry="gpu5_force", block_size=256,
        tunables={"block_size": BLOCK_SIZES},
        origin="the brute-force optimisation write-ups' starting kernel (separate force and move kernels)"),
    KernelRecord(
        name="shared-unroll",
        doc="shared tiles with the tile loop unrolled 2x by hand (two accumulators) plus #pragma unroll",
        backend="cuda", precision="fp32", source="shared_unroll.cu", entry="shared_unroll_force",
        block_size=256, tunables={"block_size": BLOCK_SIZES},
        origin="GPU Gems 3 ch. 31 §31.4 loop unrolling; the brute-force optimisation write-ups"),
    KernelRecord(
        name="shared-ptx-fma",
        doc="shared tiles with the distance chain as inline PTX sub.rn.f32 / fma.rn.f32",
        backend="cuda", precision="fp32", source="shared_ptx_fma.cu", entry="shared_ptx_force",
        block_size=256, tunables={"block_size": BLOCK_SIZES},
        origin="the brute-force optimisation write-ups (hand-written FMA); PTX ISA fma.rn.f32"),
    KernelRecord(
        name="block-template",
        doc="compile-time block size (64...1024): static tile, __launch_bounds__, exact trip count",
        backend="cuda", precision="fp32", source="block_template.cu", entry="block_template_force",
        block_size=256, tunables={"block_size": BLOCK_SIZES},
        origin="CUDA samples tiling example (template<int BLOCKSIZE>); CUDA Handbook ch. 14"),
    KernelRecord(
        name="warp-shuffle",
        doc="tile broadcast through __shfl_sync (4 SHFL per source body) instead of shared memory",
        backend="cuda", precision="fp32", source="warp_shuffle.cu", entry="warp_shuffle_force",
        block_size=256, tunables={"block_size": BLOCK_SIZES},
        origin="CUDA Handbook ch. 14 (N-body with warp shuffle); Kepler shuffle write-ups"),
    KernelRecord(
        name="multi-thread-per-body",
        doc="q threads share one body's j-range and reduce with __shfl_xor_sync (fills the GPU at small N)",
        backend="cuda", precision="fp32", source="multi_thread.cu", entry="multi_thread_force",
        block_size=256, tunables={"block_size": BLOCK_SIZES, "q": (2, 4, 8, 16, 32)},
        origin="GPU Gems 3 ch. 31 §31.4 (several threads per body for small N)"),
    KernelRecord(
        name="register-blocked",
        doc="K bodies per thread in mass-scaled coordinates (11 FP32 + 1 MUFU), j split across blocks",
        backend="cuda", precision="fp32", source="register_blocked.cu", entry="register_blocked_force",
        block_size=128, tunables={"block_size": SMALL_BLOCKS, "k": (1, 2, 4, 6), "slices": SLICES},
        origin="register blocking (Volkov & Demmel 2008) applied to GPU Gems 3 ch. 31; NBody Live"),
    KernelRecord(
        name="atomics-n3l",
        doc="Newton's third law: each pair once, reactions rotated by __shfl_sync and added by atomics",
        backend="cuda", precision="fp32", source="atomics_n3l.cu", entry="atomics_n3l_force",
        block_size=128, tunables={"block_size": (64, 128), "ki": (2, 4), "chunk": CHUNKS},
        origin="the symmetric-force trick of the brute-force write-ups; CUDA Handbook ch. 14 atomics"),
    KernelRecord(
        name="streams-remainder",
        doc="check-free tiled kernel on floor(N/B)*B bodies plus a remainder kernel on a second stream",
        backend="cuda", precision="fp32", source="streams_remainder.cu", entry="streams_remainder_force",
        block_size=256, tunables={"block_size": BLOCK_SIZES},
        origin="the brute-force optimisation write-ups (remainder handling with CUDA streams)"),
    KernelRecord(
        name="fp64",
        doc="double-precision force and integrators (double state; float32 copies for the renderer)",
        backend="cuda", precision="fp64", source="fp64.cu", entry="fp64_force", block_size=128,
        tunables={"block_size": BLOCK_SIZES},
        origin="GPU Gems 3 ch. 31 tiling in double precision (accuracy reference on the GPU)"),
    KernelRecord(
        name="pair-matrix",
        doc="tiled N x N |a_ij| interaction matrix for the heatmap (N <= 8,192); steps as tiled rows",
        backend="cuda", precision="fp32", source="pair_matrix.cu", entry="pair_matrix_force",
        block_size=256, tunables={"block_size": BLOCK_SIZES}, max_n=8192,
        origin="GPU Gems 3 ch. 31 fig. 31-1 (the N x N grid of pair interactions)"),
    KernelRecord(
        name=BEST,
        doc="the fastest variant and tunables for this N and GPU from `nbody-live tune`'s cache",
        backend="cuda", precision="fp32", source="register_blocked.cu", entry="register_blocked_force",
        block_size=128, tunables={},
        origin="NBody Live autotuner (per GPU name, driver and kernel-source hash)"),
)
BY_NAME = {rec.name: rec for rec in RECORDS}


@dataclass(frozen=True)
class LaunchPolicy:
    """How a force record is launched (app/backends/cuda/launch.py implements each kind).

    kind: "grid" (one thread per body, ceil(N / block) blocks), "block-template", "multi-thread",
    "register-blocked", "n3l", "streams", "fp64", or "best" (resolved to another record at load).
    shared_bytes_per_thread: dynamic shared memory per thread. arg_types: pycuda's prepare() string
    of the force entries. defaults: tunables other than block_size (the record's field).
    """

    shared_bytes_per_thread: int = 0
    kind: str = "grid"
    arg_types: str = "PPifff"
    defaults: Mapping[str, int] = field(default_factory=dict)


# Per-source launch needs (the record fields cover the rest).
LAUNCH = {
    "naive.cu": LaunchPolicy(shared_bytes_per_thread=0),
    "shared.cu": LaunchPolicy(shared_bytes_per_thread=16),  # one float4 per thread: the tile
    "gpu5.cu": LaunchPolicy(),
    "shared_unroll.cu": LaunchPolicy(shared_bytes_per_thread=16),
    "shared_ptx_fma.cu": LaunchPolicy(shared_bytes_per_thread=16),
    "warp_shuffle.cu": LaunchPolicy(),
    "pair_matrix.cu": LaunchPolicy(shared_bytes_per_thread=16),
    "block_template.cu": LaunchPolicy(kind="block-template"),  # static tile[BS]
    "multi_thread.cu": LaunchPolicy(shared_bytes_per_thread=16, kind="multi-thread", defaults={"q": 4}),
    "register_blocked.cu": LaunchPolicy(kind="register-blocked", arg_types="PPifffPi",
                                        defaults={"k": 4, "slices": 0}),
    "atomics_n3l.cu": LaunchPolicy(kind="n3l", arg_types="PPifffii", defaults={"ki": 4, "chunk": 0}),
    "streams_remainder.cu": LaunchPolicy(shared_bytes_per_thread=16, kind="streams"),
    "fp64.cu": LaunchPolicy(shared_bytes_per_thread=32, kind="fp64", arg_types="PPidddP"),
}
POLICY_BY_NAME = {BEST: LaunchPolicy(kind="best", arg_types="PPifffPi", defaults={"k": 4, "slices": 0})}
PAIR_MATRIX_SOURCE = "pair_matrix.cu"
PAIR_MATRIX_MAX_N = 8192


def force_symbol(record: KernelRecord, repulsion: bool, soft: bool) -> str:
    return f"{record.entry}_{'repulsion' if repulsion else 'gravity'}_{'soft' if soft else 'plain'}"


def force_symbols(record: KernelRecord) -> list[str]:
    return [force_symbol(record, r, s) for r in (False, True) for s in (True, False)]


def launch_policy(record: KernelRecord) -> LaunchPolicy:
    if record.name in POLICY_BY_NAME:
        return POLICY_BY_NAME[record.name]
    return LAUNCH.get(record.source or "", LaunchPolicy())


def _suffix(repulsion: bool, soft: bool) -> str:
    return f"{'repulsion' if repulsion else 'gravity'}_{'soft' if soft else 'plain'}"


def launch_symbol(record: KernelRecord, repulsion: bool, soft: bool, tunables: Mapping[str, int]) -> str:
    """The compiled specialisation a launch with these tunables uses (force_symbol for plain kinds)."""
    kind = launch_policy(record).kind
    suffix = _suffix(repulsion, soft)
    if kind == "block-template":
        return f"block_template_b{tunables['block_size']}_{suffix}"
    if kind == "multi-thread":
        return f"multi_thread_q{tunables['q']}_{suffix}"
    if kind == "register-blocked":
        return f"regblock_k{tunables['k']}_b{tunables['block_size']}_{suffix}"
    if kind == "n3l":
        return f"n3l_ki{tunables['ki']}_{suffix}"
    return force_symbol(record, repulsion, soft)


def specialised_symbols(record: KernelRecord) -> list[str]:
    """Every symbol launch_symbol can return for this record's allowed tunables (for compile tests)."""
    out = set(force_symbols(record))
    kind = launch_policy(record).kind
    values = dict(record.tunables)
    for r in (False, True):
        for soft in (True, False):
            if kind == "block-template":
                out |= {launch_symbol(record, r, soft, {"block_size": b}) for b in values["block_size"]}
            elif kind == "multi-thread":
                out |= {launch_symbol(record, r, soft, {"q": q}) for q in values["q"]}
            elif kind == "register-blocked":
                out |= {launch_symbol(record, r, soft, {"k": k, "block_size": b})
                        for k in values["k"] for b in values["block_size"]}
            elif kind == "n3l":
                out |= {launch_symbol(record, r, soft, {"ki": ki}) for ki in values["ki"]}
            elif kind == "streams":
                out.add(f"streams_remainder_tail_{_suffix(r, soft)}")
    return sorted(out)


def default_tunables(record: KernelRecord) -> dict[str, int]:
    """The record's own launch settings: block_size from the record, the rest from its policy."""
    out = dict(launch_policy(record).defaults)
    if record.block_size:
        out["block_size"] = record.block_size
    return out
