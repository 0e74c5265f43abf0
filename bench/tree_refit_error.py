"""The CPU twin's refit (cpu-tree rebuild_every, docs/tree.md "Refit"): force error against the float64 direct
sum as a function of the evaluations since the last build, and the evaluation time with and without the
rebuild.

    .venv/bin/python bench/tree_refit_error.py --scenes plummer,collision --n 65536 > bench/results/...

Method: per scene (assets/scenes, the scene's own seed, softening and dt, N overridden) and theta, one
leapfrog (KDK) trajectory of `--steps` steps, driven by today's tree (rebuild_every = 1) in float64
positions and velocities. At every force evaluation (the initial one and one per step) each rebuild_every
R in --every has its own evaluator evaluate all bodies at the same float32 positions: it built at the
evaluations 0, R, 2R, ... and refits in between, so evaluation e is (e mod R) evaluations after its build.
The same positions give one float64 reference per evaluation (app.backends.cpu_forces.exact_rows,
cpu-fp64, all N sources) on K sampled targets (numpy default_rng(seed 0), without replacement), and the
relative errors are app.model.physics.relative_errors' (|a_exact| floored at 1e-3 of the sample's RMS).

Printed per (scene, theta):
- per evaluation e: p99 and max for each R, and for R = max(--every) the cells whose cube the refit grew
  and the largest side growth side'/side - 1 over all cells (the input of an adaptive rule);
- per R: the p99 and max of the relative errors pooled over the evaluations 0 .. R*floor(E/R) - 1 (whole
  cycles: what a run with that R sees in steady state), the worst per-evaluation p99, the interactions per
  body (mean over the evaluations), and the median wall ms of a build evaluation and of a refit evaluation
  (stage_ms: keys, sort, build, moments, walk; the walk is included, so the refit's saving and the cost of
  its grown cubes are both in it).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np

from app.backends.cpu_forces import BY_NAME, cpu_name, exact_rows
from app.engine.forces import Span
from app.model.physics import Physics, relative_errors
from app.scene import load_scene, make_bodies

RECORD = BY_NAME["cpu-tree"]


def scene_start(scene_name: str, n: int, softening: float | None = None, dt: float | None = None):
    """(bodies, physics) of a scene at N = n: its own seed, G, softening and dt unless overridden."""
    scene = load_scene(scene_name, {"initial.n": n})
    p = scene.physics
    physics = Physics(
        G=p.G, softening=p.softening if softening is None else softening, dt=p.dt if dt is None else dt
    )
    return make_bodies(scene), physics


def leapfrog_positions(bodies, physics: Physics, theta: float, steps: int):
    """The float32 [x, y, z, m] rows at each force evaluation e = 0 .. steps of a leapfrog (KDK) trajectory
    in float64 positions and velocities, driven by cpu-tree building every evaluation: yields (e, rows,
    the driving evaluation's ForceWork), the rows before the step goes on."""
    n = bodies.n
    x = bodies.pos.astype(np.float64).copy()
    v = bodies.vel.astype(np.float64).copy()
    mass = bodies.mass.astype(np.float64)
    driver = RECORD.policy.evaluator(RECORD, physics)
    driver.set_tunables(theta=theta, rebuild_every=1)
    everyone = Span.all(n)

    def evaluate():
        p = np.empty((n, 4), np.float32)
        p[:, :3] = x
        p[:, 3] = mass
        acc = np.zeros_like(p)
        work = driver.evaluate(p, acc, everyone, everyone)
        return p, acc[:, :3].astype(np.float64), work

    p, a, work = evaluate()
    yield 0, p, work
    for step in range(1, steps + 1):
        v += 0.5 * physics.dt * a
        x += physics.dt * v
        p, a, work = evaluate()
        v += 0.5 * physics.dt * a
        yield step, p, work


def run(scene_name: str, n: int, theta: float, everies: list[int], steps: int, k: int) -> None:
    bodies, physics = scene_start(scene_name, n)
    dt = physics.dt
    n = bodies.n
    rows = np.sort(np.random.default_rng(0).choice(n, size=min(k, n), replace=False))
    evaluators = {}
    for r in everies:
        ev = RECORD.policy.evaluator(RECORD, physics)
        ev.set_tunables(theta=theta, rebuild_every=r)
        evaluators[r] = ev
    everyone = Span.all(n)
    rel = {r: [] for r in everies}
    inter = {r: [] for r in everies}
    ms = {r: {"build": [], "refit": []} for r in everies}
    rmax = max(everies)
    growth = []
    print(
        f"## {scene_name} N={n:,} eps={physics.softening:g} dt={dt:g} theta={theta:g} leaf=16 group=64; "
        f"{steps} KDK steps, {rows.size} sampled targets",
        flush=True,
    )
    head = " ".join(f"R={r}:p99/max" for r in everies)
    print(f"eval | {head} | R={rmax}: grown cells, max side growth")

    def measure(e: int, p: np.ndarray) -> None:
        exact = exact_rows(p.astype(np.float64), rows, physics)
        cells = []
        for r, ev in evaluators.items():
            acc = np.zeros_like(p)
            ev.stage_ms()
            work = ev.evaluate(p, acc, everyone, everyone)
            took = sum(ev.stage_ms().values())
            ms[r]["build" if ev.since_build == 0 else "refit"].append(took)
            inter[r].append(work.interactions / n)
            err = relative_errors(acc[rows, :3].astype(np.float64), exact)
            rel[r].append(err)
            cells.append(f"{np.percentile(err, 99):.3e}/{err.max():.3e}")
            if r == rmax:
                built = ev._built
                g = float((ev.last_tree.side / built.side).max() - 1.0)
                growth.append(g)
                grown = ev.last_grown
        print(f"{e:>4} | {' '.join(cells)} | {grown:,} of {ev.last_tree.ncell:,}, {g:.3e}", flush=True)

    for e, p, _ in leapfrog_positions(bodies, physics, theta, steps):
        measure(e, p)
    evals = steps + 1
    print(
        "R | pooled p99 | pooled max | worst eval p99 | interactions/body | ms build eval | ms refit eval "
        "(median) | refit saving"
    )
    for r in everies:
        cycles = (evals // r) * r
        pooled = np.concatenate(rel[r][:cycles])
        worst = max(float(np.percentile(e, 99)) for e in rel[r][:cycles])
        b = float(np.median(ms[r]["build"]))
        f = float(np.median(ms[r]["refit"])) if ms[r]["refit"] else float("nan")
        print(
            f"{r:>2} | {np.percentile(pooled, 99):.3e} | {pooled.max():.3e} | {worst:.3e} | "
            f"{np.mean(inter[r][:cycles]):.0f} | {b:.0f} | {f:.0f} | "
            f"{'-' if r == 1 else f'{1 - f / b:.0%}'}",
            flush=True,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenes", default="plummer,collision")
    ap.add_argument("--n", type=int, default=65536)
    ap.add_argument("--thetas", default="0.5,0.6")
    ap.add_argument("--every", default="1,2,4,8,16")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--k", type=int, default=4096, help="sampled targets")
    args = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    ).stdout.strip()
    print(f"# command: {' '.join([sys.executable.rsplit('/', 1)[-1]] + sys.argv)}")
    print(f"# machine: {cpu_name()}, {os.cpu_count()} cores")
    print(f"# commit: {commit.stdout.strip()}{' (+ uncommitted changes: this refit)' if dirty else ''}")
    everies = [int(c) for c in args.every.split(",")]
    t0 = time.perf_counter()
    for scene in args.scenes.split(","):
        for theta in (float(t) for t in args.thetas.split(",")):
            run(scene, args.n, theta, everies, args.steps, args.k)
    print(f"# {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
