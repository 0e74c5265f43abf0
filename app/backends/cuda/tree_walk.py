"""The third layer of the GPU tree's evaluator (tree.py): the walk. A warp per group of targets walks the
tree's rows (kernels/tree/walk.cu), re-run with deeper stacks when a group's overflowed; then the
evaluation's stage times and work (`_finish`), and the last walk's groups (`last_groups`)."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from app.backends.cuda.policies import launch
from app.backends.cuda.tree_build import TreeBuild
from app.backends.cuda.tree_kernels import GROUP_LISTS, WALK_ARGS, WALK_BLOCKS_PER_SM, WALK_SOURCE, WALK_WARPS
from app.core.errors import RuntimeFault
from app.engine.forces import STAGES, ForceWork

log = logging.getLogger(__name__)


class TreeWalk(TreeBuild):
    """The tree evaluator's walk of the built (or refitted) tree."""

    _stack_cap: int  # cells per warp's stack (STACK_CAP, doubled when a group overflows it)
    ngroups: int  # the groups of the last build
    _stream: Any  # the stream of the evaluation under way (`_finish` records its last event there)
    _stage_totals: dict[str, float]  # ms per stage since the last stage_ms()

    def _walk(self, repulsion: bool, soft: bool, group: int | None = None):
        group = int(self._tunables["group"]) if group is None else group
        symbol = self.record.policy.walk_symbol(group, repulsion, soft)
        return self.device.function(WALK_SOURCE, symbol, WALK_ARGS, None)

    def _walk_all(
        self,
        on,
        group,
        gstart,
        targets,
        sources,
        spos: int,
        sorder: int,
        links,
        mac,
        rel,
        pack,
        out,
        stream,
        groups: tuple[int, int],
        sorted_out: bool = False,
        prev=(0, 0),
        mask: int = 0,
    ):
        """Launch the walk over the groups [groups[0], groups[1]) of the sorted bodies at `spos` (their
        rows: `sorder`); re-run it with deeper stacks if one overflowed (a generator of phases, as
        `_phases`). `prev` (pointer, by_order): the members' last accelerations for the relative test, at
        their place k (by_order 0: a refit's rows, in its key order) or at their source row sorder[k] (1);
        pointer 0: none. Returns (interactions, body-cell interactions)."""
        repulsion, soft, eps2, g, h = self._args
        prev_ptr, prev_by_order = prev
        rel_scale = self._relative_scale(g, sources.count) if prev_ptr else 0.0
        fn = self._walk(repulsion, soft, group)
        ngroups = self.ngroups
        g_lo, g_hi = groups
        blocks = self._walk_blocks(g_lo, g_hi)
        t_lo = int(targets.start - sources.start)
        while True:
            with on():
                per_group, flags, totals, stacks = self._walk_buffers(ngroups, blocks, stream)
                args = (
                    spos,
                    sorder,
                    gstart.data.ptr,
                    t_lo,
                    t_lo + int(targets.count),
                    links.data.ptr,
                    mac.data.ptr,
                    pack.data.ptr,
                    out,
                    eps2,
                    g,
                    h,
                    g_hi,
                    stacks.data.ptr,
                    self._stack_cap,
                    flags.data.ptr,
                    per_group["nbody"].data.ptr,
                    per_group["ncell"].data.ptr,
                    per_group["nactive"].data.ptr,
                    totals.data.ptr,
                    g_lo,
                    int(sorted_out),
                    rel.data.ptr,
                    prev_ptr,
                    int(prev_by_order),
                    float(rel_scale),
                    int(mask),
                )
                launch(fn, (blocks, 1), 32 * WALK_WARPS, stream, *args)
                queued = self._queued(stream)
            yield queued
            with on():
                queued.wait()
                overflow = int(flags[1])
                if not overflow:
                    t = totals[:2].get()
                    self._evaluated = True  # the rows written are this evaluator's: the next walk may read
                    return int(t[0]), int(t[1])
            self._grow_stack()

    def _walk_blocks(self, g_lo: int, g_hi: int) -> int:
        """The walk's blocks for the groups [g_lo, g_hi): WALK_WARPS warps each, a warp per group, at most
        WALK_BLOCKS_PER_SM blocks per SM."""
        return max(
            1,
            min(
                (g_hi - g_lo + WALK_WARPS - 1) // WALK_WARPS, WALK_BLOCKS_PER_SM * int(self.device.facts.sms)
            ),
        )

    def _walk_buffers(self, ngroups: int, blocks: int, stream):
        """The walk's outputs and stacks: per group the list lengths (GROUP_LISTS), the flags (an overflow),
        the totals (interactions, body-cell interactions), a stack per warp; flags and totals cleared."""
        per_group = {k: self._buf(f"group-{k}", ngroups, np.int32) for k in GROUP_LISTS}
        flags = self._buf("flags", 2, np.int32)
        totals = self._buf("totals", 2, np.uint64)
        stacks = self._buf("stacks", blocks * WALK_WARPS * self._stack_cap, np.int32)
        self._set32(flags.data.ptr, 0, 2, stream)
        self._set32(totals.data.ptr, 0, 4, stream)  # two uint64
        return per_group, flags, totals, stacks

    def _grow_stack(self) -> None:
        """After a group's stack overflowed: stacks twice as deep for the walk's re-run, up to a limit."""
        if self._stack_cap >= 1 << 20:
            raise RuntimeFault(
                f"{self.record.name}: the walk's stack overflowed at {self._stack_cap} "
                "cells per group; this tree is deeper than any the walk is made for"
            )
        self._stack_cap *= 2
        log.warning(
            "tree: a group's walk overflowed its stack; re-running with %d cells per warp",
            self._stack_cap,
        )

    def _finish(self, on, work: tuple[int, int], pairs: int) -> ForceWork:
        """After the walk: the stage times of this evaluation added up, and its work."""
        events = self._events
        assert events is not None  # made by _phases before any walk
        with on():
            events[5].record(self._stream)
            events[5].synchronize()
            for k, name in enumerate(STAGES):
                self._stage_totals[name] += events[k + 1].time_since(events[k])
        return ForceWork(interactions=work[0], pair_equivalent=pairs, body_cell=work[1], evaluations=1)

    def last_groups(self) -> dict[str, np.ndarray]:
        """Of the last walk: the group starts (with the end) and per group the list lengths (nbody,
        ncell) and targets written (nactive)."""
        out = {k: self._buffers[f"group-{k}"][: self.ngroups].get() for k in GROUP_LISTS}
        out["start"] = self._buffers["group-start"][: self.ngroups + 1].get()
        return out
