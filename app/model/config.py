"""Typed settings: one schema for scene TOML keys and CLI overrides, with messages a user can act on.

Every key is `section.name` (e.g. `physics.dt`). A value is checked for type and range here; whether a
kernel name exists or a file reads is checked where that knowledge lives (the registry, app.model.formats).
The camera keyframes ([[camera.keys]] tables, or a TOML file of [[keys]] for `--camera FILE`) are read
and checked here too (`parse_keys`, `load_keys_file`); app.render.camera_path flies through them.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.core.backend_table import backend_choices
from app.core.errors import ConfigError
from app.core.values import within
from app.model.typed_text import parse_device_count, tunables_table

# the physics' names (app/model/physics.py Physics takes one of each)
INTEGRATORS = ("leapfrog", "euler-damped")
MODELS = ("gravity", "gravity-repulsion")
TIMESTEPS = ("shared", "block")
# block steps: coarser only between max steps and no coarser than the level wanted at the boundary before
# (the default); only between max steps; at any aligned tick (app.engine.blocksteps.relevel)
COARSEN = ("settled", "boundary", "aligned")
BACKEND_CHOICES = backend_choices  # auto, then app/core/backend_table.py's names (read when asked)
COLOR_BY = ("speed", "mass", "none", "component", "component-speed", "component-mass", "error", "error-ab")
COLORMAPS = ("inferno", "magma", "plasma", "viridis", "white")
DRAW_STYLES = ("auto", "sprites", "splat")  # app/render/splat_style.py
TONE_MAPS = ("exp", "aces")  # app/render/splat.py
# several devices (app/parallel/multidevice.py runs them): the drivers and the exchanges a run may name
DRIVERS = ("auto", "threads", "single")  # auto: the decomposition's (Decomposition.driver)
EXCHANGES = ("auto", "peer", "nccl", "host")  # auto: peer copies where every pair can, else host
# snapshot formats: the names of app/model/formats' TABLE (tests/test_format_table.py holds the two equal),
# here so that the settings check a name without loading the readers; formats.register adds a new one's
FORMAT_CHOICES: list[str] = ["tipsy", "nemo", "nbabel", "npz", "csv"]


@dataclass(frozen=True)
class Field:
    """One setting: its type, allowed values and a line of help."""

    kind: str  # float | int | str | bool | vec3 | color | keys (camera keyframe tables) | components |
    #            devices (a number of devices >= 1, or "all") | tunables (a table of NAME = VALUE) |
    #            paths (a list of file paths)
    doc: str
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False  # lo itself not allowed
    # a list is read as it is when asked (the formats' names); a callable is called (the backends' table)
    choices: tuple | list | Callable[[], tuple] | None = None
    optional: bool = False  # may be left unset (None): e.g. camera.distance = fit

    def _limit(self, value: float) -> str:
        """An int key's limit as the integer it is (16777216, not 1.67772e+07)."""
        return str(int(value)) if self.kind == "int" else f"{value:g}"

    def allowed(self) -> tuple | list | None:
        """The values it takes, when it is a choice."""
        return self.choices() if callable(self.choices) else self.choices

    def describe(self) -> str:
        if self.choices:
            return "one of: " + ", ".join(map(str, self.allowed() or ()))
        if self.kind in ("vec3", "color"):
            rng = f" each in [{self.lo:g}, {self.hi:g}]" if self.lo is not None else ""
            return f"three numbers{rng}"
        if self.kind == "bool":
            return "true or false"
        if self.kind == "keys":
            return "[[camera.keys]] tables"
        if self.kind == "components":
            return "tables per component name"
        if self.kind == "devices":
            return "a whole number >= 1, or all"
        if self.kind == "tunables":
            return "a [run.tunables] table of NAME = VALUE"
        if self.kind == "paths":
            return 'a list of file paths, e.g. ["my-kernel.cu"] (comma-separated on the command line)'
        parts = []
        if self.lo is not None:
            parts.append(f"{'>' if self.lo_open else '>='} {self._limit(self.lo)}")
        if self.hi is not None:
            parts.append(f"<= {self._limit(self.hi)}")
        unit = {"float": "a number", "int": "a whole number", "str": "text"}[self.kind]
        return unit + (" " + " and ".join(parts) if parts else "")


