"""K CPU "devices" for the multi-device driver (app/multidevice.py): the CPU backend split into shares.

Each CpuDevice owns full-size host arrays (its own copy of the positions, as a GPU would) and the
numba kernels of the CPU backend: its record's evaluator for the forces of its share against all
sources, and the element-wise updates on its share's rows. This is the CI twin of the multi-GPU run:
the splitting, both drivers, the exchange and the re-balancing are tested here without a GPU, and
accelerations and fp64 trajectories from K shares are bitwise those of one device (every row is summed
by the same kernel over the same sources in the same order, whoever computes it).
"""

from __future__ import annotations

import time

import numpy as np

from app.backends.cpu import CPUBackend, CpuOps
from app.bodies import Bodies
from app.forces import ForceWork, Span
from app.integrator import Integrator
from app.multidevice import HostExchange, MultiDeviceOps, balanced_weights, make_driver, split
from app.physics import Physics

_DTYPES = {"fp32": np.float32, "fp64": np.float64}


class CpuDevice:
    """One CPU "device": full-size pos / vel / acc / speed arrays, current on its share (pos everywhere)."""

    def __init__(self, index: int, record_name: str, physics: Physics, bodies: Bodies, share: Span):
        record = CPUBackend.record(record_name)
        dtype = _DTYPES[record.precision]
        self.name = f"cpu{index}"
        self.share = share
        self.evaluator = record.policy.evaluator(record, physics)
        self.pos, self.vel = bodies.pos4(dtype), bodies.vel4(dtype)
        self.acc = np.zeros_like(self.pos)
        self.speed = np.linalg.norm(self.vel[:, :3], axis=1).astype(np.float32)
        self.everyone = Span.all(bodies.n)
        self.last_force_ms = 0.0

    def _share_ops(self) -> CpuOps:
        rows = self.share.as_slice()
        return CpuOps(self.evaluator, self.pos[rows], self.vel[rows], self.acc[rows], self.speed[rows])

    def force(self) -> ForceWork:
        t = time.perf_counter()
        work = self.evaluator.evaluate(self.pos, self.acc, self.share, self.everyone)
        self.last_force_ms = (time.perf_counter() - t) * 1e3
        return work

    def kick_drift(self, half_dt: float, dt: float) -> None:
        self._share_ops().kick_drift(half_dt, dt)

    def kick(self, half_dt: float) -> None:
        self._share_ops().kick(half_dt)

    def euler_damped(self, dt: float, damping: float) -> None:
        self._share_ops().euler_damped(dt, damping)

    def synchronize(self) -> None:
        """CPU work is done when its call returns."""

    def rows(self, field: str, span: Span) -> np.ndarray:
        return getattr(self, field)[span.as_slice()]

    def set_rows(self, field: str, span: Span, values) -> None:
        getattr(self, field)[span.as_slice()] = values


class CpuMultiDevice:
    """A simulation over K CPU devices: load, step (the shared Integrator), re-balance, read back."""

    def __init__(self, k: int, driver: str = "threads", weights=None):
        if k < 1:
            raise ValueError(f"devices: {k} must be >= 1")
        self.k, self.driver_name = int(k), driver
        self.weights = list(weights) if weights is not None else [1.0] * self.k
        self.devices: list[CpuDevice] = []
        self.ops: MultiDeviceOps | None = None
        self.integrator = Integrator()
        self.physics = Physics()

    def load(self, bodies: Bodies, physics: Physics, kernel: str = "cpu-fp64") -> None:
        self.close()
        self.physics = physics
        spans = split(bodies.n, self.weights)
        self.devices = [CpuDevice(i, kernel, physics, bodies, spans[i]) for i in range(self.k)]
        self.ops = MultiDeviceOps(self.devices, make_driver(self.driver_name, self.devices), HostExchange())
        self.integrator.invalidate()

    def step(self, steps: int = 1) -> ForceWork:
        return self.integrator.step(self.ops, self.physics, steps)

    def accelerations(self) -> np.ndarray:
        self.ops.force()
        self.integrator.acc_valid = True
        return self.gathered("acc")[:, :3].astype(np.float64)

    def rebalance(self) -> list[Span]:
        """Shares from each device's last measured force time (see multidevice.balanced_weights)."""
        shares = [d.share for d in self.devices]
        self.weights = balanced_weights(self.weights, shares, self.ops.force_times_ms())
        spans = split(sum(s.count for s in shares), self.weights)
        self.ops.reshare(spans)
        return spans

    def gathered(self, field: str) -> np.ndarray:
        """The whole of `field`, each row from the device that owns it."""
        out = np.empty_like(getattr(self.devices[0], field))
        for device in self.devices:
            out[device.share.as_slice()] = device.rows(field, device.share)
        return out

    def close(self) -> None:
        if self.ops is not None:
            self.ops.driver.close()
            self.ops = None
