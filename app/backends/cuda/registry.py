"""The CUDA kernel records: one per force variant, each its own descriptor (app.engine.forces.KernelRecord).

A record names its source in kernels/, its entry-symbol prefix, its typed tunables and its launch
policy (policies.py), which knows the entry names, the launch geometry, the nvcc options and what
`tune` sweeps. Every variant file defines `<entry>_<model>_<self-term>` through NBODY_FORCE_ENTRIES in
kernels/common.cuh, with model in {gravity, repulsion} and self-term in {soft (ε² > 0, branch-free),
plain (ε = 0, skips s² = 0)}. All fp32 variants share the integrate kernels of `INTEGRATE_SOURCE`.

To add a variant: write kernels/<name>.cu (include "common.cuh", end with NBODY_FORCE_ENTRIES) and add
one record here with an existing policy (GridPolicy for one thread per target). The tests, the panel,
`bench --kernels all` and `tune` walk this table; docs/architecture.md shows a worked example.
"""

from __future__ import annotations

from app.backends.cpu_tree import OPENING_TUNABLES, THETA
from app.backends.cuda.policies import (
    SMALL_BLOCKS,
    BestPolicy,
    BlockTemplatePolicy,
    Fp64Policy,
    GridPolicy,
    MultiThreadPolicy,
    N3LPolicy,
    RegisterBlockedPolicy,
    StreamsPolicy,
    block_size,
)
from app.backends.cuda.tree import WALK_SOURCE, TreePolicy
from app.core.values import IntChoice
from app.engine.forces import TREE_WALK_FLOPS, ErrorBudget, KernelRecord, with_role
from app.engine.refit_cadence import REFIT_TUNABLES
from app.parallel.decomposition import DOMAINS, PAIRS

INTEGRATE_SOURCE = "integrate.cu"
BEST = "best"
# What `best` runs on a GPU with neither a tuning cache nor a family in kernels/best_heuristic.json:
# atomics-n3l at its defaults (chunk from N and the SM count). Accurate at every N (each pair once, partial
# sums: 5.8e-6 at N = 1 Mi where register-blocked's long slices reach 2.4e-3 on a skewed scene), and the
# fastest variant from N = 16k up in every H200 tune; at 4k it trails register-blocked by ~20% (0.03 ms).
SAFE_PICK = "atomics-n3l"
PAIR_MATRIX_SOURCE = "pair_matrix.cu"
PAIR_MATRIX_MAX_N = 8192
TILE = 16  # dynamic shared memory per thread of the tiled variants: one float4 of the tile

# `shared` is the baseline that reproduces NVIDIA's CUDA samples nbody kernel, and the samples build it
# without --use_fast_math: its rsqrtf keeps IEEE denormal handling (an FSETP and two predicated FMULs
# around MUFU.RSQ), part of what separates the sample from the 12-instruction budget.
SAMPLES_NVCC_OPTIONS = ("-O3", "-std=c++17", "-lineinfo")
# register-blocked: 0 = choose the number of source slices from N and the SM count (auto_slices).
SLICES = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
# atomics-n3l: j-tiles per warp task; 0 = choose from N and the SM count (auto_chunk).
CHUNKS = (0, 1, 2, 4, 8, 16, 32, 64)


def _record(
    name: str, doc: str, source: str, entry: str, policy, origin: str, tunables=None, **fields
) -> KernelRecord:
    """A CUDA record; tunables default to the block size alone (64...1024, default 256)."""
    tunables = (block_size(),) if tunables is None else tunables
    return KernelRecord(
        name=name,
        doc=doc,
        backend="cuda",
        source=source,
        entry=entry,
        tunables=tunables,
        origin=origin,
        policy=policy,
        **fields,
    )


