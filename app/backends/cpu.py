"""The `cpu` backend: numba-parallel kernels on a host-resident state.

State: contiguous (N, 4) pos [x, y, z, m] and (N, 4) vel [vx, vy, vz, 0] in the precision of the kernel
that last stepped them (float32 for `cpu-simd`, float64 for `cpu-fp64`), the accelerations at the current
positions (so a leapfrog step costs one force evaluation) and a float32 (N,) speed array that the
integrate kernels keep current for the renderer.

`set_kernel` only records the choice: the state is converted to the new kernel's precision at the next
`step`, so switching leaves it bitwise untouched until then.

numba is imported lazily (through `cpu_kernels`): without it the backend reports `why_not` instead of
failing at import, and kernels compile on first use (cached on disk afterwards).
"""

from __future__ import annotations

import logging
import time

import numpy as np

from app.backends.base import Backend, KernelRecord, StepTimings, check_physics
from app.bodies import Bodies
from app.errors import ConfigError, NonFiniteState
from app.physics import Physics

log = logging.getLogger(__name__)

_SOURCE = "app/backends/cpu_kernels.py"
_ORIGIN = "The CUDA Handbook (Wilt), ch. 14 N-body: the multithreaded SIMD CPU variant"

RECORDS = (
    KernelRecord(
        name="cpu-simd",
        doc="fp32 all-pairs, numba parallel over targets + fastmath SIMD over sources (SoA copies)",
        backend="cpu", precision="fp32", source=_SOURCE, entry="accel_float32_*", origin=_ORIGIN),
    KernelRecord(
        name="cpu-fp64",
        doc="float64 all-pairs, numba parallel without fastmath: the accurate CPU path",
        backend="cpu", precision="fp64", source=_SOURCE, entry="accel_float64_*", origin=_ORIGIN),
)
_BY_NAME = {rec.name: rec for rec in RECORDS}
DEFAULT_KERNEL = "cpu-simd"
_DTYPES = {"fp32": np.float32, "fp64": np.float64}


def _kernels_module():
    from app.backends import cpu_kernels  # imports numba

    return cpu_kernels


def _accel_fn(precision: str, physics: Physics):
    """(compiled kernel, scalar args) for this precision and physics; picks the ε = 0 specialisation."""
    dtype = _DTYPES[precision]
    eps2 = dtype(physics.softening ** 2)  # the value the kernel sees (a tiny ε can underflow in fp32)
    h = physics.h
    kernel = _kernels_module().accel_kernel(precision, repulsion=h != 0.0, skip_self=eps2 == 0)
    return kernel, (eps2, dtype(physics.G), dtype(h))


def cpu_accelerations_fp64(pos: np.ndarray, mass: np.ndarray, physics: Physics) -> np.ndarray:
    """Float64 accelerations (N, 3) by the numba `cpu-fp64` kernel; a drop-in `accel_fn` for
    app.physics.integrate (same signature as app.physics.accelerations, ~100x faster at N = 1k)."""
    pos = np.asarray(pos, dtype=np.float64)
    n = pos.shape[0]
    pos4 = np.empty((n, 4))
    pos4[:, :3] = pos
    pos4[:, 3] = mass
    acc = np.empty((n, 3))
    kernel, args = _accel_fn("fp64", physics)
    kernel(pos4, *args, acc)
    return acc


