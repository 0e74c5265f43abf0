"""`cpu-tree`: a Barnes–Hut octree code on the host, the CPU twin and CI oracle of the GPU tree code.

The algorithm (docs/tree.md is its specification; the kernels are in `cpu_tree_kernels.py`), per
evaluation of acc[targets] = F(pos[targets]; pos[sources]):

1. keys: 63-bit Morton keys (21 bits per axis) of the sources over their bounding cube (per-axis
   minimum, largest extent padded by 1e-6; coordinates clamped to [0, 2^21 - 1], NaN -> 0);
2. sort: a stable argsort of the keys (ties keep the source order), and the source rows reordered
   into float32 structure-of-arrays copies (the moments and the walk);
3. tree: cells are key prefixes of 3 bits per level, a cell is a leaf when it holds <= `leaf` bodies or
   is at level 21;
4. moments (float32, bottom up): mass, centre of mass, the traceless quadrupole about it and the trace
   of the second moment (the trace keeps the softened expansion exact to second order);
5. opening test (the tunable `opening`; docs/tree.md step 5): a cell is accepted for a group of targets
   when the distance from the group's bounding box to the cell's centre of mass exceeds its opening
   radius, side / theta + |com - geometric centre| (cube, Bonsai's; the default) or b_max / theta (bmax),
   float32 with r_open rounded outwards; or (rel, GADGET-2's relative test) when G M b_max^3 / d^5 <=
   alpha |a|min of the group's members' last accelerations, beyond b_max;
6. groups: `group` consecutive targets in key order. When the targets lie within the sources (the
   integrator's case) the groups are chunks of the sources' sorted order and a target outside the span
   still shapes its group's box, so a span of targets gets bitwise the rows of the full evaluation; other
   targets are keyed in their own bounding cube, sorted and chunked the same way;
7. walk (numba prange over groups): accepted cells add monopole + quadrupole terms of the softened pair
   potential (gravity or gravity-repulsion), opened leaves add body-body interactions (app/model/physics.py).

With the tunable rebuild_every = R > 1, steps 1-3 run every R-th evaluation only: in between, `refit`
keeps the last build's topology (its key order, cells, body ranges and so the groups) and recomputes from
the current positions the moments (step 4, the same float32 operations) and the cubes the opening test
reads, each grown to hold its cell's current bodies (`refit_cubes`), so the test keeps its guarantee.
R = 1 (the default) builds every evaluation, as before. A domain split (`domain_phases`: one device or
several, MPI ranks) keeps its rows in the last tree's key order (DeviceState.take_key_order), so its refit
takes the rows as they are, with no gather (`kept_order`: the devices have nothing to re-sort), as the
GPU tree does.

Arithmetic (docs/tree.md, step 7): the cube and the keys in float64; the moments and the opening test in
float32, operation by operation as the GPU computes them, so that both trees accept the same cells (the
float64 left is the cells' cubes, from which each r_open takes its centre offset); the interactions in
float32 with fastmath (the record's precision: positions are float32; the rounding, ~1e-6, is far below
the 1e-3 budget of the approximation).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# the octree itself; Tree, build, refit, key_order and group_starts are also this module's names (tests)
from app.backends.cpu_octree import (  # noqa: F401
    GROUP_CELL_FACTOR,
    Tree,
    _kernels_module,
    build,
    group_starts,
    key_order,
    refit,
)
from app.core.values import AUTO, Choice, FloatRange
from app.engine.clocks import HostTimer
from app.engine.forces import ForceEvaluator, ForceWork, KernelRecord, Span, drain
from app.engine.refit_cadence import CadencedTree
from app.model.physics import Physics
from app.parallel.decomposition import align_cuts

# `alpha`'s auto steps (from N bodies, alpha): each the largest of 0.001-0.004 whose p99 against float64
# stayed within 8e-4 (80% of the 1e-3 budget) at the step's smallest N, Plummer and collision, on the CPU
# twin and (where measured) on the H100; the error at one alpha falls as N grows. 0.002 at 262,144 gave
# up to 9.1e-4 and at 1M 6.9e-4 (the twin); 0.003 at 4M 8.9e-4 (the twin's collision) and at 8M 7.8e-4
# (the twin) and 6.2e-4 (the H100's Plummer); 0.004 at 8M 9.8e-4 (the twin's collision). Measured since on
# the H100 at these steps: the collision at 8M 8.15e-4, 2% over the margin and within the budget, kept
# (h100-2026-11-27-tree-alpha-auto.json). bench/results/cpu-2026-11-27-tree-rel-alpha-large.txt,
# -2m-8m.txt, h100-2026-11-26-tree-final.json; docs/tree.md ("The default on the H100").
ALPHA_BY_N = ((0, 0.001), (1_048_576, 0.002), (8_388_608, 0.003))
OPENINGS = ("cube", "bmax", "rel")  # both trees' `opening` (cpu_tree_kernels.opening_rows, relative_rows)
# the opening test's tunables, the same on both tree records (cpu-tree and the GPU's tree)
THETA = FloatRange(
    "theta",
    0.0,
    1.5,
    0.5,
    lo_open=True,
    doc="opening angle: a cell is accepted for a group of targets beyond its opening radius, "
    "b_max/theta (opening=bmax) or side/theta + |com - centre| (cube); under opening=rel, the default, "
    "only a run's first walk reads it (the cube test, before any last acceleration)",
)
OPENING_TUNABLES = (
    Choice(
        "opening",
        OPENINGS,
        "rel",
        doc="the opening test: rel (the default), the relative test of alpha, cube's where a group has no "
        "last acceleration yet (about half cube's interactions at theta 0.5 from 16k bodies up, within the "
        "same p99 budget: docs/tree.md); cube, side / theta + |com - centre| of the cell's octree cube; "
        "bmax, b_max / theta with b_max the cell's bodies' farthest distance from its centre of mass",
    ),
    FloatRange(
        "alpha",
        0.0,
        0.1,
        AUTO,
        lo_open=True,
        log=True,
        doc="the relative test's accuracy (opening=rel): a cell is accepted for a group when "
        "G M b_max^3 / d^5 <= alpha |a|min, |a|min the smallest of its members' last accelerations, "
        "and never within b_max of the group's box; auto (the default) follows N, since the error at one "
        "alpha falls as N grows: the largest alpha whose p99 stayed within 80% of the budget at the "
        "step's smallest N on the CPU twin (docs/tree.md, \"alpha's default\")",
        read_when=("opening", ("rel",)),
        by_n=ALPHA_BY_N,
    ),
)


@dataclass(frozen=True)
class NumbaTree:
    """`cpu-tree`'s policy: the walk's dtype, and the builder of its evaluator."""

    dtype: type = np.float32

    def evaluator(self, record: KernelRecord, physics: Physics) -> CpuTreeEvaluator:
        return CpuTreeEvaluator(record, physics)


class CpuTreeEvaluator(CadencedTree, ForceEvaluator):
    """The tree code with one physics: acc[targets] from the sources' tree (numpy arrays)."""

    def __init__(self, record: KernelRecord, physics: Physics):
        super().__init__(record)
        self.dtype = record.policy.dtype
        eps2 = self.dtype(physics.softening**2)
        h = physics.h
        self.kernel = _kernels_module().walk_kernel(self.dtype, repulsion=h != 0.0, skip_self=eps2 == 0)
        self._scalars = (eps2, self.dtype(physics.G), self.dtype(h))
        self._trace_factor = 1.0 if h != 0.0 else float(eps2)  # gravity walks take eps^2 tr, repulsion tr
        self.last_tree: Tree | None = None  # the tree of the last evaluation (diagnostics, tests)
        self._groups: dict[str, np.ndarray] = {}  # the last walk's groups (last_groups)
        self._clock = HostTimer()  # perf_counter per stage, summed until stage_ms() takes them
        # the refit (rebuild_every > 1): the last build's tree, what it was built over, the evaluations since
        self._built: Tree | None = None
        self._built_key: tuple | None = None
        self._restart_cadence()  # when the next evaluation builds (refit_cadence.CadencedTree)
        self.last_grown = 0  # cells whose cube the last refit grew (0 after a build)
        self.kept_order = False  # the last evaluation refitted rows already in its key order (a domain's)
        self._domain_cuts: list[int] = []  # the cuts of the last domain build, kept by its refits

    def set_tunables(self, **values) -> None:
        super().set_tunables(**values)
        self._built = None  # a new leaf or rebuild_every: the next evaluation builds
        self._restart_cadence()

    def _tree(self, pos: np.ndarray, first: int, leaf: int, domain: int | None = None) -> Tree:
        """The sources' tree (rows pos of sources starting at row `first`): a build every `rebuild_every`
        evaluations, a refit of the last build's topology in between (docs/tree.md, "Refit"). A build
        when the sources (their count and first row), the leaf or the kind of evaluation changed since.
        `domain` (a domain split's device index) for a domain split's part, whose rows are in the last
        tree's key order: its refit takes them as they are (`kept_order`)."""
        cadence = self._cadence
        key = (int(pos.shape[0]), int(first), int(leaf), domain)
        self.kept_order = False
        built = self._built
        if cadence.refits and built is not None and self._built_key == key and not cadence.next_builds():
            tree, self.last_grown = refit(built, pos, self._clock, in_order=domain is not None)
            self.kept_order = domain is not None
            cadence.refitted()
        else:
            tree = build(pos, leaf, self._clock)
            self._built, self._built_key = (tree, key) if cadence.refits else (None, None)
            cadence.built(int(pos.shape[0]))
            self.last_grown = 0
        self.last_tree = tree
        return tree

    def stage_ms(self) -> dict[str, float]:
        """ms per stage since the last call: keys, sort, build, moments, walk (docs/tree.md)."""
        return self._clock.collect()

    def last_groups(self) -> dict[str, np.ndarray]:
        """Of the last walk, as the GPU tree's `last_groups`: the group starts (with the end) and per group
        the list lengths (nbody, ncell) and the targets written (nactive)."""
        return self._groups

    # host bytes per body of one evaluation: the Tree's order, keys and float32 x, y, z, m (32), the
    # float32 copy of the sources and its reordered copy (32), the targets' rows (24); per cell: structure
    # (6 int64), the cube's offset and side (32 in float64), mass, com, quad, trace (44 in float32), the
    # opening test's row (16) and the packed float32 row (48)
    BODY_BYTES = 32 + 32 + 24
    CELL_BYTES = 48 + 32 + 44 + 16 + 48
    CELLS_PER_LEAF = 4.0  # cells ~ 4 n / leaf (3.3-4.2 on Plummer spheres, leaf 8-64:
    # bench/results/cpu-2026-11-26-tree-twin-figures.txt)

    def bytes_per_body(self, n: int) -> int | None:
        """Host bytes per body that one evaluation allocates at N = n, beside the state: an estimate
        with the cell count of a Plummer sphere (a more clustered cloud has more cells per leaf)."""
        leaf = int(self._tunables["leaf"])
        return int(round(self.BODY_BYTES + self.CELLS_PER_LEAF / leaf * self.CELL_BYTES))

    def evaluate(self, pos, acc, targets: Span, sources: Span, stream=None) -> ForceWork:
        n = pos.shape[0]
        rows = targets.check_within(n, "targets").as_slice()
        cols = sources.check_within(n, "sources").as_slice()
        theta = float(self._tunables["theta"])
        leaf = int(self._tunables["leaf"])
        group = int(self._tunables["group"])
        pairs = int(targets.count) * int(sources.count)
        if targets.count == 0:
            return ForceWork(pair_equivalent=0, evaluations=1)
        if sources.count == 0:
            acc[rows, :3] = 0
            return ForceWork(pair_equivalent=0, evaluations=1)
        clock = self._clock
        tree = self._tree(pos[cols], sources.start, leaf)
        within = sources.contains(targets)
        if within:  # the groups are runs of the sources' group cells
            with clock.time("walk"):
                tpos = (tree.x, tree.y, tree.z)
                trow = sources.start + tree.order
                trow = np.where((trow >= targets.start) & (trow < targets.stop), trow, -1)
        else:  # targets keyed in their own cube
            t32 = np.asarray(pos[rows, :3], dtype=np.float32)
            order = key_order(t32, clock)[0]
            with clock.time("sort"):
                tpos = (
                    np.ascontiguousarray(t32[order, 0]),
                    np.ascontiguousarray(t32[order, 1]),
                    np.ascontiguousarray(t32[order, 2]),
                )
                trow = targets.start + order
        with clock.time("walk"):  # the relative test reads every member's last row (a non-target's too)
            prow = sources.start + tree.order if within else trow
            work = self._walk(tree, tpos, trow, acc, theta, group, pairs, within, prow=prow)
        self._cadence.observe(work.interactions)  # this evaluator walked the evaluation: its own count
        return work

    def evaluate_rows(self, pos, acc, rows: np.ndarray) -> ForceWork:
        """acc[rows] for an index array of `rows`, every body a source (block time steps' active targets,
        app/engine/blocksteps.py): the tree of all bodies, the walk of only the groups that hold an active
        row. The groups are the full evaluation's (an inactive body still shapes its group's box), so each row
        gets bitwise its value in the full evaluation. The work counts the active targets only."""
        n = pos.shape[0]
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size == 0 or n == 0:
            return ForceWork(evaluations=1)
        clock = self._clock
        tree = self._tree(pos, 0, int(self._tunables["leaf"]))
        with clock.time("walk"):
            active = np.zeros(n, dtype=bool)
            active[rows] = True
            trow = np.where(active[tree.order], tree.order, -1)
            return self._walk(
                tree,
                (tree.x, tree.y, tree.z),
                trow,
                acc,
                float(self._tunables["theta"]),
                int(self._tunables["group"]),
                int(rows.size) * n,
                True,
                prow=tree.order,
            )

    def evaluate_domain(self, pos, out, cuts, index: int, prev=None) -> tuple[ForceWork, list[int]]:
        """One device's part of a domain split (app/parallel/decomposition.py): the tree of every row of
        `pos`, the walk of the groups of key range `index` only, each of its bodies' accelerations written to
        out[k] at its position k in key order. `cuts` (K + 1 increasing bounds from 0 to n) are moved to
        group starts; returns the work and those aligned cuts. Every target's walk is the one the full
        evaluation does, so K domains scattered back (`unsort`) give bitwise its accelerations. `prev`: the
        rows' last accelerations (row order of `pos`), which the relative test reads (`opening = rel`)."""
        return drain(self.domain_phases(pos, out, cuts, index, prev))

    def domain_phases(self, pos, out, cuts, index: int, prev=None):
        """`evaluate_domain` in two phases, as the GPU tree's (a generator yielding between the build and
        the walk), so that CI runs the single driver's turns over CPU devices."""
        n = pos.shape[0]
        theta = float(self._tunables["theta"])
        leaf = int(self._tunables["leaf"])
        group = int(self._tunables["group"])
        if n == 0:
            return ForceWork(evaluations=1), [0] * len(cuts)
        clock = self._clock
        tree = self._tree(pos, 0, leaf, domain=int(index))
        if self.since_build == 0:  # a build takes the cuts; its refits keep them (the GPU's rule)
            self._domain_cuts = [int(c) for c in cuts]
        cuts = self._domain_cuts
        yield
        with clock.time("walk"):
            gstart = group_starts(tree.start, tree.count, tree.nchild, group)
            aligned = align_cuts(cuts, gstart)
            lo, hi = aligned[index], aligned[index + 1]
            g_lo, g_hi = (int(np.searchsorted(gstart, c)) for c in (lo, hi))
            trow = np.full(n, -1, np.int64)
            trow[lo:hi] = np.arange(lo, hi)
            prow = tree.order if prev is not None else np.full(n, -1, np.int64)  # a body's row of pos
            work = self._walk(
                tree,
                (tree.x, tree.y, tree.z),
                trow,
                out,
                theta,
                group,
                (hi - lo) * n,
                True,
                gstart=gstart[g_lo : g_hi + 1],
                prev=prev,
                prow=prow,
            )
        return work, aligned

    def _walk(
        self,
        tree: Tree,
        tpos,
        trow,
        acc,
        theta: float,
        group: int,
        pairs: int,
        within: bool,
        gstart=None,
        prev=None,
        prow=None,
    ) -> ForceWork:
        """The walk of the targets at float32 positions tpos = (x, y, z) in key order, trow their rows.
        prev[prow[t]]: member t's last acceleration, which the relative test's threshold reads (by default
        acc[trow[t]], the row the walk will write; the callers pass every member's row)."""
        nt = tpos[0].shape[0]
        if gstart is None and within:  # (given: a domain's run of the groups)
            gstart = group_starts(tree.start, tree.count, tree.nchild, group)
        elif gstart is None:
            gstart = np.minimum(np.arange(0, nt + group, group, dtype=np.int64), nt)
            gstart = gstart[np.concatenate([[True], np.diff(gstart) > 0])]
        ngroup = gstart.shape[0] - 1
        dt = self.dtype
        xs, ys, zs, ms = (np.ascontiguousarray(a, dtype=dt) for a in (tree.x, tree.y, tree.z, tree.m))
        k = _kernels_module()
        cells = k.pack_cells(tree.com, tree.mass, tree.quad, tree.trace, dt, self._trace_factor)
        nbody = np.zeros(ngroup, np.int64)
        ncells = np.zeros(ngroup, np.int64)
        nactive = np.zeros(ngroup, np.int64)
        opening = self._tunables.get("opening", "cube")
        rel_scale = np.float32(self._relative_scale(self._scalars[1], tree.order.shape[0]))
        crel = k.relative_rows(tree.mass, tree.bmax) if rel_scale > 0 else np.zeros((0, 2), np.float32)
        trow = trow.astype(np.int64)
        self.kernel(
            *tpos,
            gstart,
            trow,
            tree.child,
            tree.nchild,
            tree.start,
            tree.count,
            tree.mac(theta, "cube" if opening == "rel" else opening),
            cells,
            xs,
            ys,
            zs,
            ms,
            *self._scalars,
            acc,
            nbody,
            ncells,
            nactive,
            acc if prev is None else prev,
            trow if prow is None else prow,
            crel,
            rel_scale,
        )
        self._evaluated = True  # the rows written are this evaluator's: the next walk may read them
        self._groups = {"start": gstart, "nbody": nbody, "ncell": ncells, "nactive": nactive}
        body_cell = int(np.dot(nactive, ncells))
        return ForceWork(
            interactions=int(np.dot(nactive, nbody)) + body_cell,
            pair_equivalent=pairs,
            body_cell=body_cell,
            evaluations=1,
        )
