"""The host octree of `cpu-tree` (app/backends/cpu_tree.py, whose docstring is the algorithm; docs/tree.md
its specification): `Tree`, its `build` (keys, sort, cells, moments) and `refit` (the last build's
topology over moved bodies), the key order and the groups. Its numba kernels are in cpu_tree_kernels.py.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np


class _NoClock:
    @contextmanager
    def time(self, category: str):
        yield


_NO_CLOCK = _NoClock()


def _kernels_module():
    from app.backends import cpu_tree_kernels  # imports numba

    return cpu_tree_kernels


@dataclass(frozen=True)
class Tree:
    """An octree over sorted sources (float32 positions x, y, z and masses m, in key order)."""

    lo: np.ndarray  # the key cube's corner (3,), float64
    size: float  # and its side
    order: np.ndarray  # order[k] = the source-local index of the k-th body in key order
    keys: np.ndarray  # the sorted keys (int64)
    x: np.ndarray
    y: np.ndarray
    z: np.ndarray
    m: np.ndarray
    start: np.ndarray  # per cell: first body (in key order), number of bodies, level, key prefix,
    count: np.ndarray  # first child and number of children (0: a leaf)
    level: np.ndarray
    prefix: np.ndarray
    child: np.ndarray
    nchild: np.ndarray
    offset: np.ndarray  # the geometric centre relative to lo (ncell, 3) and the side (ncell,), float64
    side: np.ndarray
    mass: np.ndarray  # moments, float32: mass, centre of mass (ncell, 3), traceless quadrupole (ncell, 6:
    com: np.ndarray  # xx yy zz xy xz yz) about the com, trace sum m |y|^2 of the second moment
    quad: np.ndarray
    trace: np.ndarray
    bmax: np.ndarray  # float32 bound of the distance from the centre of mass to the cell's bodies

    @property
    def ncell(self) -> int:
        return int(self.start.shape[0])

    def mac(self, theta: float, opening: str = "cube") -> np.ndarray:
        """(ncell, 4) float32 rows [com, r_open^2] of the opening test `opening` ("cube" or "bmax"): a cell
        is accepted for a group whose box is farther than r_open from its centre of mass
        (cpu_tree_kernels.opening_rows)."""
        return _kernels_module().opening_rows(
            self.com, self.lo, self.offset, self.side, theta, self.bmax, opening
        )


def key_order(xyz: np.ndarray, clock=None) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """(order, sorted keys, lo, size) of the rows of xyz: Morton keys over their bounding cube.
    `clock` (an app.engine.clocks.HostTimer) times the stages "keys" and "sort"."""
    k = _kernels_module()
    clock = clock or _NO_CLOCK
    with clock.time("keys"):
        lo, size = k.bounding_cube(xyz)
        keys = k.morton_keys(xyz, lo, size)
    with clock.time("sort"):
        order = k.stable_key_order(keys)
        keys = keys[order]
    return order, keys, lo, size


GROUP_CELL_FACTOR = 8  # a group cell holds at most 8 groups' worth of bodies (docs/tree.md, step 5)


def group_starts(start: np.ndarray, count: np.ndarray, nchild: np.ndarray, group: int) -> np.ndarray:
    """The groups of the sorted bodies, as starts plus the end (int64): every *group cell* (a cell with at
    most `GROUP_CELL_FACTOR * group` bodies, or a leaf, whose parent has more) cut into runs of `group`
    bodies. Group cells partition the bodies, so a group never spans two of them: its box stays inside its
    cell, which is what keeps a group of outlying bodies from opening half the tree."""
    cap = GROUP_CELL_FACTOR * int(group)
    ncell = count.shape[0]
    internal = np.flatnonzero(nchild > 0)
    parent_count = np.full(ncell, np.iinfo(np.int64).max)
    parent_count[1:] = np.repeat(count[internal], nchild[internal])  # children follow their parents' order
    cells = np.flatnonzero(((count <= cap) | (nchild == 0)) & (parent_count > cap))
    cells = cells[np.argsort(start[cells], kind="stable")]
    runs = -(-count[cells] // group)
    first = np.repeat(np.cumsum(runs) - runs, runs)
    starts = np.repeat(start[cells], runs) + group * (np.arange(int(runs.sum())) - first)
    return np.append(starts, count[0]).astype(np.int64)


def build(pos: np.ndarray, leaf: int, clock=None) -> Tree:
    """The tree over the (n, 4) [x, y, z, m] rows of `pos`, read as float32 (the record's precision, and
    the GPU state's); `clock` (an app.engine.clocks.HostTimer) times the stages: keys, sort (with the reorder
    of the rows), build (cells and their cubes), moments."""
    k = _kernels_module()
    clock = clock or _NO_CLOCK
    with clock.time("keys"):
        src = np.asarray(pos[:, :4], dtype=np.float32)
    order, keys, lo, size = key_order(src[:, :3], clock)
    with clock.time("sort"):
        s = src[order]
        x, y, z, m = (np.ascontiguousarray(s[:, i]) for i in range(4))
    with clock.time("build"):
        start, count, level, prefix, child, nchild = k.build_tree(keys, int(leaf))
        offset, side = k.cell_cubes(level, prefix, float(size))
    with clock.time("moments"):
        mass, com, quad, trace, bmax = k.moments(x, y, z, m, start, count, child, nchild)
    return Tree(
        lo,
        float(size),
        order,
        keys,
        x,
        y,
        z,
        m,
        start,
        count,
        level,
        prefix,
        child,
        nchild,
        offset,
        side,
        mass,
        com,
        quad,
        trace,
        bmax,
    )


def refit(built: Tree, pos: np.ndarray, clock=None, in_order: bool = False) -> tuple[Tree, int]:
    """The tree of `built`'s topology over the current (n, 4) rows of `pos` (the same sources, same n),
    and the number of cells whose cube grew (docs/tree.md, "Refit"): the bodies are gathered in the
    build's key order (not re-sorted), the cells and their body ranges are kept, and what depends on the
    positions is recomputed: the cubes the opening test reads, grown from the build's to hold the cells'
    current bodies (`refit_cubes`), and the float32 moments (`moments`, the build's operations). The keys
    stay the build's (they no longer describe the bodies). `in_order`: the rows of `pos` are in the build's
    key order already (a domain split's state), so they are taken as they are and the tree's order is the
    identity. Stages: the gather under "sort", the cubes under "build", the moments under "moments"."""
    k = _kernels_module()
    clock = clock or _NO_CLOCK
    with clock.time("sort"):
        s = np.asarray(pos[:, :4], dtype=np.float32)
        order = np.arange(s.shape[0], dtype=built.order.dtype) if in_order else built.order
        if not in_order:
            s = s[order]
        x, y, z, m = (np.ascontiguousarray(s[:, i]) for i in range(4))
    with clock.time("build"):
        offset, side, grown = k.refit_cubes(
            x,
            y,
            z,
            built.start,
            built.count,
            built.child,
            built.nchild,
            built.lo,
            built.size,
            built.offset,
            built.side,
        )
    with clock.time("moments"):
        mass, com, quad, trace, bmax = k.moments(
            x, y, z, m, built.start, built.count, built.child, built.nchild
        )
    tree = Tree(
        built.lo,
        built.size,
        order,
        built.keys,
        x,
        y,
        z,
        m,
        built.start,
        built.count,
        built.level,
        built.prefix,
        built.child,
        built.nchild,
        offset,
        side,
        mass,
        com,
        quad,
        trace,
        bmax,
    )
    return tree, int(grown)
