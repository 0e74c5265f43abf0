"""A Scene: initial conditions + physics + camera + render + run settings.

Precedence: dataclass defaults, then the scene TOML (a preset in assets/scenes/ or a user file), then
CLI flags. Every key is validated by app.model.config with a message naming the key and the allowed range.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from app.model.physics import Physics
from app.model.typed_text import tunables_table


@dataclass
class InitialConditions:
    generator: str | None = "plummer"  # a name from app.model.ics.GENERATORS, or None when `file` is set
    file: str | None = None  # a snapshot to read instead (any format app.model.formats reads)
    format: str | None = None  # force a reader; default: by extension / content
    n: int = 16384
    seed: int = 42
    subsample: int = 0  # a snapshot only: keep a seeded random K of its bodies (0 = all)
    params: dict = field(default_factory=dict)  # generator-specific keys (validated by the generator)


@dataclass
class CameraSettings:
    azimuth: float = 30.0  # degrees around +z
    elevation: float = 20.0  # degrees above the x-y plane
    distance: float | None = None  # None: fit the scene (bodies' 90% radius) into the view
    target: tuple[float, float, float] | None = None  # None: the centre of mass
    fov: float = 45.0  # vertical field of view, degrees
    # the recording camera (app.render.camera_path): static | orbit | keys | a TOML file of [[keys]]
    path: str = "static"
    orbit_speed: float = 12.0  # degrees of azimuth per second of video
    orbit_elevation: float | None = None  # None: `elevation`
    keys: tuple = ()  # config.Keyframe records from [[camera.keys]]


@dataclass
class RenderSettings:
    point_size: float = 3.0  # sprite diameter in pixels for a body of mean mass
    size_by_mass: bool = True
    color_by: str = "speed"  # config.COLOR_BY: speed | mass | none | component[-...] | error | error-ab
    colormap: str = "inferno"
    brightness: float = 1.0  # multiplies each sprite's contribution before additive blending
    background: tuple[float, float, float] = (0.0, 0.0, 0.0)
    min_sprite: float = 3.0  # smallest sprite drawn, px; smaller ones are drawn this size and dimmed
    draw_limit: int = 0  # at most this many bodies drawn (every k-th, k times the light); 0: all
    style: str = "auto"  # config.DRAW_STYLES: sprites | splat | auto (app/render/splat_style.py)
    splat_from: int = 262144  # auto: splat from this many bodies on CUDA (docs/rendering.md, "Measured")
    exposure: float = 0.0  # splat: one body's light at N <= 16k in tone-map units; 0: automatic
    tone_map: str = "exp"  # splat: exp | aces
    bloom: float = 0.0  # splat: the glow's strength around the brightest parts, 0 off (splat_bloom.py)
    bloom_threshold: float = 4.0  # splat: the glow is of the parts brighter than this tone-map x
    bloom_radius: float = 6.0  # splat: the glow's Gaussian sigma, pixels
    # render.components.KEY.{visible, brightness, color}: KEY -> app.model.components.Style, in the order set
    components: dict = field(default_factory=dict)


@dataclass
class RunSettings:
    backend: str = "auto"  # auto, or a name of app/core/backend_table.py
    kernel: str = "auto"  # auto: the backend's default kernel (cuda: best, cpu: cpu-simd)
    kernel_files: tuple = ()  # the user's CUDA kernel files (app/backends/cuda/user_kernels.py)
    steps_per_frame: int = 1
    frames_per_step: int = 1  # block time steps: frames drawn inside each max step (app/backends/block.py)
    gpus: int | str | None = None  # --gpus: a number of devices or "all"; None: one device, no driver
    gpu_driver: str = "auto"  # several devices: auto | threads | single (app.parallel.multidevice.DRIVERS)
    exchange: str = "auto"  # several devices: auto | peer | nccl | host
    tunables: dict = field(default_factory=dict)  # the kernel's: [run.tunables], --tunable NAME=VALUE


@dataclass
class Scene:
    name: str = "untitled"
    description: str = ""
    initial: InitialConditions = field(default_factory=InitialConditions)
    physics: Physics = field(default_factory=Physics)
    camera: CameraSettings = field(default_factory=CameraSettings)
    render: RenderSettings = field(default_factory=RenderSettings)
    run: RunSettings = field(default_factory=RunSettings)
    components: tuple = ()  # [[components]] tables: ((name, first row, end row), ...), app.model.components


# --------------------------------------------------------------------------------------------------
# Loading, overriding, validating

_SECTION_TARGETS = {"initial": "initial", "camera": "camera", "render": "render", "run": "run"}


def preset_names() -> list[str]:
    from app.core.paths import SCENES

    return sorted(p.stem for p in SCENES.glob("*.toml"))


def resolve_scene_path(name_or_path: str):
    """A preset name (`plummer`) or a path to a .toml file -> Path; ConfigError listing presets."""
    from pathlib import Path

    from app.core.errors import ConfigError, InputFileError
    from app.core.paths import SCENES

    p = Path(name_or_path)
    if p.exists() and not p.is_file():  # said before any read: a fifo would block it
        kind = "a folder" if p.is_dir() else "not a regular file (a fifo, a socket or a device)"
        raise InputFileError(
            f"{p}: {kind}; give a preset name, a scene .toml or a snapshot file (a folder of snapshots is a "
            "series, which run and record replay)"
        )
    if p.suffix == ".toml" or p.exists():
        if not p.is_file():
            raise InputFileError(missing_file(p, "scene file"))
        return p
    preset = SCENES / f"{name_or_path}.toml"
    if preset.is_file():
        return preset
    if p.suffix or len(p.parts) > 1:  # a path, not a preset name: say what is wrong with the path
        raise InputFileError(missing_file(p, "scene or snapshot file"))
    raise ConfigError(
        f"unknown scene preset {name_or_path!r}; presets: {', '.join(preset_names())} "
        "(or give a path to a scene .toml or a snapshot file)"
    )


def missing_file(path, what: str) -> str:
    """'<full path>: no such <what>' with the closest names in its folder, when there are any."""
    import difflib
    import os
    from pathlib import Path

    path = Path(os.path.abspath(path))  # absolute and without '..', not resolving links
    folder = path.parent
    if not folder.is_dir():
        return f"{path}: no such {what} (folder {folder} does not exist)"
    close = difflib.get_close_matches(path.name, [c.name for c in folder.iterdir()], n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(close)}?" if close else ""
    return f"{path}: no such {what}{hint}"


def load_scene(name_or_path: str | None = None, overrides: dict[str, object] | None = None) -> Scene:
    """Defaults, then the scene file (preset name or path), then `overrides` ({'physics.dt': '0.002'})."""
    import os
    import tomllib

    from app.core.errors import ConfigError

    scene = Scene()
    if name_or_path:
        path = resolve_scene_path(name_or_path)
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: not valid TOML: {e}") from None
        except UnicodeDecodeError as e:  # a binary or damaged file (found by tests/test_fuzz_readers.py)
            raise ConfigError(
                f"{path}: not a text file (byte {e.object[e.start]:#04x} at offset {e.start} is not "
                "UTF-8); a scene file is TOML text"
            ) from None
        if not data:  # an empty file is a mistake, not a request for the defaults
            raise ConfigError(
                f"{path}: the scene file is empty; give at least an [initial] table (a generator and n, or a "
                "file), or run a preset by name (nbody-live info --scenes, --keys)"
            )
        scene.name = path.stem
        origin = str(path)
        for section, table in data.items():
            if section == "components":  # [[components]]: row ranges with names
                from app.model.components import parse_table

                scene.components = parse_table(table, origin)
                continue
            if not isinstance(table, dict):
                raise ConfigError(
                    f"{origin}: top-level key {section!r} must be a [section] table; "
                    f"sections: {', '.join(_schema_sections())}"
                )
            for key, value in table.items():
                set_value(scene, f"{section}.{key}", value, origin)
        if scene.initial.file:  # a file named in the TOML is where the TOML says, wherever it is run from
            scene.initial.file = os.path.abspath(path.parent / scene.initial.file)
        scene.run.kernel_files = tuple(os.path.abspath(path.parent / f) for f in scene.run.kernel_files)
    for key, value in (overrides or {}).items():
        set_value(scene, key, value, "command line")
    validate(scene)
    return scene


def _schema_sections():
    from app.model.config import SCHEMA

    return list(SCHEMA)


def set_value(scene: Scene, key: str, value, origin: str = "") -> None:
    """Validate one `section.key = value` and store it; generator parameters go to initial.params."""
    from dataclasses import replace

    from app.core.errors import ConfigError
    from app.model import config

    section, name = config.split_key(key)
    prefix = f"{origin}: " if origin else ""
    if section == "initial" and name not in config.SCHEMA["initial"]:
        scene.initial.params[name] = value  # checked against the generator's own spec in validate()
        return
    if section == "run" and name.startswith("tunables."):  # --set run.tunables.theta=0.6: one of the table
        typed = tunables_table(key.rpartition(".")[0], {name.split(".", 1)[1]: value})
        scene.run.tunables = {**scene.run.tunables, **typed}
        return
    if section == "render" and name.split(".", 1)[0] == "components":
        from app.model.components import set_style

        scene.render.components = set_style(scene.render.components, name, value, origin)
        return
    try:
        typed = config.coerce(key, value, config.field_for(key))
    except ConfigError as e:
        raise ConfigError(prefix + str(e)) from None
    if section == "scene":
        setattr(scene, name, typed)
    elif section == "physics":
        scene.physics = replace(scene.physics, **{name: typed})
    else:
        setattr(getattr(scene, _SECTION_TARGETS[section]), name, typed)


def validate(scene: Scene) -> None:
    """Cross-key checks: a generator or a file (not both), the generator's own parameters."""
    from app.core.errors import ConfigError
    from app.model import ics

    if scene.run.kernel_files:  # before the kernel name is looked up: it may be one of them
        from app.backends.cuda import user_kernels

        user_kernels.load(scene.run.kernel_files, ())
    if scene.run.kernel != "auto":
        from app.backends import find_kernel

        find_kernel(scene.run.kernel)  # ConfigError listing every kernel name
    from app.model.config import validate_camera_path

    validate_camera_path(scene.camera)
    init = scene.initial
    if init.subsample and not init.file:
        raise ConfigError(
            "initial.subsample applies only to a snapshot (initial.file); a generator takes initial.n"
        )
    if init.file:
        if init.params:
            raise ConfigError(
                f"initial.file is set, so generator parameters "
                f"{', '.join('initial.' + k for k in init.params)} do not apply"
            )
        return
    if not init.generator:
        raise ConfigError(
            "the scene needs initial.generator or initial.file; generators: " + ", ".join(ics.GENERATORS)
        )
    if init.generator not in ics.GENERATORS:
        raise ConfigError(
            f"initial.generator = {init.generator!r} is unknown; generators: " + ", ".join(ics.GENERATORS)
        )
    init.params = ics.validate_params(init.generator, init.params, key_prefix="initial.")


