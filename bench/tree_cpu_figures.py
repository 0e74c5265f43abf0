"""The CPU twin's figures that no nbody-live command prints (docs/tree.md cites the output):

- cells per n / leaf on the bench's Plummer spheres (the memory estimate's CELLS_PER_LEAF);
- `stable_key_order` against numpy's stable argsort on the sorted keys' input at N = 65,536;
- the longest interaction list and the interactions per body at N = 262,144 (group cells, θ = 0.5).

    .venv/bin/python bench/tree_cpu_figures.py > bench/results/cpu-DATE-tree-twin-figures.txt

The bodies are the bench's (app.tools.bench.bench_bodies: the Plummer generator, seed 42), float32 rows.
"""

from __future__ import annotations

import time

import numpy as np

from app.backends import cpu_tree
from app.backends import cpu_tree_kernels as k
from app.backends.cpu_forces import BY_NAME
from app.engine.forces import Span
from app.model.physics import Physics
from app.tools.bench import bench_bodies

RECORD = BY_NAME["cpu-tree"]


def rows(n: int, seed: int = 42) -> np.ndarray:
    b = bench_bodies(n, seed)
    return np.column_stack([b.pos, b.mass]).astype(np.float32)


def cells_per_leaf() -> None:
    print("## cells per n / leaf (build(pos, leaf).ncell / (n / leaf)), bench Plummer sphere, seed 42")
    for n in (16384, 65536, 262144):
        pos = rows(n)
        line = [f"{cpu_tree.build(pos, leaf).ncell / (n / leaf):.2f}" for leaf in (8, 16, 32, 64)]
        print(f"N {n:>7,}  leaf 8 / 16 / 32 / 64: {' / '.join(line)}")


def sort_times(n: int = 65536, repeats: int = 21) -> None:
    pos = rows(n)
    xyz = pos[:, :3]
    lo, size = k.bounding_cube(xyz)
    keys = k.morton_keys(xyz, lo, size)
    k.stable_key_order(keys)  # compile
    ours, numpys = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        a = k.stable_key_order(keys)
        ours.append(time.perf_counter() - t)
        t = time.perf_counter()
        b = np.argsort(keys, kind="stable")
        numpys.append(time.perf_counter() - t)
    assert np.array_equal(a, b)
    print(
        f"## the sort at N = {n:,} (Morton keys of the bench sphere, median / min of {repeats}, ms; "
        "orders equal)"
    )
    print(f"stable_key_order      {1e3 * np.median(ours):.2f} / {1e3 * min(ours):.2f}")
    print(f"np.argsort(stable)    {1e3 * np.median(numpys):.2f} / {1e3 * min(numpys):.2f}")


def lists(n: int = 262144, theta: float = 0.5) -> None:
    pos = rows(n)
    ev = RECORD.policy.evaluator(RECORD, Physics(softening=0.01))
    ev.set_tunables(theta=theta)
    acc = np.zeros_like(pos)
    work = ev.evaluate(pos, acc, Span.all(n), Span.all(n))
    g = ev.last_groups()
    length = g["nbody"] + g["ncell"]
    print(f"## lists at N = {n:,}, theta {theta}, leaf 16, group 64, eps 0.01 (one evaluation)")
    longest = length.argmax()
    print(
        f"groups {length.size:,}; longest list {int(length.max()):,} entries ({int(g['nbody'][longest]):,}"
        f" bodies + {int(g['ncell'][longest]):,} cells); median {int(np.median(length)):,}"
    )
    print(f"interactions per body {work.interactions / n:.1f} (body-cell {work.body_cell / n:.1f})")


if __name__ == "__main__":
    cells_per_leaf()
    sort_times()
    lists()
