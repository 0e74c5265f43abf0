"""How the galaxy generator should get its pull (docs/galaxies.md, "The potential"): the closed forms of
the smooth model (rings and shells, app/model/galaxy_pull.py) against the project's cpu-tree on the drawn
bodies (theta 0.5), at the disk table's points, N = 65,536 and 1,048,576: the time of each and the
relative difference of a_R. Host only (numba); one run per machine.

    .venv/bin/python bench/galaxy_pull.py > bench/results/cpu-DATE-galaxy-pull.txt
"""

import time

import numpy as np

from app.backends.cpu import CPUBackend
from app.engine.forces import Span
from app.model import ics
from app.model.galaxy import Disk, Spheroid, make_galaxy, potential
from app.model.physics import Physics

spec, _ = ics.galaxy_spec(softening=0.02)  # the presets' galaxy (internal ε 0.08)


def main() -> None:
    for n in (65536, 1 << 20):
        counts = (n // 10, 2 * n // 5, n - n // 10 - 2 * n // 5)
        g = make_galaxy(np.random.default_rng(1), counts, spec)
        r_grid = g.potential.r
        t = time.perf_counter()
        pot = potential(
            spec,
            Disk(spec.disk_height, spec.disk_extent),
            Spheroid(spec.bulge_mass, spec.bulge_scale, spec.bulge_radius, r_grid),
            Spheroid(spec.halo_mass, spec.halo_scale, spec.halo_radius, r_grid),
        )
        closed = time.perf_counter() - t
        RR, ZZ = np.meshgrid(pot.table_R, pot.table_z, indexing="ij")
        pts = np.column_stack([RR.ravel(), np.zeros(RR.size), ZZ.ravel()])
        pos4 = np.zeros((n + len(pts), 4), np.float32)
        pos4[:n, :3], pos4[:n, 3] = g.pos, g.mass
        pos4[n:, :3] = pts
        record = CPUBackend.record("cpu-tree")
        ev = record.policy.evaluator(record, Physics(softening=spec.softening))
        ev.set_tunables(theta=0.5)
        acc = np.zeros_like(pos4)
        t = time.perf_counter()
        ev.evaluate(pos4, acc, Span(n, len(pts)), Span(0, n))
        tree = time.perf_counter() - t
        a_R = acc[n:, 0].reshape(RR.shape)
        inside = (RR < 3.0) & (RR > 0.2)
        err = np.abs(a_R / pot.a_R - 1.0)[inside]
        print(
            f"N={n:>9,}: closed forms {closed:.2f} s; cpu-tree on the bodies {tree:.2f} s (build + walk, "
            f"one azimuth); |a_R tree / closed - 1| at 0.2 < R < 3 R_d: median {np.median(err):.4f}, "
            f"90% {np.percentile(err, 90):.4f}, max {err.max():.4f}"
        )


if __name__ == "__main__":
    main()
