"""A/B of the GPU tree walk's compiled shape (on the GPU machine): warps per block, __launch_bounds__'
minimum blocks per SM (which caps the registers) and the group size, on one scene at one N and θ.

    python3 bench/tree_walk_variants.py [--n 1048576] [--scene plummer] [--theta 0.6] [--evaluations 12]

Each variant is kernels/tree/walk.cu with TREE_WARPS and the launch bounds rewritten, compiled to a file
under /tmp; the tree evaluates the scene's initial positions `--evaluations` times and the median walk
stage (CUDA events) over all but the first two is printed with the registers and local memory the
compiler gave it, and the largest difference of the accelerations from the first variant's (0 for the
same group size: the same arithmetic; a different group size walks other cells). Results of a run on an
H200: bench/results/h200-2026-11-23-tree-walk-variants.txt, quoted in docs/tree.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from tree_device import (  # first: puts the checkout on sys.path
    open_tree,
    scene_arguments,
    scene_positions,
    tree_evaluator,
    upload,
)

import app.backends.cuda.tree as tree_module
import app.backends.cuda.tree_walk as walk_module  # the walk's layer: it reads WALK_* when it launches
from app.engine.forces import Span

ROOT = Path(__file__).resolve().parent.parent

# (warps per block, minimum blocks per SM or 0 for none, group)
VARIANTS = [
    (4, 0, 64),
    (4, 7, 64),  # the default of groups of 64 (walk.cu TREE_G64_BLOCKS)
    (4, 8, 64),
    (4, 10, 64),
    (4, 12, 64),
    (8, 4, 64),
    (8, 5, 64),
    (2, 16, 64),
    (4, 0, 128),
    (4, 6, 128),
    (4, 8, 128),
    (8, 3, 128),
]
LAUNCH_BOUNDS = "__launch_bounds__(32 * TREE_WARPS)"
G64_BOUNDS = "__launch_bounds__(32 * TREE_WARPS, TREE_G64_BLOCKS)"  # groups of 64: 7 blocks an SM by default


def variant_source(text: str, warps: int, min_blocks: int) -> str:
    """walk.cu with `warps` warps a block and every group size's kernels bounded for `min_blocks` blocks an SM
    (0: no minimum, the registers uncapped; groups of 64 included, whose own default is TREE_G64_BLOCKS)."""
    if LAUNCH_BOUNDS not in text or G64_BOUNDS not in text or "#define TREE_WARPS 4" not in text:
        raise SystemExit(
            "tree_walk_variants: kernels/tree/walk.cu no longer has the lines this script "
            "rewrites (TREE_WARPS 4 and the walk's launch bounds)"
        )
    text = text.replace("#define TREE_WARPS 4", f"#define TREE_WARPS {warps}")
    text = text.replace(G64_BOUNDS, LAUNCH_BOUNDS)
    if min_blocks:
        text = text.replace(LAUNCH_BOUNDS, f"__launch_bounds__(32 * TREE_WARPS, {min_blocks})")
    return text


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1 << 20, help="bodies (default 1,048,576)")
    scene_arguments(p)
    p.add_argument("--evaluations", type=int, default=12, help="evaluations per variant (default 12)")
    args = p.parse_args(argv)
    dev, record = open_tree("tree_walk_variants")
    n = args.n
    pos = scene_positions(args.scene, n)
    source = (ROOT / "kernels" / tree_module.WALK_SOURCE).read_text()
    first = None
    try:
        with dev.scope:
            p_dev, a_dev = upload(dev, pos, "variants")
            stream = dev.drv.Stream()
            for k, (warps, min_blocks, group) in enumerate(VARIANTS, 1):
                path = Path(f"/tmp/nbody-walk-w{warps}-b{min_blocks}.cu")
                path.write_text(variant_source(source, warps, min_blocks))
                walk_module.WALK_SOURCE = str(path)
                walk_module.WALK_WARPS = warps
                walk_module.WALK_BLOCKS_PER_SM = min_blocks or 32 // warps
                ev = tree_evaluator(record, dev, args.theta, group=group)
                fn = ev._walk(False, True)
                regs = fn.get_attribute(dev.drv.function_attribute.NUM_REGS)
                local = fn.get_attribute(dev.drv.function_attribute.LOCAL_SIZE_BYTES)
                walks = []
                for _ in range(args.evaluations):
                    ev.evaluate(p_dev, a_dev, Span.all(n), Span.all(n), stream)
                    walks.append(ev.stage_ms()["walk"])
                acc = np.empty((n, 4), np.float32)
                dev.drv.memcpy_dtoh(acc, a_dev)
                first = acc[:, :3].copy() if first is None else first
                diff = np.abs(acc[:, :3] - first).max() / np.abs(first).max()
                print(
                    f"[{k}/{len(VARIANTS)}] group {group} warps {warps} min blocks {min_blocks or '-':>2}: "
                    f"regs {regs} local {local} B, walk median {np.median(walks[2:]):.3f} ms "
                    f"(min {min(walks[2:]):.3f}), max diff {diff:.1e}",
                    flush=True,
                )
    finally:
        dev.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
