"""The walk of `cpu-tree` (docs/tree.md, steps 5-7), in numba: `walk_kernel(dtype, repulsion, skip_self)`.

numba-parallel over groups of consecutive targets: one depth-first walk per group against the group's
bounding box gives a list of accepted cells and a list of opened leaves; both are copied into contiguous
structure-of-arrays buffers, then every target of the group sums over them in two vectorisable loops
(fastmath, like cpu-simd's). The GPU's counterpart is kernels/tree/walk.cu.

The opening tests (`box_accepts`, `relative_accepts`, and the relative test's `group_threshold`) are
reproduced by the GPU bit for bit, so they say fastmath=False: numba then keeps every float32 operation as
written, rounded to nearest, with no FMA contraction and no reassociation. Said explicitly, because a
jitted function that leaves the flag unset inherits its caller's: `box_accepts`, called from the fastmath
walk, was compiled (and cached) with fastmath while it left it unset. The walk's own helpers say
inline="always": numba inlines their IR into the walk, which compiles it with the walk's flags, so the
walk's split into them changed no result bit (every model, softening and opening test).

numba's cache of the walk sees edits to this file only: `points_box`, compiled into it, is in
cpu_tree_build.py, so after changing that one delete this folder's __pycache__ (or touch this file).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from app.backends.cpu_tree_build import MAX_LEVEL, points_box

STACK = 8 * (MAX_LEVEL + 2)  # a depth-first walk pushes at most 8 cells per level


# --- the opening tests -----------------------------------------------------------------------------------
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


# --- one group's lists -----------------------------------------------------------------------------------
@njit(cache=True, inline="always")
def _active_targets(trow, a, b):
    """How many of the targets [a, b) write a row (trow[t] >= 0)."""
    active = 0
    for t in range(a, b):
        if trow[t] >= 0:
            active += 1
    return active


@njit(cache=True, inline="always")
def _accepts(lox, loy, loz, hix, hiy, hiz, c, cmac, crel, tg):
    """Whether cell c is accepted for the group's box: the relative test when the group's threshold tg is
    usable (> 0), else the geometric one on the cell's row of cmac."""
    if tg > 0:
        return relative_accepts(
            lox, loy, loz, hix, hiy, hiz, cmac[c, 0], cmac[c, 1], cmac[c, 2], crel[c, 0], crel[c, 1], tg
        )
    return box_accepts(lox, loy, loz, hix, hiy, hiz, cmac[c, 0], cmac[c, 1], cmac[c, 2], cmac[c, 3])


@njit(cache=True, inline="always")
def _walk_lists(lox, loy, loz, hix, hiy, hiz, tg, child, nchild, ccount, cmac, crel):
    """The depth-first walk of one group from the root, in a fixed order: (accepted cells, opened leaves,
    the number of each, the bodies in the opened leaves)."""
    ncell_all = ccount.shape[0]
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
        if _accepts(lox, loy, loz, hix, hiy, hiz, c, cmac, crel, tg):
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
    return cells, leaves, nc, nl, nb


@njit(cache=True, inline="always")
def _gather_bodies(leaves, nl, nb, cstart, ccount, xs, ys, zs, ms, ftype):
    """The bodies of the opened leaves as a contiguous (4, nb) buffer of x, y, z, m rows in `ftype`."""
    bod = np.empty((4, nb), ftype)
    p = 0
    for li in range(nl):
        c = leaves[li]
        for j in range(cstart[c], cstart[c] + ccount[c]):
            bod[0, p] = xs[j]
            bod[1, p] = ys[j]
            bod[2, p] = zs[j]
            bod[3, p] = ms[j]
            p += 1
    return bod


@njit(cache=True, inline="always")
def _gather_cells(cells, nc, cpack, ftype):
    """The accepted cells' rows of cpack (`pack_cells`) as a contiguous (11, nc) buffer, one row per column
    of cpack (com x y z, mass, Q xx yy zz xy xz yz, the trace term)."""
    cel = np.empty((11, nc), ftype)
    for ci in range(nc):
        c = cells[ci]
        for col in range(11):
            cel[col, ci] = cpack[c, col]
    return cel