SCHEMA: dict[str, dict[str, Field]] = {
    "scene": {
        "name": Field("str", "display name"),
        "description": Field("str", "one paragraph shown by `info` and the panel"),
    },
    "initial": {
        "generator": Field(
            "str", "initial-condition generator (see `nbody-live info --generators`)", optional=True
        ),
        "file": Field("str", "read bodies from this snapshot instead of generating them", optional=True),
        "format": Field(
            "str", "snapshot format; default: by extension or content", choices=FORMAT_CHOICES, optional=True
        ),
        "n": Field("int", "number of bodies for a generator", lo=1, hi=16_777_216),
        "seed": Field("int", "random seed: the same seed gives the same bodies", lo=0, hi=2**63 - 1),
        "subsample": Field(
            "int",
            "a snapshot only: a seeded random subset of this many bodies, the total "
            "mass kept (0 = every body)",
            lo=0,
            hi=16_777_216,
        ),
    },
    "physics": {
        "G": Field("float", "gravitational constant", lo=0, lo_open=True, hi=1e12),
        "softening": Field("float", "Plummer softening length ε", lo=0, hi=1e6),
        "dt": Field("float", "time step", lo=0, lo_open=True, hi=1e6),
        "integrator": Field("str", "leapfrog (kick-drift-kick) or euler-damped", choices=INTEGRATORS),
        "damping": Field(
            "float", "velocity multiplier per step (euler-damped only)", lo=0, lo_open=True, hi=1
        ),
        "model": Field("str", "gravity, or gravity-repulsion (G/r² minus H/r⁴)", choices=MODELS),
        "repulsion": Field("float", "H of the gravity-repulsion model", lo=0, hi=1e12),
        "timesteps": Field(
            "str",
            "shared (every body takes dt) or block (hierarchical levels: body i steps "
            "dt / 2^l_i, dt the max step; leapfrog on the tree, one device)",
            choices=TIMESTEPS,
        ),
        "block_levels": Field("int", "block steps: L, the finest step is dt / 2^L", lo=0, hi=20),
        "block_eta": Field(
            "float",
            "block steps: the accuracy η of the level criterion dt_i = sqrt(2 η ε "
            "/ |a_i|) (smaller: finer levels)",
            lo=0,
            lo_open=True,
            hi=10,
        ),
        "block_coarsen": Field(
            "str",
            "block steps: when a body's level may get coarser: settled (the "
            "default: only between max steps, and only to a level wanted at "
            "the boundary before too; the least drift on softened models, and "
            "its snapshots keep the levels), boundary (only between max steps) "
            "or aligned (at any tick aligned with the coarser step; better "
            "where close encounters at small softening dominate)",
            choices=COARSEN,
        ),
    },
    "camera": {
        "azimuth": Field("float", "degrees around the z axis", lo=-360, hi=360),
        "elevation": Field("float", "degrees above the x-y plane", lo=-90, hi=90),
        "distance": Field(
            "float",
            "distance from the target; unset: fit the scene",
            lo=0,
            lo_open=True,
            hi=1e12,
            optional=True,
        ),
        "target": Field(
            "vec3", "point the camera orbits; unset: centre of mass", lo=-1e12, hi=1e12, optional=True
        ),
        "fov": Field("float", "vertical field of view, degrees", lo=1, hi=170),
        "path": Field(
            "str",
            "recording camera: static, orbit, keys (the [[camera.keys]] tables), or a TOML file of [[keys]]",
        ),
        "orbit_speed": Field(
            "float", "orbit path: degrees of azimuth per second of video", lo=-3600, hi=3600
        ),
        "orbit_elevation": Field(
            "float", "orbit path: elevation, degrees; unset: camera.elevation", lo=-89, hi=89, optional=True
        ),
        "keys": Field(
            "keys", "keyframes: [[camera.keys]] tables with t (s), position, target, fov", optional=True
        ),
    },
    "render": {
        "point_size": Field("float", "sprite diameter in pixels for a body of mean mass", lo=0.5, hi=64),
        "size_by_mass": Field("bool", "scale sprites with mass"),
        "color_by": Field(
            "str",
            "what the colour shows: the colormap by speed, mass or force error (error: against the exact sum,"
            " error-ab: against A/B's kernel B; the viewer's), or each component's colour (-speed / -mass)",
            choices=COLOR_BY,
        ),
        "colormap": Field("str", "colormap", choices=COLORMAPS),
        "brightness": Field("float", "sprite intensity before additive blending", lo=0, lo_open=True, hi=100),
        "background": Field("color", "background colour, RGB in [0, 1]", lo=0, hi=1),
        "min_sprite": Field(
            "float",
            "smallest sprite drawn, in pixels: smaller ones are drawn this size "
            "and dimmed to the same light (fewer pixels, less fill at large N)",
            lo=1,
            hi=16,
        ),
        "draw_limit": Field(
            "int",
            "draw at most this many bodies: above it every k-th body with k times the light (0: all)",
            lo=0,
            hi=2**31 - 1,
        ),
        "style": Field(
            "str",
            "how bodies are drawn: sprites (GL point sprites), splat (CUDA adds each body's light into an "
            "integer frame and tone-maps it: no burn-out at large N, byte-identical recordings; needs a CUDA "
            "backend with GL interop), auto (splat from render.splat_from bodies on CUDA, else sprites)",
            choices=DRAW_STYLES,
        ),
        "splat_from": Field(
            "int", "render.style auto: the body count from which splat is drawn", lo=1, hi=2**31 - 1
        ),
        "exposure": Field(
            "float",
            "splat: the light of one body at N <= 16k, in tone-map units (light per body falls as 1/N "
            "above); 0: automatic, the lit pixels' light-weighted median at 86% of white",
            lo=0,
            hi=1e6,
        ),
        "tone_map": Field(
            "str",
            "splat: exp (1 - exp(-x), as the sprites) or aces (a filmic toe and shoulder)",
            choices=TONE_MAPS,
        ),
        "bloom": Field(
            "float", "splat: a glow around the brightest parts, its strength (0: off)", lo=0, hi=16
        ),
        "bloom_threshold": Field(
            "float", "splat: the glow is of the parts brighter than this x", lo=0, hi=7.99
        ),
        "bloom_radius": Field("float", "splat: the glow's Gaussian sigma, pixels", lo=0.5, hi=32),
        "components": Field(
            "components",
            "per component: render.components.NAME.visible (true/false), "
            ".brightness (0..100), .color (RGB); NAME may be a pattern (halo, "
            "galaxy1-*, *) or an index",
            optional=True,
        ),
    },
    "run": {
        "backend": Field("str", "auto picks CUDA when it works, else the CPU", choices=BACKEND_CHOICES),
        "kernel": Field(
            "str",
            "kernel name from the registry (`nbody-live info --kernels`), or auto "
            "(the backend's default: best on cuda, cpu-simd on cpu)",
        ),
        "kernel_files": Field(
            "paths",
            "CUDA kernel files of yours, as --kernel-file: a list of paths (relative to the scene file), "
            "each joining the registry under the name its header gives (docs/writing-kernels.md)",
        ),
        "steps_per_frame": Field("int", "simulation steps per rendered frame", lo=1, hi=10_000),
        "frames_per_step": Field(
            "int",
            "block time steps: frames drawn inside each max step (K): a frame "
            "advances steps_per_frame / K max steps, the bodies drawn at its "
            "time (the substeps that end by then run, the others' positions "
            "predicted along their drift); 1 draws between max steps only",
            lo=1,
            hi=1024,
        ),
        "gpus": Field(
            "devices",
            "run on this many GPUs (or all), the forces split by the multi-device "
            'driver; with backend cpu: this many CPU "devices"; unset: one device '
            "(on cuda the same run with K = 1; on cpu the CPU backend itself)",
            optional=True,
        ),
        "gpu_driver": Field(
            "str",
            "several devices: one host thread per device (threads), one thread "
            "issuing every device's work (single), or the kernel's split's choice "
            "(auto: single for the tree's domains, else threads)",
            choices=DRIVERS,
        ),
        "exchange": Field(
            "str",
            "several devices: how positions are exchanged after each update (auto: "
            "peer copies where every pair of GPUs can, else host)",
            choices=EXCHANGES,
        ),
        "tunables": Field(
            "tunables",
            "the kernel's tunables, e.g. theta = 0.6 (`nbody-live info --kernels` "
            "lists each kernel's); checked against the kernel the run takes, when "
            "it is assembled; --tunable NAME=VALUE and --set run.tunables.NAME=V "
            "add to them",
        ),
    },
}


