"""Options shared by the sub-commands that take a scene, and turning them into a Scene + Backend."""

from __future__ import annotations

import argparse
import logging
import math
from pathlib import Path

from app.core.errors import ConfigError
from app.model.config import BACKEND_CHOICES, FORMAT_CHOICES, parse_assignment, scalar_value

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

SCENE_HELP = ("a preset name (see `nbody-live info --scenes`), a scene .toml file, or a snapshot file "
              "(Tipsy, NEMO, NBabel, npz, csv) to start from")


SERIES_HELP = "; or a snapshot series to replay: a folder (simulate --out-dir) or a quoted glob"


def add_scene_options(p: argparse.ArgumentParser, scene_required: bool = False, series: bool = False) -> None:
    """SCENE and the scene overrides; `series`: SCENE may also be a snapshot series (run, record)."""
    default = None if scene_required else "plummer"
    p.add_argument("scene", nargs=None if scene_required else "?", default=default, metavar="SCENE",
                   help=SCENE_HELP + ("" if scene_required else " (default: plummer)")
                   + (SERIES_HELP if series else ""))
    g = p.add_argument_group("scene overrides (applied after the scene file)")
    g.add_argument("--n", type=str, metavar="N", help="number of bodies (generators only)")
    g.add_argument("--seed", type=str, metavar="S", help="random seed of the generator (and of --subsample)")
    g.add_argument("--subsample", type=str, metavar="K",
                   help="a snapshot SCENE only: a seeded random subset of K bodies, the total mass kept")
    g.add_argument("--format", choices=FORMAT_CHOICES,
                   help="format of a snapshot SCENE (default: from the extension or content)")
    g.add_argument("--dt", type=str, metavar="DT", help="time step (> 0)")
    g.add_argument("--softening", type=str, metavar="EPS", help="Plummer softening length (>= 0)")
    g.add_argument("--G", type=str, metavar="G", help="gravitational constant (> 0)")
    g.add_argument("--integrator", type=str, metavar="NAME", help="leapfrog | euler-damped")
    g.add_argument("--model", type=str, metavar="NAME", help="gravity | gravity-repulsion")
    g.add_argument("--damping", type=str, metavar="D", help="velocity damping per step, (0, 1]")
    g.add_argument("--repulsion", type=str, metavar="H", help="H of the gravity-repulsion model")
    g.add_argument("--timesteps", type=str, metavar="MODE",
                   help="shared (default: every body takes --dt) | block: hierarchical time steps, body i "
                        "steps dt/2^l_i with l_i from GADGET-2's criterion sqrt(2 eta eps/|a_i|), so only "
                        "the bodies that need short steps take them; --dt is then the max step (give it "
                        "some multiple of a shared step, e.g. --dt 0.0625 for the collision: with the "
                        "preset's 0.002 every body would stay at level 0) and one step is one max step. "
                        "Runs on the tree (kernel tree, or cpu-tree on the CPU), one device "
                        "(docs/blocksteps.md)")
    g.add_argument("--block-levels", dest="block_levels", type=str, metavar="L",
                   help="block steps: levels below --dt, the finest step is dt/2^L (default 6)")
    g.add_argument("--block-eta", dest="block_eta", type=str, metavar="ETA",
                   help="block steps: the level criterion's accuracy (default 0.025; smaller is finer)")
    g.add_argument("--block-coarsen", dest="block_coarsen", type=str, metavar="RULE",
                   help="block steps: settled (default: a level gets coarser only between max steps, and "
                        "only to a level also wanted at the boundary before; its snapshots keep the "
                        "levels, .npz) | boundary (only between max steps; x and v are the whole state) | "
                        "aligned (at any tick aligned with the coarser step; better where close "
                        "encounters at small softening dominate)")
    g.add_argument("--backend", type=str, metavar="NAME",
                   help=f"{' | '.join(BACKEND_CHOICES())} (default: auto = the first that works, best "
                        "first: CUDA, else the CPU)")
    g.add_argument("--kernel", type=str, metavar="NAME",
                   help="kernel from `nbody-live info --kernels` (default: the backend's default: best on "
                        "cuda, cpu-simd on cpu)")
    g.add_argument("--steps-per-frame", dest="steps_per_frame", type=str, metavar="K",
                   help="simulation steps per rendered frame")
    g.add_argument("--frames-per-step", dest="frames_per_step", type=str, metavar="K",
                   help="block time steps: frames drawn inside each max step, so that a long --dt still "
                        "moves smoothly: a frame advances steps-per-frame/K max steps (default 1)")
    g.add_argument("--tunable", dest="tunables", action="append", default=[], metavar="NAME=VALUE",
                   help="a tunable of the kernel, e.g. --tunable theta=0.7 for cpu-tree (repeatable; "
                        "`nbody-live info --kernels` lists each kernel's tunables and their ranges)")
    g.add_argument("--set", dest="assignments", action="append", default=[], metavar="KEY=VALUE",
                   help="any scene key, e.g. --set camera.fov=30 --set render.colormap=viridis "
                        "(repeatable; `nbody-live info --keys` lists them)")


