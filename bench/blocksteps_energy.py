"""Block against shared time steps at the same η, on the float64 reference (docs/blocksteps.md cites the
output): max |dE/E| over the max steps, the active targets evaluated, the levels at the end.

    .venv/bin/python bench/blocksteps_energy.py > bench/results/cpu-DATE-blocksteps-energy.txt

"shared" is every body at the finest level any body wants (app.blocksteps mode "shared"); forces are the
numba float64 direct sum of the active rows (app.backends.cpu.exact_rows).
"""

from __future__ import annotations

import copy
import time

import numpy as np

from app.backends.cpu import exact_rows
from app.blocksteps import BlockSteps, NumpyBlockOps
from app.ics import generate
from app.physics import Physics, total_energy

# (scene, N, seed, dt_max, L, η, ε, max steps)
CASES = (
    ("plummer", 2048, 3, 1 / 32, 8, 0.01, 0.001, 16),  # tests/test_blocksteps.py's case
    ("plummer", 2048, 3, 1 / 16, 6, 0.01, 0.01, 16),
    ("plummer", 2048, 3, 1 / 16, 6, 0.025, 0.01, 16),
    ("collision", 2048, 3, 1 / 32, 6, 0.01, 0.01, 16),
    ("collision", 4096, 3, 1 / 16, 8, 0.02, 0.001, 16),
)


def fast_rows(pos, mass, physics, rows):
    pos4 = np.empty((pos.shape[0], 4))
    pos4[:, :3], pos4[:, 3] = pos, mass
    return exact_rows(pos4, rows, physics)


def run(bodies, physics, L, eta, mode, steps):
    bodies = copy.deepcopy(bodies)
    e0 = total_energy(bodies, physics)
    ops = NumpyBlockOps(bodies, physics, fast_rows)
    sched = BlockSteps(physics, L, eta=eta, mode=mode)
    worst = 0.0
    for _ in range(steps):
        sched.max_step(ops)
        worst = max(worst, abs(total_energy(bodies, physics) - e0) / abs(e0))
    return worst, sched


def main() -> None:
    print("scene N seed dt_max L eta eps steps | mode max|dE/E| active_targets levels_at_end | seconds")
    for scene, n, seed, dt, L, eta, eps, steps in CASES:
        bodies = generate(scene, n, seed)
        physics = Physics(dt=dt, softening=eps)
        out = {}
        for mode in ("block", "shared"):
            t = time.perf_counter()
            out[mode] = run(bodies, physics, L, eta, mode, steps)
            de, sched = out[mode]
            print(f"{scene} {n} {seed} {dt:g} {L} {eta:g} {eps:g} {steps} | {mode} {de:.3e} "
                  f"{sched.total.targets:,} {sched.histogram().tolist()} | {time.perf_counter() - t:.1f}")
        (b_de, b), (s_de, s) = out["block"], out["shared"]
        print(f"  -> energy block/shared {b_de / s_de:.2f}x, forces shared/block "
              f"{s.total.targets / b.total.targets:.2f}x")


if __name__ == "__main__":
    main()
