"""The GPU tree code: the `tree` record's policy and evaluator (docs/tree.md; kernels/tree/).

An evaluation builds the tree of the sources on the device, in the order docs/tree.md specifies and the
CPU twin (`cpu-tree`, app/backends/cpu_tree.py) implements:

    bounds -> keys (kernels/tree/build.cu) -> sort (CuPy's device radix sort, sharing the primary context)
    -> gather into key order -> octree, level by level (count, prefix sum, write) -> moments bottom up
    -> packed cell rows -> walk (kernels/tree/walk.cu: a warp per group of targets)

or, with rebuild_every = R > 1, refits the last build between builds (`_refit_phases`: the moments and
grown cubes of the build's cells over the current rows, then the rows and the walk; docs/tree.md, "The GPU
refit").

`evaluate` (a span of targets) works on sorted copies and writes each target's original row. A domain
split (`domain_phases`, every run of the engine, one GPU included) writes key order instead, and its
devices then move their state into that order (CudaShareDevice.take_key_order), with `ids` naming the
bodies, so colours, picks, recordings and snapshots still follow their bodies.

Why CuPy's sort: the GPU image carries CuPy (cupy-cuda13x), whose `argsort` runs a stable device radix
sort (CUB via Thrust) in the retained primary context that pycuda also uses, so pointers pass both ways
with no copy; cuda-cccl would be a second wheel to carry for the same CUB call. Its time is the `sort`
stage of the split (`stage_ms`), measured by `bench`.

Host round trips, two per evaluation usually: one after the build, which reads the level ranges, the
number of groups and a domain split's cuts at once (the groups and the cuts are found on the device behind
the levels, reading their counts there; a tree deeper than the last one queues a few more levels and looks
again), and one after the walk (the interaction counts and the stack-overflow flag); an evaluation
synchronises the stream. The evaluation is a generator of phases that yields before each of them
(`domain_phases`), so that one host thread can drive several GPUs' evaluations in turns.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import numpy as np

from app.core.errors import ConfigError, RuntimeFault
from app.engine.forces import STAGES, ForceEvaluator, ForceWork, KernelRecord, Span, drain
from app.engine.refit_cadence import CadencedTree
from app.model.physics import Physics

from ..cpu_tree import GROUP_CELL_FACTOR, OPENINGS
from .errors import out_of_memory
from .policies import FORMS, ceil_div, force_arguments, launch, suffix
from .state_ops import BYTES_PER_BODY

log = logging.getLogger(__name__)

BUILD_SOURCE = "tree/build.cu"
WALK_SOURCE = "tree/walk.cu"
# The build is compiled without FMA contraction and without fast math (IEEE division, square root and
# denormals): its expressions are evaluated as the CPU twin writes them, so that the cube, keys, moments
# and opening rows are bitwise the CPU's (kernels/tree/build.cu says which are float64 and why).
BUILD_OPTIONS = ("-O3", "-std=c++17", "-lineinfo", "-fmad=false")
WALK_WARPS = 4  # kernels/tree/walk.cu TREE_WARPS
WALK_BLOCKS_PER_SM = 8
STACK_CAP = 2048  # cells per warp's stack; doubled and the walk re-run if a group overflows it

BLOCK = 256
BOUNDS_BLOCKS = 264

BUILD_KERNELS = {  # symbol -> pycuda argument types
    "tree_bounds_partial": "PiP",
    "tree_bounds_finish": "PiP",
    "tree_keys": "PiPP",
    "tree_gather": "PPPiPPP",
    "tree_level_split": "PiiPPPPPPiPPP",
    "tree_moments": "PiPPPPPPPPP",
    "tree_refit": "Pi" + "P" * 15,
    "tree_pack": "iPiPPPPPPPPPPPfifPPPP",
    "tree_group_marks": "PiiPPPPP",
    "tree_group_starts": "PPiPP",
    "tree_domain_cuts": "PPPiP",
}
MAX_LEVEL = 21  # kernels/tree/build.cu TREE_MAX_LEVEL: 63-bit keys, 21 levels below the root
LEVEL_SLOTS = MAX_LEVEL + 3  # lvl[L] for L = 0 .. 23 (level 21's cells end at lvl[22]; lvl[23] closes it)
NGROUPS_SLOT = 2 * LEVEL_SLOTS + 1  # in "levels", after the overflow flag and the scan's tickets (_build)
CUTS_SLOT = NGROUPS_SLOT + 1
LEVEL_BLOCKS_PER_SM = 4  # the per-level kernels' fixed grid (they loop over their level's cells)
SPLIT_THREADS = 256  # kernels/tree/build.cu SPLIT_THREADS: tree_level_split's block, on the per-level grid
SPLIT_TILE = 256  # kernels/tree/build.cu SPLIT_TILE: cells per tile of its look-back scan
CELL_LANES = 8  # kernels/tree/build.cu CELL_LANES: the split's lanes per cell, one per octant
EXTRA_LEVELS = 2  # levels queued past the previous build's depth before the host looks
GROWTH = 1.5  # _buf allocates half again over what is asked, so that a slowly growing N reuses it
WALK_ARGS = "PPPiiPPPPfffiPiPPPPPiiPPifP"
CELL_FIELDS = ("start", "count", "child", "nchild")  # the cell arrays of the build, int32 each
GROUP_LISTS = ("nbody", "ncell", "nactive")  # per group of the last walk (last_groups)


def cupy_module():
    try:
        import cupy
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise RuntimeFault(
            "the GPU tree needs CuPy for its device sort: pip install cupy-cuda13x "
            "(make run installs it on a machine with an NVIDIA GPU)"
        ) from e
    return cupy


class TreePolicy:
    """The `tree` record's policy: its kernels, and the builder of its evaluator."""

    arg_types = WALK_ARGS
    row_bytes = 16
    targets_within_sources = True
    resolves = False
    nvcc_options = None  # the walk's: compile.NVCC_OPTIONS; the build has BUILD_OPTIONS

    def evaluator(self, record: KernelRecord, device, records: dict) -> TreeEvaluator:
        return TreeEvaluator(record, device)

    def walk_symbol(self, group: int, repulsion: bool, soft: bool) -> str:
        return f"tree_walk_g{int(group)}_{suffix(repulsion, soft)}"

    def entries(self, rec, repulsion: bool, soft: bool, tun: dict) -> list[tuple[str, str]]:
        """(symbol, arg types) of the walk entry these tunables launch (the build kernels: BUILD_KERNELS)."""
        return [(self.walk_symbol(tun["group"], repulsion, soft), WALK_ARGS)]

    def symbol_tunables(self, rec) -> list[dict]:
        """The tunable settings that change which walk entry runs: the group size."""
        return [{**rec.default_tunables(), "group": g} for g in rec.tunable("group").values]

    def symbols(self, rec) -> list[str]:
        return sorted(self.walk_symbol(g, r, s) for g in rec.tunable("group").values for r, s in FORMS)

    def candidates(self, rec, n: int, sms: int) -> list[dict]:
        return [rec.default_tunables()]