SAY_GENERATING_FROM = 1_000_000  # bodies: a galaxy of 2 M takes ~5 s to make on one core


def make_bodies(scene: Scene):
    """The scene's initial Bodies: read from initial.file or generated (deterministic from the seed).
    A scene's [[components]] tables replace the components the file or the generator gave."""
    from app.model import components, formats, ics

    init = scene.initial
    if init.file:
        bodies = formats.read(init.file, format=init.format)
        if scene.components:
            bodies.components = components.from_table(scene.components, bodies.n, f"{scene.name}")
        return subsample(bodies, init.subsample, init.seed) if init.subsample else bodies
    assert init.generator is not None, "a scene without a file names a generator (InitialConditions)"
    if init.n >= SAY_GENERATING_FROM:  # seconds on a CPU core: say what the wait is for
        logging.getLogger("nbody-live").info("generating %s bodies of %r ...", f"{init.n:,}", init.generator)
    bodies = ics.generate(
        init.generator, init.n, init.seed, init.params, G=scene.physics.G, softening=scene.physics.softening
    )
    if scene.components:
        bodies.components = components.from_table(scene.components, bodies.n, f"{scene.name}")
    return bodies


def subsample(bodies, k: int, seed: int):
    """A seeded random subset of `k` bodies (in their file order), masses scaled so that the total mass,
    and with it the dynamical time and the virial balance, stays that of the whole snapshot."""
    import numpy as np

    from app.core.errors import ConfigError
    from app.model.bodies import Bodies

    if k >= bodies.n:
        raise ConfigError(f"initial.subsample = {k}: the snapshot has only {bodies.n} bodies")
    rows = np.sort(np.random.default_rng(seed).choice(bodies.n, size=k, replace=False))
    mass = bodies.mass[rows] * (bodies.mass.sum() / bodies.mass[rows].sum())
    ids = None if bodies.ids is None else bodies.ids[rows]
    comp = None if bodies.components is None else bodies.components.take(rows)
    return Bodies.from_arrays(bodies.pos[rows], bodies.vel[rows], mass, bodies.time, ids, "subsample", comp)
