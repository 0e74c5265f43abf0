"""The opening test's per-cell rows of `cpu-tree` (docs/tree.md, step 5), in numpy: `opening_rows` (the
geometric tests, cube and bmax) and `relative_rows` (the relative test, rel), exactly as
kernels/tree/build.cu `tree_pack` computes them; the walk (cpu_tree_walk.py) tests them against each group.
Elementwise numpy in float32, rounded to nearest, in the order written.
"""

from __future__ import annotations

import numpy as np

# r_open is multiplied by this (1 + 2^-19, exact in float32) before it is squared: 32 float32 units of
# rounding, more than the roundings of r_open and of the test's d_box^2 add up to (opening_rows), so that
# the float32 test accepts no cell that exact arithmetic would open. kernels/tree/build.cu TREE_MAC_SLACK.
MAC_SLACK = np.float32(1.0 + 2.0**-19)


def opening_rows(com, lo, offset, side, theta: float, bmax=None, opening: str = "cube") -> np.ndarray:
    """(ncell, 4) float32 rows [com x y z, r_open^2] of the opening test (docs/tree.md, step 5), exactly
    as kernels/tree/build.cu `tree_pack` computes them. `opening`:
    - "cube": r_open = side / theta + |com - centre|, from the float32 centres of mass `com`, the key
      cube's corner `lo` and the cells' float64 cubes (`cell_cubes`);
    - "bmax": r_open = b_max / theta, b_max the float32 bound of `moments` (every body of the cell lies
      within it of the centre of mass, so an accepted cell's bodies are all farther than b_max from the
      group's box for theta <= 1). It needs fewer interactions for the same error
      (bench/tree_mac_study.py: 21% fewer on the 1M Plummer sphere, 41% on the 1M collision at p99 1e-3).

    The com's offset from its cell's centre is taken in float64, as (com - lo) - offset: both terms are as
    large as the key cube and their difference must be resolved to a fraction of a deep cell's side (2^-21
    of the cube at level 21), where float32 resolves 2^-24 of the cube, an eighth of such a cell. Its
    float64 error stays near 2^-52 of the cube. The rest is float32, rounded to nearest in numpy's
    elementwise order. Then r_open is rounded outwards by MAC_SLACK (32 float32 units): its own roundings
    (about 4 units) and those of the walk's d_box^2 (about 5 units of d_box^2, from correctly rounded
    differences of float32 coordinates) are far below that, so a cell the float32 test accepts is one that
    exact arithmetic on the same centre of mass accepts too. The slack moves the acceptance distance by
    2e-6 of itself, as a change of theta by 2e-6 would."""
    if opening == "bmax":
        r = (bmax.astype(np.float32) / np.float32(theta)) * MAC_SLACK
    elif opening == "cube":
        # a run blowing up (coordinates past 1e19) overflows these float32 squares: r_open becomes inf, the
        # cell is opened, and the step's non-finite check names the body; numpy need not warn first
        with np.errstate(over="ignore", invalid="ignore"):
            f = ((com.astype(np.float64) - lo) - offset).astype(np.float32)
            delta = np.sqrt((f[:, 0] * f[:, 0] + f[:, 1] * f[:, 1]) + f[:, 2] * f[:, 2])
        r = (side.astype(np.float32) / np.float32(theta) + delta) * MAC_SLACK
    else:
        raise ValueError(f"opening must be 'cube' or 'bmax', not {opening!r}")
    rows = np.empty((com.shape[0], 4), np.float32)
    rows[:, :3] = com
    rows[:, 3] = r * r
    return rows


def relative_rows(mass, bmax) -> np.ndarray:
    """(ncell, 2) float32 rows [M b_max^3, guard^2] of the relative opening test (`opening = rel`,
    docs/tree.md step 5), exactly as kernels/tree/build.cu `tree_pack` computes them: M b_max^3 as
    ((b b) b) M, and the guard (b_max rounded outwards by MAC_SLACK)^2, within which no cell is accepted
    whatever the group's acceleration (there the expansion does not converge). The walk accepts a cell
    for a group of threshold t = rel_scale |a|_min when d^2 > guard^2 and (d^2 d^2) sqrt(d^2) t >=
    M b_max^3 (`relative_accepts`): GADGET-2's criterion (Springel 2005) with the quadrupole expansion's
    error term, G M b^3 / d^5 <= alpha |a|."""
    b = bmax.astype(np.float32)
    rows = np.empty((b.shape[0], 2), np.float32)
    rows[:, 0] = ((b * b) * b) * mass.astype(np.float32)
    guard = b * MAC_SLACK
    rows[:, 1] = guard * guard
    return rows
