"""The numba kernels behind the `cpu` backend (imports numba; `cpu.py` imports this module lazily).

The force kernel is the CUDA Handbook's "multithreaded SIMD CPU" N-body variant, written for the force
seam (app/engine/forces.py): it takes the rows of the targets and the rows of the sources, so any range of
bodies can be evaluated against any other. `prange` over targets spreads them over the cores, and the
inner loop over sources reads structure-of-arrays copies of the sources' x, y, z and m so that LLVM
vectorises it (with fastmath it also vectorises the three sums). Reading the (N, 4) array directly in the
inner loop defeats the vectoriser: 0.8 instead of 7 G interactions/s on 2 cores. Each target's sum runs
over the sources in the same order whatever the range of targets, so a slice of targets gets bitwise the
rows of the full evaluation (tests/test_force_seam.py).

The interaction is the one of app/model/physics.py's docstring, s² = r² + ε², d = x_j - x_i:
    gravity:            a_i += G m_j d / s³
    gravity-repulsion:  a_i += m_j d (G / s³ - H / s⁵)
Each (dtype, fastmath, model, ε = 0) combination is its own compiled function (`accel_kernel`), so that
neither the softened path nor pure gravity pays for a branch it does not need. With ε = 0 the self term
(and any exact coincidence) would be 0/0; its s² is replaced by 1 before the rsqrt, which is harmless
because d = 0.

Each target's sum is two-level, as in the CUDA kernels (kernels/common.cuh, "Two-level accumulation"): a
partial sum per tile of SOURCE_TILE sources, each started from zero, added to the total. One float32
running sum over all N sources drops every term below half its ulp: in bench/realn.sh's collision at
N = 81,920 this kernel without fastmath gave the H200's pair-matrix and streams-remainder figures to
every printed digit (max relative error 1.657e-3, p99 1.264e-3, rms 3.898e-4: most of the secondary
galaxy's pull on the primary's inner bodies lost); with tiles 7.8e-7.
fastmath vectorises the tile loop (its lanes are partial sums too: 2.3e-5 there before the tiles, 6.3e-7
with them); the tiles cost it 0-4% (one thread, process time, N = 1,000 to 65,536).

Kernels compile lazily on first call and are cached on disk (`cache=True`). A closure's cache key
includes its captured values but not the compile flags, so each specialisation has its own name.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit, prange

SOURCE_TILE = 1024  # sources per partial sum, as NBODY_PARTIAL_LEN in kernels/common.cuh


def _make_accel(ftype, fastmath: bool, repulsion: bool, skip_self: bool):
    """The force kernel for one dtype / model / softening-zero combination (flags are compile-time)."""

    def accel(targets, sources, eps2, g, h, acc):
        """acc[i, :3] = the acceleration of targets[i] due to every row of sources; both are (n, 4)
        [x, y, z, m] and acc is (len(targets), >=3)."""
        nj = sources.shape[0]
        zero = ftype(0.0)
        one = ftype(1.0)
        xs = np.empty(nj, dtype=ftype)
        ys = np.empty(nj, dtype=ftype)
        zs = np.empty(nj, dtype=ftype)
        ms = np.empty(nj, dtype=ftype)
        for j in range(nj):
            xs[j] = sources[j, 0]
            ys[j] = sources[j, 1]
            zs[j] = sources[j, 2]
            ms[j] = sources[j, 3]
        for i in prange(targets.shape[0]):
            xi = targets[i, 0]
            yi = targets[i, 1]
            zi = targets[i, 2]
            ax = zero
            ay = zero
            az = zero
            # A partial sum per tile, then the total. Both loops counted from 0: ranges with a start or
            # a step here defeat the vectoriser (3x slower).
            for t in range((nj + SOURCE_TILE - 1) // SOURCE_TILE):
                base = t * SOURCE_TILE
                px = zero
                py = zero
                pz = zero
                for jj in range(min(SOURCE_TILE, nj - base)):
                    j = base + jj
                    dx = xs[j] - xi
                    dy = ys[j] - yi
                    dz = zs[j] - zi
                    s2 = dx * dx + dy * dy + dz * dz + eps2
                    if skip_self:
                        s2 = s2 if s2 > zero else one  # d = 0 there: the term vanishes
                    inv = one / np.sqrt(s2)
                    inv2 = inv * inv
                    w = ms[j] * inv * inv2  # m / s³
                    if repulsion:
                        w *= g - h * inv2  # m (G / s³ - H / s⁵)
                    px += w * dx
                    py += w * dy
                    pz += w * dz
                ax += px
                ay += py
                az += pz
            if repulsion:
                acc[i, 0] = ax
                acc[i, 1] = ay
                acc[i, 2] = az
            else:
                acc[i, 0] = g * ax
                acc[i, 1] = g * ay
                acc[i, 2] = g * az

    model = "repulsion" if repulsion else "gravity"
    suffix = ("_eps0" if skip_self else "") + ("_fast" if fastmath else "")
    accel.__name__ = accel.__qualname__ = f"accel_{np.dtype(ftype).name}_{model}{suffix}"
    return accel


_ACCEL: dict[tuple[type, bool, bool, bool], Any] = {}  # (dtype, fastmath, repulsion, skip_self) -> kernel


def accel_kernel(dtype, fastmath: bool, repulsion: bool, skip_self: bool):
    """The compiled (lazily, on first call) force kernel for this combination.

    Call it as `kernel(targets4, sources4, eps2, G, H, acc)` with scalars of `dtype` (np.float32: a
    Python float would promote the arithmetic to float64). fastmath lets LLVM vectorise the reductions
    and use a fast reciprocal square root; without it the sums are sequential IEEE arithmetic.
    """
    key = (np.dtype(dtype).type, bool(fastmath), bool(repulsion), bool(skip_self))
    if key not in _ACCEL:
        _ACCEL[key] = njit(parallel=True, fastmath=key[1], cache=True)(_make_accel(*key))
    return _ACCEL[key]


# --- Newton's third law over pair tiles (`cpu-n3l`, the CPU twin of atomics-n3l's pair split) ----------
def _make_pairs(repulsion: bool, skip_self: bool):
    """The pair-tile kernel (float64, sequential: every pair adds to both bodies, so threads would race)."""

    def pairs(pos, acc, ti, tj, chunk, lo, hi, eps2, g, h):
        """acc[:, :3] += the interactions of the tasks [lo, hi) of app.parallel.decomposition.PairTiles(n, ti,
        tj, chunk): task w is i-tile w // chunks_per_row against `chunk` j-tiles from its diagonal on; a
        j-tile inside the i-tile adds to the i side only, one right of it to both bodies (the reaction).
        Gravity is scaled by G at the end of each pair (as the GPU kernel scales at its atomics)."""
        n = pos.shape[0]
        r = ti // tj
        ntj = (n + tj - 1) // tj
        cpr = (ntj + chunk - 1) // chunk
        scale = 1.0 if repulsion else g
        for w in range(lo, hi):
            row = w // cpr
            t0 = row * r + (w - row * cpr) * chunk
            t1 = min(t0 + chunk, ntj)
            for i in range(row * ti, min((row + 1) * ti, n)):
                xi = pos[i, 0]
                yi = pos[i, 1]
                zi = pos[i, 2]
                mi = pos[i, 3]
                for jt in range(t0, t1):
                    both = jt >= (row + 1) * r
                    for j in range(jt * tj, min((jt + 1) * tj, n)):
                        dx = pos[j, 0] - xi
                        dy = pos[j, 1] - yi
                        dz = pos[j, 2] - zi
                        s2 = dx * dx + dy * dy + dz * dz + eps2
                        if skip_self and s2 == 0.0:
                            continue  # d = 0: the term vanishes
                        inv = 1.0 / np.sqrt(s2)
                        inv2 = inv * inv
                        f = inv * inv2
                        if repulsion:
                            f *= g - h * inv2
                        f *= scale
                        acc[i, 0] += pos[j, 3] * f * dx
                        acc[i, 1] += pos[j, 3] * f * dy
                        acc[i, 2] += pos[j, 3] * f * dz
                        if both:
                            acc[j, 0] -= mi * f * dx
                            acc[j, 1] -= mi * f * dy
                            acc[j, 2] -= mi * f * dz

    model = "repulsion" if repulsion else "gravity"
    pairs.__name__ = pairs.__qualname__ = f"n3l_pairs_float64_{model}{'_eps0' if skip_self else ''}"
    return pairs


_PAIRS: dict[tuple[bool, bool], Any] = {}  # (repulsion, skip_self) -> kernel (numba dispatchers: Any)


def pairs_kernel(repulsion: bool, skip_self: bool):
    """The compiled (lazily) pair-tile kernel: `kernel(pos4, acc4, ti, tj, chunk, lo, hi, eps2, G, H)`."""
    key = (bool(repulsion), bool(skip_self))
    if key not in _PAIRS:  # nogil: the slices of several CPU devices run at once from their threads
        _PAIRS[key] = njit(cache=True, nogil=True)(_make_pairs(*key))
    return _PAIRS[key]


# --- integrators (O(N), memory bound: no fastmath needed) -------------------------------------------
# One compiled function per kernel, specialised by numba on the state's dtype. Scalars must be passed
# with the state's dtype. `speed` is always float32: it feeds the renderer's speed buffer.


@njit(parallel=True, cache=True)
def kick_drift(pos, vel, acc, half_dt, dt):
    """Leapfrog's first half: v += a dt/2; x += v dt."""
    for i in prange(pos.shape[0]):
        for k in range(3):
            v = vel[i, k] + half_dt * acc[i, k]
            vel[i, k] = v
            pos[i, k] = pos[i, k] + dt * v


