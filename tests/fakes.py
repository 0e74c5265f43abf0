"""Test doubles of `app.backends.base.Backend`, and what they share."""

from __future__ import annotations

import numpy as np

from app.backends.base import Backend, KernelRecord, StepTimings, TunablesPerKernel
from app.engine.forces import Span, all_pairs_work
from app.model.bodies import Bodies
from app.model.physics import Physics


class BackendDouble(TunablesPerKernel):
    """What test doubles share: physics kept as given, and the Backend ABC's tunables kept per kernel
    against its record (TunablesPerKernel, as the multi-device and MPI backends keep them). A double mixes
    this in before `Backend`."""

    _physics = Physics()
    _t0, _steps = 0.0, 0  # (Backend.time: t0 + steps * dt)

    def set_physics(self, physics) -> None:
        self._physics = physics

    @property
    def physics(self):
        return self._physics


class FakeBackend(BackendDouble, Backend):
    """Bodies exactly where the test puts them; step() only counts."""

    name = "fake"

    def __init__(self, pos4, speeds=None, interop: bool = False):
        self.set_bodies(pos4, speeds)
        self.interop = interop
        self.steps = 0
        self.attached: list[tuple[int, int]] = []
        self.host_reads = 0

    def set_bodies(self, pos4, speeds=None):
        self.pos4 = np.asarray(pos4, np.float32).reshape(-1, 4).copy()
        self.speeds = (
            np.ones(len(self.pos4), np.float32) if speeds is None else np.asarray(speeds, np.float32).copy()
        )

    @classmethod
    def why_not(cls):
        return None

    @classmethod
    def kernels(cls):
        return [KernelRecord(name="fake", doc="test double", backend="fake")]

    def load(self, bodies, physics, kernel=None):
        self.set_bodies(bodies.pos4())

    @property
    def kernel(self):
        return "fake"

    def set_kernel(self, name):
        pass

    @property
    def n(self):
        return len(self.pos4)

    def step(self, steps=1):
        self.steps += steps
        work = all_pairs_work(Span.all(self.n), Span.all(self.n))
        return StepTimings(
            kernel=self.kernel,
            steps=steps,
            n=self.n,
            force_ms=0.25,
            interactions=work.interactions * steps,
            pair_equivalent=work.pair_equivalent * steps,
        )

    def accelerations(self):
        return np.zeros((self.n, 3))

    def state(self):
        return Bodies(self.pos4[:, :3].astype(float), np.zeros((self.n, 3)), self.pos4[:, 3].astype(float))

    def host_render_arrays(self):
        self.host_reads += 1
        return self.pos4.copy(), self.speeds.copy()

    def attach_gl_buffers(self, position_vbo, speed_vbo):
        self.attached.append((position_vbo, speed_vbo))
        return self.interop

    @property
    def data_path(self):
        return "CUDA-GL interop" if self.interop else "host upload"