def validate_camera_path(settings) -> None:
    """Check a CameraSettings' path: a built-in name with what it needs, or a readable keyframe file."""
    path = settings.path
    if path == "keys":
        if not settings.keys:
            raise ConfigError(
                "camera.path = 'keys' needs [[camera.keys]] tables in the scene file "
                "(t, position, optionally target and fov)"
            )
    elif path not in ("static", "orbit"):
        load_keys_file(path)


def split_key(key: str) -> tuple[str, str]:
    section, _, name = key.partition(".")
    if section not in SCHEMA:
        raise ConfigError(f"unknown scene section {section!r} in {key!r}; sections: " + ", ".join(SCHEMA))
    if not name:
        raise ConfigError(
            f"{key!r} names a section, not a key; keys in [{section}]: " + ", ".join(SCHEMA[section])
        )
    return section, name


def field_for(key: str, extra_keys: dict[str, Field] | None = None) -> Field:
    section, name = split_key(key)
    fields = SCHEMA[section] | (extra_keys or {})
    if name not in fields:
        raise ConfigError(f"unknown key {key!r}; valid keys in [{section}]: {', '.join(fields)}")
    return fields[name]


def _number(key: str, value, want_int: bool):
    if isinstance(value, bool):
        raise ConfigError(f"{key} = {value!r}: expected {'a whole number' if want_int else 'a number'}")
    if isinstance(value, str):
        try:
            value = int(value) if want_int else float(value)
        except ValueError:
            raise ConfigError(
                f"{key} = {value!r}: expected {'a whole number' if want_int else 'a number'}"
            ) from None
    if want_int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int):
            raise ConfigError(f"{key} = {value!r}: expected a whole number")
        return value
    if not isinstance(value, int | float):
        raise ConfigError(f"{key} = {value!r}: expected a number")
    value = float(value)
    if not math.isfinite(value):
        raise ConfigError(f"{key} = {value!r}: must be a finite number")
    return value