@njit(parallel=True, cache=True)
def kick(vel, acc, half_dt, speed):
    """Leapfrog's closing half kick v += a dt/2, writing |v| into `speed`."""
    for i in prange(vel.shape[0]):
        vx = vel[i, 0] + half_dt * acc[i, 0]
        vy = vel[i, 1] + half_dt * acc[i, 1]
        vz = vel[i, 2] + half_dt * acc[i, 2]
        vel[i, 0] = vx
        vel[i, 1] = vy
        vel[i, 2] = vz
        speed[i] = np.sqrt(vx * vx + vy * vy + vz * vz)


@njit(parallel=True, cache=True)
def euler_damped(pos, vel, acc, dt, damping, speed):
    """The CUDA samples' integrateBodies: v = (v + a dt) · damping; x += v dt; |v| into `speed`."""
    for i in prange(pos.shape[0]):
        vx = (vel[i, 0] + dt * acc[i, 0]) * damping
        vy = (vel[i, 1] + dt * acc[i, 1]) * damping
        vz = (vel[i, 2] + dt * acc[i, 2]) * damping
        vel[i, 0] = vx
        vel[i, 1] = vy
        vel[i, 2] = vz
        pos[i, 0] = pos[i, 0] + dt * vx
        pos[i, 1] = pos[i, 1] + dt * vy
        pos[i, 2] = pos[i, 2] + dt * vz
        speed[i] = np.sqrt(vx * vx + vy * vy + vz * vz)