GPUS_HELP = ("split the forces over N GPUs (or all) through the multi-device driver: each GPU holds every "
             "position and does its part as the kernel's record splits it (`info --kernels`: its share of "
             "the targets, a slice of the Newton-3 pair tiles, or a key range of the tree's groups; "
             "docs/multi-gpu.md); with --backend cpu, N CPU \"devices\" (the CI twin). More than the "
             "machine has is an error")


def add_gpu_options(p: argparse.ArgumentParser, gpus_help: str = GPUS_HELP) -> None:
    """--gpus, --gpu-driver, --exchange (run, simulate, record; bench takes a list for --gpus)."""
    from app.model.config import DRIVERS, EXCHANGES

    g = p.add_argument_group("several GPUs (scene keys run.gpus, run.gpu_driver, run.exchange)")
    g.add_argument("--gpus", type=str, metavar="N|all", help=gpus_help)
    g.add_argument("--gpu-driver", dest="gpu_driver", choices=DRIVERS,
                   help="threads: one host thread per GPU; single: one thread issues every GPU's work, "
                        "taking the tree's phases in turns; auto (default): single for a domain split (the "
                        "tree), threads otherwise, as measured on two H100s (docs/multi-gpu.md)")
    g.add_argument("--exchange", choices=EXCHANGES,
                   help="how rows move between GPUs (positions; for Newton 3 the partial forces, for the "
                        "tree the key ranges' forces): peer copies, NCCL (nvidia-nccl-cu13), or through host "
                        "memory; auto (default): peer where every pair of GPUs can reach each other, else "
                        "host")


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
        raise ConfigError(f"--n applies to generators; {scene.initial.file} is a snapshot: use --subsample K "
                          "for a random subset of K of its bodies")
    if scene_arg is None and scene.initial.file:
        scene.name = Path(scene.initial.file).name
    # --tunable over the scene's [run.tunables]
    scene.run.tunables = {**scene.run.tunables, **parse_tunables(getattr(args, "tunables", None) or [])}
    if scene.run.tunables and scene.run.kernel != "auto":
        from app.backends import find_kernel

        find_kernel(scene.run.kernel).validate_tunables(scene.run.tunables)  # before any work
    return scene


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
            raise ConfigError(f"--tunable {text!r}: an empty value in the list; expected NAME=V1,V2,..., "
                              "e.g. --tunable theta=0.3,0.5")
        out[name] = [scalar_value(v) for v in items]
    return out


def split_tunable(text: str) -> tuple[str, str]:
    """'theta=0.7' -> ('theta', '0.7'); ConfigError saying what is expected otherwise."""
    name, eq, value = text.partition("=")
    name, value = name.strip(), value.strip()
    if not eq or not name or not value:
        raise ConfigError(f"--tunable {text!r}: expected NAME=VALUE, e.g. --tunable theta=0.7")
    return name, value


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
        raise ConfigError(f"run.frames_per_step = {scene.run.frames_per_step}: frames are drawn inside a "
                          "step only with block time steps (--timesteps block); with shared steps a frame "
                          "comes after each step: lower --dt for smaller ones, or drop --frames-per-step")
    elif scene.run.gpus is not None:
        cls = several_devices(cls, scene.run.gpus, scene.run.gpu_driver, scene.run.exchange,
                              chosen=scene.run.backend != "auto" or kernel is not None)
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
        raise ConfigError(f"--gpus {scene.run.gpus}: block time steps run on one device (the active-group "
                          "walk is not split across devices yet); drop --gpus, or use --timesteps shared")
    if comm is not None:
        raise ConfigError("block time steps run in one process on one device; run without mpiexec, or use "
                          "--timesteps shared")
    return block_steps_backend_class(cls)


