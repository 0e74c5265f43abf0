"""The second layer of the GPU tree's evaluator (tree.py): the build. The sources' keys and CuPy's stable
device sort (`_sort`), the octree level by level with its groups and a domain split's cuts (`_build`),
the moments bottom up (`_moments`) and the rows the walk reads (`_pack`), and the mark a phase yields
before its host read (`Queued`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from app.backends.cpu_tree import GROUP_CELL_FACTOR, OPENINGS
from app.backends.cuda.policies import ceil_div, launch
from app.backends.cuda.tree_kernels import (
    BLOCK,
    BOUNDS_BLOCKS,
    BUILD_KERNELS,
    BUILD_OPTIONS,
    BUILD_SOURCE,
    CELL_FIELDS,
    CELL_LANES,
    CUTS_SLOT,
    EXTRA_LEVELS,
    LEVEL_BLOCKS_PER_SM,
    LEVEL_SLOTS,
    MAX_LEVEL,
    NGROUPS_SLOT,
    SPLIT_THREADS,
    SPLIT_TILE,
)
from app.backends.cuda.tree_memory import TreeMemory, cell_capacity, cupy_module


class TreeBuild(TreeMemory):
    """The tree evaluator's build: keys, sort, octree, groups, moments and the walk's rows."""

    _events: list | None  # the stage clock (CUDA events): made by the first evaluation (`_phases`)
    _settle_event: Any  # the event `_queued` records (made on its first use)
    _depth: int  # levels of the last build: how many the next one queues before looking
    _args: tuple[bool, bool, float, float, float]  # force_arguments of the physics

    def _fn(self, symbol: str):
        return self.device.function(BUILD_SOURCE, symbol, BUILD_KERNELS[symbol], BUILD_OPTIONS)

    def _set32(self, ptr: int, value: int, count: int, stream) -> None:
        """`count` 32-bit words at `ptr` set to `value`: one driver call (a CuPy fill is a kernel launch
        through CuPy, about four times the host time, and the build does several per evaluation)."""
        drv = self.device.drv
        if stream is None:
            drv.memset_d32_async(ptr, value, count)
        else:
            drv.memset_d32_async(ptr, value, count, stream)

    def _per_level(self, symbol: str, stream, *args, block: int = BLOCK) -> None:
        """A per-level kernel on its fixed grid: it reads its level's range from the device."""
        blocks = LEVEL_BLOCKS_PER_SM * max(int(self.device.facts.sms), 1)
        launch(self._fn(symbol), (blocks, 1), block, stream, *args)

    def _queued(self, stream) -> Queued:
        """A mark after the work queued so far on `stream`, yielded by a phase before its host read: the
        single driver tests it without waiting (`ready`), the phase then waits on it (`wait`)."""
        event = self._settle_event
        if event is None:
            event = self._settle_event = self.device.drv.Event()
        event.record(stream)
        return Queued(event, self.device.scope)

    def _sort(self, on, run, stream, events: list, src: int, nj: int):
        """The sources in key order (`_phases`): keys over their bounding cube, CuPy's stable device sort,
        and the bodies, keys and source rows gathered into that order: (spos, skeys, sorder). Stages: keys
        and sort, on `events`."""
        cp = cupy_module()
        with on():
            events[0].record(stream)
            # keys over the sources' bounding cube
            part = self._buf("part", 6 * BOUNDS_BLOCKS, np.float32)
            box = self._buf("box", 5, np.float64)  # lo, size and the keys' scale (tree_bounds_finish)
            launch(self._fn("tree_bounds_partial"), (BOUNDS_BLOCKS, 1), 256, stream, src, nj, part.data.ptr)
            launch(
                self._fn("tree_bounds_finish"), (1, 1), 1, stream, part.data.ptr, BOUNDS_BLOCKS, box.data.ptr
            )
            keys = self._buf("keys", nj, np.uint64)
            run("tree_keys", nj, src, nj, box.data.ptr, keys.data.ptr)
            events[1].record(stream)
            # the stable device sort (ties keep the source order, as the CPU's stable_key_order)
            order = cp.argsort(keys[:nj])
            events[2].record(stream)
            # bodies and keys in key order, then the octree level by level
            spos = self._buf("spos", 4 * nj, np.float32)
            skeys = self._buf("skeys", nj, np.uint64)
            sorder = self._buf("sorder", nj, np.int32)
            run(
                "tree_gather",
                nj,
                src,
                keys.data.ptr,
                order.data.ptr,
                nj,
                spos.data.ptr,
                skeys.data.ptr,
                sorder.data.ptr,
            )
            del order
        return spos, skeys, sorder

    def _build(self, on, run, stream, nj: int, leaf: int, group: int, skeys, cuts):
        """The octree over the nj sorted keys, breadth first, and its groups (a generator of phases, as
        `_phases`): returns level_start, the cell arrays and the host's copy of the "levels" buffer.

        Every level is queued without waiting for the previous one's size: the level ranges live in the
        device buffer "levels", and each level is one launch (tree_level_split: count, scan, write) that
        reads its range there. The host queues as many levels as the last build had plus EXTRA_LEVELS
        and, behind them, the groups (marks, CuPy's scan of them, starts) and a domain split's cuts,
        which read the number of cells and groups on the device too; then it looks once (usually), at
        everything. A deeper tree queues more levels and its groups again and looks again. A tree with
        more cells than the arrays hold (a deep, thin one) is built again in arrays twice as large.

        The "levels" buffer (int32): the level starts [0, LEVEL_SLOTS), the overflow flag (LEVEL_SLOTS),
        the scan's ticket per level, the number of groups (NGROUPS_SLOT), and from CUTS_SLOT a domain's
        cuts, the groups they fall at, and the aligned cuts (tree_domain_cuts)."""
        cap = cell_capacity(nj, leaf)
        ncuts = 0 if cuts is None else len(cuts)
        while True:
            cells, cap, lvl, edges, status = self._build_arrays(on, stream, nj, cap, cuts, ncuts)
            tickets = lvl.data.ptr + 4 * (LEVEL_SLOTS + 1)
            flag = lvl.data.ptr + 4 * LEVEL_SLOTS
            start, count, child, nchild = (cells[k].data.ptr for k in CELL_FIELDS)
            level, stop = 0, min(self._depth + EXTRA_LEVELS, MAX_LEVEL + 1)
            while True:
                with on():
                    for lv in range(level, stop):
                        self._per_level(
                            "tree_level_split",
                            stream,
                            lvl.data.ptr,
                            lv,
                            leaf,
                            skeys.data.ptr,
                            start,
                            count,
                            child,
                            nchild,
                            edges.data.ptr,
                            cap,
                            flag,
                            status.data.ptr,
                            tickets,
                            block=SPLIT_THREADS,
                        )
                    queued = self._queue_groups(
                        run, stream, nj, group, cap, lvl, stop, (start, count, child, nchild), cuts, ncuts
                    )
                yield queued
                with on():
                    queued.wait()
                    look = lvl[: CUTS_SLOT + 2 * ncuts].get()  # the host's one look at the build (usually)
                if look[LEVEL_SLOTS] or stop > MAX_LEVEL or look[stop + 1] == look[stop]:
                    break  # overflowed, or every level queued, or the level after the last queued is empty
                level, stop = stop, min(stop + EXTRA_LEVELS, MAX_LEVEL + 1)
            if not look[LEVEL_SLOTS]:
                levels = _levels(look[:LEVEL_SLOTS])
                self._depth = len(levels) - 1
                return levels, cells, look
            cap *= 2

    def _build_arrays(self, on, stream, nj: int, cap: int, cuts, ncuts: int):
        """`_build`'s arrays for `cap` cells (or as many more as they hold), the levels buffer cleared, the
        root set (cell 0: all nj bodies) and a domain's cuts written: (cells, cap, levels, edges, status)."""
        with on():
            cells = {k: self._buf(f"cell-{k}", cap, np.int32) for k in CELL_FIELDS}
            cap = min(int(c.size) for c in cells.values())  # what _buf holds (half again over the ask)
            lvl = self._buf("levels", CUTS_SLOT + 3 * ncuts, np.int32)
            edges = self._buf("edges", CELL_LANES * cap, np.int32)  # a level's octant starts, 8 per cell
            status = self._buf("scan-status", ceil_div(cap, SPLIT_TILE) + 1, np.uint64)  # a word per tile
            self._set32(lvl.data.ptr, 0, CUTS_SLOT, stream)
            self._set32(status.data.ptr, 0, 2 * status.size, stream)  # uint64 words
            self._set32(lvl.data.ptr + 4, 1, 1, stream)  # level 0: the root, cell 0
            self._set32(cells["start"].data.ptr, 0, 1, stream)
            self._set32(cells["count"].data.ptr, nj, 1, stream)
            if cuts is not None:
                lvl[CUTS_SLOT + 2 * ncuts : CUTS_SLOT + 3 * ncuts].set(np.asarray(cuts, dtype=np.int32))
        return cells, cap, lvl, edges, status

    def _queue_groups(
        self, run, stream, nj: int, group: int, cap: int, lvl, stop: int, cells, cuts, ncuts: int
    ):
        """`_build`'s groups behind the levels queued up to `stop` (marks, CuPy's scan of them, starts) and a
        domain split's cuts moved to group starts, all read on the device; returns the mark after them."""
        cp = cupy_module()
        start, count, child, nchild = cells
        assert self._events is not None  # made by _phases before its build
        # the groups, as if the tree ended here (it usually does): every cell is in
        # [0, lvl[stop + 1]) then (level stop is empty and so are those after it)
        mark = self._buf("group-mark", nj, np.int32)
        incl = self._buf("group-incl", nj, np.int32)
        gstart = self._buf("group-start", nj + 1, np.int32)
        self._set32(mark.data.ptr, 0, nj, stream)
        run(
            "tree_group_marks",
            cap,
            lvl.data.ptr + 4 * (stop + 1),
            GROUP_CELL_FACTOR * group,
            group,
            start,
            count,
            child,
            nchild,
            mark.data.ptr,
        )
        cp.cumsum(mark[:nj], dtype=np.int32, out=incl[:nj])
        ngroups_at = lvl.data.ptr + 4 * NGROUPS_SLOT
        run("tree_group_starts", nj, mark.data.ptr, incl.data.ptr, nj, gstart.data.ptr, ngroups_at)
        if cuts is not None:
            run(
                "tree_domain_cuts",
                ncuts,
                gstart.data.ptr,
                ngroups_at,
                lvl.data.ptr + 4 * (CUTS_SLOT + 2 * ncuts),
                ncuts,
                lvl.data.ptr + 4 * CUTS_SLOT,
            )
        self._events[3].record(stream)
        return self._queued(stream)

    def _moments(self, on, run, stream, events: list, levels: list[int], cells: dict, spos):
        """The moments of the built cells bottom up, then the rows the walk reads (`_pack`): (mac, rel, pack,
        links). Stage: moments, on `events`."""
        ncell = levels[-1]
        with on():
            # moments bottom up, then the rows the walk reads
            mass = self._buf("mass", ncell, np.float32)
            com = self._buf("com", 3 * ncell, np.float32)
            m2 = self._buf("m2", 6 * ncell, np.float32)
            bmax = self._buf("bmax", ncell, np.float32)
            lvl = self._buffers["levels"]
            cell_ptrs = [cells[k].data.ptr for k in CELL_FIELDS]
            for lv in range(len(levels) - 2, -1, -1):
                self._per_level(
                    "tree_moments",
                    stream,
                    lvl.data.ptr,
                    lv,
                    spos.data.ptr,
                    *cell_ptrs,
                    mass.data.ptr,
                    com.data.ptr,
                    m2.data.ptr,
                    bmax.data.ptr,
                )
            mac, rel, pack, links = self._pack(run, levels, cell_ptrs, 0)
            events[4].record(stream)
        return mac, rel, pack, links

    def _pack(self, run, levels: list[int], cell_ptrs: list[int], cubes: int):
        """tree_pack: the walk's rows of every cell (mac, rel, pack, links) from the moments; `cubes`: a
        refit's cube per cell (tree_refit), or 0 for the build's (from the key prefixes). rel (the relative
        test's rows) is written under opening = rel only."""
        repulsion, _soft, eps2, _g, _h = self._args
        ncell = levels[-1]
        mac = self._buf("mac", 4 * ncell, np.float32)  # float4 per cell: com, r_open^2
        rel = self._buf("rel", 2 * ncell, np.float32)  # float2 per cell: M b_max^3, guard^2
        pack = self._buf("pack", 12 * ncell, np.float32)
        links = self._buf("links", 4 * ncell, np.int32)  # int4 per cell: start, count, child, nchild
        trace_factor = 1.0 if repulsion else float(np.float32(eps2))
        b = self._buffers
        opening = OPENINGS.index(self._tunables.get("opening", "cube"))  # tree_pack's 0 cube, 1 bmax, 2 rel
        run(
            "tree_pack",
            ncell,
            ncell,
            b["levels"].data.ptr,
            len(levels) - 1,
            b["skeys"].data.ptr,
            *cell_ptrs,
            b["box"].data.ptr,
            b["mass"].data.ptr,
            b["com"].data.ptr,
            b["m2"].data.ptr,
            b["bmax"].data.ptr,
            cubes,
            float(self._tunables["theta"]),
            opening,
            trace_factor,
            mac.data.ptr,
            rel.data.ptr,
            pack.data.ptr,
            links.data.ptr,
        )
        return mac, rel, pack, links


class Queued:
    """The work one phase queued on a GPU, marked by an event: `ready()` asks without waiting (the single
    driver's test, in the GPU's context), `wait()` waits through a pycuda event, whose wait lets go of the
    GIL, so that the host read after it finds the work done."""

    def __init__(self, event, scope):
        self.event, self.scope = event, scope

    def ready(self) -> bool:
        with self.scope:
            return bool(self.event.query())

    __call__ = ready

    def wait(self) -> None:
        self.event.synchronize()


def _levels(bounds) -> list[int]:
    """level_start from the device's level ranges: up to the first empty level."""
    levels = [int(bounds[0])]
    for b in bounds[1:]:
        if int(b) == levels[-1]:
            break
        levels.append(int(b))
    return levels
