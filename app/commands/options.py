"""The options the sub-commands share: the scene overrides and their shortcut flags, the GPU options, the
kernel's --tunable values, and the argparse value types."""

from __future__ import annotations

import argparse
import logging
import math
from pathlib import Path

from app.core.errors import ConfigError
from app.model.config import BACKEND_CHOICES, FORMAT_CHOICES
from app.model.typed_text import scalar_value

log = logging.getLogger("nbody-live")


# Shortcut flags -> scene keys. Everything else goes through --set KEY=VALUE.
SHORTCUTS = {
    "n": "initial.n",
    "seed": "initial.seed",
    "subsample": "initial.subsample",
    "dt": "physics.dt",
    "softening": "physics.softening",
    "G": "physics.G",
    "integrator": "physics.integrator",
    "model": "physics.model",
    "damping": "physics.damping",
    "repulsion": "physics.repulsion",
    "timesteps": "physics.timesteps",
    "block_levels": "physics.block_levels",
    "block_eta": "physics.block_eta",
    "block_coarsen": "physics.block_coarsen",
    "backend": "run.backend",
    "kernel": "run.kernel",
    "steps_per_frame": "run.steps_per_frame",
    "frames_per_step": "run.frames_per_step",
    "gpus": "run.gpus",
    "gpu_driver": "run.gpu_driver",
    "exchange": "run.exchange",
}


SCENE_HELP = (
    "a preset name (see `nbody-live info --scenes`), a scene .toml file, or a snapshot file "
    "(Tipsy, NEMO, NBabel, npz, csv) to start from"
)


SERIES_HELP = "; or a snapshot series to replay: a folder (simulate --out-dir) or a quoted glob"


def add_scene_options(p: argparse.ArgumentParser, scene_required: bool = False, series: bool = False) -> None:
    """SCENE and the scene overrides; `series`: SCENE may also be a snapshot series (run, record)."""
    default = None if scene_required else "plummer"
    p.add_argument(
        "scene",
        nargs=None if scene_required else "?",
        default=default,
        metavar="SCENE",
        help=SCENE_HELP + ("" if scene_required else " (default: plummer)") + (SERIES_HELP if series else ""),
    )
    g = p.add_argument_group("scene overrides (applied after the scene file)")
    _add_initial_options(g)
    _add_physics_options(g)
    _add_block_step_options(g)
    _add_run_options(g)


def _add_initial_options(g) -> None:
    """The bodies: how many, the seed, a snapshot's subset and format."""
    g.add_argument("--n", type=str, metavar="N", help="number of bodies (generators only)")
    g.add_argument("--seed", type=str, metavar="S", help="random seed of the generator (and of --subsample)")
    g.add_argument(
        "--subsample",
        type=str,
        metavar="K",
        help="a snapshot SCENE only: a seeded random subset of K bodies, the total mass kept",
    )
    g.add_argument(
        "--format",
        choices=FORMAT_CHOICES,
        help="format of a snapshot SCENE (default: from the extension or content)",
    )


def _add_physics_options(g) -> None:
    """[physics]: the step, the force law, the integrator, shared or block time steps."""
    g.add_argument("--dt", type=str, metavar="DT", help="time step (> 0)")
    g.add_argument("--softening", type=str, metavar="EPS", help="Plummer softening length (>= 0)")
    g.add_argument("--G", type=str, metavar="G", help="gravitational constant (> 0)")
    g.add_argument("--integrator", type=str, metavar="NAME", help="leapfrog | euler-damped")
    g.add_argument("--model", type=str, metavar="NAME", help="gravity | gravity-repulsion")
    g.add_argument("--damping", type=str, metavar="D", help="velocity damping per step, (0, 1]")
    g.add_argument("--repulsion", type=str, metavar="H", help="H of the gravity-repulsion model")
    g.add_argument(
        "--timesteps",
        type=str,
        metavar="MODE",
        help="shared (default: every body takes --dt) | block: hierarchical time steps, body i "
        "steps dt/2^l_i with l_i from GADGET-2's criterion sqrt(2 eta eps/|a_i|), so only "
        "the bodies that need short steps take them; --dt is then the max step (give it "
        "some multiple of a shared step, e.g. --dt 0.0625 for the collision: with the "
        "preset's 0.002 every body would stay at level 0) and one step is one max step. "
        "Runs on the tree (kernel tree, or cpu-tree on the CPU), one device "
        "(docs/blocksteps.md)",
    )