def _in_range(key: str, value: float, f: Field) -> None:
    lo = -math.inf if f.lo is None else f.lo
    hi = math.inf if f.hi is None else f.hi
    if not within(value, lo, hi, f.lo_open and f.lo is not None):  # the tunables' test (app/core/values.py)
        raise ConfigError(f"{key} = {value!r} is out of range: must be {f.describe()}")


def coerce(key: str, value, f: Field):
    """Check `value` (from TOML, or a string from the command line) against `f`; return the typed value."""
    if value is None or (isinstance(value, str) and value.lower() in ("none", "auto-fit")) and f.optional:
        if not f.optional:
            raise ConfigError(f"{key} must be set: {f.describe()}")
        return None
    if f.kind == "keys":
        return parse_keys(value, key)
    if f.kind == "devices":
        return parse_device_count(value, key)
    if f.kind == "tunables":
        return tunables_table(key, value)
    if f.kind == "paths":
        items = [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else value
        if not isinstance(items, list | tuple) or not all(isinstance(v, str) and v for v in items):
            raise ConfigError(f"{key} = {value!r}: expected {f.describe()}")
        return tuple(items)
    if f.kind in ("float", "int"):
        v = _number(key, value, f.kind == "int")
        _in_range(key, v, f)
        return v
    if f.kind == "bool":
        if isinstance(value, str):
            low = value.lower()
            if low in ("true", "1", "yes", "on"):
                return True
            if low in ("false", "0", "no", "off"):
                return False
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key} = {value!r}: expected true or false")
    if f.kind in ("vec3", "color"):
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple) or len(items) != 3:
            raise ConfigError(f"{key} = {value!r}: expected three numbers, e.g. 0,0,0")
        out = tuple(_number(key, v, False) for v in items)
        for v in out:
            _in_range(key, v, f)
        return out
    if not isinstance(value, str):
        raise ConfigError(f"{key} = {value!r}: expected text ({f.describe()})")
    if f.choices and value not in (f.allowed() or ()):
        raise ConfigError(f"{key} = {value!r} is not allowed; {f.describe()}")
    return value


