"""The `cuda` backend: fp32 kernels from kernels/*.cu on a device-resident state.

State on the device: positions float4 [x, y, z, m] (in the renderer's GL vertex buffer once
`attach_gl_buffers` succeeded, else in a plain allocation), velocities float4 [vx, vy, vz, 0],
accelerations float4 (the leapfrog's cached a(x)), speeds float (|v|, in the renderer's speed VBO when
attached) and one int for the non-finite check. Nothing crosses to the host per step but the CUDA-event
timings (and every `check_every` steps a 4-byte check result).

Per step: leapfrog = kick_drift, force, kick (one force launch: the acceleration is cached between
steps); euler-damped = force, euler_damped. Every launch is bracketed by CUDA events (force_ms,
integrate_ms); with interop, map_ms/unmap_ms are host perf_counter times of mapping the VBOs.

All pycuda work happens inside `self._scope` (the primary context pushed for the call only), on the
thread that made the backend. pycuda is imported on first use, never at module import.
"""

from __future__ import annotations

import atexit
import logging
import os
import weakref
from contextlib import contextmanager

import numpy as np

from app.backends.base import Backend, KernelRecord, StepTimings, check_physics
from app.backends.cuda import context, registry
from app.backends.cuda.compile import CompiledModule, compile_file, find_nvcc, nvcc_version, resolve_source
from app.backends.cuda.context import (
    ContextScope,
    CudaUnavailable,
    device_facts,
    driver,
    driver_why_not,
    gl_module_or_reason,
)
from app.backends.cuda.errors import KernelCompileError, NonFiniteState
from app.backends.cuda.interop import GLBuffers, gl_renderer_string, renderer_cannot_interop
from app.backends.cuda.launch import KernelPolicies
from app.bodies import Bodies
from app.errors import BackendUnavailable, ConfigError, RuntimeFault
from app.physics import Diagnostics, Physics
from app.timing import EventTimer

log = logging.getLogger(__name__)

INT_MAX = 0x7FFFFFFF
SOFT_EPS2_MIN = 1e-12  # NBODY_MIN_SOFT_EPS2 in kernels/common.cuh: below it the PLAIN form is used
FLT_MIN = 1.1754943508222875e-38
BYTES_PER_BODY = 16 + 16 + 16 + 4  # pos, vel, acc (float4) + speed (float)
INTEGRATE_BLOCK = 256

_LIVE: weakref.WeakSet = weakref.WeakSet()
_ATEXIT = False


def _close_all_at_exit() -> None:
    """Close every live backend, then make sure pycuda's context stack is empty (else it aborts)."""
    for backend in list(_LIVE):
        try:
            backend.close()
        except Exception as e:  # pragma: no cover - best effort at exit
            log.debug("closing a CUDA backend at exit: %s", e)
    try:
        drv = driver()
        for _ in range(32):
            if drv.Context.get_current() is None:
                break
            drv.Context.pop()
    except Exception:  # pragma: no cover
        pass
    context.release_primary_context()


def force_arguments(physics: Physics) -> tuple[bool, bool, float, float, float]:
    """(repulsion, soft, eps2, G, H) as the force kernels take them.

    The branch-free SOFT form needs ε² >= 1e-12 (so 1/s⁵ stays finite in fp32); below that the PLAIN
    form skips s² = 0 instead, with ε² itself (0 when it would be denormal).
    """
    eps2 = float(physics.softening) ** 2
    soft = eps2 >= SOFT_EPS2_MIN
    if eps2 < FLT_MIN:
        eps2 = 0.0
    h = float(physics.h)
    return h != 0.0, soft, eps2, float(physics.G), h


