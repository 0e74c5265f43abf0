"""The numba kernels of `cpu-tree` (imports numba; `cpu_tree.py` imports this module lazily).

The algorithm, step by step, is specified in docs/tree.md; this module is its CPU implementation:

- `morton_keys` (numpy): 21 bits per axis, interleaved x|y|z from the top (x takes bit 3b+2, y 3b+1,
  z 3b of the key for coordinate bit b), 63 bits in all, held in int64 (non-negative);
- `build_tree`: the octree of the sorted keys, breadth first; cells are key prefixes of 3 bits per
  level, a cell with <= `leaf` bodies or at level 21 is a leaf; children of a cell are contiguous;
- `moments`: mass, centre of mass, traceless quadrupole and trace of the second moment, bottom up,
  in float32 (the GPU's operations in the GPU's order: kernels/tree/build.cu `cell_moments`);
- `refit_cubes`: between rebuilds, the build's cell cubes grown to hold the cells' current bodies (the
  refit keeps the topology and recomputes `moments` and the opening rows from them: docs/tree.md);
- `opening_rows`: per cell the float32 row [com, r_open^2] of the opening test (kernels/tree/build.cu
  `tree_pack`), and `box_accepts`, the test itself in IEEE float32 (kernels/tree/walk.cu `accepted`);
- `walk_kernel(dtype, repulsion, skip_self)`: numba-parallel over groups of consecutive targets: one
  depth-first walk per group against the group's bounding box gives a list of accepted cells and a
  list of opened leaves; both are copied into contiguous structure-of-arrays buffers, then every
  target of the group sums over them in two vectorisable loops (fastmath, like cpu-simd's).

The GPU reproduces `moments`, `opening_rows` and `box_accepts` bit for bit. The numba ones say
fastmath=False: numba then keeps every float32 operation as written, rounded to nearest, with no FMA
contraction and no reassociation (build.cu is compiled with -fmad=false for the same reason; opening_rows
is numpy, elementwise). Said explicitly, because a jitted function that leaves the flag unset inherits its
caller's: `box_accepts`, called from the fastmath walk, was compiled (and cached) with fastmath while it
left it unset.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

MAX_LEVEL = 21  # bits per axis
KEY_CELLS = 1 << MAX_LEVEL  # integer coordinates per axis: [0, 2^21 - 1]
STACK = 8 * (MAX_LEVEL + 2)  # a depth-first walk pushes at most 8 cells per level
# r_open is multiplied by this (1 + 2^-19, exact in float32) before it is squared: 32 float32 units of
# rounding, more than the roundings of r_open and of the test's d_box^2 add up to (opening_rows), so that
# the float32 test accepts no cell that exact arithmetic would open. kernels/tree/build.cu TREE_MAC_SLACK.
MAC_SLACK = np.float32(1.0 + 2.0**-19)


# --- keys ------------------------------------------------------------------------------------------------
@njit(cache=True, inline="always")
def _spread(v):
    """A 21-bit integer (int64) with its bit b moved to bit 3b."""
    v &= 0x1FFFFF
    v = (v | (v << 32)) & 0x1F00000000FFFF
    v = (v | (v << 16)) & 0x1F0000FF0000FF
    v = (v | (v << 8)) & 0x100F00F00F00F00F
    v = (v | (v << 4)) & 0x10C30C30C30C30C3
    v = (v | (v << 2)) & 0x1249249249249249
    return v


@njit(cache=True, inline="always")
def _coord(v, lo, scale):
    """floor((v - lo) * scale) clamped to [0, 2^21 - 1]; NaN -> 0 (never an undefined cast)."""
    f = (v - lo) * scale
    if not f > 0.0:  # NaN, negatives
        return 0
    if f >= KEY_CELLS - 1:
        return KEY_CELLS - 1
    return int(f)


def bounding_cube(xyz: np.ndarray) -> tuple[np.ndarray, float]:
    """(lo, size): the cube [lo, lo + size)^3 the keys are taken over. lo is the per-axis minimum, size
    the largest extent padded by 1e-6 of itself (so the maximum lands below 2^21); a zero or non-finite
    extent (one body, bodies at one point, an infinity) gives size 1 so the keys stay valid."""
    if xyz.shape[0] == 0:
        return np.zeros(3), 1.0
    lo = xyz.min(axis=0).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf: a non-finite extent, handled below
        extent = float((xyz.max(axis=0).astype(np.float64) - lo).max())
    size = extent * (1.0 + 1e-6)
    if not (np.isfinite(size) and size > 0.0):
        size = 1.0
    lo = np.where(np.isfinite(lo), lo, 0.0)
    return lo, size


@njit(parallel=True, cache=True)
def _keys(x, y, z, lo, scale):
    n = x.shape[0]
    ijk = np.empty((n, 3), np.int64)
    key = np.empty(n, np.int64)
    for i in prange(n):
        ix = _coord(x[i], lo[0], scale)
        iy = _coord(y[i], lo[1], scale)
        iz = _coord(z[i], lo[2], scale)
        ijk[i, 0] = ix
        ijk[i, 1] = iy
        ijk[i, 2] = iz
        key[i] = (_spread(ix) << 2) | (_spread(iy) << 1) | _spread(iz)
    return ijk, key


def integer_coords(xyz: np.ndarray, lo: np.ndarray, size: float) -> np.ndarray:
    """(n, 3) int64 coordinates floor((x - lo) / size * 2^21), clamped to [0, 2^21 - 1]; NaN -> 0."""
    xyz = np.asarray(xyz, np.float64)
    return _keys(xyz[:, 0].copy(), xyz[:, 1].copy(), xyz[:, 2].copy(), lo, KEY_CELLS / size)[0]


def morton_keys(xyz: np.ndarray, lo: np.ndarray, size: float) -> np.ndarray:
    """63-bit Morton keys (int64, >= 0) of the rows of xyz in the cube (lo, size): coordinate bit b of
    x, y, z goes to key bit 3b + 2, 3b + 1, 3b."""
    xyz = np.asarray(xyz, np.float64)
    return _keys(xyz[:, 0].copy(), xyz[:, 1].copy(), xyz[:, 2].copy(), lo, KEY_CELLS / size)[1]


def stable_key_order(keys: np.ndarray) -> np.ndarray:
    """The stable argsort of `keys` (equal keys keep their index order), faster than numpy's stable
    sort: numpy's quicksort (vectorised), then each run of equal keys put back in index order."""
    order = np.argsort(keys)
    _order_ties(keys[order], order)
    return order


