"""A command's run assembled from its options: the Scene (preset or file, overrides, tunables), then the
Backend that runs it (one device, --gpus K, block time steps, MPI ranks), its bodies checked first."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from app.commands.options import SHORTCUTS, parse_tunables
from app.core.errors import ConfigError
from app.model.typed_text import parse_assignment

log = logging.getLogger("nbody-live")


def is_snapshot(arg: str) -> bool:
    p = Path(arg)
    return p.suffix != ".toml" and p.is_file()


def scene_from_args(args: argparse.Namespace):
    """Scene file or preset, or a snapshot wrapped in the default scene, then flags, then --set."""
    from app.scene import load_scene

    overrides: dict[str, object] = {}
    scene_arg = args.scene
    if scene_arg and is_snapshot(scene_arg):
        overrides["initial.file"] = scene_arg
        overrides["initial.generator"] = None
        if getattr(args, "format", None):
            overrides["initial.format"] = args.format
        scene_arg = None
    elif getattr(args, "format", None):
        raise ConfigError("--format applies only when SCENE is a snapshot file")
    for attr, key in SHORTCUTS.items():
        value = getattr(args, attr, None)
        if value is not None:
            overrides[key] = value
    for text in getattr(args, "assignments", []):
        key, value = parse_assignment(text)
        overrides[key] = value
    scene = load_scene(scene_arg, overrides)
    if getattr(args, "n", None) is not None and scene.initial.file:
        raise ConfigError(
            f"--n applies to generators; {scene.initial.file} is a snapshot: use --subsample K "
            "for a random subset of K of its bodies"
        )
    if scene_arg is None and scene.initial.file:
        scene.name = Path(scene.initial.file).name
    # --tunable over the scene's [run.tunables]
    scene.run.tunables = {**scene.run.tunables, **parse_tunables(getattr(args, "tunables", None) or [])}
    if scene.run.tunables and scene.run.kernel != "auto":
        from app.backends import find_kernel

        find_kernel(scene.run.kernel).validate_tunables(scene.run.tunables)  # before any work
    return scene


def make_backend(scene, bodies=None, comm=None):
    """Pick the backend the scene asks for (auto falls back with a log line), load the bodies. With an MPI
    `comm`, the backend of the job's ranks (app/backends/ranks.py) over that backend, on every rank."""
    from app.backends import select_backend
    from app.scene import make_bodies

    kernel = scene.run.kernel if scene.run.kernel != "auto" else None
    cls = select_backend(scene.run.backend, kernel)
    if scene.run.backend == "auto":
        log.info("backend: %s", cls.name)
    if scene.physics.timesteps == "block":
        cls = block_steps_class(cls, scene, comm)
        kernel = kernel or cls.tree_kernel()
    elif scene.run.frames_per_step != 1:
        raise ConfigError(
            f"run.frames_per_step = {scene.run.frames_per_step}: frames are drawn inside a "
            "step only with block time steps (--timesteps block); with shared steps a frame "
            "comes after each step: lower --dt for smaller ones, or drop --frames-per-step"
        )
    elif scene.run.gpus is not None:
        cls = several_devices(
            cls,
            scene.run.gpus,
            scene.run.gpu_driver,
            scene.run.exchange,
            chosen=scene.run.backend != "auto" or kernel is not None,
        )
    if comm is not None:
        from app.backends.ranks import ranks_backend_class

        cls = ranks_backend_class(comm, cls)
    bodies = bodies if bodies is not None else make_bodies(scene)
    backend = cls()
    try:
        record = backend.record(kernel or backend.kernel)
        check_fits(bodies, record)
        record.validate_tunables(scene.run.tunables)  # (ConfigError naming record.key) before the load
        backend.load(bodies, scene.physics, kernel)
        backend.components = bodies.components
        if scene.run.tunables:
            backend.set_tunables(**scene.run.tunables)
    except BaseException:
        backend.close()
        raise
    return backend


def block_steps_class(cls, scene, comm=None):
    """The block-step form of backend `cls` (app/backends/block.py): one device, the tree; ConfigError
    naming what to drop for several devices or MPI ranks."""
    from app.backends.block import block_steps_backend_class

    if scene.run.gpus is not None:
        raise ConfigError(
            f"--gpus {scene.run.gpus}: block time steps run on one device (the active-group "
            "walk is not split across devices yet); drop --gpus, or use --timesteps shared"
        )
    if comm is not None:
        raise ConfigError(
            "block time steps run in one process on one device; run without mpiexec, or use "
            "--timesteps shared"
        )
    return block_steps_backend_class(cls)


def several_devices(cls, gpus, driver: str = "auto", exchange: str = "auto", chosen: bool = True):
    """The multi-device form of backend `cls` on `gpus` devices (app/backends/multi.py). `chosen`: the
    backend was named (or implied by the kernel); auto falling back to the CPU is not taken for CPU
    devices."""
    from app.backends import backend_classes
    from app.backends.multi import multi_backend_class

    if cls.memory != "device" and not chosen:  # auto fell back to a backend on the host
        reasons = {name: other.why_not() for name, other in backend_classes().items()}
        why = "; ".join(f"{name}: {reason}" for name, reason in reasons.items() if reason)
        raise ConfigError(
            f"--gpus {gpus}: no GPU is usable here ({why}); --backend {cls.name} --gpus N "
            f"splits the {cls.name} backend into N devices instead"
        )
    return multi_backend_class(cls, gpus, driver, exchange)


def make_rank_run(comm, scene, bodies=None):
    """This rank's RankRun for a scene: CPU shares, or one GPU per rank picked by local rank."""
    if scene.physics.timesteps == "block":
        block_steps_class(None, scene, comm)  # (ConfigError: one process, one device)
    if scene.run.gpus is not None:
        raise ConfigError(
            f"--gpus {scene.run.gpus}: under mpiexec each rank takes one GPU (of its local "
            "rank); leave --gpus out, or run one process with --gpus"
        )
    from app.backends import select_backend
    from app.backends.distributed import RankRun, device_maker
    from app.scene import make_bodies

    kernel = scene.run.kernel if scene.run.kernel not in ("auto", None) else None
    cls = select_backend(scene.run.backend, kernel)
    bodies = bodies if bodies is not None else make_bodies(scene)
    kernel, make = device_maker(comm, cls, kernel)
    record = cls.record(kernel)
    check_fits(bodies, record)
    record.validate_tunables(scene.run.tunables)  # (ConfigError naming record.key) before the load
    run = RankRun(comm, make)
    run.load(bodies, scene.physics, kernel)
    run.set_tunables(scene.run.tunables)
    return run


def check_fits(bodies, record) -> None:
    """ConfigError naming the first body an fp32 kernel cannot hold: a value beyond float32's range
    would be inf from the start (and numpy's overflow warnings the only sign of it)."""
    import numpy as np

    if record.precision != "fp32":
        return
    limit = float(np.finfo(np.float32).max)
    for what, values in (("position", bodies.pos), ("velocity", bodies.vel), ("mass", bodies.mass)):
        rows = np.abs(values.reshape(bodies.n, -1)).max(axis=1) > limit
        if rows.any():
            i = int(np.argmax(rows))
            shown = ", ".join(f"{v:g}" for v in np.atleast_1d(values[i]))
            raise ConfigError(
                f"body {i}: {what} ({shown}) is beyond the range of float32 (|x| <= 3.4e38) "
                f"in which kernel {record.name!r} computes; use a float64 kernel (cpu-fp64, "
                "fp64) or other units"
            )