# --- camera keyframes: the [[camera.keys]] tables (messages name the key: camera.keys[2].fov, or
# FILE: keys[2].fov); app.render.camera_path flies the camera through them
MAX_KEY_T = 1e6  # seconds
KEY_FIELDS: dict[str, Field] = {
    "t": Field("float", "time of the key, seconds of video", lo=0, hi=MAX_KEY_T),
    "position": Field("vec3", "eye position", lo=-1e12, hi=1e12),
    "target": Field("vec3", "point looked at", lo=-1e12, hi=1e12, optional=True),
    "fov": Field("float", "vertical field of view, degrees", lo=1, hi=170, optional=True),
}


@dataclass(frozen=True)
class Keyframe:
    t: float  # seconds of video
    position: tuple[float, float, float]  # eye, world coordinates
    target: tuple[float, float, float] | None = None  # None: the scene camera's target
    fov: float | None = None  # None: the scene camera's fov


def parse_keys(value, key: str = "camera.keys") -> tuple[Keyframe, ...]:
    """A list of tables (from TOML) -> validated Keyframes; ConfigError naming `key[i].field`."""
    if isinstance(value, str):
        raise ConfigError(
            f"{key} cannot be given as text: write [[camera.keys]] tables in the scene file, "
            "or put [[keys]] tables in a file and pass --camera FILE"
        )
    if not isinstance(value, list | tuple) or not value:
        raise ConfigError(
            f"{key}: expected one or more tables, e.g. [[camera.keys]] t = 0.0 position = [0, -8, 3]"
        )
    keys: list[Keyframe] = []
    for i, table in enumerate(value):
        where = f"{key}[{i}]"
        if isinstance(table, Keyframe):
            keys.append(table)
            continue
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: expected a table with {', '.join(KEY_FIELDS)}")
        unknown = sorted(set(table) - set(KEY_FIELDS))
        if unknown:
            raise ConfigError(
                f"{where}: unknown key {unknown[0]!r}; keys of a camera key: " + ", ".join(KEY_FIELDS)
            )
        for need in ("t", "position"):
            if need not in table:
                raise ConfigError(f"{where}.{need} must be set: {KEY_FIELDS[need].describe()}")
        typed = {name: coerce(f"{where}.{name}", table.get(name), f) for name, f in KEY_FIELDS.items()}
        if typed["target"] is not None and math.dist(typed["position"], typed["target"]) <= 1e-9:
            raise ConfigError(
                f"{where}: position and target are the same point; the camera needs a direction to look in"
            )
        keys.append(Keyframe(**typed))
    for i in range(1, len(keys)):
        if keys[i].t <= keys[i - 1].t:
            raise ConfigError(
                f"{key}[{i}].t = {keys[i].t:g} must be greater than {key}[{i - 1}].t = "
                f"{keys[i - 1].t:g}: key times must increase"
            )
    return tuple(keys)


def load_keys_file(path) -> tuple[Keyframe, ...]:
    """Keyframes from a TOML file with [[keys]] tables (or [[camera.keys]]); ConfigError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"camera path file {str(path)!r} does not exist (--camera takes static, orbit, "
            "keys, or a TOML file with [[keys]] tables)"
        )
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read it: {e}") from None
    if "keys" in data:
        value, key = data["keys"], "keys"
    elif isinstance(data.get("camera"), dict) and "keys" in data["camera"]:
        value, key = data["camera"]["keys"], "camera.keys"
    else:
        raise ConfigError(f"{path}: no [[keys]] tables; each needs t and position, optionally target and fov")
    try:
        return parse_keys(value, key)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
