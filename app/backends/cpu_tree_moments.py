"""The cells' moments of `cpu-tree`'s octree (docs/tree.md, step 4), in numba: `moments`, bottom up.

float32, the GPU's operations in the GPU's order (kernels/tree/build.cu `cell_moments`), which reproduces
them bit for bit. The kernels say fastmath=False: numba then keeps every float32 operation as written,
rounded to nearest, with no FMA contraction and no reassociation (build.cu is compiled with -fmad=false
for the same reason); each helper says so too, as a jitted function that leaves the flag unset inherits
its caller's.

`moments` runs in two passes, the leaves over their bodies, then the other cells bottom up over their
children: a cell's values depend on its own bodies or children only, so the order changes no result. A
pass is one call: helpers called per cell (inlined or not) made `moments` 1.3 to 2 times slower at
N = 65,536 and 262,144 (likely the reference counts of the arrays passed on each call).
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, fastmath=False)
def _leaf_moments(x, y, z, m, start, count, nchild, mass, com, bmax, m2):
    """The leaves' mass, com, b_max and second moment m2 (xx yy zz xy xz yz) over their bodies, in two passes:
    the centre of mass first, sum m (x - x0) / M about the first body x0 (the mean position where the mass
    is 0), then the second moment about it and b_max, sqrt of the largest ((dx dx + dy dy) + dz dz)."""
    f0 = np.float32(0.0)
    q = np.zeros(6, np.float32)
    for c in range(start.shape[0]):
        if nchild[c] != 0:
            continue
        mt = f0
        sx = f0
        sy = f0
        sz = f0
        q[:] = f0
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
        _store_cell(c, mt, cx, cy, cz, np.sqrt(r2), q, mass, com, bmax, m2)


@njit(cache=True, fastmath=False)
def _parent_moments(count, child, nchild, mass, com, bmax, m2):
    """The other cells' mass, com, b_max and m2, bottom up (a child's index is above its parent's) from their
    children's: the centre of mass about the first child's (where the mass is 0, the mean of the children's
    centres weighted by their body counts), the second moments by the parallel-axis theorem, and b_max the
    largest |com - com_child| + b_max_child."""
    f0 = np.float32(0.0)
    q = np.zeros(6, np.float32)
    for c in range(count.shape[0] - 1, -1, -1):
        if nchild[c] == 0:
            continue
        mt = f0
        sx = f0
        sy = f0
        sz = f0
        q[:] = f0
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
        _store_cell(c, mt, cx, cy, cz, br, q, mass, com, bmax, m2)


@njit(cache=True, fastmath=False, inline="always")
def _store_cell(c, mt, cx, cy, cz, br, q, mass, com, bmax, m2):
    """Cell c's mass, centre of mass, b_max and second moment q, into the arrays."""
    mass[c] = mt
    bmax[c] = br
    com[c, 0] = cx
    com[c, 1] = cy
    com[c, 2] = cz
    for k in range(6):
        m2[c, k] = q[k]


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
    mass = np.zeros(ncell, np.float32)
    com = np.zeros((ncell, 3), np.float32)
    bmax = np.zeros(ncell, np.float32)
    m2 = np.zeros((ncell, 6), np.float32)  # the second moment sum m y y^T about the com: xx yy zz xy xz yz
    _leaf_moments(x, y, z, m, start, count, nchild, mass, com, bmax, m2)  # (a leaf needs no other cell)
    _parent_moments(count, child, nchild, mass, com, bmax, m2)
    trace = m2[:, 0] + m2[:, 1] + m2[:, 2]
    quad = np.float32(3.0) * m2
    for k in range(3):
        quad[:, k] -= trace
    return mass, com, quad, trace, bmax