@njit(cache=True)
def _order_ties(sorted_keys, order):
    n = sorted_keys.shape[0]
    i = 0
    while i < n:
        j = i + 1
        while j < n and sorted_keys[j] == sorted_keys[i]:
            j += 1
        if j - i > 1:
            order[i:j] = np.sort(order[i:j])
        i = j


# --- the tree --------------------------------------------------------------------------------------------
@njit(cache=True)
def _grow(a, cap):
    out = np.empty(cap, a.dtype)
    out[: a.shape[0]] = a
    return out


@njit(cache=True)
def build_tree(keys, leaf):
    """The octree of sorted `keys` (int64), breadth first: per cell (start, count) of its bodies in the
    sorted order, level, key prefix (level * 3 bits), first child and number of children (0: a leaf).
    Returns the six arrays trimmed to the number of cells; cell 0 is the root (level 0, all bodies)."""
    n = keys.shape[0]
    cap = 64 + 4 * (n // max(leaf, 1) + 1)
    start = np.empty(cap, np.int64)
    count = np.empty(cap, np.int64)
    level = np.empty(cap, np.int64)
    prefix = np.empty(cap, np.int64)
    child = np.empty(cap, np.int64)
    nchild = np.empty(cap, np.int64)
    start[0] = 0
    count[0] = n
    level[0] = 0
    prefix[0] = 0
    ncell = 1
    i = 0
    while i < ncell:
        child[i] = -1
        nchild[i] = 0
        if count[i] > leaf and level[i] < MAX_LEVEL:
            if ncell + 8 > cap:
                cap *= 2
                start = _grow(start, cap)
                count = _grow(count, cap)
                level = _grow(level, cap)
                prefix = _grow(prefix, cap)
                child = _grow(child, cap)
                nchild = _grow(nchild, cap)
            shift = 3 * (MAX_LEVEL - 1 - level[i])  # the octant bits of the next level
            j = start[i]
            end = j + count[i]
            child[i] = ncell
            while j < end:
                octant = (keys[j] >> shift) & 7
                k = j + 1
                while k < end and ((keys[k] >> shift) & 7) == octant:
                    k += 1
                start[ncell] = j
                count[ncell] = k - j
                level[ncell] = level[i] + 1
                prefix[ncell] = (prefix[i] << 3) | octant
                ncell += 1
                nchild[i] += 1
                j = k
        i += 1
    return (
        start[:ncell].copy(),
        count[:ncell].copy(),
        level[:ncell].copy(),
        prefix[:ncell].copy(),
        child[:ncell].copy(),
        nchild[:ncell].copy(),
    )


@njit(cache=True, fastmath=False)
def cell_cubes(level, prefix, size):
    """The cells' cubes (key prefixes) in float64: (ncell, 3) geometric centres relative to the key cube's
    corner `lo` (the centre is lo + offset) and (ncell,) side lengths."""
    ncell = level.shape[0]
    offset = np.empty((ncell, 3))
    side = np.empty(ncell)
    for c in range(ncell):
        lv = level[c]
        p = prefix[c]
        ix = 0
        iy = 0
        iz = 0
        for b in range(lv):
            ix |= ((p >> (3 * b + 2)) & 1) << b
            iy |= ((p >> (3 * b + 1)) & 1) << b
            iz |= ((p >> (3 * b)) & 1) << b
        w = size / (1 << lv)
        side[c] = w
        offset[c, 0] = (ix + 0.5) * w
        offset[c, 1] = (iy + 0.5) * w
        offset[c, 2] = (iz + 0.5) * w
    return offset, side


# the refit's tolerance: a body counts as inside its cell's cube when it is at most this fraction of the key
# cube's side outside it (a body on a face may sit an ulp out after the float64 key and offset roundings);
# far below MAC_SLACK's margin (2^-19 of r_open >= 2^-19 side / 1.5 >= 2^-40.6 of the key cube)
REFIT_TOL = 2.0**-46


@njit(cache=True, inline="always")
def points_box(x, y, z, a, b):
    """(lox, loy, loz, hix, hiy, hiz): the bounding box of points [a, b) (b > a) of x, y, z; min / max,
    so exact under any fastmath flags of the caller (a refit's leaf, a walk's group of targets)."""
    lox = hix = x[a]
    loy = hiy = y[a]
    loz = hiz = z[a]
    for i in range(a + 1, b):
        lox = min(lox, x[i])
        hix = max(hix, x[i])
        loy = min(loy, y[i])
        hiy = max(hiy, y[i])
        loz = min(loz, z[i])
        hiz = max(hiz, z[i])
    return lox, loy, loz, hix, hiy, hiz


@njit(cache=True, fastmath=False)
def refit_cubes(x, y, z, start, count, child, nchild, lo, size, offset, side):
    """The refit's opening cubes (docs/tree.md, "Refit"): per cell, its build cube (float64 `offset` from
    `lo` and `side`, `cell_cubes`) grown to hold the cell's current bodies (sorted float32 x, y, z at the
    build's order). Returns (offset, side) as float64 arrays like `cell_cubes`' and the number of cells
    grown. A cell whose bodies all lie within its cube (to REFIT_TOL of the key cube) keeps offset and
    side bit for bit; otherwise its box is the union of the cube and the bodies' bounding box, and its
    new cube is centred on that box with the box's largest extent (plus 2 REFIT_TOL of the key cube) as
    its side, so that every current body lies inside it. The bounding boxes are min / max (exact), bottom
    up: a leaf over its bodies, a parent over its children."""
    ncell = start.shape[0]
    bmin = np.empty((ncell, 3), np.float32)
    bmax = np.empty((ncell, 3), np.float32)
    out_offset = offset.copy()
    out_side = side.copy()
    tol = size * REFIT_TOL
    grown = 0
    for c in range(ncell - 1, -1, -1):
        if count[c] == 0:
            continue
        if nchild[c] == 0:
            lox, loy, loz, hix, hiy, hiz = points_box(x, y, z, start[c], start[c] + count[c])
        else:
            f = child[c]
            lox = bmin[f, 0]
            hix = bmax[f, 0]
            loy = bmin[f, 1]
            hiy = bmax[f, 1]
            loz = bmin[f, 2]
            hiz = bmax[f, 2]
            for k in range(f + 1, f + nchild[c]):
                lox = min(lox, bmin[k, 0])
                hix = max(hix, bmax[k, 0])
                loy = min(loy, bmin[k, 1])
                hiy = max(hiy, bmax[k, 1])
                loz = min(loz, bmin[k, 2])
                hiz = max(hiz, bmax[k, 2])
        bmin[c, 0] = lox
        bmax[c, 0] = hix
        bmin[c, 1] = loy
        bmax[c, 1] = hiy
        bmin[c, 2] = loz
        bmax[c, 2] = hiz
        half = side[c] * 0.5
        out = False
        for a in range(3):  # the bodies' box relative to lo, in float64, against the cube's faces
            if np.float64(bmin[c, a]) - lo[a] < offset[c, a] - half - tol:
                out = True
            if np.float64(bmax[c, a]) - lo[a] > offset[c, a] + half + tol:
                out = True
        if out:
            grown += 1
            w = 0.0
            for a in range(3):
                blo = min(offset[c, a] - half, np.float64(bmin[c, a]) - lo[a])
                bhi = max(offset[c, a] + half, np.float64(bmax[c, a]) - lo[a])
                w = max(w, bhi - blo)
                out_offset[c, a] = (blo + bhi) * 0.5
            out_side[c] = w + 2.0 * tol
    return out_offset, out_side, grown


@njit(cache=True, fastmath=False)
def moments(x, y, z, m, start, count, child, nchild):
    """Bottom-up float32 moments of every cell over the sorted float32 bodies (x, y, z, m): mass, centre of
    mass (the mean position where the mass is 0), traceless quadrupole Q = sum m (3 y y^T - |y|^2 I) about
    the centre of mass as (xx, yy, zz, xy, xz, yz), and the trace sum m |y|^2 of the second moment.
    Leaves sum their bodies (two passes: the centre of mass first); a parent combines its children by the
    parallel-axis theorem.

    float32, operation by operation as kernels/tree/build.cu `cell_moments` (float64 cost a desktop GPU
    1/64 of its rate, per cell every step, and the walk reads float32 rows anyway). The centre of mass is
    summed relative to a reference point inside the cell (the first body, or the first child's centre of
    mass): sum m (x - x0) rounds relative to the cell's extent, where sum m x would round relative to |x|,
    so an off-centre or far-off cloud keeps a centre of mass good to about one float32 unit of |x|.

    Also b_max, a bound on the distance from the centre of mass to the cell's bodies (the `bmax` opening
    test): over a leaf's bodies sqrt of the largest ((dx dx + dy dy) + dz dz), and for a parent the largest
    |com - com_child| + b_max_child over its children (Salmon & Warren 1994's bottom-up bound), float32 in
    that order. Its roundings (a few float32 units) stay under the opening test's MAC_SLACK."""
    ncell = start.shape[0]
    f0 = np.float32(0.0)
    mass = np.zeros(ncell, np.float32)
    com = np.zeros((ncell, 3), np.float32)
    bmax = np.zeros(ncell, np.float32)
    m2 = np.zeros((ncell, 6), np.float32)  # the second moment sum m y y^T about the com: xx yy zz xy xz yz
    q = np.zeros(6, np.float32)
    for c in range(ncell - 1, -1, -1):
        mt = f0
        sx = f0
        sy = f0
        sz = f0
        q[:] = f0
        if nchild[c] == 0:
            s = start[c]
            e = s + count[c]
            x0 = x[s]
            y0 = y[s]
            z0 = z[s]
            for b in range(s, e):
                mt += m[b]
                sx += m[b] * (x[b] - x0)
                sy += m[b] * (y[b] - y0)
                sz += m[b] * (z[b] - z0)
            if mt != f0:
                cx = x0 + sx / mt
                cy = y0 + sy / mt
                cz = z0 + sz / mt
            else:  # massless: the mean position
                sx = f0
                sy = f0
                sz = f0
                for b in range(s, e):
                    sx += x[b] - x0
                    sy += y[b] - y0
                    sz += z[b] - z0
                cx = x0 + sx / np.float32(e - s)
                cy = y0 + sy / np.float32(e - s)
                cz = z0 + sz / np.float32(e - s)
            r2 = f0
            for b in range(s, e):
                dx = x[b] - cx
                dy = y[b] - cy
                dz = z[b] - cz
                r2 = max(r2, (dx * dx + dy * dy) + dz * dz)
                q[0] += m[b] * dx * dx
                q[1] += m[b] * dy * dy
                q[2] += m[b] * dz * dz
                q[3] += m[b] * dx * dy
                q[4] += m[b] * dx * dz
                q[5] += m[b] * dy * dz
            br = np.sqrt(r2)
        else:
            f = child[c]
            x0 = com[f, 0]
            y0 = com[f, 1]
            z0 = com[f, 2]
            for k in range(f, f + nchild[c]):
                mt += mass[k]
                sx += mass[k] * (com[k, 0] - x0)
                sy += mass[k] * (com[k, 1] - y0)
                sz += mass[k] * (com[k, 2] - z0)
            if mt != f0:
                cx = x0 + sx / mt
                cy = y0 + sy / mt
                cz = z0 + sz / mt
            else:  # massless: the mean of the children's centres, weighted by their body counts
                sx = f0
                sy = f0
                sz = f0
                for k in range(f, f + nchild[c]):
                    sx += np.float32(count[k]) * (com[k, 0] - x0)
                    sy += np.float32(count[k]) * (com[k, 1] - y0)
                    sz += np.float32(count[k]) * (com[k, 2] - z0)
                cx = x0 + sx / np.float32(count[c])
                cy = y0 + sy / np.float32(count[c])
                cz = z0 + sz / np.float32(count[c])
            br = f0
            for k in range(f, f + nchild[c]):
                dx = com[k, 0] - cx
                dy = com[k, 1] - cy
                dz = com[k, 2] - cz
                br = max(br, np.sqrt((dx * dx + dy * dy) + dz * dz) + bmax[k])
                mk = mass[k]
                q[0] += m2[k, 0] + mk * dx * dx
                q[1] += m2[k, 1] + mk * dy * dy
                q[2] += m2[k, 2] + mk * dz * dz
                q[3] += m2[k, 3] + mk * dx * dy
                q[4] += m2[k, 4] + mk * dx * dz
                q[5] += m2[k, 5] + mk * dy * dz
        mass[c] = mt
        bmax[c] = br
        com[c, 0] = cx
        com[c, 1] = cy
        com[c, 2] = cz
        for k in range(6):
            m2[c, k] = q[k]
    trace = m2[:, 0] + m2[:, 1] + m2[:, 2]
    quad = np.float32(3.0) * m2
    for k in range(3):
        quad[:, k] -= trace
    return mass, com, quad, trace, bmax


# --- the opening test ------------------------------------------------------------------------------------
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


@njit(cache=True, fastmath=False)
def group_threshold(prev, prow, a, b, rel_scale):
    """A group's relative threshold rel_scale |a|_min (float32) over its members t in [a, b) (prow[t] >= 0,
    the row of prev holding the member's last acceleration: every member, a target or not, so that a span
    of targets gets the full evaluation's lists), |a| = sqrt((x x + y y) + z z) in float32 in this order,
    as kernels/tree/walk.cu's first pass; 0 when it cannot be used (an |a| of 0, as before a first step,
    or no member with a row, or an inf): the group then takes the geometric rows."""
    amin = np.float32(np.inf)
    for t in range(a, b):
        r = prow[t]
        if r >= 0:
            x = np.float32(prev[r, 0])  # (a float64 state holds the walk's float32 values exactly)
            y = np.float32(prev[r, 1])
            z = np.float32(prev[r, 2])
            m = np.sqrt((x * x + y * y) + z * z)
            if m < amin:
                amin = m
    tg = rel_scale * amin
    if tg > np.float32(0.0) and tg < np.float32(np.inf):
        return tg
    return np.float32(0.0)


@njit(cache=True, fastmath=False)
def relative_accepts(lox, loy, loz, hix, hiy, hiz, cx, cy, cz, w, guard2, tg):
    """The relative opening test of a cell (float32 centre of mass, w = M b_max^3 and guard^2 of
    `relative_rows`) for a group's box and threshold tg: d_box^2 > guard^2 and (d^2 d^2) sqrt(d^2) tg >= w,
    in IEEE float32 in this order, as kernels/tree/walk.cu `accepted_relative`."""
    zero = np.float32(0.0)
    dx = max(max(lox - cx, zero), cx - hix)
    dy = max(max(loy - cy, zero), cy - hiy)
    dz = max(max(loz - cz, zero), cz - hiz)
    d2 = (dx * dx + dy * dy) + dz * dz
    if not d2 > guard2:
        return False
    return ((d2 * d2) * np.sqrt(d2)) * tg >= w


@njit(cache=True, fastmath=False)
def box_accepts(lox, loy, loz, hix, hiy, hiz, cx, cy, cz, r2):
    """The opening test of a cell (float32 centre of mass cx, cy, cz and r_open^2) for a group's float32
    box: d_box(com)^2 > r_open^2, in IEEE float32 in this order, as kernels/tree/walk.cu `accepted`. The
    walk that calls it has fastmath, which it would inherit without fastmath=False (then fusing
    dx dx + dy dy into an FMA, tests/test_cpu_tree.py shows). A cell it accepts has its centre of mass
    strictly outside the box (d_box^2 > 0 needs a positive difference on some axis), so no target of the
    group sits on it."""
    zero = np.float32(0.0)
    dx = max(max(lox - cx, zero), cx - hix)
    dy = max(max(loy - cy, zero), cy - hiy)
    dz = max(max(loz - cz, zero), cz - hiz)
    return (dx * dx + dy * dy) + dz * dz > r2


# --- the walk --------------------------------------------------------------------------------------------
def _make_walk(ftype, repulsion: bool, skip_self: bool):
    """The walk for one dtype / model / softening-zero combination (flags are compile-time)."""

    def walk(
        tx,
        ty,
        tz,
        gstart,
        trow,
        child,
        nchild,
        cstart,
        ccount,
        cmac,
        cpack,
        xs,
        ys,
        zs,
        ms,
        eps2,
        g,
        h,
        acc,
        nbody,
        ncells,
        nactive,
        prev,
        prow,
        crel,
        rel_scale,
    ):
        """For each group g of targets [gstart[g], gstart[g+1]) (float32 positions tx, ty, tz; a target
        with trow[t] >= 0 writes acc[trow[t], :3], one with -1 only shapes its group's box): walk the tree
        from the root; a cell is accepted when the squared distance from the group's box to its centre of
        mass exceeds its r_open^2 (`box_accepts` on its row of `cmac`, `opening_rows`), an unaccepted leaf
        is opened (its bodies xs, ys, zs, ms in sorted order are interacted body by body), other cells are
        descended. Records the list lengths per group in nbody / ncells and the targets written in nactive.
        `cpack` holds per cell the interaction's inputs in the walk's dtype (`pack_cells`).

        The relative test (`opening = rel`) when rel_scale > 0: a group whose threshold (`group_threshold`
        over prev[prow[t]], its members' last accelerations) is usable tests its cells with
        `relative_accepts` on their rows of `crel` (`relative_rows`); any other group, and every group when
        rel_scale = 0, tests `cmac`."""
        ngroup = gstart.shape[0] - 1
        ncell_all = cstart.shape[0]
        zero = ftype(0.0)
        one = ftype(1.0)
        half = ftype(0.5)
        third = ftype(1.0 / 3.0)
        for grp in prange(ngroup):
            a = gstart[grp]
            b = gstart[grp + 1]
            active = 0
            for t in range(a, b):
                if trow[t] >= 0:
                    active += 1
            nactive[grp] = active
            if active == 0:
                nbody[grp] = 0
                ncells[grp] = 0
                continue
            lox, loy, loz, hix, hiy, hiz = points_box(tx, ty, tz, a, b)
            tg = group_threshold(prev, prow, a, b, rel_scale) if rel_scale > 0 else np.float32(0.0)
            # depth-first walk: accepted cells and opened leaves, in a fixed order
            cells = np.empty(ncell_all, np.int64)
            leaves = np.empty(ncell_all, np.int64)
            nc = 0
            nl = 0
            nb = 0
            stack = np.empty(STACK, np.int64)
            top = 0
            if ncell_all > 0 and ccount[0] > 0:
                stack[0] = 0
                top = 1
            while top > 0:
                top -= 1
                c = stack[top]
                if tg > 0:
                    take = relative_accepts(
                        lox,
                        loy,
                        loz,
                        hix,
                        hiy,
                        hiz,
                        cmac[c, 0],
                        cmac[c, 1],
                        cmac[c, 2],
                        crel[c, 0],
                        crel[c, 1],
                        tg,
                    )
                else:
                    take = box_accepts(
                        lox, loy, loz, hix, hiy, hiz, cmac[c, 0], cmac[c, 1], cmac[c, 2], cmac[c, 3]
                    )
                if take:
                    cells[nc] = c
                    nc += 1
                elif nchild[c] == 0:
                    leaves[nl] = c
                    nl += 1
                    nb += ccount[c]
                else:
                    first = child[c]
                    for k in range(first + nchild[c] - 1, first - 1, -1):  # popped in child order
                        stack[top] = k
                        top += 1
            nbody[grp] = nb
            ncells[grp] = nc
            # the lists as contiguous structure-of-arrays buffers
            bx = np.empty(nb, ftype)
            by = np.empty(nb, ftype)
            bz = np.empty(nb, ftype)
            bm = np.empty(nb, ftype)
            p = 0
            for li in range(nl):
                c = leaves[li]
                for j in range(cstart[c], cstart[c] + ccount[c]):
                    bx[p] = xs[j]
                    by[p] = ys[j]
                    bz[p] = zs[j]
                    bm[p] = ms[j]
                    p += 1
            qx = np.empty(nc, ftype)
            qy = np.empty(nc, ftype)
            qz = np.empty(nc, ftype)
            qm = np.empty(nc, ftype)
            qxx = np.empty(nc, ftype)
            qyy = np.empty(nc, ftype)
            qzz = np.empty(nc, ftype)
            qxy = np.empty(nc, ftype)
            qxz = np.empty(nc, ftype)
            qyz = np.empty(nc, ftype)
            qtr = np.empty(nc, ftype)
            for ci in range(nc):
                c = cells[ci]
                qx[ci] = cpack[c, 0]
                qy[ci] = cpack[c, 1]
                qz[ci] = cpack[c, 2]
                qm[ci] = cpack[c, 3]
                qxx[ci] = cpack[c, 4]
                qyy[ci] = cpack[c, 5]
                qzz[ci] = cpack[c, 6]
                qxy[ci] = cpack[c, 7]
                qxz[ci] = cpack[c, 8]
                qyz[ci] = cpack[c, 9]
                qtr[ci] = cpack[c, 10]
            for t in range(a, b):
                row = trow[t]
                if row < 0:
                    continue
                xi = ftype(tx[t])
                yi = ftype(ty[t])
                zi = ftype(tz[t])
                ax = zero
                ay = zero
                az = zero
                for j in range(nb):  # body-body: app/model/physics.py's interaction
                    dx = bx[j] - xi
                    dy = by[j] - yi
                    dz = bz[j] - zi
                    s2 = dx * dx + dy * dy + dz * dz + eps2
                    if skip_self:
                        s2 = s2 if s2 > zero else one  # d = 0 there: the term vanishes
                    inv = one / np.sqrt(s2)
                    inv2 = inv * inv
                    w = bm[j] * inv * inv2
                    if repulsion:
                        w *= g - h * inv2
                    ax += w * dx
                    ay += w * dy
                    az += w * dz
                for j in range(nc):  # body-cell: monopole + quadrupole of the softened potential
                    dx = qx[j] - xi
                    dy = qy[j] - yi
                    dz = qz[j] - zi
                    r2 = dx * dx + dy * dy + dz * dz
                    inv = one / np.sqrt(r2 + eps2)
                    inv2 = inv * inv
                    inv3 = inv * inv2
                    inv5 = inv3 * inv2
                    qdx = qxx[j] * dx + qxy[j] * dy + qxz[j] * dz
                    qdy = qxy[j] * dx + qyy[j] * dy + qyz[j] * dz
                    qdz = qxz[j] * dx + qyz[j] * dy + qzz[j] * dz
                    dqd = dx * qdx + dy * qdy + dz * qdz
                    if repulsion:
                        # derivatives of the pair potential g(s): D1 = g'/s, D2 = D1'/s, D3 = D2'/s;
                        # a += M D1 d + D2 (M2 d) + (D2 tr + D3 d.M2.d) d / 2, with M2 = (Q + tr I) / 3
                        inv7 = inv5 * inv2
                        d1 = g * inv3 - h * inv5
                        d2 = ftype(-3.0) * g * inv5 + ftype(5.0) * h * inv7
                        d3 = ftype(15.0) * g * inv7 - ftype(35.0) * h * inv7 * inv2
                        tr = qtr[j]
                        radial = (
                            qm[j] * d1 + d2 * tr * third + half * (d2 * tr + d3 * third * (dqd + tr * r2))
                        )
                        tang = d2 * third
                    else:
                        # the same with g = -1/s (G applied at the end), simplified with r^2 = s^2 - eps^2:
                        # a += (M / s^3 + 5/2 (d.Q.d - eps^2 tr) / s^7) d - Q d / s^5
                        radial = qm[j] * inv3 + ftype(2.5) * inv5 * inv2 * (dqd - qtr[j])
                        tang = -inv5
                    ax += radial * dx + tang * qdx
                    ay += radial * dy + tang * qdy
                    az += radial * dz + tang * qdz
                if repulsion:
                    acc[row, 0] = ax
                    acc[row, 1] = ay
                    acc[row, 2] = az
                else:
                    acc[row, 0] = g * ax
                    acc[row, 1] = g * ay
                    acc[row, 2] = g * az

    model = "repulsion" if repulsion else "gravity"
    suffix = "_eps0" if skip_self else ""
    walk.__name__ = walk.__qualname__ = f"tree_walk_{np.dtype(ftype).name}_{model}{suffix}"
    return walk


def pack_cells(com, mass, quad, trace, dtype, trace_factor: float) -> np.ndarray:
    """(ncell, 12) rows [com x y z, mass, Q xx yy zz xy xz yz, trace_factor * trace, 0] in the walk's
    dtype: one 48-byte row per accepted cell to gather (gravity walks take eps^2 * trace, repulsion the
    trace)."""
    out = np.zeros((mass.shape[0], 12), dtype)
    out[:, 0:3] = com
    out[:, 3] = mass
    out[:, 4:10] = quad
    out[:, 10] = trace * trace_factor
    return out


_WALK = {}


def walk_kernel(dtype, repulsion: bool, skip_self: bool):
    """The compiled (lazily) walk for this combination; scalars eps2, G, H must be of `dtype`."""
    key = (np.dtype(dtype).type, bool(repulsion), bool(skip_self))
    if key not in _WALK:
        _WALK[key] = njit(parallel=True, fastmath=True, cache=True)(_make_walk(*key))
    return _WALK[key]
