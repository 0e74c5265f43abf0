"""Launch policies: how one CUDA force record is named, compiled, launched and tuned.

A record's `policy` is one of these objects (app/backends/cuda/registry.py); the evaluator
(evaluator.py) asks it for a `plan`: a closure that launches the force for fixed tunables, physics
and span sizes, `run(targets_ptr, sources_ptr, acc_ptr, stream)`. All the Python (symbols, grid
geometry, task counts) happens when the plan is built, once per configuration, so that between the
two CUDA events of a timed force evaluation only driver calls remain (at N = 4,096 a launch runs for
~20 µs: a few hundred µs of Python there would be timed as GPU time).

The base, `GridPolicy` (one thread per target), and the kernels' argument conventions are policy_base.py;
here are its variants (a compile-time block, several threads per target, two streams, register blocking,
double precision); atomics-n3l's is n3l_policy.py, `best`'s (which runs another record) best_policy.py,
the tree's tree.py. This module names them all. Adding a variant: one .cu file plus one record whose
policy is one of these (or a new subclass when its launch is new).
"""

from __future__ import annotations

import logging
import math

from app.backends.cuda.best_policy import BestPolicy
from app.backends.cuda.n3l_policy import N3LPolicy, auto_chunk, n3l_geometry, n3l_tasks
from app.backends.cuda.policy_base import (
    BLOCK_SIZES,
    FLT_MIN,
    FORMS,
    SMALL_BLOCKS,
    SOFT_EPS2_MIN,
    GridPolicy,
    Run,
    block_size,
    ceil_div,
    force_arguments,
    launch,
    suffix,
    sweep,
)

__all__ = [  # the policies and their helpers, wherever each is written (the registry's and tests' path)
    "BLOCK_SIZES",
    "FLT_MIN",
    "FORMS",
    "MAX_SCRATCH_BYTES",
    "REDUCE_BLOCK",
    "REGBLOCK_REDUCE",
    "SMALL_BLOCKS",
    "SOFT_EPS2_MIN",
    "BestPolicy",
    "BlockTemplatePolicy",
    "Fp64Policy",
    "GridPolicy",
    "MultiThreadPolicy",
    "N3LPolicy",
    "RegisterBlockedPolicy",
    "Run",
    "StreamsPolicy",
    "auto_chunk",
    "auto_slices",
    "block_size",
    "ceil_div",
    "force_arguments",
    "launch",
    "n3l_geometry",
    "n3l_tasks",
    "slice_plan",
    "suffix",
]

log = logging.getLogger(__name__)

MAX_SCRATCH_BYTES = 512 * 2**20
REDUCE_BLOCK = 256


class BlockTemplatePolicy(GridPolicy):
    """A compile-time block size: symbol block_template_b<B>_<form>."""

    def symbol(self, rec, repulsion, soft, tun):
        return f"block_template_b{tun['block_size']}_{suffix(repulsion, soft)}"

    def symbol_tunables(self, rec):
        return [{"block_size": b} for b in rec.tunable("block_size").values]


class MultiThreadPolicy(GridPolicy):
    """q threads per target share its source range and reduce by shuffles: ceil(ni q / B) blocks."""

    def symbol(self, rec, repulsion, soft, tun):
        return f"multi_thread_q{tun['q']}_{suffix(repulsion, soft)}"

    def symbol_tunables(self, rec):
        return [{"q": q} for q in rec.tunable("q").values]

    def plan(self, dev, rec, tun, args, ni, nj):
        repulsion, soft, eps2, g, h = args
        fn = self.function(dev, rec, repulsion, soft, tun)
        block = int(tun["block_size"])
        grid, shared = (ceil_div(ni * int(tun["q"]), block), 1), self.shared_bytes_per_thread * block

        def run(t, s, a, stream=None):
            launch(fn, grid, block, stream, t, s, a, ni, nj, eps2, g, h, shared=shared)

        return run

    def candidates(self, rec, n, sms):
        return sweep(rec, [{"q": q, "block_size": b} for q in (2, 8, 16, 32, 4) for b in (256, 128, 512)])


