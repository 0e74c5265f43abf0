"""Which opening test needs the fewest interactions for the tree's error budget (issue 25's lever 3)?

The GPU walk's time is proportional to its interactions (1.45 ps each on an H200 across Plummer and the
collision, 1M and 8M: bench/results/h200x2-2026-11-26-fixed.json), and the CPU twin's interaction lists
are the GPU's bit for bit. So this study needs no GPU: it builds the twin's tree once per scene, walks it
under several opening tests over a sweep of theta, measures the relative force error of random targets
against a float64 all-pairs sum, and reports the interactions per body each test needs where its
99th-percentile error reaches the budget (1e-3), interpolated in log-log between the two thetas around it.

The opening tests (a cell is accepted for a group when the distance from the group's box to the cell's
centre of mass exceeds r_open; the twin's float32 test `box_accepts`, with its slack):
  cube    r_open = side / theta + |com - cube centre|, side the octree cube's: the trees' `opening=cube`
  bmax    r_open = b_max / theta, b_max bounded bottom up (exact over a leaf's bodies, the largest
          |com - com_child| + b_max_child above; Salmon & Warren 1994): the trees' `opening=bmax`
  box     r_open = extent / theta + |com - box centre|, extent the largest side of the box around the
          cell's bodies (tight boxes, as Bonsai's cells carry them): this study only
  bexact  r_open = b_max / theta with the exact largest distance from the centre of mass to a body of
          the cell: this study only (bench/results/cpu-2026-11-26-tree-mac-study-1m.txt calls it bmax,
          run before the trees had theirs; its bup rows are the trees' bmax computed in float64)
  rel     a relative criterion in the manner of GADGET-2 (Springel 2005), for a quadrupole expansion: a
          cell is accepted when M b_max^3 / d^5 <= alpha |a|, |a| the smallest acceleration of the group's
          targets (here from a cube walk at theta 0.5; a run would take the last step's), and never
          within b_max of the group's box. The parameter swept is alpha. The walk takes per-cell rows
          only, so the groups are binned by that |a| (REL_BINS log bins, each held to its smallest) and
          the tree is walked once per bin, each group's lists and forces taken from its bin's walk:
          this study only

    python3 bench/tree_mac_study.py --n 1048576 --scene plummer,collision [--out FILE.txt]

Rows print as they are measured (and go to --out as they come); Ctrl-C keeps those measured.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
from numba import njit

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere in the checkout

from app.model.physics import Physics, accelerations, relative_errors  # noqa: E402
from app.tools.bench import bench_bodies  # noqa: E402

B_THETAS = (0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.7, 0.8, 0.9, 1.0)
THETAS = {
    "cube": (0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.8),
    "bmax": B_THETAS,
    "box": (0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.8, 0.9),
    "bexact": B_THETAS,
    "rel": (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2),
}  # rel: alpha
REL_BINS = 16
BUDGET_P99 = 1e-3


@njit(cache=True)
def cell_extents(x, y, z, start, count, com):
    """Per cell: its bodies' box (lo, hi; float32 as the bodies) and b_max, the largest distance from its
    centre of mass to one of its bodies (float64)."""
    ncell = start.shape[0]
    lo = np.empty((ncell, 3), np.float32)
    hi = np.empty((ncell, 3), np.float32)
    bmax = np.zeros(ncell)
    for c in range(ncell):
        a, b = start[c], start[c] + count[c]
        lx, ly, lz = x[a], y[a], z[a]
        hx, hy, hz = x[a], y[a], z[a]
        cx, cy, cz = float(com[c, 0]), float(com[c, 1]), float(com[c, 2])
        r2 = 0.0
        for i in range(a, b):
            lx, ly, lz = min(lx, x[i]), min(ly, y[i]), min(lz, z[i])
            hx, hy, hz = max(hx, x[i]), max(hy, y[i]), max(hz, z[i])
            dx, dy, dz = float(x[i]) - cx, float(y[i]) - cy, float(z[i]) - cz
            r2 = max(r2, dx * dx + dy * dy + dz * dz)
        lo[c, 0], lo[c, 1], lo[c, 2] = lx, ly, lz
        hi[c, 0], hi[c, 1], hi[c, 2] = hx, hy, hz
        bmax[c] = math.sqrt(r2)
    return lo, hi, bmax


def mac_rows(tree, extents, test: str, theta: float) -> np.ndarray:
    """(ncell, 4) float32 [com, r_open^2] for `test` (cube and bmax: the trees' own rows)."""
    from app.backends.cpu_tree_kernels import MAC_SLACK

    if test in ("cube", "bmax"):
        return tree.mac(theta, test)
    lo, hi, bexact = extents
    if test == "box":
        extent = (hi - lo).max(axis=1).astype(np.float64)
        centre = (lo.astype(np.float64) + hi) / 2
        delta = np.linalg.norm(tree.com.astype(np.float64) - centre, axis=1)
        r = extent / theta + delta
    elif test == "bexact":
        r = bexact / theta
    else:
        raise ValueError(f"unknown opening test {test!r}")
    rows = np.empty((tree.ncell, 4), np.float32)
    rows[:, :3] = tree.com
    # rounded outwards (float64 here, float32 in the walk's comparison): never accepts what exact
    # arithmetic would open
    rows[:, 3] = (r * float(MAC_SLACK)) ** 2
    return rows


class _WithRows:
    """The tree with another opening test's rows: what the walk asks `mac(theta)` for."""

    def __init__(self, tree, rows: np.ndarray):
        self._tree, self._rows = tree, rows

    def __getattr__(self, name):
        return getattr(self._tree, name)

    def mac(self, _theta: float, _opening: str = "cube") -> np.ndarray:
        return self._rows


def group_of_rows(tree, gstart: np.ndarray) -> np.ndarray:
    """The group (index into gstart's runs of key positions) of every original row."""
    in_key_order = np.repeat(np.arange(gstart.size - 1), np.diff(gstart))
    out = np.empty(tree.order.size, np.int64)
    out[tree.order] = in_key_order
    return out


def relative_walk(
    evaluator,
    tree,
    group: int,
    n: int,
    rows: np.ndarray,
    alpha: float,
    amin: np.ndarray,
    groups_of: np.ndarray,
) -> tuple[int, int, np.ndarray]:
    """The rel test at `alpha`: (interactions, body-cell interactions, float64 accelerations of `rows`),
    each group's from the walk of its |a| bin (REL_BINS log bins over the groups' smallest |a|)."""
    from app.backends.cpu_tree_kernels import MAC_SLACK

    mass, b = tree.mass.astype(np.float64), tree.bmax.astype(np.float64)
    la = np.log(amin)
    edges = np.linspace(la.min(), la.max(), REL_BINS + 1)
    bin_of = np.clip(np.searchsorted(edges, la, side="right") - 1, 0, REL_BINS - 1)
    sample_bin = bin_of[groups_of[rows]]
    approx = np.empty((rows.size, 3))
    interactions = body_cell = 0
    for k in range(REL_BINS):
        members = bin_of == k
        if not members.any():
            continue
        a_k = math.exp(edges[k])  # the bin's smallest |a|: every group in it gets at least its demand
        r2 = np.maximum(b * b, (mass * b**3 / (alpha * a_k)) ** 0.4)  # d^5 >= M b^3 / (alpha a)
        macs = np.empty((tree.ncell, 4), np.float32)
        macs[:, :3] = tree.com
        macs[:, 3] = r2 * float(MAC_SLACK) ** 2
        acc = np.zeros((n, 4), np.float32)
        evaluator._walk(
            _WithRows(tree, macs), (tree.x, tree.y, tree.z), tree.order, acc, 1.0, group, n * n, True
        )
        g = evaluator._groups
        interactions += int(np.dot(g["nactive"][members], g["nbody"][members] + g["ncell"][members]))
        body_cell += int(np.dot(g["nactive"][members], g["ncell"][members]))
        sel = sample_bin == k
        approx[sel] = acc[rows[sel], :3]
    return interactions, body_cell, approx


def at_budget(points: list[tuple[float, float, float]]) -> tuple[float, float] | None:
    """(theta, interactions per body) where the p99 reaches BUDGET_P99: log-log interpolation between the
    two measured thetas around it; None when the sweep does not bracket it."""
    points = sorted(points)
    for (t0, i0, p0), (t1, i1, p1) in zip(points, points[1:], strict=False):
        if p0 <= BUDGET_P99 < p1:
            f = (math.log(BUDGET_P99) - math.log(p0)) / (math.log(p1) - math.log(p0))
            return t0 + f * (t1 - t0), math.exp(math.log(i0) + f * (math.log(i1) - math.log(i0)))
    return None


def study(scene: str, n: int, sample: int, leaf: int, group: int, tests: list[str], emit) -> None:
    from app.backends.cpu import CPUBackend
    from app.backends.cpu_tree import build

    physics = Physics(softening=0.01, dt=0.001)  # bench's physics for every scene
    bodies = bench_bodies(n, scene=scene)
    pos4 = np.empty((n, 4))
    pos4[:, :3], pos4[:, 3] = bodies.pos, bodies.mass
    rows = np.sort(np.random.default_rng(7).choice(n, size=min(sample, n), replace=False))
    t = time.perf_counter()
    exact = accelerations(bodies.pos, bodies.mass, physics, targets=rows)
    took = time.perf_counter() - t
    emit(f"# {scene}, N = {n:,}: float64 all-pairs for {rows.size:,} targets in {took:.1f} s")
    tree = build(pos4, leaf)
    extents = cell_extents(tree.x, tree.y, tree.z, tree.start, tree.count, tree.com)
    record = CPUBackend.record("cpu-tree")
    evaluator = record.policy.evaluator(record, physics)
    evaluator.set_tunables(leaf=leaf, group=group, rebuild_every=1, opening="cube")
    if "rel" in tests:  # each group's smallest |a|, from a cube walk at theta 0.5
        acc = np.zeros((n, 4), np.float32)
        evaluator._walk(tree, (tree.x, tree.y, tree.z), tree.order, acc, 0.5, group, n * n, True)
        gstart = evaluator._groups["start"]
        groups_of = group_of_rows(tree, gstart)
        amin = np.full(gstart.size - 1, np.inf)
        np.minimum.at(amin, groups_of, np.linalg.norm(acc[:, :3].astype(np.float64), axis=1))
    emit("test  theta  interactions/body  body-cell  p99        median     max        walk s")
    for test in tests:
        points = []
        for theta in THETAS[test]:
            t = time.perf_counter()
            if test == "rel":
                interactions, cells, approx = relative_walk(
                    evaluator, tree, group, n, rows, theta, amin, groups_of
                )
            else:
                acc = np.zeros((n, 4), np.float32)
                work = evaluator._walk(
                    _WithRows(tree, mac_rows(tree, extents, test, theta)),
                    (tree.x, tree.y, tree.z),
                    tree.order,
                    acc,
                    theta,
                    group,
                    n * n,
                    True,
                )
                interactions, cells, approx = work.interactions, work.body_cell, acc[rows, :3]
            walk_s = time.perf_counter() - t
            err = relative_errors(approx.astype(np.float64), exact)
            p99 = float(np.percentile(err, 99))
            per_body = interactions / n
            points.append((theta, per_body, p99))
            emit(
                f"{test:5s} {theta:5.2g}  {per_body:17.1f}  {cells / max(interactions, 1):9.2f}"
                f"  {p99:.3e}  {float(np.median(err)):.3e}  {float(err.max()):.3e}  {walk_s:6.1f}"
            )
        found = at_budget(points)
        emit(
            f"# {scene} {test}: "
            + (
                f"p99 = 1e-3 at {found[0]:.3g}, {found[1]:,.0f} interactions a body"
                if found
                else "the sweep does not bracket p99 = 1e-3"
            )
        )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=262144, help="bodies (default 262,144; the bench's: 1048576)")
    ap.add_argument("--scene", default="plummer,collision", help="comma-separated bench scenes")
    ap.add_argument("--tests", default="cube,bmax,box,bexact,rel", help="opening tests (default all)")
    ap.add_argument("--sample", type=int, default=4096, help="targets in the error sample (default 4,096)")
    ap.add_argument("--leaf", type=int, default=16)
    ap.add_argument("--group", type=int, default=64)
    ap.add_argument("--out", type=Path, help="also write the rows to this text file, as they come")
    args = ap.parse_args(argv)
    tests = args.tests.split(",")
    bad = [t for t in tests if t not in THETAS]
    if bad:
        ap.error(f"--tests: unknown {', '.join(bad)}; choose from {', '.join(THETAS)}")
    if args.n < 1024:
        ap.error("--n: at least 1,024 bodies")
    out = args.out.open("x") if args.out else None  # never over an earlier study

    def emit(line: str) -> None:
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    try:
        for scene in args.scene.split(","):
            study(scene, args.n, args.sample, args.leaf, args.group, tests, emit)
    except KeyboardInterrupt:
        emit("# interrupted: the rows above were measured")
        return 130
    finally:
        if out:
            out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
