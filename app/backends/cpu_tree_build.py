"""The build of `cpu-tree`'s octree (docs/tree.md, steps 1-3, and the refit's cubes), in numba.

- `morton_keys` (numpy): 21 bits per axis, interleaved x|y|z from the top (x takes bit 3b+2, y 3b+1,
  z 3b of the key for coordinate bit b), 63 bits in all, held in int64 (non-negative);
- `stable_key_order`: the sort of the keys, ties in index order;
- `build_tree`: the octree of the sorted keys, breadth first; cells are key prefixes of 3 bits per
  level, a cell with <= `leaf` bodies or at level 21 is a leaf; children of a cell are contiguous;
- `cell_cubes`: the cells' cubes, in float64;
- `refit_cubes`: between rebuilds, the build's cell cubes grown to hold the cells' current bodies (the
  refit keeps the topology and recomputes the moments and the opening rows from them: docs/tree.md).

The GPU's counterpart is kernels/tree/build.cu. `points_box` is also the walk's (cpu_tree_walk.py).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

MAX_LEVEL = 21  # bits per axis
KEY_CELLS = 1 << MAX_LEVEL  # integer coordinates per axis: [0, 2^21 - 1]


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