class StreamsPolicy(GridPolicy):
    """The check-free tiled kernel on floor(ni / B) B targets on one stream, the remainder kernel on a
    second stream, concurrently (both blocking streams: ordered with the default stream)."""

    def helpers(self, rec, repulsion, soft, tun):
        return [(f"streams_remainder_tail_{suffix(repulsion, soft)}", self.arg_types)]

    def plan(self, dev, rec, tun, args, ni, nj):
        repulsion, soft, eps2, g, h = args
        fn = self.function(dev, rec, repulsion, soft, tun)
        tail = dev.function(rec.source, *self.helpers(rec, repulsion, soft, tun)[0], self.nvcc_options)
        block = int(tun["block_size"])
        s1, s2 = dev.stream("streams-main"), dev.stream("streams-tail")
        nfull, shared = (ni // block) * block, self.shared_bytes_per_thread * block

        def run(t, s, a, stream=None):
            if nfull:
                launch(fn, (nfull // block, 1), block, s1, t, s, a, ni, nj, eps2, g, h, shared=shared)
            if ni > nfull:
                launch(tail, (1, 1), block, s2, t, s, a, ni, nj, eps2, g, h, shared=shared)

        return run


# --- register blocking --------------------------------------------------------------------------------
def slice_plan(n: int, block: int, slices: int) -> tuple[int, int]:
    """(slice_len, slices actually used): slice_len is a multiple of `block` covering n in `slices`."""
    slices = max(1, min(int(slices), ceil_div(max(n, 1), block)))
    slice_len = ceil_div(ceil_div(max(n, 1), slices), block) * block
    return slice_len, ceil_div(max(n, 1), slice_len)


def auto_slices(ni: int, nj: int, block: int, k: int, sms: int, warps_per_sm: int = 16) -> int:
    """How many source slices register-blocked needs so that every SM has enough warps and equal work.

    Scores each distinct slice count by (blocks per SM / its ceiling: the balance of the last wave) x
    (resident warps per SM / warps_per_sm, capped at 1), with a small preference for fewer slices
    (less partial-sum traffic); at large N this is 1.
    """
    body_blocks = ceil_div(max(ni, 1), block * k)
    best, best_score = 1, -1.0
    seen = set()
    for s in range(1, 129):
        _slice_len, used = slice_plan(nj, block, s)
        if used in seen:
            continue
        seen.add(used)
        per_sm = body_blocks * used / max(sms, 1)
        balance = per_sm / math.ceil(per_sm)
        occupancy = min(1.0, per_sm * (block // 32) / warps_per_sm)
        score = balance * occupancy / (1.0 + 0.003 * used)
        if score > best_score + 1e-9:
            best, best_score = used, score
    return best


REGBLOCK_REDUCE = ("regblock_reduce", "PPiiif")  # (partial, acc, ni, npad, slices, scale)


class RegisterBlockedPolicy(GridPolicy):
    """K targets per thread; a 2-D grid of (target tiles of B K) x (source slices); with more than one
    slice a second kernel (regblock_reduce) adds the partial sums from a scratch buffer."""

    arg_types = "PPPiifffPi"

    def symbol(self, rec, repulsion, soft, tun):
        return f"regblock_k{tun['k']}_b{tun['block_size']}_{suffix(repulsion, soft)}"

    def helpers(self, rec, repulsion, soft, tun):
        return [REGBLOCK_REDUCE]

    def symbol_tunables(self, rec):
        return [
            {"k": k, "block_size": b}
            for k in rec.tunable("k").values
            for b in rec.tunable("block_size").values
        ]

    def plan(self, dev, rec, tun, args, ni, nj):
        repulsion, soft, eps2, g, h = args
        fn = self.function(dev, rec, repulsion, soft, tun)
        block, k = int(tun["block_size"]), int(tun["k"])
        slices = int(tun.get("slices", 0)) or auto_slices(ni, nj, block, k, dev.facts.sms)
        body_blocks = ceil_div(ni, block * k)
        npad = body_blocks * block * k
        while slices > 1 and slices * npad * 16 > MAX_SCRATCH_BYTES:
            slices //= 2
        slice_len, slices = slice_plan(nj, block, slices)
        if slices == 1:

            def run_one_slice(t, s, a, stream=None):
                launch(fn, (body_blocks, 1), block, stream, t, s, a, ni, nj, eps2, g, h, 0, slice_len)

            return run_one_slice
        red = dev.function(rec.source, *REGBLOCK_REDUCE, self.nvcc_options)
        nbytes, scale, rgrid = slices * npad * 16, 1.0 if repulsion else g, ceil_div(ni, REDUCE_BLOCK)

        def run(t, s, a, stream=None):
            partial = dev.scratch("regblock-partial", nbytes)  # looked up per launch: it may have grown
            launch(fn, (body_blocks, slices), block, stream, t, s, a, ni, nj, eps2, g, h, partial, slice_len)
            launch(red, (rgrid, 1), REDUCE_BLOCK, stream, partial, a, ni, npad, slices, scale)

        return run

    def candidates(self, rec, n, sms):
        allowed = rec.tunable("slices").values
        changes = []
        for k, b in ((6, 128), (4, 64), (6, 64), (2, 64), (4, 256), (2, 128), (6, 256), (1, 64), (4, 128)):
            auto = auto_slices(n, n, b, k, sms)
            others = (auto // 2, auto * 2, auto + auto // 2)
            near = {auto} | {slice_plan(n, b, s)[1] for s in others if s >= 1}
            changes += [
                {"k": k, "block_size": b, "slices": 0 if s == auto else s}
                for s in sorted(near)
                if (0 if s == auto else s) in allowed
            ]
        return sweep(rec, changes)


# --- double precision --------------------------------------------------------------------------------------
class Fp64Policy(GridPolicy):
    """Double state: positions are dvec4 rows (32 bytes) and the accelerations land in a double buffer
    (the evaluator's `acc`); the kernel's float copy of them goes to scratch, nothing reads it."""

    arg_types = "PPPiidddP"
    row_bytes = 32

    def plan(self, dev, rec, tun, args, ni, nj):
        repulsion, soft, eps2, g, h = args
        fn = self.function(dev, rec, repulsion, soft, tun)
        block = dev.max_block(fn, int(tun["block_size"]))
        grid, shared = (ceil_div(ni, block), 1), self.shared_bytes_per_thread * block

        def run(t, s, a, stream=None):
            acc32 = dev.scratch("fp64-acc32", 16 * ni)
            launch(fn, grid, block, stream, t, s, acc32, ni, nj, eps2, g, h, a, shared=shared)

        return run