RECORDS: tuple[KernelRecord, ...] = (
    _record(
        "naive",
        "one thread per body, every source body read from global memory (float4 __ldg)",
        "naive.cu",
        "naive_force",
        GridPolicy(),
        "textbook all-pairs loop (the floor every tiled variant is measured against)",
        tune_rank=10,
        partial_sums=True,
    ),
    _record(
        "shared",
        "GPU Gems 3 tiled kernel: blockDim-sized float4 tiles in shared memory, one thread per body",
        "shared.cu",
        "shared_force",
        GridPolicy(TILE, nvcc_options=SAMPLES_NVCC_OPTIONS),
        "GPU Gems 3 ch. 31 (Nyland, Harris & Prins 2007); NVIDIA CUDA samples nbody",
        tune_rank=4,
        roles=frozenset({"exact", "baseline"}),
        partial_sums=True,
    ),
    _record(
        "gpu5-branchy",
        "textbook first port: sqrtf and divides, a per-pair branch skipping self, global loads",
        "gpu5.cu",
        "gpu5_force",
        GridPolicy(),
        "the brute-force optimisation write-ups' starting kernel (separate force and move kernels)",
        tune_rank=9,
        partial_sums=True,
    ),
    _record(
        "shared-unroll",
        "shared tiles with the tile loop unrolled 2x by hand (two accumulators) plus #pragma unroll",
        "shared_unroll.cu",
        "shared_unroll_force",
        GridPolicy(TILE),
        "GPU Gems 3 ch. 31 §31.4 loop unrolling; the brute-force optimisation write-ups",
        tune_rank=3,
        partial_sums=True,
    ),
    _record(
        "shared-ptx-fma",
        "shared tiles with the distance chain as inline PTX sub.rn.f32 / fma.rn.f32",
        "shared_ptx_fma.cu",
        "shared_ptx_force",
        GridPolicy(TILE),
        "the brute-force optimisation write-ups (hand-written FMA); PTX ISA fma.rn.f32",
        tune_rank=5,
        partial_sums=True,
    ),
    _record(
        "block-template",
        "compile-time block size (64...1024): static tile, __launch_bounds__, exact trip count",
        "block_template.cu",
        "block_template_force",
        BlockTemplatePolicy(),
        "CUDA samples tiling example (template<int BLOCKSIZE>); CUDA Handbook ch. 14",
        tune_rank=2,
        partial_sums=True,
    ),
    _record(
        "warp-shuffle",
        "tile broadcast through __shfl_sync (4 SHFL per source body) instead of shared memory",
        "warp_shuffle.cu",
        "warp_shuffle_force",
        GridPolicy(),
        "CUDA Handbook ch. 14 (N-body with warp shuffle); Kepler shuffle write-ups",
        tune_rank=8,
        partial_sums=True,
    ),
    _record(
        "multi-thread-per-body",
        "q threads share one body's j-range and reduce with __shfl_xor_sync (fills the GPU at small N)",
        "multi_thread.cu",
        "multi_thread_force",
        MultiThreadPolicy(TILE),
        "GPU Gems 3 ch. 31 §31.4 (several threads per body for small N)",
        tunables=(block_size(), IntChoice("q", (2, 4, 8, 16, 32), 4, "threads per body")),
        tune_rank=6,
        partial_sums=True,
    ),
    _record(
        "register-blocked",
        "K bodies per thread in mass-scaled coordinates (11 FP32 + 1 MUFU), j split across blocks",
        "register_blocked.cu",
        "register_blocked_force",
        RegisterBlockedPolicy(),
        "register blocking (Volkov & Demmel 2008) applied to GPU Gems 3 ch. 31; NBody Live",
        tunables=(
            block_size(SMALL_BLOCKS, 128),
            IntChoice("k", (1, 2, 4, 6), 4, "bodies per thread"),
            IntChoice("slices", SLICES, 0, "source slices (0: from N and the SM count)"),
        ),
        tune_rank=0,
    ),
    _record(
        "atomics-n3l",
        "Newton's third law: each pair once, reactions rotated by __shfl_sync and added by atomics",
        "atomics_n3l.cu",
        "atomics_n3l_force",
        N3LPolicy(),
        "the symmetric-force trick of the brute-force write-ups; CUDA Handbook ch. 14 atomics",
        tunables=(
            block_size((64, 128), 128),
            IntChoice("ki", (2, 4), 4, "32-body rows per warp task"),
            IntChoice("chunk", CHUNKS, 0, "j-tiles per warp task (0: from N and the SM count)"),
        ),
        decomposition=PAIRS,
        tune_rank=1,
    ),
    _record(
        "streams-remainder",
        "check-free tiled kernel on floor(N/B)*B bodies plus a remainder kernel on a second stream",
        "streams_remainder.cu",
        "streams_remainder_force",
        StreamsPolicy(TILE),
        "the brute-force optimisation write-ups (remainder handling with CUDA streams)",
        tune_rank=7,
        partial_sums=True,
    ),
    _record(
        "fp64",
        "double-precision force and integrators (double state; float32 copies for the renderer)",
        "fp64.cu",
        "fp64_force",
        Fp64Policy(32),
        "GPU Gems 3 ch. 31 tiling in double precision (accuracy reference on the GPU)",
        tunables=(block_size(default=128),),
        precision="fp64",
        tuned=False,
        roles=frozenset({"reference"}),
    ),
    _record(
        "pair-matrix",
        "tiled N x N |a_ij| interaction matrix for the heatmap (N <= 8,192); steps as tiled rows",
        "pair_matrix.cu",
        "pair_matrix_force",
        GridPolicy(TILE),
        "GPU Gems 3 ch. 31 fig. 31-1 (the N x N grid of pair interactions)",
        max_n=PAIR_MATRIX_MAX_N,
        tuned=False,
        partial_sums=True,
    ),
    _record(
        BEST,
        "the fastest variant and tunables for this N and GPU: `nbody-live tune`'s cache, else the "
        "committed measured picks for the GPU family",
        "register_blocked.cu",
        "register_blocked_force",
        BestPolicy(SAFE_PICK),
        "NBody Live autotuner (per GPU name, driver and kernel-source hash) and kernels/best_heuristic.json",
        tunables=(),
        tuned=False,
        roles=frozenset({"default"}),
    ),
    _record(
        "tree",
        "Barnes-Hut octree built on the GPU and refitted between builds (by default a build once "
        "the refits stop paying, at least every rebuild_every steps; Morton keys, device sort, "
        "quadrupoles, a warp per group of targets); approximate: judged on its 99th-percentile error",
        WALK_SOURCE,
        "tree_walk",
        TreePolicy(),
        "Bonsai (Bedorf et al., arXiv:1106.1900) and Ryoanji (Keller et al., arXiv:2307.06345); docs/tree.md",
        tunables=(
            THETA,
            IntChoice("leaf", (8, 16, 32, 64), 16, doc="a cell with at most this many bodies is a leaf"),
            IntChoice(
                "group",
                (32, 64, 128),
                64,
                doc="targets walked together by one warp (consecutive in key order)",
            ),
            *REFIT_TUNABLES,
            *OPENING_TUNABLES,
        ),
        budget=ErrorBudget(max_rel=5e-3, p99_rel=1e-3),
        tuned=False,
        approximate=True,
        decomposition=DOMAINS,
        period_tunable="rebuild_every",
        walk_flops=TREE_WALK_FLOPS,
        roles=frozenset({"block-steps"}),
    ),
)
DEFAULT_KERNEL = with_role(RECORDS, "default").name  # `best`: the tuned or measured pick for this GPU and N