def several_devices(cls, gpus, driver: str = "auto", exchange: str = "auto", chosen: bool = True):
    """The multi-device form of backend `cls` on `gpus` devices (app/backends/multi.py). `chosen`: the
    backend was named (or implied by the kernel); auto falling back to the CPU is not taken for CPU
    devices."""
    from app.backends import backend_classes
    from app.backends.multi import multi_backend_class

    if cls.memory != "device" and not chosen:  # auto fell back to a backend on the host
        why = "; ".join(f"{name}: {other.why_not()}" for name, other in backend_classes().items()
                        if other.why_not())
        raise ConfigError(f"--gpus {gpus}: no GPU is usable here ({why}); --backend {cls.name} --gpus N "
                          f"splits the {cls.name} backend into N devices instead")
    return multi_backend_class(cls, gpus, driver, exchange)


def make_rank_run(comm, scene, bodies=None):
    """This rank's RankRun for a scene: CPU shares, or one GPU per rank picked by local rank."""
    if scene.physics.timesteps == "block":
        block_steps_class(None, scene, comm)  # (ConfigError: one process, one device)
    if scene.run.gpus is not None:
        raise ConfigError(f"--gpus {scene.run.gpus}: under mpiexec each rank takes one GPU (of its local "
                          "rank); leave --gpus out, or run one process with --gpus")
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
            raise ConfigError(f"body {i}: {what} ({shown}) is beyond the range of float32 (|x| <= 3.4e38) "
                              f"in which kernel {record.name!r} computes; use a float64 kernel (cpu-fp64, "
                              "fp64) or other units")


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


class Interruption:
    """SIGINT / SIGTERM caught as a flag while a long loop runs, so that the loop stops between steps
    (never inside one, which would leave a half-kicked state) and can still write what it has done.
    Only the first is caught. `signum` is None until a signal arrives; `exit_code` is the shell's
    128 + signal number."""

    SIGNALS = ("SIGINT", "SIGTERM")

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict = {}

    def __enter__(self) -> Interruption:
        import signal

        for name in self.SIGNALS:
            sig = getattr(signal, name)
            self._previous[sig] = signal.signal(sig, self._catch)
        return self

    def _catch(self, signum, _frame) -> None:
        self.signum = signum
        self._restore()  # a second Ctrl-C is not caught: it stops the process the ordinary way

    def _restore(self) -> None:
        import signal

        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def __exit__(self, *exc) -> None:
        self._restore()

    @property
    def name(self) -> str:
        import signal

        return signal.Signals(self.signum).name if self.signum else ""

    @property
    def exit_code(self) -> int:
        return 128 + self.signum if self.signum else 0


def progress_bar(args: argparse.Namespace, show: bool = True, **options):
    """A tqdm bar on stderr only when stderr is a terminal and neither -q nor --no-progress was given
    (`show` False: not from this process at all, e.g. an MPI rank other than 0)."""
    import sys

    from tqdm import tqdm

    hidden = (not show or getattr(args, "quiet", False) or getattr(args, "no_progress", False)
              or not sys.stderr.isatty())
    return tqdm(disable=hidden, file=sys.stderr, **options)


def report_viewer_outputs(args: argparse.Namespace, viewer, frame_log, recorder,
                          recordings: bool = True) -> None:
    """After `run`'s loop: the live recordings (when `recordings`), then its files; a file that could not
    be written is a RuntimeFault (exit 1), never "wrote"."""
    from app.core.errors import RuntimeFault

    if recordings:  # closing the viewer finalised a recording still running
        from app.render.live_recording import recording_line

        for res in recorder.recordings:
            print(recording_line(res))
    if recorder.error:
        log.error("%s", recorder.error)
    for error in (frame_log.stream_error, viewer.screenshot_error):
        if error:
            raise RuntimeFault(error)
    frame_log.close()
    for path in (args.timings, args.screenshot):
        if path:
            print(f"wrote {path}")