class CPUBackend(Backend):
    name = "cpu"
    _warm: set = set()  # (kernel, dtype) combinations already compiled / loaded in this process
    _logged_compile = False

    def __init__(self):
        self._kernel = DEFAULT_KERNEL
        self._physics = Physics()
        self._pos = self._vel = self._acc = None
        self._speed = np.zeros(0, np.float32)
        self._render_pos = None
        self._mass = np.zeros(0)
        self._ids = None
        self._t0 = 0.0  # time at the last change of dt ...
        self._steps = 0  # ... plus steps taken since, times dt

    # --- discovery -------------------------------------------------------------------------------
    @classmethod
    def why_not(cls) -> str | None:
        try:
            import numba  # noqa: F401
        except ImportError as e:
            return f"numba is not importable ({e}); pip install numba"
        return None

    @classmethod
    def kernels(cls) -> list[KernelRecord]:
        return list(RECORDS)

    @classmethod
    def kernel_why_not(cls, name: str) -> str | None:
        if name not in _BY_NAME:
            return f"{name!r} is not a cpu kernel (choose from {', '.join(_BY_NAME)})"
        return cls.why_not()

    # --- state -----------------------------------------------------------------------------------
    def load(self, bodies: Bodies, physics: Physics, kernel: str | None = None) -> None:
        self._physics = check_physics(physics)
        self._kernel = self._resolve(kernel)
        dtype = self._dtype
        self._pos = bodies.pos4(dtype)
        self._vel = bodies.vel4(dtype)
        self._acc = None
        self._mass = bodies.mass.copy()
        self._ids = None if bodies.ids is None else bodies.ids.copy()
        self._speed = np.linalg.norm(self._vel[:, :3], axis=1).astype(np.float32)
        self._render_pos = None
        self._t0, self._steps = float(bodies.time), 0

    @property
    def kernel(self) -> str:
        return self._kernel

    def set_kernel(self, name: str) -> None:
        self._kernel = self._resolve(name)  # the state is converted lazily, at the next step

    def set_physics(self, physics: Physics) -> None:
        physics = check_physics(physics)
        old = self._physics
        if physics.dt != old.dt:
            self._t0, self._steps = self._t0 + self._steps * old.dt, 0
        if (physics.G, physics.softening, physics.h) != (old.G, old.softening, old.h):
            self._acc = None
        self._physics = physics

    @property
    def physics(self) -> Physics:
        return self._physics

    @property
    def n(self) -> int:
        return int(self._mass.shape[0])

    @property
    def _dtype(self):
        return _DTYPES[_BY_NAME[self._kernel].precision]

    def _resolve(self, name: str | None) -> str:
        name = name or DEFAULT_KERNEL
        if name not in _BY_NAME:
            raise ConfigError(f"kernel: {name!r} is not a cpu kernel; choose from {', '.join(_BY_NAME)}")
        return name

    def _require_state(self):
        if self._pos is None:
            raise RuntimeError("CPUBackend: call load() before stepping or reading the state")

    def _to_kernel_precision(self) -> None:
        dtype = self._dtype
        if self._pos.dtype != dtype:
            self._pos = self._pos.astype(dtype)
            self._pos[:, 3] = self._mass  # masses from the float64 originals, not a rounded copy
            self._vel = self._vel.astype(dtype)
            self._acc = None
            self._render_pos = None

    def _warm_up(self, fns) -> None:
        """Compile (or load from numba's cache) the kernels of one step outside the timed region."""
        dtype = self._dtype
        key = (self._kernel, np.dtype(dtype).name, fns[0].py_func.__name__)
        if key in CPUBackend._warm:
            return
        if not CPUBackend._logged_compile:
            log.info("compiling CPU kernels (first run only)…")
            CPUBackend._logged_compile = True
        t = time.perf_counter()
        pos, vel, acc = np.zeros((1, 4), dtype), np.zeros((1, 4), dtype), np.zeros((1, 4), dtype)
        speed = np.zeros(1, np.float32)
        accel, args = fns
        accel(pos, *args, acc)
        k = _kernels_module()
        zero = dtype(0.0)
        k.kick_drift(pos, vel, acc, zero, zero)
        k.kick(vel, acc, zero, speed)
        k.euler_damped(pos, vel, acc, zero, dtype(1.0), speed)
        CPUBackend._warm.add(key)
        log.debug("CPU kernels %s ready in %.2f s", key, time.perf_counter() - t)

    def _accel_fns(self):
        return _accel_fn(_BY_NAME[self._kernel].precision, self._physics)

    def step(self, steps: int = 1) -> StepTimings:
        if steps < 0:
            raise ValueError(f"steps must be >= 0, not {steps}")
        self._require_state()
        self._check_finite()  # before: one bad body contaminates every force within a single step
        self._to_kernel_precision()
        fns = self._accel_fns()
        self._warm_up(fns)
        accel, args = fns
        k = _kernels_module()
        dtype = self._dtype
        phys = self._physics
        pos, vel, speed = self._pos, self._vel, self._speed
        if self._acc is None:
            self._acc = np.zeros((self.n, 4), dtype)
            acc_valid = False
        else:
            acc_valid = True
        acc = self._acc
        dt, half_dt, damping = dtype(phys.dt), dtype(0.5 * phys.dt), dtype(phys.damping)
        leapfrog = phys.integrator == "leapfrog"
        force = integ = 0.0
        evals = 0
        clock = time.perf_counter
        for _ in range(steps):
            if not acc_valid:
                t = clock()
                accel(pos, *args, acc)
                force += clock() - t
                evals += 1
            t = clock()
            if leapfrog:
                k.kick_drift(pos, vel, acc, half_dt, dt)
                t1 = clock()
                accel(pos, *args, acc)
                t2 = clock()
                k.kick(vel, acc, half_dt, speed)
                t3 = clock()
                force += t2 - t1
                integ += (t1 - t) + (t3 - t2)
                evals += 1
                acc_valid = True
            else:
                k.euler_damped(pos, vel, acc, dt, damping, speed)
                integ += clock() - t
                acc_valid = False  # A(x) of the old positions
        if not acc_valid:
            self._acc = None
        self._steps += steps
        self._check_finite()
        return StepTimings(kernel=self._kernel, steps=steps, n=self.n, force_ms=force * 1e3,
                           integrate_ms=integ * 1e3, extra={"force_evals": float(evals)})

    def _check_finite(self) -> None:
        """The GPU's guard on the host: a blown-up state pauses the viewer instead of drawing NaNs.
        One vectorised pass per step() call (about 0.1 ms at N = 65k), not per step."""
        ok = np.isfinite(self._pos).all(axis=1) & np.isfinite(self._vel).all(axis=1)
        if not ok.all():
            raise NonFiniteState(int(np.argmin(ok)), step=self._steps, time=self.time)

    def accelerations(self) -> np.ndarray:
        self._require_state()
        dtype = self._dtype
        if self._acc is not None and self._acc.dtype == dtype:
            return self._acc[:, :3].astype(np.float64)
        fns = self._accel_fns()
        accel, args = fns
        if self._pos.dtype == dtype:
            pos = self._pos
        else:  # kernel switched since the last step: evaluate on a converted copy, state untouched
            pos = self._pos.astype(dtype)
            pos[:, 3] = self._mass
        acc = np.zeros((self.n, 4), dtype)
        accel(pos, *args, acc)
        if pos is self._pos:
            self._acc = acc
        return acc[:, :3].astype(np.float64)

    def state(self) -> Bodies:
        self._require_state()
        return Bodies(pos=self._pos[:, :3].astype(np.float64), vel=self._vel[:, :3].astype(np.float64),
                      mass=self._mass.copy(), time=self.time,
                      ids=None if self._ids is None else self._ids.copy())

    @property
    def time(self) -> float:
        return self._t0 + self._steps * self._physics.dt

    # --- rendering -------------------------------------------------------------------------------
    def host_render_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The live float32 (N, 4) positions and (N,) speeds: no copy on the fp32 path, so they are
        overwritten by the next `step` and must be treated as read-only."""
        self._require_state()
        if self._pos.dtype == np.float32:
            return self._pos, self._speed
        if self._render_pos is None:
            self._render_pos = np.empty(self._pos.shape, np.float32)
        np.copyto(self._render_pos, self._pos, casting="same_kind")
        return self._render_pos, self._speed

    def close(self) -> None:
        self._pos = self._vel = self._acc = self._render_pos = None


BACKEND = CPUBackend
