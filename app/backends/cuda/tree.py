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

The evaluator is built in layers, a module each: tree_kernels.py (the kernels' entries and the buffers'
layout), tree_memory.py (the buffers and the memory they need), tree_build.py (keys, sort, octree,
groups, moments), tree_walk.py (the walk), tree_refit.py (the refit); here, the record's policy and the
evaluator's contract: evaluate, evaluate_rows, domain_phases and the phases of an evaluation.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from app.backends.cuda.policies import FORMS, ceil_div, force_arguments, launch, suffix
from app.backends.cuda.tree_build import Queued
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
    GROUP_LISTS,
    LEVEL_BLOCKS_PER_SM,
    LEVEL_SLOTS,
    MAX_LEVEL,
    NGROUPS_SLOT,
    SPLIT_THREADS,
    SPLIT_TILE,
    STACK_CAP,
    WALK_ARGS,
    WALK_BLOCKS_PER_SM,
    WALK_SOURCE,
    WALK_WARPS,
)
from app.backends.cuda.tree_memory import GROWTH, cupy_module
from app.backends.cuda.tree_refit import Built, TreeRefit
from app.core.errors import ConfigError
from app.engine.forces import STAGES, ForceWork, KernelRecord, Span, drain
from app.model.physics import Physics

__all__ = [  # the policy and evaluator, and the names of the layers' modules (their importers' path)
    "BLOCK",
    "BOUNDS_BLOCKS",
    "BUILD_KERNELS",
    "BUILD_OPTIONS",
    "BUILD_SOURCE",
    "CELL_FIELDS",
    "CELL_LANES",
    "CUTS_SLOT",
    "EXTRA_LEVELS",
    "GROUP_LISTS",
    "GROWTH",
    "LEVEL_BLOCKS_PER_SM",
    "LEVEL_SLOTS",
    "MAX_LEVEL",
    "NGROUPS_SLOT",
    "SPLIT_THREADS",
    "SPLIT_TILE",
    "STACK_CAP",
    "WALK_ARGS",
    "WALK_BLOCKS_PER_SM",
    "WALK_SOURCE",
    "WALK_WARPS",
    "Queued",
    "TreeEvaluator",
    "TreePolicy",
    "cupy_module",
]


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


class TreeEvaluator(TreeRefit):
    """The GPU tree on one device: acc[targets] from the tree of the sources (targets within them)."""

    def __init__(self, record: KernelRecord, device):
        super().__init__(record)
        self.device = device
        self._args = force_arguments(Physics())
        self._h = 0.0
        self._buffers = {}
        self._stage_totals = dict.fromkeys(STAGES, 0.0)
        self._stack_cap = STACK_CAP
        self._events = None
        self._settle_event = None
        self.levels: list[int] = []  # level_start of the last build (cells of level L: [ls[L], ls[L+1]))
        self._depth = MAX_LEVEL + 1  # levels of the last build: how many the next one queues before looking
        self.ngroups = 0
        # the refit (rebuild_every > 1, domain evaluations only): the last domain build's topology on the
        # device, its host facts here; the evaluations since; whether the last one kept its rows' order
        self._built: Built | None = None
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

    def active(self, n: int, devices: int = 1) -> tuple[KernelRecord, dict]:
        """What runs: this record (CudaEvaluator's signature; only `best` resolves per device count)."""
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

    def stage_ms(self) -> dict[str, float]:
        """Milliseconds per stage (keys, sort, build, moments, walk) since the last call."""
        out, self._stage_totals = self._stage_totals, dict.fromkeys(STAGES, 0.0)
        return out

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
            self._built = Built(key, list(self.levels), self._last_groups_range, result[1])
        cadence.built(int(n))
        return result

    def last_order(self) -> tuple[int, int]:
        """Device pointers of the last evaluation's key order: int32, the source row at each place; and
        the sources' float4 rows in that order (a domain split moves its state into it, CudaShareDevice
        .take_key_order)."""
        return self._buffers["sorder"].data.ptr, self._buffers["spos"].data.ptr

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

        spos, skeys, sorder = self._sort(on, run, stream, events, src, nj)
        cuts = None if domain is None else [int(c) for c in domain[0]]
        levels, cells, look = yield from self._build(on, run, stream, nj, leaf, group, skeys, cuts)
        self.ngroups = int(look[NGROUPS_SLOT])
        gstart = self._buffers["group-start"]
        groups, aligned = (0, self.ngroups), None
        if domain is not None:  # this device's run of groups: the cuts moved to group starts
            assert cuts is not None  # (made from domain above)
            index = domain[1]
            found = look[CUTS_SLOT : CUTS_SLOT + 2 * len(cuts)]
            at, aligned = found[: len(cuts)], [int(a) for a in found[len(cuts) :]]
            groups = (int(at[index]), int(at[index + 1]))
            pairs = (aligned[index + 1] - aligned[index]) * nj
        self._last_groups_range = groups
        mac, rel, pack, links = self._moments(on, run, stream, events, levels, cells, spos)
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
