"""A runnable check of the renderer without the CLI or a physics backend.

    python -m app.render.demo_window --frames 120 [--screenshot PATH] [--headless] [--n 4000]

Shows a seeded Plummer sphere that turns differentially about +z (a stand-in Backend, no gravity), in a
glfw window when a display exists, else headless on EGL. Escape or closing the window exits with
status 0; `--frames N` exits after N frames; `--screenshot PATH` writes a PNG of the last frame on exit.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from app.backends.base import Backend, KernelRecord, StepTimings
from app.bodies import Bodies
from app.physics import Physics


def plummer(n: int, seed: int = 42, a: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Positions (n, 3) of a Plummer sphere of scale radius `a` (radii cut at 10 a) and equal masses 1/n."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.0, 1.0, n) * (1.0 - 1e-3) + 1e-3
    r = a / np.sqrt(x ** (-2.0 / 3.0) - 1.0)
    r = np.minimum(r, 10.0 * a)
    u = rng.normal(size=(n, 3))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    return u * r[:, None], np.full(n, 1.0 / n)


class TurningCloud(Backend):
    """Holds a cloud and turns it about +z by a radius-dependent angle per step (no physics)."""

    name = "demo"
    _KERNEL = KernelRecord(name="demo-turn", doc="rotates the bodies about +z; no gravity", backend="demo")

    def __init__(self, omega: float = 0.6):
        self.omega = omega
        self._physics = Physics()
        self._pos = np.zeros((0, 3))
        self._mass = np.zeros(0)
        self._time = 0.0

    @classmethod
    def why_not(cls):
        return None

    @classmethod
    def kernels(cls):
        return [cls._KERNEL]

    def load(self, bodies: Bodies, physics: Physics, kernel=None) -> None:
        self._pos = bodies.pos.copy()
        self._mass = bodies.mass.copy()
        self._physics = physics
        self._time = bodies.time

    @property
    def kernel(self) -> str:
        return self._KERNEL.name

    def set_kernel(self, name: str) -> None:
        pass

    def set_physics(self, physics: Physics) -> None:
        self._physics = physics

    @property
    def physics(self) -> Physics:
        return self._physics

    @property
    def n(self) -> int:
        return len(self._mass)

    def _angular_velocity(self) -> np.ndarray:
        r = np.hypot(self._pos[:, 0], self._pos[:, 1])
        return self.omega / (1.0 + r) ** 1.5

    def step(self, steps: int = 1) -> StepTimings:
        t0 = time.perf_counter()
        dt = self._physics.dt * 10.0 * steps
        ang = self._angular_velocity() * dt
        c, s = np.cos(ang), np.sin(ang)
        x, y = self._pos[:, 0].copy(), self._pos[:, 1]
        self._pos[:, 0] = c * x - s * y
        self._pos[:, 1] = s * x + c * y
        self._time += dt
        return StepTimings(kernel=self.kernel, steps=steps, n=self.n,
                           integrate_ms=(time.perf_counter() - t0) * 1e3)

    def accelerations(self) -> np.ndarray:
        return np.zeros((self.n, 3))

    def state(self) -> Bodies:
        w = self._angular_velocity()
        vel = np.c_[-w * self._pos[:, 1], w * self._pos[:, 0], np.zeros(self.n)]
        return Bodies(self._pos.copy(), vel, self._mass.copy(), self._time)


def make_demo(n: int = 4000, seed: int = 42, omega: float = 0.6):
    """(scene, backend) for the demo: a Plummer sphere in a TurningCloud."""
    from app.scene import Scene

    pos, mass = plummer(n, seed)
    backend = TurningCloud(omega)
    backend.load(Bodies.from_arrays(pos, np.zeros_like(pos), mass, source="demo"), Physics())
    return Scene(name="demo"), backend


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m app.render.demo_window", description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=None, help="exit after this many frames")
    ap.add_argument("--screenshot", default=None, help="write a PNG of the last frame here on exit")
    ap.add_argument("--n", type=int, default=4000, help="bodies (default 4000)")
    ap.add_argument("--size", default="960x540", help="window size WxH (default 960x540)")
    ap.add_argument("--omega", type=float, default=0.6, help="turning rate of the cloud; 0 holds it still")
    ap.add_argument("--headless", action="store_true", help="render on EGL even when a display exists")
    args = ap.parse_args(argv)
    w, h = (int(v) for v in args.size.lower().split("x"))

    from app.render.canvas import Viewer

    scene, backend = make_demo(args.n, omega=args.omega)
    viewer = Viewer(scene, backend, size=(w, h), headless=True if args.headless else None,
                    title="NBody Live demo")
    viewer.screenshot_on_exit = args.screenshot
    print(f"demo_window: {viewer.kind} window {w}x{h}, N={args.n}", flush=True)
    rc = viewer.run(frames=args.frames)
    print(f"demo_window: exit after {viewer.stats.frame} frames", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