# --- one target's sums -----------------------------------------------------------------------------------
@njit(cache=True, inline="always")
def _sum_bodies(xi, yi, zi, bod, eps2, g, h, zero, one, repulsion, skip_self):
    """(ax, ay, az) of the body-body terms of the target at (xi, yi, zi): app/model/physics.py's
    interaction, unscaled by G for gravity. `zero` and `one` are the walk's, defined outside its parallel
    loop, which receives them as values: as constants inside the loop, fastmath compiles the unsoftened
    interaction (skip_self) to other roundings than the walk had before its split into these helpers."""
    ax = zero
    ay = zero
    az = zero
    for j in range(bod.shape[1]):
        dx = bod[0, j] - xi
        dy = bod[1, j] - yi
        dz = bod[2, j] - zi
        s2 = dx * dx + dy * dy + dz * dz + eps2
        if skip_self:
            s2 = s2 if s2 > zero else one  # d = 0 there: the term vanishes
        inv = one / np.sqrt(s2)
        inv2 = inv * inv
        w = bod[3, j] * inv * inv2
        if repulsion:
            w *= g - h * inv2
        ax += w * dx
        ay += w * dy
        az += w * dz
    return ax, ay, az


@njit(cache=True, inline="always")
def _sum_cells(ax, ay, az, xi, yi, zi, cel, eps2, g, h, one, half, third, ftype, repulsion):
    """(ax, ay, az) plus the body-cell terms of the target at (xi, yi, zi): monopole + quadrupole of the
    softened potential. `one`, `half` and `third` are the walk's, as `_sum_bodies`' constants."""
    for j in range(cel.shape[1]):
        dx = cel[0, j] - xi
        dy = cel[1, j] - yi
        dz = cel[2, j] - zi
        r2 = dx * dx + dy * dy + dz * dz
        inv = one / np.sqrt(r2 + eps2)
        inv2 = inv * inv
        inv3 = inv * inv2
        inv5 = inv3 * inv2
        qdx = cel[4, j] * dx + cel[7, j] * dy + cel[8, j] * dz
        qdy = cel[7, j] * dx + cel[5, j] * dy + cel[9, j] * dz
        qdz = cel[8, j] * dx + cel[9, j] * dy + cel[6, j] * dz
        dqd = dx * qdx + dy * qdy + dz * qdz
        if repulsion:
            # derivatives of the pair potential g(s): D1 = g'/s, D2 = D1'/s, D3 = D2'/s;
            # a += M D1 d + D2 (M2 d) + (D2 tr + D3 d.M2.d) d / 2, with M2 = (Q + tr I) / 3
            inv7 = inv5 * inv2
            d1 = g * inv3 - h * inv5
            d2 = ftype(-3.0) * g * inv5 + ftype(5.0) * h * inv7
            d3 = ftype(15.0) * g * inv7 - ftype(35.0) * h * inv7 * inv2
            tr = cel[10, j]
            radial = cel[3, j] * d1 + d2 * tr * third + half * (d2 * tr + d3 * third * (dqd + tr * r2))
            tang = d2 * third
        else:
            # the same with g = -1/s (G applied at the end), simplified with r^2 = s^2 - eps^2:
            # a += (M / s^3 + 5/2 (d.Q.d - eps^2 tr) / s^7) d - Q d / s^5
            radial = cel[3, j] * inv3 + ftype(2.5) * inv5 * inv2 * (dqd - cel[10, j])
            tang = -inv5
        ax += radial * dx + tang * qdx
        ay += radial * dy + tang * qdy
        az += radial * dz + tang * qdz
    return ax, ay, az