def _add_block_step_options(g) -> None:
    """Block time steps' levels, criterion and coarsening rule."""
    g.add_argument(
        "--block-levels",
        dest="block_levels",
        type=str,
        metavar="L",
        help="block steps: levels below --dt, the finest step is dt/2^L (default 6)",
    )
    g.add_argument(
        "--block-eta",
        dest="block_eta",
        type=str,
        metavar="ETA",
        help="block steps: the level criterion's accuracy (default 0.025; smaller is finer)",
    )
    g.add_argument(
        "--block-coarsen",
        dest="block_coarsen",
        type=str,
        metavar="RULE",
        help="block steps: settled (default: a level gets coarser only between max steps, and "
        "only to a level also wanted at the boundary before; its snapshots keep the "
        "levels, .npz) | boundary (only between max steps; x and v are the whole state) | "
        "aligned (at any tick aligned with the coarser step; better where close "
        "encounters at small softening dominate)",
    )


def _add_run_options(g) -> None:
    """[run]: backend, kernel, steps and frames, tunables, and --set for any key."""
    g.add_argument(
        "--backend",
        type=str,
        metavar="NAME",
        help=f"{' | '.join(BACKEND_CHOICES())} (default: auto = the first that works, best "
        "first: CUDA, else the CPU)",
    )
    g.add_argument(
        "--kernel",
        type=str,
        metavar="NAME",
        help="kernel from `nbody-live info --kernels` (default: the backend's default: best on "
        "cuda, cpu-simd on cpu)",
    )
    g.add_argument(
        "--steps-per-frame",
        dest="steps_per_frame",
        type=str,
        metavar="K",
        help="simulation steps per rendered frame",
    )
    g.add_argument(
        "--frames-per-step",
        dest="frames_per_step",
        type=str,
        metavar="K",
        help="block time steps: frames drawn inside each max step, so that a long --dt still "
        "moves smoothly: a frame advances steps-per-frame/K max steps (default 1)",
    )
    g.add_argument(
        "--tunable",
        dest="tunables",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a tunable of the kernel, e.g. --tunable theta=0.7 for cpu-tree (repeatable; "
        "`nbody-live info --kernels` lists each kernel's tunables and their ranges)",
    )
    g.add_argument(
        "--set",
        dest="assignments",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any scene key, e.g. --set camera.fov=30 --set render.colormap=viridis "
        "(repeatable; `nbody-live info --keys` lists them)",
    )


GPUS_HELP = (
    "split the forces over N GPUs (or all) through the multi-device driver: each GPU holds every "
    "position and does its part as the kernel's record splits it (`info --kernels`: its share of "
    "the targets, a slice of the Newton-3 pair tiles, or a key range of the tree's groups; "
    'docs/multi-gpu.md); with --backend cpu, N CPU "devices" (the CI twin). More than the '
    "machine has is an error"
)


def add_kernel_file_options(p: argparse.ArgumentParser) -> None:
    """--kernel-file and --kernel-dir: the user's own CUDA kernels beside the built-ins
    (app/backends/cuda/user_kernels.py; docs/writing-kernels.md)."""
    g = p.add_argument_group("your own kernels")
    g.add_argument(
        "--kernel-file",
        action="append",
        default=[],
        type=Path,
        metavar="PATH.cu",
        help="a CUDA force kernel of yours, described by its /* nbody-live kernel */ header: it joins the "
        "built-ins under its name (repeatable; `nbody-live new-kernel NAME` writes a starter)",
    )
    g.add_argument(
        "--kernel-dir",
        action="append",
        default=[],
        type=Path,
        metavar="DIR",
        help="every *.cu in DIR that opens with such a header (repeatable)",
    )


def add_gpu_options(p: argparse.ArgumentParser, gpus_help: str = GPUS_HELP) -> None:
    """--gpus, --gpu-driver, --exchange (run, simulate, record; bench takes a list for --gpus)."""
    from app.model.config import DRIVERS, EXCHANGES

    g = p.add_argument_group("several GPUs (scene keys run.gpus, run.gpu_driver, run.exchange)")
    g.add_argument("--gpus", type=str, metavar="N|all", help=gpus_help)
    g.add_argument(
        "--gpu-driver",
        dest="gpu_driver",
        choices=DRIVERS,
        help="threads: one host thread per GPU; single: one thread issues every GPU's work, "
        "taking the tree's phases in turns; auto (default): single for a domain split (the "
        "tree), threads otherwise, as measured on two H100s (docs/multi-gpu.md)",
    )
    g.add_argument(
        "--exchange",
        choices=EXCHANGES,
        help="how rows move between GPUs (positions; for Newton 3 the partial forces, for the "
        "tree the key ranges' forces): peer copies, NCCL (nvidia-nccl-cu13), or through host "
        "memory; auto (default): peer where every pair of GPUs can reach each other, else "
        "host",
    )


def refuse_error_colours(scene, where: str) -> None:
    """ConfigError where the colour by force error would show nothing true: only the live viewer's panel
    computes each body's error (its Compare tab), not `record` or a replay, which would draw speeds as
    errors."""
    from app.render.particles import ERROR_VIEWS

    if scene.render.color_by in ERROR_VIEWS:
        raise ConfigError(
            f"render.color_by = {scene.render.color_by} is the live viewer's (its Compare tab computes each "
            f"body's error); {where} colours by speed, mass or component"
        )


def parse_tunables(texts: list[str]) -> dict[str, object]:
    """['theta=0.7', 'leaf=32'] -> {'theta': 0.7, 'leaf': 32}: each value a whole number, else a number,
    else text, for the record to validate (KernelRecord.validate_tunables names record.key and the range)."""
    return {name: scalar_value(value) for name, value in map(split_tunable, texts)}


def parse_tunable_lists(texts: list[str]) -> dict[str, list[object]]:
    """['theta=0.3,0.5', 'leaf=32'] -> {'theta': [0.3, 0.5], 'leaf': [32]}: `bench`'s sweeps, each value
    read as `parse_tunables` reads one; a name given twice keeps the later list."""
    out: dict[str, list[object]] = {}
    for text in texts:
        name, values = split_tunable(text)
        items = [v.strip() for v in values.split(",")]
        if not all(items):
            raise ConfigError(
                f"--tunable {text!r}: an empty value in the list; expected NAME=V1,V2,..., "
                "e.g. --tunable theta=0.3,0.5"
            )
        out[name] = [scalar_value(v) for v in items]
    return out


def split_tunable(text: str) -> tuple[str, str]:
    """'theta=0.7' -> ('theta', '0.7'); ConfigError saying what is expected otherwise."""
    name, eq, value = text.partition("=")
    name, value = name.strip(), value.strip()
    if not eq or not name or not value:
        raise ConfigError(f"--tunable {text!r}: expected NAME=VALUE, e.g. --tunable theta=0.7")
    return name, value


def parse_size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise ConfigError(f"--size {text!r}: expected WIDTHxHEIGHT, e.g. 1280x720") from None
    if not (16 <= w <= 16384 and 16 <= h <= 16384):
        raise ConfigError(f"--size {text!r}: width and height must be between 16 and 16384")
    return w, h


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (v > 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"{text} must be a number > 0")
    return v


def positive_int(text: str) -> int:
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    return _int_at_least(text, 0)


def _int_at_least(text: str, low: int) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if v < low:
        raise argparse.ArgumentTypeError(f"{text} must be at least {low}")
    return v
