"""The softened pull of smooth axisymmetric mass: thin spherical shells and thin coaxial rings.

The galaxy generator (app/model/galaxy.py) takes every velocity from the model's own potential: the
exact pull, with the run's Plummer softening, of the model's density laid out as shells (the spheroids,
and the disk's spherical average) and rings (the disk). Both are closed forms of the Plummer-softened
pair potential -G m / sqrt(d^2 + eps^2), so no particle noise enters the velocities and the cost does not
grow with N. tests/test_galaxy.py checks both against the float64 all-pairs sum over sampled bodies.

Shell of radius s, mass m, seen from radius r (the angle average of the softened kernel):
    Phi = -2 G m / (P + M),  P = sqrt((r + s)^2 + eps^2),  M = sqrt((r - s)^2 + eps^2)
which is -G m / max(r, s) without softening, written without the 1/(r s) that cancels at small r.

Ring of radius R', height z', mass m, seen from (R, z): with A = R^2 + R'^2 + (z - z')^2 + eps^2 and
B = 2 R R', the angle integrals J1 = int (A - B cos t)^(-1/2) dt = 4 K(k) / sqrt(A + B) and
J3 = int (A - B cos t)^(-3/2) dt = 4 E(k) / ((A - B) sqrt(A + B)), k^2 = 2B / (A + B), give
    a_z = -(G m / 2 pi) (z - z') J3,   a_R = (G m / 2 pi) (R' Jc - R J3),   Jc = (A J3 - J1) / B
(Jc = int cos t (A - B cos t)^(-3/2) dt; its series 3 pi B / (2 A^(5/2)) where B << A). K and E come from
the arithmetic-geometric mean (Abramowitz & Stegun 17.6), float64 to round-off.
"""

from __future__ import annotations

import numpy as np

_SERIES_BELOW = 1e-4  # B / A under which Jc takes its series (the difference A J3 - J1 loses digits)


def elliptic_ke(one_minus_m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Complete elliptic integrals K(m) and E(m) (parameter m = k^2) from 1 - m, by the AGM: the ring
    kernel's own scalar routine over an array (tests; the kernel calls it per ring-target pair).

    Taking 1 - m keeps K's logarithmic growth exact where a target sits on a ring (m -> 1)."""
    agm_ke = _compiled()[0]
    pairs = [agm_ke(float(x)) for x in np.asarray(one_minus_m, dtype=np.float64).ravel()]
    return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])


def shell_potential_and_pull(r, shell_r, shell_m, eps: float, chunk: int = 4096):
    """Phi(r) and the radial acceleration a_r(r) (negative: inwards) of shells (radius shell_r, mass
    shell_m), G = 1, softening eps; r and the shells are 1-D arrays."""
    r = np.asarray(r, dtype=np.float64)
    phi = np.empty_like(r)
    a_r = np.empty_like(r)
    s, m = np.asarray(shell_r, np.float64)[None, :], np.asarray(shell_m, np.float64)[None, :]
    e2 = eps * eps
    for lo in range(0, r.size, chunk):
        x = r[lo : lo + chunk, None]
        p = np.sqrt((x + s) ** 2 + e2)
        q = np.sqrt((x - s) ** 2 + e2)
        total = p + q
        phi[lo : lo + chunk] = -2.0 * (m / total).sum(axis=1)
        # d Phi / dr = 2 m ((r + s) / P + (r - s) / M) / (P + M)^2, a_r = -d Phi / dr
        a_r[lo : lo + chunk] = -2.0 * (m * ((x + s) / p + (x - s) / q) / (total * total)).sum(axis=1)
    return phi, a_r


def ring_pull(R, z, ring_R, ring_z, ring_m, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """(a_R, a_z) at the points (R, z) of rings (radius ring_R, height ring_z, mass ring_m), G = 1."""
    R = np.ascontiguousarray(R, dtype=np.float64).ravel()
    z = np.ascontiguousarray(z, dtype=np.float64).ravel()
    a_R = np.empty_like(R)
    a_z = np.empty_like(R)
    _compiled()[1](
        R,
        z,
        np.ascontiguousarray(ring_R, np.float64),
        np.ascontiguousarray(ring_z, np.float64),
        np.ascontiguousarray(ring_m, np.float64) / (2.0 * np.pi),
        float(eps * eps),
        a_R,
        a_z,
    )
    return a_R, a_z


_COMPILED: tuple | None = None


def _compiled():
    """(agm_ke, kernel): K and E by the AGM, and the ring sum as one numba loop calling it (a numpy
    version spends 5 s on 18M ring-target pairs in temporaries; this takes ~0.3 s on one core). Compiled on
    first use, cached on disk like the project's other kernels."""
    global _COMPILED
    if _COMPILED is None:
        from numba import njit

        @njit(cache=True, fastmath=False)
        def agm_ke(one_minus_m):  # pragma: no cover - compiled
            ag = 1.0
            bg = np.sqrt(one_minus_m)
            c2_sum = 0.5 * (1.0 - bg * bg)  # sum of 2^(n-1) c_n^2, from c_0^2 = m (times 1/2)
            power = 0.5
            for _ in range(40):
                c = 0.5 * (ag - bg)
                ag, bg = 0.5 * (ag + bg), np.sqrt(ag * bg)
                power *= 2.0
                c2_sum += power * c * c
                if abs(c) <= 1e-16 * ag:
                    break
            k = np.pi / (2.0 * ag)
            return k, k * (1.0 - c2_sum)

        @njit(cache=True, fastmath=False)
        def kernel(R, z, rr, rz, rm, e2, a_R, a_z):  # pragma: no cover - compiled
            for i in range(R.size):
                x = R[i]
                sum_R = 0.0
                sum_z = 0.0
                for j in range(rr.size):
                    dz = z[i] - rz[j]
                    a = x * x + rr[j] * rr[j] + dz * dz + e2
                    b = 2.0 * x * rr[j]
                    a_minus_b = (x - rr[j]) * (x - rr[j]) + dz * dz + e2
                    k, e = agm_ke(a_minus_b / (a + b))  # 1 - m = (A - B) / (A + B)
                    root = np.sqrt(a + b)
                    j1 = 4.0 * k / root
                    j3 = 4.0 * e / (a_minus_b * root)
                    # Jc = (A J3 - J1) / B loses its digits where B << A: there, its series
                    jc = 1.5 * np.pi * b / a**2.5 if b < _SERIES_BELOW * a else (a * j3 - j1) / b
                    sum_R += rm[j] * (rr[j] * jc - x * j3)
                    sum_z -= rm[j] * dz * j3
                a_R[i] = sum_R
                a_z[i] = sum_z

        _COMPILED = (agm_ke, kernel)
    return _COMPILED
