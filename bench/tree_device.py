"""What the tree's device tools in bench/ share (tree_kernel_profile.py, tree_walk_variants.py): the CUDA
device and the `tree` record, or exit 2 saying why not; an evaluator as the bench's scenes use it; a
scene's positions uploaded with a buffer for the accelerations."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere in the checkout

from app.backends import backend_class  # noqa: E402
from app.model.physics import Physics  # noqa: E402
from app.tools.bench import bench_bodies, check_scene  # noqa: E402

SOFTENING = 0.01  # the bench's ε


def scene_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scene", default="plummer", help="a bench scene (default plummer)")
    p.add_argument("--theta", type=float, default=0.6, help="opening angle (default 0.6)")


def open_tree(tool: str):
    """(CudaDevice 0, the `tree` record); SystemExit(2) with one line where CUDA is unavailable."""
    cuda = backend_class("cuda")
    if cuda.why_not():
        print(f"{tool}: needs the CUDA backend: {cuda.why_not()}", file=sys.stderr)
        raise SystemExit(2)
    from app.backends.cuda.device import CudaDevice
    from app.backends.cuda.registry import RECORDS

    return CudaDevice(0), next(r for r in RECORDS if r.name == "tree")


def tree_evaluator(record, dev, theta: float, **tunables):
    ev = record.policy.evaluator(record, dev, {})
    ev.set_physics(Physics(softening=SOFTENING))
    ev.set_tunables(theta=theta, **tunables)
    return ev


def scene_positions(scene: str, n: int) -> np.ndarray:
    return bench_bodies(n, scene=check_scene(scene)).pos4(np.float32)


def upload(dev, pos: np.ndarray, tag: str) -> tuple[int, int]:
    """(positions, accelerations) device buffers of the scratch named `tag`, the positions copied in.
    Call with the device's scope entered."""
    n = pos.shape[0]
    p_dev, a_dev = dev.scratch(f"{tag}-pos", 16 * n), dev.scratch(f"{tag}-acc", 16 * n)
    dev.drv.memcpy_htod(p_dev, pos)
    return p_dev, a_dev
