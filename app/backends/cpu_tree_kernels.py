"""The numba kernels of `cpu-tree` (imports numba; `cpu_tree.py` imports this module lazily).

The algorithm, step by step, is specified in docs/tree.md; this module is its CPU implementation:

- `morton_keys` (numpy): 21 bits per axis, interleaved x|y|z from the top (x takes bit 3b+2, y 3b+1,
  z 3b of the key for coordinate bit b), 63 bits in all, held in int64 (non-negative);
- `build_tree`: the octree of the sorted keys, breadth first; cells are key prefixes of 3 bits per
  level, a cell with <= `leaf` bodies or at level 21 is a leaf; children of a cell are contiguous;
- `moments`: mass, centre of mass, traceless quadrupole and trace of the second moment, bottom up,
  in float64;
- `walk_kernel(dtype, repulsion, skip_self)`: numba-parallel over groups of consecutive targets: one
  depth-first walk per group against the group's bounding box gives a list of accepted cells and a
  list of opened leaves; both are copied into contiguous structure-of-arrays buffers, then every
  target of the group sums over them in two vectorisable loops (fastmath, like cpu-simd's).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

MAX_LEVEL = 21  # bits per axis
KEY_CELLS = 1 << MAX_LEVEL  # integer coordinates per axis: [0, 2^21 - 1]
STACK = 8 * (MAX_LEVEL + 2)  # a depth-first walk pushes at most 8 cells per level


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
    out[:a.shape[0]] = a
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
    return (start[:ncell].copy(), count[:ncell].copy(), level[:ncell].copy(), prefix[:ncell].copy(),
            child[:ncell].copy(), nchild[:ncell].copy())


@njit(cache=True)
def cell_centres(level, prefix, lo, size):
    """(ncell, 3) float64 geometric centres and (ncell,) side lengths of the cells (key prefixes)."""
    ncell = level.shape[0]
    centre = np.empty((ncell, 3))
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
        centre[c, 0] = lo[0] + (ix + 0.5) * w
        centre[c, 1] = lo[1] + (iy + 0.5) * w
        centre[c, 2] = lo[2] + (iz + 0.5) * w
    return centre, side


@njit(cache=True)
def moments(x, y, z, m, start, count, child, nchild):
    """Bottom-up float64 moments of every cell over the sorted bodies (x, y, z, m): mass, centre of mass
    (the mean position where the mass is 0), traceless quadrupole Q = sum m (3 y y^T - |y|^2 I) about the
    centre of mass as (xx, yy, zz, xy, xz, yz), and the trace sum m |y|^2 of the second moment.
    Leaves sum their bodies (two passes: the centre of mass first); a parent combines its children by the
    parallel-axis theorem."""
    ncell = start.shape[0]
    mass = np.zeros(ncell)
    com = np.zeros((ncell, 3))
    m2 = np.zeros((ncell, 6))  # the second moment sum m y y^T about the com: xx yy zz xy xz yz
    for c in range(ncell - 1, -1, -1):
        if nchild[c] == 0:
            s = start[c]
            e = s + count[c]
            mt = 0.0
            sx = 0.0
            sy = 0.0
            sz = 0.0
            for b in range(s, e):
                mt += m[b]
                sx += m[b] * x[b]
                sy += m[b] * y[b]
                sz += m[b] * z[b]
            if mt != 0.0:
                cx = sx / mt
                cy = sy / mt
                cz = sz / mt
            else:
                cx = 0.0
                cy = 0.0
                cz = 0.0
                for b in range(s, e):
                    cx += x[b]
                    cy += y[b]
                    cz += z[b]
                if e > s:
                    cx /= e - s
                    cy /= e - s
                    cz /= e - s
            q = np.zeros(6)
            for b in range(s, e):
                dx = x[b] - cx
                dy = y[b] - cy
                dz = z[b] - cz
                q[0] += m[b] * dx * dx
                q[1] += m[b] * dy * dy
                q[2] += m[b] * dz * dz
                q[3] += m[b] * dx * dy
                q[4] += m[b] * dx * dz
                q[5] += m[b] * dy * dz
        else:
            f = child[c]
            mt = 0.0
            sx = 0.0
            sy = 0.0
            sz = 0.0
            for k in range(f, f + nchild[c]):
                mt += mass[k]
                sx += mass[k] * com[k, 0]
                sy += mass[k] * com[k, 1]
                sz += mass[k] * com[k, 2]
            if mt != 0.0:
                cx = sx / mt
                cy = sy / mt
                cz = sz / mt
            else:  # massless: the mean of the children's centres, weighted by their body counts
                cx = 0.0
                cy = 0.0
                cz = 0.0
                for k in range(f, f + nchild[c]):
                    cx += count[k] * com[k, 0]
                    cy += count[k] * com[k, 1]
                    cz += count[k] * com[k, 2]
                cx /= count[c]
                cy /= count[c]
                cz /= count[c]
            q = np.zeros(6)
            for k in range(f, f + nchild[c]):
                dx = com[k, 0] - cx
                dy = com[k, 1] - cy
                dz = com[k, 2] - cz
                mk = mass[k]
                q[0] += m2[k, 0] + mk * dx * dx
                q[1] += m2[k, 1] + mk * dy * dy
                q[2] += m2[k, 2] + mk * dz * dz
                q[3] += m2[k, 3] + mk * dx * dy
                q[4] += m2[k, 4] + mk * dx * dz
                q[5] += m2[k, 5] + mk * dy * dz
        mass[c] = mt
        com[c, 0] = cx
        com[c, 1] = cy
        com[c, 2] = cz
        for k in range(6):
            m2[c, k] = q[k]
    trace = m2[:, 0] + m2[:, 1] + m2[:, 2]
    quad = 3.0 * m2
    for k in range(3):
        quad[:, k] -= trace
    return mass, com, quad, trace


# --- the walk --------------------------------------------------------------------------------------------
def _make_walk(ftype, repulsion: bool, skip_self: bool):
    """The walk for one dtype / model / softening-zero combination (flags are compile-time)."""

    def walk(tx, ty, tz, gstart, trow, child, nchild, cstart, ccount, ccom, crmac2, cpack,
             xs, ys, zs, ms, eps2, g, h, acc, nbody, ncells, nactive):
        """For each group g of targets [gstart[g], gstart[g+1]) (positions tx, ty, tz in float64; a target
        with trow[t] >= 0 writes acc[trow[t], :3], one with -1 only shapes its group's box): walk the tree
        from the root; a cell is accepted when the squared distance from the group's box to its centre of
        mass exceeds crmac2 (= (side / theta + |com - centre|)^2), an unaccepted leaf is opened (its bodies
        xs, ys, zs, ms in sorted order are interacted body by body), other cells are descended. Records the
        list lengths per group in nbody / ncells and the targets written in nactive. `cpack` holds per cell
        the interaction's inputs in the walk's dtype (`pack_cells`), `ccom` the float64 centres of mass of
        the opening test."""
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
            lox = tx[a]
            hix = tx[a]
            loy = ty[a]
            hiy = ty[a]
            loz = tz[a]
            hiz = tz[a]
            for t in range(a + 1, b):
                lox = min(lox, tx[t])
                hix = max(hix, tx[t])
                loy = min(loy, ty[t])
                hiy = max(hiy, ty[t])
                loz = min(loz, tz[t])
                hiz = max(hiz, tz[t])
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
                cx = ccom[c, 0]
                cy = ccom[c, 1]
                cz = ccom[c, 2]
                dx = max(lox - cx, 0.0, cx - hix)
                dy = max(loy - cy, 0.0, cy - hiy)
                dz = max(loz - cz, 0.0, cz - hiz)
                if dx * dx + dy * dy + dz * dz > crmac2[c]:
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
                for j in range(nb):  # body-body: app/physics.py's interaction
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
                        radial = qm[j] * d1 + d2 * tr * third + half * (d2 * tr + d3 * third * (dqd + tr*r2))
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
