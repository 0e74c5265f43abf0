"""The integrator's element-wise updates on device arrays (app.engine.integrator.StateOps), per precision.

fp32: kernels/integrate.cu on float4 positions, velocities and
accelerations. fp64: kernels/fp64.cu on dvec4 arrays, which also write the float copies the renderer
draws (positions, velocities, speeds). `force` is a bound force evaluation (CudaEvaluator.bind): only
the launches remain between the timing events.
"""

from __future__ import annotations

from collections.abc import Callable

from app.backends.cuda.policies import ceil_div
from app.engine.forces import ForceWork

INTEGRATE_SOURCE = "integrate.cu"
FP64_SOURCE = "fp64.cu"
BLOCK = 256
BYTES_PER_BODY = 16 + 16 + 16 + 4  # the fp32 state: pos, vel, acc (float4) + speed (float)


class _Ops:
    def __init__(self, device, force: Callable[[], ForceWork], n: int, source: str, kernels: dict[str, str]):
        self.force = force
        self.n = int(n)
        self._grid = (ceil_div(self.n, BLOCK), 1)
        self._fns = {name: device.function(source, name, types) for name, types in kernels.items()}

    def _launch(self, name: str, *args) -> None:
        self._fns[name].prepared_call(self._grid, (BLOCK, 1, 1), *args)


class Fp32Ops(_Ops):
    KERNELS = {"kick_drift": "PPPiff", "kick": "PPPif", "euler_damped": "PPPPiff"}

    def __init__(self, device, force, n: int, pos: int, vel: int, acc: int, speed: int):
        super().__init__(device, force, n, INTEGRATE_SOURCE, self.KERNELS)
        self.pos, self.vel, self.acc, self.speed = pos, vel, acc, speed

    def kick_drift(self, half_dt: float, dt: float) -> None:
        self._launch("kick_drift", self.pos, self.vel, self.acc, self.n, half_dt, dt)

    def kick(self, half_dt: float) -> None:
        self._launch("kick", self.vel, self.acc, self.speed, self.n, half_dt)

    def euler_damped(self, dt: float, damping: float) -> None:
        self._launch("euler_damped", self.pos, self.vel, self.acc, self.speed, self.n, dt, damping)


class Fp64Ops(_Ops):
    KERNELS = {"fp64_kick_drift": "PPPPPidd", "fp64_kick": "PPPPid", "fp64_euler_damped": "PPPPPPidd"}

    def __init__(
        self, device, force, n: int, pos64: int, vel64: int, acc64: int, pos: int, vel: int, speed: int
    ):
        super().__init__(device, force, n, FP64_SOURCE, self.KERNELS)
        self.pos64, self.vel64, self.acc64 = pos64, vel64, acc64
        self.pos, self.vel, self.speed = pos, vel, speed

    def kick_drift(self, half_dt: float, dt: float) -> None:
        self._launch(
            "fp64_kick_drift", self.pos64, self.vel64, self.acc64, self.pos, self.vel, self.n, half_dt, dt
        )

    def kick(self, half_dt: float) -> None:
        self._launch("fp64_kick", self.vel64, self.acc64, self.vel, self.speed, self.n, half_dt)

    def euler_damped(self, dt: float, damping: float) -> None:
        self._launch(
            "fp64_euler_damped",
            self.pos64,
            self.vel64,
            self.acc64,
            self.pos,
            self.vel,
            self.speed,
            self.n,
            dt,
            damping,
        )