def _blocks(n: int, block: int) -> tuple[int, int]:
    return ((n + block - 1) // block, 1)


class CudaBackend(KernelPolicies, Backend):
    name = "cuda"
    check_every = 8  # steps between the GPU non-finite checks (0: never)

    _extra_records: list[KernelRecord] = []  # kernels registered at run time (tests, user variants)
    _compiled_memo: dict[tuple, CompiledModule] = {}
    _failed_memo: dict[tuple, KernelCompileError] = {}

    # --- discovery -------------------------------------------------------------------------------
    @classmethod
    def why_not(cls) -> str | None:
        reason = driver_why_not()
        if reason:
            return reason
        if find_nvcc() is None:
            return ("nvcc not found: the kernels are compiled on first use; install the CUDA toolkit "
                    "(or set CUDA_HOME / NBODY_NVCC)")
        return None

    @classmethod
    def kernels(cls) -> list[KernelRecord]:
        return [*registry.RECORDS, *cls._extra_records]

    @classmethod
    def register_kernel(cls, record: KernelRecord) -> None:
        """Add a variant at run time (its .cu must define the NBODY_FORCE_ENTRIES symbols)."""
        if any(r.name == record.name for r in cls.kernels()):
            raise ConfigError(f"a CUDA kernel named {record.name!r} already exists")
        cls._extra_records = [*cls._extra_records, record]

    @classmethod
    def record(cls, name: str) -> KernelRecord:
        for rec in cls.kernels():
            if rec.name == name:
                return rec
        names = ", ".join(r.name for r in cls.kernels())
        raise ConfigError(f"kernel: {name!r} is not a cuda kernel; choose from {names}")

    @classmethod
    def kernel_why_not(cls, name: str) -> str | None:
        reason = cls.why_not()
        if reason:
            return reason
        try:
            rec = cls.record(name)
        except ConfigError as e:
            return str(e)
        for source in (rec.source, registry.INTEGRATE_SOURCE):
            try:
                cls.compiled(source)
            except KernelCompileError as e:
                return f"{e.path.name} does not compile for {e.arch}: {_first_error(e.log)}"
            except CudaUnavailable as e:
                return str(e)
        return None

    @classmethod
    def compiled(cls, source: str) -> CompiledModule:
        """The cubin of a kernels/ file for this device (memoised per process, cached on disk)."""
        arch = device_facts().arch
        path = resolve_source(source)
        key = (str(path), arch, _mtimes(path))
        if key in cls._failed_memo:
            raise cls._failed_memo[key]
        if key not in cls._compiled_memo:
            try:
                cls._compiled_memo[key] = compile_file(path, arch)
            except KernelCompileError as e:
                cls._failed_memo[key] = e
                raise
        return cls._compiled_memo[key]

    @classmethod
    def function_resources(cls, name: str) -> dict:
        """ptxas's registers / spills / stack frame for each entry of a kernel (for the panel and bench)."""
        rec = cls.record(name)
        module = cls.compiled(rec.source)
        return {sym: module.functions.get(sym) for sym in registry.force_symbols(rec)}

    # --- life cycle ------------------------------------------------------------------------------
    def __init__(self):
        global _ATEXIT
        reason = self.why_not()
        if reason:
            raise BackendUnavailable(f"backend 'cuda' is not available: {reason}")
        self._drv = driver()
        self._facts = device_facts()
        self._scope = ContextScope()
        self._closed = False
        self._kernel = registry.DEFAULT_KERNEL
        self._physics = Physics()
        self._block_override: int | None = None
        self._n = 0
        self._mass = np.zeros(0)
        self._ids = None
        self._t0 = 0.0
        self._steps = 0  # steps since _t0 (time = _t0 + _steps * dt)
        self._steps_total = 0  # drives the non-finite check cadence
        self._alloc: dict[str, object] = {}
        self._gl: GLBuffers | None = None
        self._gl_reason: str | None = None  # why interop is not used (after an attach attempt)
        self._warned_copy = False
        self._acc_valid = False
        self._modules: dict[str, object] = {}
        self._functions: dict[tuple[str, str], object] = {}
        self._timer: EventTimer | None = None
        self._flag_host = np.full(1, INT_MAX, dtype=np.int32)
        self._flag_pinned = None  # pinned host copy of the check flag for the live (non-waiting) path
        self._check_event = None
        self._diag_pinned = None  # pinned host buffer of the device diagnostics' ten doubles (diagnostics.py)
        self._diag_pending = None  # the last PendingDiagnostics, which owns that buffer until settled
        self._last_totals: dict[str, float] = {}
        self._init_policies()  # launch policies, tunables, `best`, fp64 state (launch.py)
        _LIVE.add(self)
        if not _ATEXIT:
            atexit.register(_close_all_at_exit)
            _ATEXIT = True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        _LIVE.discard(self)
        try:
            with self._scope:
                if self._gl is not None:
                    self._gl.unregister()
                    self._gl = None
                for alloc in self._alloc.values():
                    alloc.free()
                self._alloc.clear()
                self._close_policies()
                self._functions.clear()
                self._modules.clear()  # unloads the modules while the context is current
                if self._timer is not None:
                    self._timer.release()
                    self._timer = None
                self._flag_pinned = self._diag_pinned = self._diag_pending = None  # freed in the context
        except Exception as e:
            log.warning("releasing CUDA resources failed: %s", e)
        self._n = 0

    def _require_open(self):
        if self._closed:
            raise RuntimeError("this CUDA backend was closed")

    def _require_state(self):
        self._require_open()
        if self._n == 0:
            raise RuntimeError("CudaBackend: call load() before stepping or reading the state")

    # --- kernels and launches --------------------------------------------------------------------
    def _module(self, source: str):
        mod = self._modules.get(source)
        if mod is None:
            compiled = self.compiled(source)
            mod = self._drv.module_from_buffer(compiled.cubin)
            self._modules[source] = mod
        return mod

    def _function(self, source: str, symbol: str, arg_types: str):
        key = (source, symbol)
        fn = self._functions.get(key)
        if fn is None:
            try:
                fn = self._module(source).get_function(symbol)
            except KernelCompileError:
                raise
            except Exception as e:
                raise RuntimeFault(f"{source}: kernel symbol {symbol!r} not found ({e}); every variant must "
                                   "end with NBODY_FORCE_ENTRIES(<entry>, <body>)") from e
            fn.prepare(arg_types)
            self._functions[key] = fn
        return fn

    def _load_kernel(self, name: str) -> None:
        """Compile and load every entry `name` may need, so a later step cannot fail to compile."""
        rec = self.record(name)
        arg_types = registry.launch_policy(rec).arg_types
        for sym in registry.force_symbols(rec):
            self._function(rec.source, sym, arg_types)

    def _ensure_support(self) -> None:
        if self._timer is None:
            self._timer = EventTimer(self._drv)
        src = registry.INTEGRATE_SOURCE
        self._function(src, "kick_drift", "PPPiff")
        self._function(src, "kick", "PPPif")
        self._function(src, "euler_damped", "PPPPiff")
        self._function(src, "speeds", "PPi")
        self._function(src, "first_nonfinite", "PPiP")

    def _launch_force(self, pos_ptr: int, acc_ptr: int, plan=None) -> None:
        """One force launch of the current kernel: acc = A(pos) for the current physics.

        The record's launch policy (registry.LaunchPolicy.kind, implemented in launch.py) decides the
        grid, the specialisation and any extra launches (memset, reduce, second stream); `plan` is the
        cached launch plan (built outside the timed region by `_force`), else it is looked up here.
        """
        (plan or self._force_plan())(pos_ptr, acc_ptr)

    def _launch(self, symbol: str, *args) -> None:
        fn = self._functions[(registry.INTEGRATE_SOURCE, symbol)]
        fn.prepared_call(_blocks(self._n, INTEGRATE_BLOCK), (INTEGRATE_BLOCK, 1, 1), *args)

    def _force(self, pos_ptr: int) -> None:
        plan, acc = self._force_plan(), self._ptr("acc")  # Python work before the first event
        with self._timer.time("force"):
            self._launch_force(pos_ptr, acc, plan)

    def _advance(self, pos: int, speed: int) -> None:
        """One integrator step on the device."""
        if self._active()[0].precision == "fp64":
            self._advance_fp64(pos, speed)  # double state, double integrators (launch.py)
            return
        self._fp64_valid = False  # the float32 state moves on without the double copy
        p = self._physics
        vel, acc, n = self._ptr("vel"), self._ptr("acc"), self._n
        dt = float(p.dt)
        if p.integrator == "leapfrog":
            if not self._acc_valid:
                self._force(pos)
            self._acc_valid = False
            with self._timer.time("integrate"):
                self._launch("kick_drift", pos, vel, acc, n, 0.5 * dt, dt)
            self._force(pos)
            self._acc_valid = True
            with self._timer.time("integrate"):
                self._launch("kick", vel, acc, speed, n, 0.5 * dt)
        else:
            self._acc_valid = False
            self._force(pos)
            with self._timer.time("integrate"):
                self._launch("euler_damped", pos, vel, acc, speed, n, dt, float(p.damping))

    def _launch_check(self, pos: int) -> None:
        self._drv.memset_d32(self._ptr("flag"), INT_MAX, 1)
        self._launch("first_nonfinite", pos, self._ptr("vel"), self._n, self._ptr("flag"))

    def _read_check(self) -> int:
        self._drv.memcpy_dtoh(self._flag_host, self._ptr("flag"))  # waits for the check kernel
        value = int(self._flag_host[0])
        return -1 if value == INT_MAX else value

    def _poll_check(self, launched: bool) -> int:
        """The non-finite check without a host wait: copy the flag into pinned memory behind an event
        and read it once the GPU got there (a frame or two later). Returns the bad index or -1."""
        bad = -1
        if self._check_event is not None and self._check_event.query():
            value = int(self._flag_pinned[0])
            bad = -1 if value == INT_MAX else value
            self._check_event = None
        if launched and self._check_event is None:
            if self._flag_pinned is None:
                self._flag_pinned = self._drv.pagelocked_empty(1, np.int32)
                self._check_event = None
            self._drv.memcpy_dtoh_async(self._flag_pinned, self._ptr("flag"))
            self._check_event = self._drv.Event()
            self._check_event.record()
        return bad

    def _ptr(self, name: str) -> int:
        return int(self._alloc[name])

    @contextmanager
    def _device_arrays(self):
        """(position pointer, speed pointer): the mapped GL buffers, or the plain allocations."""
        if self._gl is None:
            yield self._ptr("pos"), self._ptr("speed")
            return
        with self._gl.mapped() as m:
            if m.pos_bytes < 16 * self._n or m.speed_bytes < 4 * self._n:
                raise RuntimeFault(f"the GL buffers hold {m.pos_bytes // 16} positions / "
                                   f"{m.speed_bytes // 4} speeds but N = {self._n}: resize them and call "
                                   "attach_gl_buffers again")
            yield m.pos, m.speed

    # --- memory ----------------------------------------------------------------------------------
    def _allocate(self, n: int, plain_render_buffers: bool) -> None:
        """(Re)allocate the state buffers for n bodies; raises RuntimeFault saying which N fits."""
        sizes = {"vel": 16 * n, "acc": 16 * n, "flag": 16}
        if plain_render_buffers:
            sizes.update(pos=16 * n, speed=4 * n)
        if self._alloc and self._n == n and set(self._alloc) == set(sizes):
            return
        held = self._n * BYTES_PER_BODY
        for alloc in self._alloc.values():
            alloc.free()
        self._alloc.clear()
        self._n = 0
        need = sum(sizes.values())
        free, _total = self._drv.mem_get_info()
        if need > free:
            raise self._oom(n, need, free, held)
        try:
            for key, size in sizes.items():
                self._alloc[key] = self._drv.mem_alloc(max(size, 16))
        except self._drv.MemoryError as e:
            for alloc in self._alloc.values():
                alloc.free()
            self._alloc.clear()
            free, _total = self._drv.mem_get_info()
            raise self._oom(n, need, free, 0) from e

    def _oom(self, n: int, need: int, free: int, held: int) -> RuntimeFault:
        fits = max(0, int((free + held) * 0.95) // BYTES_PER_BODY)
        return RuntimeFault(f"out of GPU memory: N = {n:,} bodies need {need / 2**20:,.1f} MiB on "
                            f"{self._facts.name} but only {free / 2**20:,.1f} MiB are free; at most "
                            f"N ≈ {fits:,} fits")

    # --- state -----------------------------------------------------------------------------------
    def load(self, bodies: Bodies, physics: Physics, kernel: str | None = None) -> None:
        self._require_open()
        physics = check_physics(physics)
        name = self.record(kernel or registry.DEFAULT_KERNEL).name
        n = bodies.n
        pos4 = np.ascontiguousarray(bodies.pos4(np.float32))
        vel4 = np.ascontiguousarray(bodies.vel4(np.float32))
        speed = np.linalg.norm(vel4[:, :3], axis=1).astype(np.float32)
        with self._scope:
            self._ensure_support()
            self._load_kernel(name)
            if self._gl is not None and (self._n != n if self._n else self._gl_capacity() < n):
                # A new N: the renderer resizes its buffers and attaches them again (the new state
                # waits in plain buffers until then). Attached before the first load: kept if it fits.
                log.info("N = %d: CUDA-GL buffers detached until attach_gl_buffers is called again", n)
                self._gl.unregister()
                self._gl = None
            self._allocate(n, plain_render_buffers=self._gl is None)
            self._n = n
            self._drv.memcpy_htod(self._ptr("vel"), vel4)
            with self._device_arrays() as (pos, spd):
                self._drv.memcpy_htod(pos, pos4)
                self._drv.memcpy_htod(spd, speed)
            self._drv.Context.synchronize()
        self._kernel = name
        self._physics = physics
        self._mass = bodies.mass.astype(np.float64, copy=True)
        self._ids = None if bodies.ids is None else bodies.ids.copy()
        self._t0, self._steps = float(bodies.time), 0
        self._acc_valid = False
        self._fp64_valid = False
        self._after_kernel_change(bodies)  # resolve `best` for this N; fp64: the exact double state

    @property
    def kernel(self) -> str:
        return self._kernel

    def set_kernel(self, name: str) -> None:
        self._require_open()
        rec = self.record(name)
        if self._n:
            with self._scope:
                self._load_kernel(rec.name)  # a compile error leaves the current kernel in place
        else:
            self.compiled(rec.source)
        old, before = self._kernel, self._active_precision()
        self._kernel = rec.name
        try:
            self._after_kernel_change(None, before)
        except Exception:
            self._kernel = old
            self._resolved = None
            raise

    def set_block_size(self, block: int | None) -> None:
        """Force-kernel block size for every variant (None: each record's default)."""
        if block is not None and block not in registry.BLOCK_SIZES:
            allowed = ", ".join(map(str, registry.BLOCK_SIZES))
            raise ConfigError(f"block_size: {block} is not one of {allowed}")
        self._block_override = block

    def set_physics(self, physics: Physics) -> None:
        physics = check_physics(physics)
        old = self._physics
        if physics.dt != old.dt:
            self._t0, self._steps = self._t0 + self._steps * old.dt, 0
        if (force_arguments(physics) != force_arguments(old) or physics.integrator != old.integrator):
            self._acc_valid = False
        self._physics = physics

    @property
    def physics(self) -> Physics:
        return self._physics

    @property
    def n(self) -> int:
        return self._n

    @property
    def time(self) -> float:
        return self._t0 + self._steps * self._physics.dt

    def step(self, steps: int = 1) -> StepTimings:
        self._require_state()
        steps = int(steps)
        timings = StepTimings(kernel=self._kernel, steps=max(steps, 0), n=self._n)
        if steps <= 0:
            return timings
        checked = False
        with self._scope:
            self._timer.reset()
            with self._device_arrays() as (pos, speed):
                for _ in range(steps):
                    self._advance(pos, speed)
                    self._steps += 1
                    self._steps_total += 1
                    if self.check_every and self._steps_total % self.check_every == 0:
                        self._launch_check(pos)
                        checked = True
            if self._gl is not None:
                # Live rendering: never wait on the GPU here (see timers.py); the numbers are those
                # of the newest earlier step() the GPU has finished, usually the previous frame.
                totals = self._timer.collect_lagged()
                if totals is None:
                    totals = self._last_totals
                timings.extra["timings_lagged"] = 1.0
                bad = self._poll_check(checked)
            else:
                totals = self._timer.collect()
                bad = self._read_check() if checked else -1
            self._last_totals = totals
        timings.force_ms = totals.get("force", 0.0)
        timings.integrate_ms = totals.get("integrate", 0.0)
        if self._gl is not None:
            timings.map_ms = self._gl.last_map_ms
            timings.unmap_ms = self._gl.last_unmap_ms
        if bad >= 0:
            raise NonFiniteState(bad, step=self._steps_total, time=self.time)
        return timings

    def check_finite(self) -> None:
        """Run the GPU non-finite check now; raises NonFiniteState with the first bad body."""
        self._require_state()
        with self._scope:
            with self._device_arrays() as (pos, _speed):
                self._launch_check(pos)
            bad = self._read_check()
        if bad >= 0:
            raise NonFiniteState(bad, step=self._steps_total, time=self.time)

    def accelerations(self) -> np.ndarray:
        self._require_state()
        out = np.empty((self._n, 4), dtype=np.float32)
        with self._scope:
            with self._device_arrays() as (pos, _speed):
                self._launch_force(pos, self._ptr("acc"))
            self._acc_valid = True
            if self._active()[0].precision == "fp64":
                return self._read_acc64()
            self._drv.memcpy_dtoh(out, self._ptr("acc"))
        return out[:, :3].astype(np.float64)

    def _read_render_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        pos4 = np.empty((self._n, 4), dtype=np.float32)
        speed = np.empty(self._n, dtype=np.float32)
        with self._scope, self._device_arrays() as (pos, spd):
            self._drv.memcpy_dtoh(pos4, pos)
            self._drv.memcpy_dtoh(speed, spd)
        return pos4, speed

    def state(self) -> Bodies:
        self._require_state()
        exact = self._fp64_state()
        if exact is not None:  # fp64 runs: its double state is the state
            return Bodies(pos=exact[0], vel=exact[1], mass=self._mass.copy(), time=self.time,
                          ids=None if self._ids is None else self._ids.copy())
        vel4 = np.empty((self._n, 4), dtype=np.float32)
        pos4, _speed = self._read_render_arrays()
        with self._scope:
            self._drv.memcpy_dtoh(vel4, self._ptr("vel"))
        return Bodies(pos=pos4[:, :3].astype(np.float64), vel=vel4[:, :3].astype(np.float64),
                      mass=self._mass.copy(), time=self.time,
                      ids=None if self._ids is None else self._ids.copy())

    def diagnostics(self) -> Diagnostics:
        """Energies and momenta reduced on the device (kernels/diagnostics.cu): ten doubles come back,
        never the state. A DeviceDiagnostics, which adds angular_scale = Σ m|r||v|."""
        from app.backends.cuda.diagnostics import device_diagnostics

        return device_diagnostics(self)

    def diagnostics_async(self):
        """The same, started on the device without waiting: a PendingDiagnostics (done() / result())."""
        from app.backends.cuda.diagnostics import launch_diagnostics

        return launch_diagnostics(self)

    # --- rendering -------------------------------------------------------------------------------
    def host_render_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """float32 positions (N, 4) and speeds (N,) read back: the copy path when interop is off."""
        self._require_state()
        # The renderer's first read is the initial fill of its buffers, before it offers them for
        # interop; only a second read without interop means positions travel through the host every
        # frame (with interop, reads are occasional: the camera fitting the bodies, a screenshot).
        self._render_reads = getattr(self, "_render_reads", 0) + 1
        if not self._warned_copy and self._render_reads > 1 and self._gl is None:
            self._warned_copy = True
            why = f" ({self._gl_reason})" if self._gl_reason else ""
            log.warning("CUDA-GL interop is not active%s: positions go device→host→GL every frame", why)
        return self._read_render_arrays()

    def attach_gl_buffers(self, position_vbo: int, speed_vbo: int) -> bool:
        """Register the renderer's VBOs with CUDA and move the state into them (GL context current).

        Protocol for the renderer: (re)allocate the buffers for `n` bodies, then attach. Before deleting
        or resizing attached buffers call `detach_gl_buffers()` (the bodies live in them); `load()` with
        a new N detaches by itself, so after it the renderer resizes and attaches again.
        """
        self._require_open()
        cuda_gl, reason = gl_module_or_reason()
        if cuda_gl is None:
            return self._interop_off(reason)
        renderer = gl_renderer_string()
        if renderer_cannot_interop(renderer):
            return self._interop_off(f"the GL context renders with {renderer}, not on the NVIDIA GPU")
        with self._scope:
            if self._gl is not None:
                try:
                    self._detach_gl()  # the state goes back to plain buffers first
                except Exception as e:
                    self._gl.unregister()
                    self._gl = None
                    self._n = 0
                    raise RuntimeFault(f"the attached GL buffers could not be read back ({e}); the bodies "
                                       "lived in them: load the scene again") from e
            try:
                new = GLBuffers(cuda_gl, position_vbo, speed_vbo)
            except Exception as e:
                return self._interop_off(f"registering GL buffers {position_vbo}, {speed_vbo} failed: {e}")
            if self._n:
                try:
                    with new.mapped() as m:
                        if m.pos_bytes < 16 * self._n or m.speed_bytes < 4 * self._n:
                            raise RuntimeFault(f"GL buffers too small: {m.pos_bytes} / {m.speed_bytes} bytes "
                                               f"for N = {self._n} (need {16 * self._n} / {4 * self._n})")
                        self._drv.memcpy_dtod(m.pos, self._ptr("pos"), 16 * self._n)
                        self._drv.memcpy_dtod(m.speed, self._ptr("speed"), 4 * self._n)
                        self._drv.Context.synchronize()
                except Exception as e:
                    new.unregister()
                    return self._interop_off(str(e))
                for key in ("pos", "speed"):
                    self._alloc.pop(key).free()
            self._gl = new
            self._gl_reason = None
        log.info("CUDA-GL interop active: kernels write GL buffers %d (positions) and %d (speeds)",
                 int(position_vbo), int(speed_vbo))
        return True

    def _interop_off(self, reason: str) -> bool:
        """Registration failed: the state stays in plain buffers and the renderer copies it each frame."""
        self._gl_reason = reason
        log.warning("CUDA-GL interop unavailable (%s): falling back to device→host→GL copies", reason)
        return False

    def _gl_capacity(self) -> int:
        """How many bodies the attached GL buffers can hold."""
        with self._gl.mapped() as m:
            return min(m.pos_bytes // 16, m.speed_bytes // 4)

    def _detach_gl(self) -> None:
        """Move positions and speeds from the GL buffers back into plain allocations, then unregister."""
        gl = self._gl
        if gl is None:
            return
        with self._scope:
            if self._n:
                pos = self._drv.mem_alloc(16 * self._n)
                speed = self._drv.mem_alloc(4 * self._n)
                try:
                    with gl.mapped() as m:
                        self._drv.memcpy_dtod(int(pos), m.pos, 16 * self._n)
                        self._drv.memcpy_dtod(int(speed), m.speed, 4 * self._n)
                    self._drv.Context.synchronize()
                except Exception:
                    pos.free()
                    speed.free()
                    raise
                self._alloc["pos"], self._alloc["speed"] = pos, speed
            gl.unregister()
            self._gl = None

    def detach_gl_buffers(self) -> None:
        """The renderer is about to delete or resize its buffers: take the state back to the device."""
        self._require_open()
        self._detach_gl()
        self._gl_reason = None

    @property
    def gl_buffers(self) -> GLBuffers | None:
        return self._gl

    @property
    def data_path(self) -> str:
        if self._gl is not None:
            return "CUDA-GL interop"
        if self._gl_reason is not None:
            return "device→host→GL copy"
        return "device only (no GL)"

    # --- facts -----------------------------------------------------------------------------------
    def device_info(self) -> dict:
        info = self._facts.as_dict()
        nvcc = find_nvcc()
        info["nvcc"] = nvcc_version(nvcc) if nvcc else None
        info["backend"] = self.name
        return info


def _first_error(log_text: str) -> str:
    for line in log_text.splitlines():
        if "error" in line.lower():
            return line.strip()
    lines = [ln for ln in log_text.splitlines() if ln.strip()]
    return lines[0].strip() if lines else "no output"


def _mtimes(path) -> tuple:
    """Change stamp of a kernel file and the headers beside it (a memo key, not a content hash)."""
    stamps = []
    for p in [path, *sorted(resolve_source("common.cuh").parent.glob("*.cuh"))]:
        try:
            stamps.append(os.stat(p).st_mtime_ns)
        except OSError:
            stamps.append(0)
    return tuple(stamps)
