"""Recording camera paths: a pure function from video time t (seconds, = frame / fps) to a camera pose.

Never wall time: the same scene, path and frame number always give the same view.

    static   the scene's camera ([camera] azimuth, elevation, distance, target, fov), unchanged
    orbit    the scene's camera turning around its target: azimuth = camera.azimuth + orbit_speed * t
             (degrees per second of video), elevation = camera.orbit_elevation (unset: camera.elevation)
    keys     keyframes [[camera.keys]] from the scene TOML: t (s), position (x, y, z), target (x, y, z),
             fov (degrees); target and fov may be left out (the scene camera's are used)
    FILE     a TOML file holding the same [[keys]] tables (`--camera path/to/flight.toml`)

Keyframed positions and targets follow a cubic Hermite spline through every key: the tangent at an
inner key is the Catmull-Rom one for uneven spacing, (p[k+1] - p[k-1]) / (t[k+1] - t[k-1]), and zero at
the first and last key, so the camera eases out of the first key and into the last. The field of view
eases between neighbouring keys with a smoothstep. Before the first key and after the last the camera
holds still. A pose becomes an OrbitCamera (azimuth, elevation, distance, target, fov); elevations beyond
+-89 degrees are clipped to keep the up vector (+z) defined.

Pure numpy; no GL.
"""

from __future__ import annotations

import copy
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.errors import ConfigError

BUILTIN_PATHS = ("static", "orbit", "keys")
KEY_FIELDS = ("t", "position", "target", "fov")
MAX_T = 1e6  # seconds


@dataclass(frozen=True)
class Keyframe:
    t: float  # seconds of video
    position: tuple[float, float, float]  # eye, world coordinates
    target: tuple[float, float, float] | None = None  # None: the scene camera's target
    fov: float | None = None  # None: the scene camera's fov


@dataclass(frozen=True)
class Pose:
    eye: np.ndarray
    target: np.ndarray
    fov: float


# --------------------------------------------------------------------------------------------------
# parsing and validation (messages name the key: camera.keys[2].fov, or FILE: keys[2].fov)


def _fields():
    from app.config import Field

    return {
        "t": Field("float", "time of the key, seconds of video", lo=0, hi=MAX_T),
        "position": Field("vec3", "eye position", lo=-1e12, hi=1e12),
        "target": Field("vec3", "point looked at", lo=-1e12, hi=1e12, optional=True),
        "fov": Field("float", "vertical field of view, degrees", lo=1, hi=170, optional=True),
    }


def parse_keys(value, key: str = "camera.keys") -> tuple[Keyframe, ...]:
    """A list of tables (from TOML) -> validated Keyframes; ConfigError naming `key[i].field`."""
    from app.config import coerce

    if isinstance(value, str):
        raise ConfigError(f"{key} cannot be given as text: write [[camera.keys]] tables in the scene file, "
                          "or put [[keys]] tables in a file and pass --camera FILE")
    if not isinstance(value, list | tuple) or not value:
        raise ConfigError(f"{key}: expected one or more tables, e.g. [[camera.keys]] t = 0.0 "
                          "position = [0, -8, 3]")
    fields = _fields()
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
            raise ConfigError(f"{where}: unknown key {unknown[0]!r}; keys of a camera key: "
                              + ", ".join(KEY_FIELDS))
        for need in ("t", "position"):
            if need not in table:
                raise ConfigError(f"{where}.{need} must be set: {fields[need].describe()}")
        typed = {name: coerce(f"{where}.{name}", table.get(name), f) for name, f in fields.items()}
        if typed["target"] is not None and np.allclose(typed["position"], typed["target"], rtol=0,
                                                       atol=1e-9):
            raise ConfigError(f"{where}: position and target are the same point; the camera needs a "
                              "direction to look in")
        keys.append(Keyframe(**typed))
    for i in range(1, len(keys)):
        if keys[i].t <= keys[i - 1].t:
            raise ConfigError(f"{key}[{i}].t = {keys[i].t:g} must be greater than {key}[{i - 1}].t = "
                              f"{keys[i - 1].t:g}: key times must increase")
    return tuple(keys)


def load_keys_file(path) -> tuple[Keyframe, ...]:
    """Keyframes from a TOML file with [[keys]] tables (or [[camera.keys]]); ConfigError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"camera path file {str(path)!r} does not exist (--camera takes static, orbit, "
                          "keys, or a TOML file with [[keys]] tables)")
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
        raise ConfigError(f"{path}: no [[keys]] tables; each needs t and position, optionally target "
                          "and fov")
    try:
        return parse_keys(value, key)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def validate_settings(settings) -> None:
    """Check a CameraSettings' path: a built-in name with what it needs, or a readable keyframe file."""
    path = settings.path
    if path == "keys":
        if not settings.keys:
            raise ConfigError("camera.path = 'keys' needs [[camera.keys]] tables in the scene file "
                              "(t, position, optionally target and fov)")
    elif path not in ("static", "orbit"):
        load_keys_file(path)


# --------------------------------------------------------------------------------------------------
# interpolation


