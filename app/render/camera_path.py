"""Recording camera paths: a pure function from video time t (seconds, = frame / fps) to a camera pose.

Never wall time: the same scene, path and frame number always give the same view.

    static   the scene's camera ([camera] azimuth, elevation, distance, target, fov), unchanged
    orbit    the scene's camera turning around its target: azimuth = camera.azimuth + orbit_speed * t
             (degrees per second of video), elevation = camera.orbit_elevation (unset: camera.elevation)
    keys     keyframes [[camera.keys]] from the scene TOML: t (s), position (x, y, z), target (x, y, z),
             fov (degrees); target and fov may be left out (the scene camera's are used)
    FILE     a TOML file holding the same [[keys]] tables (`--camera path/to/flight.toml`)

The keyframes themselves (`Keyframe`, `parse_keys`, `load_keys_file`) are settings: app.model.config reads
and checks them like every other scene key.

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
from dataclasses import dataclass

import numpy as np

from app.core.errors import ConfigError
from app.model.config import load_keys_file, parse_keys

BUILTIN_PATHS = ("static", "orbit", "keys")


@dataclass(frozen=True)
class Pose:
    eye: np.ndarray
    target: np.ndarray
    fov: float


# --------------------------------------------------------------------------------------------------
# validation


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
        self.targets = np.array(
            [k.target if k.target is not None else self.base.target for k in keys], dtype=np.float64
        )
        self.fovs = np.array([k.fov if k.fov is not None else self.base.fov for k in keys], dtype=np.float64)

    def pose(self, t: float) -> Pose:
        t = float(t)
        return Pose(
            hermite(self.times, self.positions, t),
            hermite(self.times, self.targets, t),
            smoothstep_between(self.times, self.fovs, t),
        )

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
            raise ConfigError(
                "camera path 'keys' needs [[camera.keys]] tables in the scene file "
                "(t, position, optionally target and fov)"
            )
        return KeyframePath(base, settings.keys, "camera.keys")
    return KeyframePath(base, load_keys_file(spec), str(spec))
