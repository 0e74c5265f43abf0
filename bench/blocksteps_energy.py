"""Block against shared time steps at the same η and criterion, on the float64 reference (docs/blocksteps.md
cites the output): max |dE/E| over the max steps, the active targets evaluated, the levels at the end.

    .venv/bin/python bench/blocksteps_energy.py [--criteria gadget,tidal] [--cases 0,1,2,3,4] \
        [--coarsen boundary,aligned] [--forces exact,tree] > bench/results/cpu-DATE-blocksteps-criteria.txt

"shared" is every body at the finest level any body wants (app.engine.blocksteps mode "shared"); forces are
the numba float64 direct sum of the active rows (app.backends.cpu_forces.exact_rows), or with --forces tree
the CPU twin's cpu-tree (TreeBlockOps: θ 0.5, a build every evaluation; criterion gadget only). --coarsen:
when a level may get coarser (app.engine.blocksteps.relevel); the files of 2026-11-26 before the option were
made under "aligned", the scheduler's rule then.
"""

from __future__ import annotations

import argparse
import copy
import os
import subprocess
import sys
import time

import numpy as np

from app.backends.blocksteps_ops import NumpyBlockOps, TreeBlockOps
from app.backends.cpu_forces import cpu_name, exact_rows
from app.engine.blocksteps import CRITERIA, BlockSteps
from app.model.config import COARSEN
from app.model.ics import generate
from app.model.physics import Physics, total_energy

# (scene, N, seed, dt_max, L, η, ε, max steps)
CASES = (
    ("plummer", 2048, 3, 1 / 32, 8, 0.01, 0.001, 16),  # tests/test_blocksteps.py's case
    ("plummer", 2048, 3, 1 / 16, 6, 0.01, 0.01, 16),
    ("plummer", 2048, 3, 1 / 16, 6, 0.025, 0.01, 16),
    ("collision", 2048, 3, 1 / 32, 6, 0.01, 0.01, 16),
    ("collision", 4096, 3, 1 / 16, 8, 0.02, 0.001, 16),
    ("collision", 4096, 5, 1 / 16, 6, 0.01, 0.01, 16),  # the 1M GPU run's parameters (blocksteps_gpu.py)
    ("collision", 8192, 5, 1 / 16, 6, 0.01, 0.01, 16),
    ("collision", 8192, 5, 1 / 16, 6, 0.01, 0.01, 32),  # 2 time units, as the 1M GPU run: the merger too
)


def fast_rows(pos, mass, physics, rows):
    pos4 = np.empty((pos.shape[0], 4))
    pos4[:, :3], pos4[:, 3] = pos, mass
    return exact_rows(pos4, rows, physics)


def run(bodies, physics, L, eta, mode, steps, criterion="gadget", coarsen="boundary", forces="exact"):
    bodies = copy.deepcopy(bodies)
    e0 = total_energy(bodies, physics)
    if forces == "tree":
        ops = TreeBlockOps(bodies, physics)
        bodies = ops.bodies
    else:
        ops = NumpyBlockOps(bodies, physics, fast_rows, tidal=criterion == "tidal")
    sched = BlockSteps(physics, L, eta=eta, mode=mode, criterion=criterion, coarsen=coarsen)
    worst = 0.0
    for _ in range(steps):
        sched.max_step(ops)
        worst = max(worst, abs(total_energy(bodies, physics) - e0) / abs(e0))
    return worst, sched


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--criteria", default=",".join(CRITERIA), help="comma-separated: " + ", ".join(CRITERIA))
    ap.add_argument("--cases", default=",".join(map(str, range(len(CASES)))), help="indices into CASES")
    ap.add_argument("--coarsen", default=COARSEN[0], help="comma-separated: " + ", ".join(COARSEN))
    ap.add_argument(
        "--forces",
        default="exact",
        help="comma-separated: exact (float64 direct sum), tree (cpu-tree, criterion gadget)",
    )
    args = ap.parse_args()
    rules, kinds = args.coarsen.split(","), args.forces.split(",")
    if (
        any(r not in COARSEN for r in rules)
        or any(f not in ("exact", "tree") for f in kinds)
        or ("tree" in kinds and args.criteria != "gadget")
    ):
        ap.error(f"--coarsen of {', '.join(COARSEN)}; --forces of exact, tree (tree: --criteria gadget)")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    print(f"# command: {' '.join([sys.executable.rsplit('/', 1)[-1]] + sys.argv)}")
    print(
        f"# machine: {cpu_name()}, {os.cpu_count()} cores; commit {commit.stdout.strip()} "
        "(+ this change, uncommitted when run)"
    )
    print(
        "criterion coarsen forces scene N seed dt_max L eta eps steps | mode max|dE/E| active_targets "
        "levels_at_end | seconds"
    )
    for k in (int(c) for c in args.cases.split(",")):
        scene, n, seed, dt, L, eta, eps, steps = CASES[k]
        bodies = generate(scene, n, seed)
        physics = Physics(dt=dt, softening=eps)
        for criterion in args.criteria.split(","):
            for forces in kinds:
                for rule in rules:
                    out = {}
                    tag = f"{criterion} {rule} {forces}"
                    for mode in ("block", "shared"):
                        t = time.perf_counter()
                        out[mode] = run(bodies, physics, L, eta, mode, steps, criterion, rule, forces)
                        de, sched = out[mode]
                        print(
                            f"{tag} {scene} {n} {seed} {dt:g} {L} {eta:g} {eps:g} {steps} | {mode} "
                            f"{de:.3e} {sched.total.targets:,} {sched.histogram().tolist()} | "
                            f"{time.perf_counter() - t:.1f}",
                            flush=True,
                        )
                    (b_de, b), (s_de, s) = out["block"], out["shared"]
                    print(
                        f"  -> {tag}: energy block/shared {b_de / s_de:.2f}x, forces shared/block "
                        f"{s.total.targets / b.total.targets:.2f}x",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