@njit(cache=True, inline="always")
def _store(acc, row, ax, ay, az, g, repulsion):
    """acc[row, :3] = the sums, times G for gravity (repulsion's sums carry G and H already)."""
    if repulsion:
        acc[row, 0] = ax
        acc[row, 1] = ay
        acc[row, 2] = az
    else:
        acc[row, 0] = g * ax
        acc[row, 1] = g * ay
        acc[row, 2] = g * az


# --- the walk --------------------------------------------------------------------------------------------
def _make_walk(ftype, repulsion: bool, skip_self: bool):
    """The walk for one dtype / model / softening-zero combination (flags are compile-time): `walk_kernel`
    describes it."""

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
        zero = ftype(0.0)
        one = ftype(1.0)
        half = ftype(0.5)
        third = ftype(1.0 / 3.0)
        for grp in prange(gstart.shape[0] - 1):
            a = gstart[grp]
            b = gstart[grp + 1]
            active = _active_targets(trow, a, b)
            nactive[grp] = active
            if active == 0:
                nbody[grp] = 0
                ncells[grp] = 0
                continue
            lox, loy, loz, hix, hiy, hiz = points_box(tx, ty, tz, a, b)
            tg = group_threshold(prev, prow, a, b, rel_scale) if rel_scale > 0 else np.float32(0.0)
            cells, leaves, nc, nl, nb = _walk_lists(
                lox, loy, loz, hix, hiy, hiz, tg, child, nchild, ccount, cmac, crel
            )
            nbody[grp] = nb
            ncells[grp] = nc
            bod = _gather_bodies(leaves, nl, nb, cstart, ccount, xs, ys, zs, ms, ftype)
            cel = _gather_cells(cells, nc, cpack, ftype)
            for t in range(a, b):
                row = trow[t]
                if row >= 0:
                    xi = ftype(tx[t])
                    yi = ftype(ty[t])
                    zi = ftype(tz[t])
                    ax, ay, az = _sum_bodies(xi, yi, zi, bod, eps2, g, h, zero, one, repulsion, skip_self)
                    ax, ay, az = _sum_cells(
                        ax, ay, az, xi, yi, zi, cel, eps2, g, h, one, half, third, ftype, repulsion
                    )
                    _store(acc, row, ax, ay, az, g, repulsion)

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


_WALK: dict[tuple[type, bool, bool], object] = {}


def walk_kernel(dtype, repulsion: bool, skip_self: bool):
    """The compiled (lazily) walk for this combination; scalars eps2, G, H must be of `dtype`.

    walk(tx, ty, tz, gstart, trow, child, nchild, cstart, ccount, cmac, cpack, xs, ys, zs, ms, eps2, g, h,
    acc, nbody, ncells, nactive, prev, prow, crel, rel_scale): for each group g of targets
    [gstart[g], gstart[g+1]) (float32 positions tx, ty, tz; a target with trow[t] >= 0 writes
    acc[trow[t], :3], one with -1 only shapes its group's box): walk the tree from the root; a cell is
    accepted when the squared distance from the group's box to its centre of mass exceeds its r_open^2
    (`box_accepts` on its row of `cmac`, `opening_rows`), an unaccepted leaf is opened (its bodies xs, ys,
    zs, ms in sorted order are interacted body by body), other cells are descended. Records the list
    lengths per group in nbody / ncells and the targets written in nactive. `cpack` holds per cell the
    interaction's inputs in the walk's dtype (`pack_cells`).

    The relative test (`opening = rel`) when rel_scale > 0: a group whose threshold (`group_threshold`
    over prev[prow[t]], its members' last accelerations) is usable tests its cells with
    `relative_accepts` on their rows of `crel` (`relative_rows`); any other group, and every group when
    rel_scale = 0, tests `cmac`."""
    key = (np.dtype(dtype).type, bool(repulsion), bool(skip_self))
    if key not in _WALK:
        _WALK[key] = njit(parallel=True, fastmath=True, cache=True)(_make_walk(*key))
    return _WALK[key]
