"""The numba kernels of `cpu-tree`, in one namespace (`cpu_tree.py` imports this module lazily: it imports
numba). The algorithm, step by step, is specified in docs/tree.md; its CPU implementation is split by job:

- cpu_tree_build.py: the Morton keys and their stable order, the octree of the sorted keys, the cells'
  cubes, and the refit's grown cubes (`refit_cubes`);
- cpu_tree_moments.py: `moments`, mass, centre of mass, traceless quadrupole, trace of the second moment
  and b_max, bottom up, in float32 (the GPU's operations in the GPU's order);
- cpu_tree_opening.py: the opening test's per-cell rows, `opening_rows` (cube, bmax) and `relative_rows`
  (rel), and MAC_SLACK;
- cpu_tree_walk.py: `walk_kernel(dtype, repulsion, skip_self)`, the walk over groups of targets, with the
  opening tests it evaluates (`box_accepts`, `relative_accepts`, `group_threshold`) and `pack_cells`.

The GPU reproduces `moments`, `opening_rows` and the opening tests bit for bit.
"""

from __future__ import annotations

from app.backends.cpu_tree_build import (
    KEY_CELLS,
    MAX_LEVEL,
    REFIT_TOL,
    bounding_cube,
    build_tree,
    cell_cubes,
    integer_coords,
    morton_keys,
    points_box,
    refit_cubes,
    stable_key_order,
)
from app.backends.cpu_tree_moments import moments
from app.backends.cpu_tree_opening import MAC_SLACK, opening_rows, relative_rows
from app.backends.cpu_tree_walk import (
    STACK,
    box_accepts,
    group_threshold,
    pack_cells,
    relative_accepts,
    walk_kernel,
)

__all__ = [
    "KEY_CELLS",
    "MAC_SLACK",
    "MAX_LEVEL",
    "REFIT_TOL",
    "STACK",
    "bounding_cube",
    "box_accepts",
    "build_tree",
    "cell_cubes",
    "group_threshold",
    "integer_coords",
    "moments",
    "morton_keys",
    "opening_rows",
    "pack_cells",
    "points_box",
    "refit_cubes",
    "relative_accepts",
    "relative_rows",
    "stable_key_order",
    "walk_kernel",
]