def hermite(times: np.ndarray, points: np.ndarray, t: float) -> np.ndarray:
    """Cubic Hermite spline through (times[k], points[k]); Catmull-Rom tangents inside, zero at the ends."""
    times = np.asarray(times, dtype=np.float64)
    points = np.asarray(points, dtype=np.float64)
    n = len(times)
    if n == 1 or t <= times[0]:
        return points[0].copy()
    if t >= times[-1]:
        return points[-1].copy()
    k = int(np.searchsorted(times, t, side="right")) - 1
    k = min(max(k, 0), n - 2)

    def tangent(j: int) -> np.ndarray:
        if j == 0 or j == n - 1:
            return np.zeros_like(points[0])
        return (points[j + 1] - points[j - 1]) / (times[j + 1] - times[j - 1])

    h = times[k + 1] - times[k]
    s = (t - times[k]) / h
    s2, s3 = s * s, s * s * s
    h00 = 2 * s3 - 3 * s2 + 1
    h10 = s3 - 2 * s2 + s
    h01 = -2 * s3 + 3 * s2
    h11 = s3 - s2
    return h00 * points[k] + h10 * h * tangent(k) + h01 * points[k + 1] + h11 * h * tangent(k + 1)


def smoothstep_between(times: np.ndarray, values: np.ndarray, t: float) -> float:
    """Piecewise smoothstep between neighbouring keys (holds outside the key range)."""
    times = np.asarray(times, dtype=np.float64)
    if len(times) == 1 or t <= times[0]:
        return float(values[0])
    if t >= times[-1]:
        return float(values[-1])
    k = min(max(int(np.searchsorted(times, t, side="right")) - 1, 0), len(times) - 2)
    s = (t - times[k]) / (times[k + 1] - times[k])
    s = s * s * (3.0 - 2.0 * s)
    return float(values[k] + (values[k + 1] - values[k]) * s)


def apply_pose(camera, eye, target, fov: float) -> None:
    """Point an OrbitCamera from `eye` at `target` with `fov` (stops any inertia)."""
    eye = np.asarray(eye, dtype=np.float64)
    target = np.asarray(target, dtype=np.float64)
    d = eye - target
    dist = float(np.linalg.norm(d))
    if not np.isfinite(dist) or dist <= 0:
        dist, d = 1e-6, np.array([1.0, 0.0, 0.0])
    camera.target = target.copy()
    camera.distance = dist
    camera.azimuth = math.degrees(math.atan2(d[1], d[0]))
    camera.elevation = float(np.clip(math.degrees(math.asin(np.clip(d[2] / dist, -1.0, 1.0))), -89.0, 89.0))
    camera.fov = float(fov)
    camera.spin[:] = 0.0


# --------------------------------------------------------------------------------------------------
# paths


class CameraPath:
    """Base: holds the scene's (fitted) camera; `apply(camera, t)` poses `camera` for video time t."""

    name = "static"

    def __init__(self, base):
        self.base = copy.deepcopy(base)
        self.base.spin[:] = 0.0

    def apply(self, camera, t: float) -> None:
        b = self.base
        camera.azimuth, camera.elevation, camera.distance = b.azimuth, b.elevation, b.distance
        camera.target = b.target.copy()
        camera.fov = b.fov
        camera.spin[:] = 0.0

    def describe(self) -> str:
        return "static camera"


class StaticPath(CameraPath):
    pass


class OrbitPath(CameraPath):
    name = "orbit"

    def __init__(self, base, speed: float, elevation: float | None = None):
        super().__init__(base)
        self.speed = float(speed)
        self.elevation = self.base.elevation if elevation is None else float(elevation)

    def apply(self, camera, t: float) -> None:
        super().apply(camera, t)
        camera.azimuth = (self.base.azimuth + self.speed * float(t) + 180.0) % 360.0 - 180.0
        camera.elevation = float(np.clip(self.elevation, -89.0, 89.0))

    def describe(self) -> str:
        return f"orbit at {self.speed:g} deg/s, elevation {self.elevation:g} deg"


class KeyframePath(CameraPath):
    name = "keys"

    def __init__(self, base, keys, source: str = "camera.keys"):
        super().__init__(base)
        keys = parse_keys(list(keys), source)
        self.keys = keys
        self.source = source
        self.times = np.array([k.t for k in keys], dtype=np.float64)
        self.positions = np.array([k.position for k in keys], dtype=np.float64)
        self.targets = np.array([k.target if k.target is not None else self.base.target for k in keys],
                                dtype=np.float64)
        self.fovs = np.array([k.fov if k.fov is not None else self.base.fov for k in keys], dtype=np.float64)

    def pose(self, t: float) -> Pose:
        t = float(t)
        return Pose(hermite(self.times, self.positions, t), hermite(self.times, self.targets, t),
                    smoothstep_between(self.times, self.fovs, t))

    def apply(self, camera, t: float) -> None:
        p = self.pose(t)
        apply_pose(camera, p.eye, p.target, p.fov)

    def describe(self) -> str:
        return f"{len(self.keys)} keyframes from {self.source} ({self.times[0]:g}-{self.times[-1]:g} s)"


def make_path(settings, base, spec: str | None = None) -> CameraPath:
    """The path `spec` (default: settings.path) for a scene's CameraSettings, around the fitted `base`."""
    spec = settings.path if spec is None else spec
    if spec == "static":
        return StaticPath(base)
    if spec == "orbit":
        return OrbitPath(base, settings.orbit_speed, settings.orbit_elevation)
    if spec == "keys":
        if not settings.keys:
            raise ConfigError("camera path 'keys' needs [[camera.keys]] tables in the scene file "
                              "(t, position, optionally target and fov)")
        return KeyframePath(base, settings.keys, "camera.keys")
    return KeyframePath(base, load_keys_file(spec), str(spec))
