"""An orbit camera in pure numpy: matrices, projection, mouse gestures and inertia (no GL needed).

Conventions: world +z is up. The eye sits at
    target + distance * (cos(el) cos(az), cos(el) sin(az), sin(el))
with azimuth `az` measured in degrees around +z from +x and elevation `el` in degrees above the x-y plane.
Matrices are 4x4 float64 for column vectors (clip = P @ V @ [x, y, z, 1]); `gl_matrix()` gives the
layout GLSL's `mat4` uniform expects from vispy (the transpose, C-contiguous float32).
Pixel coordinates are image coordinates: x to the right, y down from the top row, pixel centres at +0.5.
A lens `shift` (normalised device x, as in `projection_matrix(aspect, shift)`) slides the picture
sideways without turning the camera: the target is drawn at x = (1 + shift) / 2 of the width, which is
how the viewer centres the scene in the part of the window its panel leaves free (app.render.view_area).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

ELEVATION_LIMIT = 89.0  # degrees; keeps the up vector well defined
ROTATE_DEG_PER_PX = 0.3
ZOOM_PER_WHEEL_STEP = 0.88
INERTIA_TAU_S = 0.12  # angular velocity e-folds in 0.12 s: below 2% of its release value after 0.5 s
INERTIA_MIN_DEG_S = 0.5  # stop when slower than this
RELEASE_STILL_S = 0.1  # a drag that paused this long before the release leaves no spin


def gl_matrix(m: np.ndarray) -> np.ndarray:
    """A column-vector matrix as a vispy `mat4` uniform value (column-major memory)."""
    return np.ascontiguousarray(np.asarray(m, dtype=np.float32).T)


def look_at(eye, target, up=(0.0, 0.0, 1.0)) -> np.ndarray:
    eye, target, up = (np.asarray(v, dtype=np.float64) for v in (eye, target, up))
    f = target - eye
    f /= np.linalg.norm(f)
    s = np.cross(f, up)
    if np.linalg.norm(s) < 1e-12:  # looking along `up`: pick any perpendicular
        s = np.cross(f, (1.0, 0.0, 0.0) if abs(f[0]) < 0.9 else (0.0, 1.0, 0.0))
    s /= np.linalg.norm(s)
    u = np.cross(s, f)
    m = np.eye(4)
    m[0, :3], m[1, :3], m[2, :3] = s, u, -f
    m[:3, 3] = -m[:3, :3] @ eye
    return m


def perspective(fov_deg: float, aspect: float, near: float, far: float) -> np.ndarray:
    f = 1.0 / math.tan(math.radians(fov_deg) / 2.0)
    m = np.zeros((4, 4))
    m[0, 0] = f / aspect
    m[1, 1] = f
    m[2, 2] = (far + near) / (near - far)
    m[2, 3] = 2.0 * far * near / (near - far)
    m[3, 2] = -1.0
    return m


@dataclass
class OrbitCamera:
    azimuth: float = 30.0
    elevation: float = 20.0
    distance: float = 5.0
    target: np.ndarray = field(default_factory=lambda: np.zeros(3))
    fov: float = 45.0
    # inertia state (degrees per second)
    spin: np.ndarray = field(default_factory=lambda: np.zeros(2))  # (d azimuth/dt, d elevation/dt)
    _drag_v: np.ndarray = field(default_factory=lambda: np.zeros(2), repr=False)
    _drag_t: float | None = field(default=None, repr=False)

    def __post_init__(self):
        self.target = np.asarray(self.target, dtype=np.float64).reshape(3).copy()
        self.elevation = float(np.clip(self.elevation, -ELEVATION_LIMIT, ELEVATION_LIMIT))

    @classmethod
    def from_settings(cls, settings, extent: float = 1.0, center=(0.0, 0.0, 0.0), aspect: float = 16 / 9):
        """From a scene's CameraSettings; None distance/target are fitted to `extent` around `center`."""
        cam = cls(
            azimuth=settings.azimuth,
            elevation=settings.elevation,
            fov=settings.fov,
            target=np.asarray(settings.target if settings.target is not None else center, float),
        )
        if settings.distance is None:
            cam.fit(extent, cam.target, aspect=aspect)
        else:
            cam.distance = float(settings.distance)
        return cam

    # --- geometry ------------------------------------------------------------------------------
    @property
    def direction(self) -> np.ndarray:
        """Unit vector from the target to the eye."""
        az, el = math.radians(self.azimuth), math.radians(self.elevation)
        return np.array([math.cos(el) * math.cos(az), math.cos(el) * math.sin(az), math.sin(el)])

    @property
    def eye(self) -> np.ndarray:
        return self.target + self.distance * self.direction

    @property
    def near(self) -> float:
        return self.distance * 1e-3

    @property
    def far(self) -> float:
        return self.distance * 1e3

    def view_matrix(self) -> np.ndarray:
        return look_at(self.eye, self.target)

    def projection_matrix(self, aspect: float, shift: float = 0.0) -> np.ndarray:
        """The perspective; `shift` moves the picture by that much of the half-width in NDC (off-axis)."""
        m = perspective(self.fov, aspect, self.near, self.far)
        if shift:
            m[0, :] += shift * m[3, :]  # clip x += shift * clip w: NDC x += shift
        return m

    def basis(self) -> tuple[np.ndarray, np.ndarray]:
        """(right, up) unit vectors of the image plane in world space."""
        v = self.view_matrix()
        return v[0, :3].copy(), v[1, :3].copy()

    def project(self, points, size: tuple[int, int], shift: float = 0.0) -> np.ndarray:
        """World points (..., 3) to pixel coordinates (..., 2) in a `size` = (width, height) image,
        through the projection with lens `shift`. Points behind the eye come back as NaN.
        """
        w, h = size
        p = np.asarray(points, dtype=np.float64)
        flat = p.reshape(-1, 3)
        hom = np.c_[flat, np.ones(len(flat))]
        clip = hom @ (self.projection_matrix(w / h, shift) @ self.view_matrix()).T
        wc = clip[:, 3:4]
        with np.errstate(divide="ignore", invalid="ignore"):
            ndc = np.where(wc > 0, clip[:, :2] / wc, np.nan)
        px = np.empty_like(ndc)
        px[:, 0] = (ndc[:, 0] + 1.0) * 0.5 * w
        px[:, 1] = (1.0 - ndc[:, 1]) * 0.5 * h
        return px.reshape(p.shape[:-1] + (2,))

    def fit(self, extent: float, center=None, aspect: float = 16 / 9, margin: float = 1.15) -> None:
        """Look at `center` from far enough that a sphere of radius `extent` fills the view with `margin`.

        The sphere fits both vertically and horizontally (narrow windows move further back).
        """
        if center is not None:
            self.target = np.asarray(center, dtype=np.float64).reshape(3).copy()
        extent = float(extent) if np.isfinite(extent) and extent > 0 else 1.0
        half_v = math.radians(self.fov) / 2.0
        half = min(half_v, math.atan(math.tan(half_v) * aspect))
        self.distance = margin * extent / math.sin(half)
        self.spin[:] = 0.0

    # --- gestures ------------------------------------------------------------------------------
    def rotate(self, d_azimuth: float, d_elevation: float) -> None:
        self.azimuth = (self.azimuth + d_azimuth + 180.0) % 360.0 - 180.0
        self.elevation = float(np.clip(self.elevation + d_elevation, -ELEVATION_LIMIT, ELEVATION_LIMIT))

    def drag(self, dx: float, dy: float, t: float | None = None) -> None:
        """Rotate by a mouse drag of (dx, dy) pixels (x right, y down) at time `t` (seconds).

        Dragging right turns the scene right (azimuth decreases); dragging down raises the eye.
        The drag's speed is remembered for the inertia after `release`.
        """
        da, de = -dx * ROTATE_DEG_PER_PX, dy * ROTATE_DEG_PER_PX
        self.rotate(da, de)
        self.spin[:] = 0.0
        if t is not None:
            if self._drag_t is not None and t > self._drag_t:
                v = np.array([da, de]) / max(t - self._drag_t, 1e-3)
                self._drag_v = 0.5 * self._drag_v + 0.5 * v  # light smoothing of jittery events
            self._drag_t = t

    def release(self, t: float | None = None) -> None:
        """End a drag: keep spinning with the drag's last speed unless the mouse had stopped."""
        if self._drag_t is not None and (t is None or t - self._drag_t < RELEASE_STILL_S):
            self.spin = self._drag_v.copy()
        self._drag_v = np.zeros(2)
        self._drag_t = None

    def update(self, dt: float) -> bool:
        """Advance the inertia by `dt` seconds; True while the camera is still moving."""
        if not self.spin.any() or dt <= 0:
            return False
        decay = math.exp(-dt / INERTIA_TAU_S)
        # exact integral of an exponentially decaying angular velocity over dt
        step = self.spin * INERTIA_TAU_S * (1.0 - decay)
        self.rotate(float(step[0]), float(step[1]))
        self.spin *= decay
        if np.hypot(*self.spin) < INERTIA_MIN_DEG_S:
            self.spin[:] = 0.0
        return True

    def pan(self, dx: float, dy: float, viewport_height: int) -> None:
        """Move the target with the mouse: the point under the cursor follows it at the target's depth."""
        per_px = 2.0 * self.distance * math.tan(math.radians(self.fov) / 2.0) / max(viewport_height, 1)
        right, up = self.basis()
        self.target = self.target + (-dx * right + dy * up) * per_px
        self.spin[:] = 0.0

    def zoom(self, steps: float) -> None:
        """Wheel zoom: positive steps move closer (each step multiplies the distance by 0.88)."""
        self.distance = float(np.clip(self.distance * ZOOM_PER_WHEEL_STEP**steps, 1e-6, 1e9))