class TreeEvaluator(CadencedTree, ForceEvaluator):
    """The GPU tree on one device: acc[targets] from the tree of the sources (targets within them)."""

    def __init__(self, record: KernelRecord, device):
        super().__init__(record)
        self.device = device
        self._args = force_arguments(Physics())
        self._h = 0.0
        self._buffers: dict[str, object] = {}
        self._stage_totals = dict.fromkeys(STAGES, 0.0)
        self._stack_cap = STACK_CAP
        self._events = None
        self._settle_event = None
        self.levels: list[int] = []  # level_start of the last build (cells of level L: [ls[L], ls[L+1]))
        self._depth = MAX_LEVEL + 1  # levels of the last build: how many the next one queues before looking
        self.ngroups = 0
        # the refit (rebuild_every > 1, domain evaluations only): the last domain build's topology on the
        # device, its host facts here; the evaluations since; whether the last one kept its rows' order
        self._built: _Built | None = None
        self._last_groups_range = (0, 0)
        self._stream = None
        self._restart_cadence()  # when the next evaluation builds (refit_cadence.CadencedTree)
        self.kept_order = False

    def set_tunables(self, **values) -> None:
        super().set_tunables(**values)
        self._built = None  # a new leaf, group or rebuild_every: the next evaluation builds
        self._restart_cadence()

    # --- the evaluator contract --------------------------------------------------------------------
    def set_physics(self, physics: Physics) -> None:
        self._args = force_arguments(physics)
        self._h = float(physics.h)
        self._built = None  # new force parameters build next, as the CPU twin's new evaluator does,
        self._restart_cadence()  # on a cadence started afresh, as its is

    def forget(self) -> None:
        pass

    def active(self, n: int) -> tuple[KernelRecord, dict]:
        return self.record, self._tunables

    def describe(self, n: int) -> str:
        t = self._tunables
        every = int(t.get("rebuild_every", 1))
        refit = f" rebuild_every={every}" if every > 1 else ""
        return f"{self.record.name} theta={t['theta']:g} leaf={t['leaf']} group={t['group']}{refit}"

    def prepare(self, n: int) -> None:
        """Compile and load every kernel an evaluation may launch (build, sort, all walk forms)."""
        for symbol, types in BUILD_KERNELS.items():
            self.device.function(BUILD_SOURCE, symbol, types, BUILD_OPTIONS)
        for repulsion, soft in FORMS:
            self._walk(repulsion, soft)
        self._require_memory(n)

    def _require_memory(self, n: int) -> None:
        """Refuse an N whose tree buffers cannot fit, before any work, with all-pairs' message."""
        need, free, held = self._memory(n)
        if need > free + held:
            raise self._out_of_memory(n)

    def _memory(self, n: int) -> tuple[int, int, int]:
        """(bytes the buffers need at N = n, bytes free, bytes the buffers hold now). `_buf` allocates
        half again over the count (GROWTH); free counts the bytes CuPy's pool holds unused."""
        cp = cupy_module()
        held = sum(int(b.nbytes) for b in self._buffers.values())
        free = int(self.device.drv.mem_get_info()[0]) + int(cp.get_default_memory_pool().free_bytes())
        return int(GROWTH * self.bytes_per_body(n) * n), free, held

    def _out_of_memory(self, n: int) -> RuntimeFault:
        need, free, held = self._memory(n)
        per_body = GROWTH * self.bytes_per_body(n) + BYTES_PER_BODY  # the tree's and the state's
        return out_of_memory(
            n, need, free, self.device.facts.name, per_body, what="the tree's buffers", held=held
        )

    def stage_ms(self) -> dict[str, float]:
        """Milliseconds per stage (keys, sort, build, moments, walk) since the last call."""
        out, self._stage_totals = self._stage_totals, dict.fromkeys(STAGES, 0.0)
        return out

    def bytes_per_body(self, n: int) -> int:
        """Device bytes per source body this evaluator allocates at N = n (buffers as sized for n)."""
        leaf = int(self._tunables["leaf"])
        cells = _cell_capacity(n, leaf) / max(n, 1)
        per_body = 8 + 8 + 8 + 16 + 4  # keys, sorted keys, sort order (int64), sorted body, order (int32)
        # ints, octant edges, mass/com/m2 (float32), mac, pack, links; a refit's boxes and cubes
        per_cell = 4 * 5 + 4 * CELL_LANES + 4 * (1 + 3 + 6) + 16 + 48 + 16
        if int(self._tunables.get("rebuild_every", 1)) > 1:
            per_cell += 4 * 6 + 8 * 4
        per_group = 3 * 4 / int(self._tunables["group"])  # at least one group per `group` bodies
        # + 12: the group marks, their prefix sum and the group starts (sized for a group per body)
        return int(round(per_body + 12 + per_cell * cells + per_group))

    def _require_within(self, targets: Span, sources: Span) -> None:
        if not sources.contains(targets):
            raise ConfigError(
                f"{self.record.name}: targets [{targets.start}, {targets.stop}) must lie "
                f"within the sources [{sources.start}, {sources.stop}) (the GPU tree walks the "
                "groups of the sources' key order)"
            )

    def bind(self, pos: int, acc: int, targets: Span, sources: Span, stream=None) -> Callable[[], ForceWork]:
        self._require_within(targets, sources)

        def force() -> ForceWork:
            return self.evaluate(pos, acc, targets, sources, stream)

        return force

    def evaluate(self, pos, acc, targets: Span, sources: Span, stream=None) -> ForceWork:
        """acc[targets] from a build of the sources' tree (every time: a refit needs the rows in the
        last build's key order, which only a domain split keeps; this build replaces that one)."""
        self._require_within(targets, sources)
        pairs = int(targets.count) * int(sources.count)
        if targets.count == 0:
            return ForceWork(pair_equivalent=pairs, evaluations=1)
        prev = int(acc) + 16 * int(sources.start)  # the relative test reads its members' last rows
        return drain(self._phases(int(pos), int(acc), targets, sources, stream, pairs, None, (prev, 1)))[0]

    def evaluate_rows(self, pos, acc, n: int, rows, stream=None) -> ForceWork:
        """acc[rows] (float4 rows at device pointer `acc`) for an index array of `rows` (numpy or CuPy),
        every one of the n
        rows of `pos` a source (block time steps' active targets, app/engine/blocksteps.py): a build of all
        bodies, then the walk of the full evaluation's groups with only the rows of a device mask written
        (an inactive body still shapes its group's box), so each row gets bitwise its value in the full
        evaluation, as the twin's `evaluate_rows`. The work counts the active targets only. Builds every
        time (block steps need a(x) from x alone); the relative opening test is refused for that reason."""
        if self._tunables.get("opening") == "rel":
            raise ConfigError(
                f"{self.record.name}: block steps take a geometric opening test (the relative "
                "one reads the last accelerations); use opening=cube or bmax"
            )
        cp = cupy_module()
        if isinstance(rows, np.ndarray):
            rows = rows.astype(np.int64, copy=False)
        n = int(n)
        if rows.size == 0 or n == 0:
            return ForceWork(evaluations=1)
        everyone = Span.all(n)
        with self._on(stream, n):
            mask = self._buf("active-mask", n, np.uint8)
            mask[:n] = 0
            mask[cp.asarray(rows)] = 1  # (a no-op copy for device rows, the block-step scheduler's)
        return drain(
            self._phases(
                int(pos),
                int(acc),
                everyone,
                everyone,
                stream,
                int(rows.size) * n,
                None,
                (0, 0),
                mask.data.ptr,
            )
        )[0]

    def evaluate_domain(
        self, pos, out, n: int, cuts, index: int, stream=None, prev: int = 0
    ) -> tuple[ForceWork, list[int]]:
        """One device's part of a domain split (app/parallel/decomposition.py): the tree of all n rows of
        `pos`, the walk of the groups of key range `index` only, each of its bodies' accelerations written to
        out[k] at its place k in key order (float4 rows). `cuts` (K + 1 bounds from 0 to n) are moved to
        group starts; returns the work and those cuts. Every target's walk is the full evaluation's, so
        the K ranges scattered back (`unsort`) are bitwise one device's accelerations. `prev`: the rows'
        last accelerations (float4 rows in the order of `pos`: the state's acc), which the relative test
        reads (`opening = rel`; 0: none, every group takes the geometric test)."""
        return drain(self.domain_phases(pos, out, n, cuts, index, stream, prev))

    def domain_phases(self, pos, out, n: int, cuts, index: int, stream=None, prev: int = 0):
        """`evaluate_domain` in phases: a generator that queues work up to its next host read and yields
        there, returning (work, cuts). Each phase makes the device's context current itself and leaves
        nothing current across a yield, so one host thread can take several devices' evaluations in turns
        (`multidevice.SingleDriver`): while it waits for one GPU, the others run what it queued.

        With rebuild_every = R > 1, R - 1 evaluations of every R refit the last build (`_refit_phases`;
        with rebuild_rule = adaptive at most R - 1, app/engine/refit_cadence.py, on the whole evaluation's
        interaction count that Domains.force tells every device): a domain split's devices keep their rows
        in the last tree's key order (take_key_order), so the rows are the build's sorted bodies as they
        are (`kept_order`: the devices have nothing to re-sort). A build happens when the cadence says so
        and whenever N, the device's index or the tunables changed; it takes the cuts given, and its refits
        keep them (new shares from a rebalance take effect at the next build: the cuts are found on the
        device, behind the build)."""
        everyone = Span.all(n)
        self.kept_order = False
        if n == 0:
            return ForceWork(evaluations=1), [0] * len(cuts)
        key = (int(n), int(index))
        cadence = self._cadence
        built = self._built
        if cadence.refits and built is not None and built.key == key and not cadence.next_builds():
            cadence.refitted()
            self.kept_order = True
            # a refit's rows are its bodies in key order: a body's last row is its place
            return (yield from self._refit_phases(int(pos), int(out), built, stream, (int(prev), 0)))
        # a build's sorted body k was row sorder[k] of pos, and of prev
        result = yield from self._phases(
            int(pos), int(out), everyone, everyone, stream, 0, (list(cuts), int(index)), (int(prev), 1)
        )
        if cadence.refits:
            self._built = _Built(key, list(self.levels), self._last_groups_range, result[1])
        cadence.built(int(n))
        return result

    def last_order(self) -> tuple[int, int]:
        """Device pointers of the last evaluation's key order: int32, the source row at each place; and
        the sources' float4 rows in that order (a domain split moves its state into it, CudaShareDevice
        .take_key_order)."""
        return self._buffers["sorder"].data.ptr, self._buffers["spos"].data.ptr

    @contextmanager
    def _on(self, stream, n: int):
        """One phase on this device: its context, CuPy's device and the stream current; an allocation
        past _require_memory's estimate (the sort's scratch) gives the same message."""
        cp = cupy_module()
        on_stream = cp.cuda.ExternalStream(int(stream.handle)) if stream is not None else cp.cuda.Stream.null
        with self.device.scope, cp.cuda.Device(self.device.ordinal), on_stream:
            try:
                yield
            except cp.cuda.memory.OutOfMemoryError as e:
                cp.get_default_memory_pool().free_all_blocks()
                raise self._out_of_memory(n) from e

    # --- the work ------------------------------------------------------------------------------------
    def _walk(self, repulsion: bool, soft: bool, group: int | None = None):
        group = int(self._tunables["group"]) if group is None else group
        symbol = self.record.policy.walk_symbol(group, repulsion, soft)
        return self.device.function(WALK_SOURCE, symbol, WALK_ARGS, None)

    def _fn(self, symbol: str):
        return self.device.function(BUILD_SOURCE, symbol, BUILD_KERNELS[symbol], BUILD_OPTIONS)

    def _buf(self, key: str, count: int, dtype, keep: int = 0):
        """A CuPy device array of at least `count` elements kept under `key` (grown by half again, the
        first `keep` elements carried over)."""
        cp = cupy_module()
        buf = self._buffers.get(key)
        if buf is None or buf.size < count or buf.dtype != np.dtype(dtype):
            new = cp.empty(max(int(count), 1) + (int(count) >> 1), dtype=dtype)  # GROWTH
            if buf is not None and keep:
                new[:keep] = buf[:keep]
            buf = self._buffers[key] = new
        return buf

    def _phases(
        self,
        pos: int,
        acc: int,
        targets: Span,
        sources: Span,
        stream,
        pairs: int,
        domain=None,
        prev=(0, 0),
        mask: int = 0,
    ):
        """The evaluation as a generator that yields before each host read (`domain_phases`); `domain`
        (cuts, index): a domain split's part (evaluate_domain), else the targets' rows; `prev` (pointer,
        by_order): where the walk reads its targets' last accelerations (`_walk_all`); `mask`: a device
        byte per source row, the targets written (`evaluate_rows`; 0: all of them). Returns the work and,
        for a domain, the aligned cuts."""
        cp = cupy_module()
        drv = self.device.drv
        nj = int(sources.count)
        self._built = None  # this build's buffers replace the last one's (domain_phases keeps a new one)
        self._stream = stream
        leaf = int(self._tunables["leaf"])
        group = int(self._tunables["group"])
        src = pos + 16 * sources.start
        out = acc + 16 * targets.start
        on = partial(self._on, stream, nj)
        if self._events is None:  # one set per evaluator: the stage clock of every evaluation
            with self.device.scope:
                self._events = [drv.Event() for _ in range(len(STAGES) + 1)]
        events = self._events

        def run(symbol, n, *args):  # one thread per element
            launch(self._fn(symbol), (ceil_div(n, BLOCK), 1), BLOCK, stream, *args)

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
        cuts = None if domain is None else [int(c) for c in domain[0]]
        levels, cells, look = yield from self._build(on, run, stream, nj, leaf, group, skeys, cuts)
        ncell = levels[-1]
        self.ngroups = int(look[NGROUPS_SLOT])
        gstart = self._buffers["group-start"]
        groups, aligned = (0, self.ngroups), None
        if domain is not None:  # this device's run of groups: the cuts moved to group starts
            index = domain[1]
            found = look[CUTS_SLOT : CUTS_SLOT + 2 * len(cuts)]
            at, aligned = found[: len(cuts)], [int(a) for a in found[len(cuts) :]]
            groups = (int(at[index]), int(at[index + 1]))
            pairs = (aligned[index + 1] - aligned[index]) * nj
        self._last_groups_range = groups
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
        work = yield from self._walk_all(
            on,
            group,
            gstart,
            targets,
            sources,
            spos.data.ptr,
            sorder.data.ptr,
            links,
            mac,
            rel,
            pack,
            out,
            stream,
            groups,
            sorted_out=domain is not None,
            prev=prev,
            mask=mask,
        )
        self.levels = levels
        return self._finish(on, work, pairs), aligned

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

    def _finish(self, on, work: tuple[int, int], pairs: int) -> ForceWork:
        """After the walk: the stage times of this evaluation added up, and its work."""
        events = self._events
        with on():
            events[5].record(self._stream)
            events[5].synchronize()
            for k, name in enumerate(STAGES):
                self._stage_totals[name] += events[k + 1].time_since(events[k])
        return ForceWork(interactions=work[0], pair_equivalent=pairs, body_cell=work[1], evaluations=1)

    def _refit_phases(self, pos: int, out: int, built: _Built, stream, prev=(0, 0)):
        """A refit of the last domain build (docs/tree.md, "Refit"): no keys, sort or build; the state's
        rows, in that build's key order, are its sorted bodies as they are now. Per level from the
        deepest, tree_refit recomputes the moments and grows each cell's build cube to hold its current
        bodies; tree_pack makes the rows from those cubes; the walk takes the build's groups and cuts.
        Stages: the refit under "moments" (keys, sort and build take no time)."""
        n = built.key[0]
        on = partial(self._on, stream, n)
        self._stream = stream
        levels = built.levels
        ncell = levels[-1]
        b = self._buffers
        cell_ptrs = [b[f"cell-{k}"].data.ptr for k in CELL_FIELDS]
        group = int(self._tunables["group"])

        def run(symbol, count, *args):
            launch(self._fn(symbol), (ceil_div(count, BLOCK), 1), BLOCK, stream, *args)

        with on():
            events = self._events
            for k in range(4):  # keys, sort and build: empty
                events[k].record(stream)
            lo3 = self._buf("refit-lo", 3 * ncell, np.float32)
            hi3 = self._buf("refit-hi", 3 * ncell, np.float32)
            cubes = self._buf("refit-cubes", 4 * ncell, np.float64)
            grown = self._buf("refit-grown", 1, np.int32)
            self._set32(grown.data.ptr, 0, 1, stream)
            for lv in range(len(levels) - 2, -1, -1):
                self._per_level(
                    "tree_refit",
                    stream,
                    b["levels"].data.ptr,
                    lv,
                    pos,
                    *cell_ptrs,
                    b["skeys"].data.ptr,
                    b["box"].data.ptr,
                    b["mass"].data.ptr,
                    b["com"].data.ptr,
                    b["m2"].data.ptr,
                    b["bmax"].data.ptr,
                    lo3.data.ptr,
                    hi3.data.ptr,
                    cubes.data.ptr,
                    grown.data.ptr,
                )
            mac, rel, pack, links = self._pack(run, levels, cell_ptrs, cubes.data.ptr)
            events[4].record(stream)
        everyone = Span.all(n)
        work = yield from self._walk_all(
            on,
            group,
            b["group-start"],
            everyone,
            everyone,
            pos,
            b["sorder"].data.ptr,
            links,
            mac,
            rel,
            pack,
            out,
            stream,
            built.groups,
            sorted_out=True,
            prev=prev,
        )
        index = built.key[1]
        pairs = (built.aligned[index + 1] - built.aligned[index]) * n
        return self._finish(on, work, pairs), list(built.aligned)

    @property
    def last_grown(self) -> int:
        """Cells whose cube the last refit grew (0 after a build); a host read: for tests and diagnostics."""
        if not self.kept_order:
            return 0
        with self.device.scope:
            return int(self._buffers["refit-grown"][:1].get()[0])

    def _queued(self, stream) -> Queued:
        """A mark after the work queued so far on `stream`, yielded by a phase before its host read: the
        single driver tests it without waiting (`ready`), the phase then waits on it (`wait`)."""
        event = self._settle_event
        if event is None:
            event = self._settle_event = self.device.drv.Event()
        event.record(stream)
        return Queued(event, self.device.scope)

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
        cp = cupy_module()
        cap = _cell_capacity(nj, leaf)
        ncuts = 0 if cuts is None else len(cuts)
        while True:
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
                    run(
                        "tree_group_starts", nj, mark.data.ptr, incl.data.ptr, nj, gstart.data.ptr, ngroups_at
                    )
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
                    queued = self._queued(stream)
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
        rel_scale = self._relative_scale(g) if prev_ptr else 0.0
        fn = self._walk(repulsion, soft, group)
        ngroups = self.ngroups
        g_lo, g_hi = groups
        blocks = max(
            1,
            min(
                (g_hi - g_lo + WALK_WARPS - 1) // WALK_WARPS, WALK_BLOCKS_PER_SM * int(self.device.facts.sms)
            ),
        )
        t_lo = int(targets.start - sources.start)
        while True:
            with on():
                per_group = {k: self._buf(f"group-{k}", ngroups, np.int32) for k in GROUP_LISTS}
                flags = self._buf("flags", 2, np.int32)
                totals = self._buf("totals", 2, np.uint64)
                stacks = self._buf("stacks", blocks * WALK_WARPS * self._stack_cap, np.int32)
                self._set32(flags.data.ptr, 0, 2, stream)
                self._set32(totals.data.ptr, 0, 4, stream)  # two uint64
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

    def last_groups(self) -> dict[str, np.ndarray]:
        """Of the last walk: the group starts (with the end) and per group the list lengths (nbody,
        ncell) and targets written (nactive)."""
        out = {k: self._buffers[f"group-{k}"][: self.ngroups].get() for k in GROUP_LISTS}
        out["start"] = self._buffers["group-start"][: self.ngroups + 1].get()
        return out


@dataclass(frozen=True)
class _Built:
    """What a refit reuses of the last domain build besides its device buffers (cells, levels, sorted
    keys, cube, groups): the evaluation it was for (n, the device's index), its level starts, this
    device's run of groups and the aligned cuts."""

    key: tuple
    levels: list[int]
    groups: tuple[int, int]
    aligned: list[int]


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


def _cell_capacity(n: int, leaf: int) -> int:
    return 64 + 4 * (int(n) // max(int(leaf), 1) + 1)
