"""The `cuda` backend: fp32 (and fp64) kernels from kernels/*.cu on a device-resident state.

State on the device: positions float4 [x, y, z, m] (in the renderer's GL vertex buffer once
`attach_gl_buffers` succeeded, else in a plain allocation), velocities float4 [vx, vy, vz, 0],
accelerations float4 (the leapfrog's cached a(x)), speeds float (|v|, in the renderer's speed VBO when
attached) and one int for the non-finite check; the fp64 record adds a double state. Nothing crosses
to the host per step but the CUDA-event timings (and every `check_every` steps a 4-byte check result).

A step is the shared integrator, through the backend's Stepper (app/integrator.py: the cached a(x), the
steps counted, the non-finite check every `check_every` of them), over this backend's StateOps
(state_ops.py), whose force is the current record's CudaEvaluator (evaluator.py) bound to the whole
state. Every launch is bracketed by CUDA events of the device's timer (force_ms, integrate_ms); with
interop, map_ms/unmap_ms are host perf_counter times of mapping the VBOs.

The GPU is a CudaDevice (device.py): all driver work happens inside its scope (its primary context
pushed for the call only), on the thread that made the backend. pycuda is imported on first use,
never at module import.
"""

from __future__ import annotations

import atexit
import logging
import weakref
from contextlib import contextmanager

import numpy as np

from app.backends.base import INTEROP_PATH, Backend, KernelRecord, StepTimings, check_physics
from app.backends.cuda import registry
from app.backends.cuda.compile import find_nvcc, nvcc_version
from app.backends.cuda.context import (
    CudaUnavailable,
    default_ordinal,
    device_facts,
    driver_why_not,
    release_primary_contexts,
)
from app.backends.cuda.device import CudaDevice, compiled
from app.backends.cuda.errors import KernelCompileError, NonFiniteState
from app.backends.cuda.evaluator import make_evaluator
from app.backends.cuda.force_sample import EXACT_KERNEL, exact_rows
from app.backends.cuda.interop import GLBuffers, fall_back, register_gl_buffers
from app.backends.cuda.nonfinite import NonFiniteCheck
from app.backends.cuda.policies import ceil_div, force_arguments, suffix
from app.backends.cuda.state import GpuState
from app.backends.cuda.state_ops import INTEGRATE_SOURCE, Fp64Ops
from app.bodies import Bodies
from app.errors import BackendUnavailable, ConfigError, RuntimeFault
from app.forces import ForceEvaluator, Span
from app.integrator import CHECK_EVERY, Stepper
from app.physics import Diagnostics, Physics
from app.timing import stage_entries

log = logging.getLogger(__name__)

_LIVE: weakref.WeakSet = weakref.WeakSet()
_ATEXIT = False


def _close_all_at_exit() -> None:
    """Close every live backend, then make sure pycuda's context stack is empty (else it aborts)."""
    for backend in list(_LIVE):
        try:
            backend.close()
        except Exception as e:  # pragma: no cover - best effort at exit
            log.debug("closing a CUDA backend at exit: %s", e)
    release_primary_contexts()


class CudaBackend(Backend):
    name = "cuda"
    check_every = CHECK_EVERY  # steps between the GPU non-finite checks (0: never)

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
        return list(registry.RECORDS)

    @classmethod
    def kernel_why_not(cls, name: str) -> str | None:
        reason = cls.why_not()
        if reason:
            return reason
        try:
            rec = cls.record(name)
        except ConfigError as e:
            return str(e)
        sources = [(rec.source, rec.policy.nvcc_options), (INTEGRATE_SOURCE, None)]
        for source, options in sources if not rec.policy.resolves else sources[1:]:
            try:
                compiled(source, device_facts().arch, options)
            except KernelCompileError as e:
                return f"{e.path.name} does not compile for {e.arch}: {_first_error(e.log)}"
            except CudaUnavailable as e:
                return str(e)
        return None

    # --- life cycle ------------------------------------------------------------------------------
    def __init__(self, device: int | None = None):
        global _ATEXIT
        reason = self.why_not()
        if reason:
            raise BackendUnavailable(f"backend 'cuda' is not available: {reason}")
        try:
            self.device = CudaDevice(default_ordinal() if device is None else device)
        except CudaUnavailable as e:
            raise BackendUnavailable(f"backend 'cuda' is not available: {e}") from e
        self._drv = self.device.drv
        self._scope = self.device.scope
        self._closed = False
        self._kernel = registry.DEFAULT_KERNEL
        self._physics = Physics()
        self._records = {r.name: r for r in self.kernels()}
        self._evaluators: dict[str, ForceEvaluator] = {}
        # the integrator's cached a(x) and the steps since load, which drive the non-finite check cadence
        # and name the step of a NonFiniteState (as in the runs over devices, app/multidevice.py)
        self._stepper = Stepper()
        self._n = 0
        self._mass = np.zeros(0)
        self._ids = None
        self._t0 = 0.0
        self._steps = 0  # steps since _t0 (time = _t0 + _steps * dt)
        self._state = GpuState(self.device)  # the fp32 state, as every GPU of --gpus holds it (state.py)
        self._gl: GLBuffers | None = None
        self._gl_reason: str | None = None  # why interop is not used (after an attach attempt)
        self._warned_copy = False
        self._render_reads = 0
        self._precision: str | None = None  # precision of the state the last step advanced
        self._fp64_valid = False  # the double state is current (fp64 runs)
        self._check = NonFiniteCheck(self.device)  # the GPU's non-finite check (nonfinite.py)
        self._last_totals: dict[str, float] = {}
        self.diag_pending = None  # the device diagnostics in flight (diagnostics.py)
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
                self._state.free()
                self._evaluators.clear()
                self.diag_pending = None
                self._check.forget()
                self.device.close()
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

    # --- records, evaluators, tunables -------------------------------------------------------------
    def evaluator(self, name: str | None = None) -> ForceEvaluator:
        """The evaluator of a record (default: the current kernel) on this backend's device."""
        rec = self.record(name or self._kernel)
        ev = self._evaluators.get(rec.name)
        if ev is None:
            ev = self._evaluators[rec.name] = make_evaluator(rec, self.device, self._records)
        ev.set_physics(self._physics)
        return ev

    def active_record(self) -> KernelRecord:
        """The record the next force launch runs (`best` resolved for the current N)."""
        return self.evaluator().active(self._n)[0] if self._n else self.record(self._kernel)

    @property
    def precision(self) -> str:
        return self.active_record().precision

    def tunables(self) -> dict:
        """The tunables the next launch uses (for `best`: the resolved variant's)."""
        ev = self.evaluator()
        return dict(ev.active(self._n)[1]) if self._n else ev.tunables

    def set_tunables(self, **values) -> None:
        self.evaluator().set_tunables(**values)

    def clear_tunables(self) -> None:
        self._evaluators.clear()

    @property
    def resolved_kernel(self) -> str:
        """'register-blocked block_size=128 k=4 slices=0': what actually runs (useful for `best`)."""
        return self.evaluator().describe(self._n)

    def _prepare(self) -> None:
        """Load every entry the current kernel may launch at this N, and bring the state to its precision."""
        ev = self.evaluator()
        ev.prepare(self._n)
        precision = ev.active(self._n)[0].precision
        if precision != self._precision:
            self._stepper.invalidate()  # the cached acceleration belongs to the other precision
            if precision == "fp64" and not self._fp64_valid:
                self._promote_fp64()
            self._precision = precision

    def _ops(self, pos: int, speed: int):
        """The StateOps of the current kernel over the whole state (pos, speed: this frame's pointers)."""
        ev, n, everyone = self.evaluator(), self._n, Span.all(self._n)
        vel, acc = self._ptr("vel"), self._ptr("acc")
        if self.precision == "fp64":
            pos64, vel64, acc64 = self._fp64_ptrs()
            force = ev.bind(pos64, acc64, everyone, everyone)
            return Fp64Ops(self.device, force, n, pos64, vel64, acc64, pos, vel, speed)
        self._fp64_valid = False  # the float32 state moves on without the double copy
        return self._state.ops(ev.bind(pos, acc, everyone, everyone), everyone, pos, speed)

    # --- the non-finite check (nonfinite.py: the same check each GPU of --gpus runs on its share) ---------
    def _launch_check(self, pos: int) -> None:
        self._check.launch(pos, self._ptr("vel"), Span.all(self._n))

    def _ptr(self, name: str) -> int:
        return self._state.pointer(name)

    @contextmanager
    def _device_arrays(self):
        """(position pointer, speed pointer): the mapped GL buffers, or the plain allocations."""
        if self._gl is None:
            yield self._ptr("pos"), self._ptr("speed")
            return
        with self._gl.mapped_for(self._n) as m:
            yield m.pos, m.speed

    @contextmanager
    def state_arrays(self):
        """Public device view of the current state for device-side consumers (diagnostics):
        yields (precision, pos, vel) pointers — float4 rows for 'fp32', dvec4 rows for 'fp64' — with the
        context current and the GL buffers mapped as needed."""
        self._require_state()
        with self._scope:
            if self.precision == "fp64" and self._fp64_valid:
                pos64, vel64, _acc64 = self._fp64_ptrs()
                yield "fp64", pos64, vel64
                return
            with self._device_arrays() as (pos, _speed):
                yield "fp32", pos, self._ptr("vel")

    # --- memory ----------------------------------------------------------------------------------
    def _allocate(self, n: int, plain_render_buffers: bool) -> None:
        """(Re)allocate the state buffers for n bodies (positions and speeds unless they live in the GL
        buffers); raises RuntimeFault saying which N fits, the old state gone."""
        fields = ("vel", "acc") + (("pos", "speed") if plain_render_buffers else ())
        try:
            self._state.allocate(n, fields)
        except BaseException:
            self._n = 0
            raise

    # --- state -----------------------------------------------------------------------------------
    def load(self, bodies: Bodies, physics: Physics, kernel: str | None = None) -> None:
        self._require_open()
        physics = check_physics(physics)
        name = self.record(kernel or registry.DEFAULT_KERNEL).name
        n = bodies.n
        with self._scope:
            self.evaluator(name).prepare(n)  # compile first: a failure leaves the current state and kernel
            if self._gl is not None and (self._n != n if self._n else self._gl.capacity() < n):
                # A new N: the renderer resizes its buffers and attaches them again (the new state
                # waits in plain buffers until then). Attached before the first load: kept if it fits.
                log.info("N = %d: CUDA-GL buffers detached until attach_gl_buffers is called again", n)
                self._gl.unregister()
                self._gl = None
            self._allocate(n, plain_render_buffers=self._gl is None)
            self._n = n
            with self._device_arrays() as (pos, spd):
                self._state.upload(bodies, pos, spd)
            self._kernel = name
            self._physics = physics
            self._mass = bodies.mass.astype(np.float64, copy=True)
            self._ids = None if bodies.ids is None else bodies.ids.copy()
            self._t0, self._steps = float(bodies.time), 0
            self._stepper.restart()
            self._check.prepare()  # a new state: the checks of the old one are dropped
            for ev in self._evaluators.values():
                ev.forget()
            self._precision = "fp32"
            self._fp64_valid = False
            if self.precision == "fp64":  # the exact double state, not the float32 one promoted
                self._upload_fp64(bodies.pos, bodies.vel, bodies.mass)
                self._precision = "fp64"
            self._prepare()
            self._drv.Context.synchronize()

    @property
    def kernel(self) -> str:
        return self._kernel

    def set_kernel(self, name: str) -> None:
        self._require_open()
        rec = self.record(name)
        if self._n:
            with self._scope:
                # a compile error raises here and leaves the current kernel in place
                self.evaluator(rec.name).prepare(self._n)
        elif not rec.policy.resolves:
            self.device.compiled(rec.source, rec.policy.nvcc_options)
        self._kernel = rec.name

    def set_physics(self, physics: Physics) -> None:
        old = self._swap_physics(physics)
        if force_arguments(physics) != force_arguments(old) or physics.integrator != old.integrator:
            self._stepper.invalidate()

    @property
    def n(self) -> int:
        return self._n


    def step(self, steps: int = 1) -> StepTimings:
        self._require_state()
        steps = int(steps)
        timings = StepTimings(kernel=self._kernel, steps=max(steps, 0), n=self._n)
        if steps <= 0:
            return timings
        timer = self.device.timer
        with self._scope:
            self._prepare()
            timer.reset()
            with self._device_arrays() as (pos, speed):
                ops = self._ops(pos, speed)
                before = self._stepper.steps
                try:
                    work = self._stepper.advance(ops, self._physics, steps, self.check_every,
                                                 lambda: self._launch_check(pos), timer)
                finally:
                    self._steps += self._stepper.steps - before  # the whole steps, also of a failed call
            timings.interactions, timings.pair_equivalent = work.interactions, work.pair_equivalent
            timings.force_evals, timings.body_cell = work.evaluations, work.body_cell
            if self._gl is not None:
                # Live rendering: never wait on the GPU here (see app/timing.py); the numbers are those
                # of the newest earlier step() the GPU has finished, usually the previous frame.
                totals = timer.collect_lagged()
                if totals is None:
                    totals = self._last_totals
                timings.extra["timings_lagged"] = 1.0
                bad = self._check.result(wait=False)  # an earlier check's, once the GPU got there
            else:
                totals = timer.collect()
                bad = self._check.result(wait=True)  # this call's (the timings waited for it anyway)
            self._last_totals = totals
            timings.extra.update(stage_entries(self.evaluator().stage_ms()))  # a tree's split; {} otherwise
        timings.force_ms = totals.get("force", 0.0)
        timings.integrate_ms = totals.get("integrate", 0.0)
        if self._gl is not None:
            timings.map_ms = self._gl.last_map_ms
            timings.unmap_ms = self._gl.last_unmap_ms
        if bad >= 0:
            raise NonFiniteState(bad, step=self._stepper.steps, time=self.time)
        return timings

    def check_finite(self) -> None:
        """Run the GPU non-finite check now; raises NonFiniteState with the first bad body."""
        self._require_state()
        with self._scope:
            with self._device_arrays() as (pos, _speed):
                self._launch_check(pos)
            bad = self._check.result(wait=True)
        if bad >= 0:
            raise NonFiniteState(bad, step=self._stepper.steps, time=self.time)

    def accelerations(self) -> np.ndarray:
        self._require_state()
        with self._scope:
            self._prepare()
            ev, everyone = self.evaluator(), Span.all(self._n)
            if self.precision == "fp64":
                pos64, _vel64, acc64 = self._fp64_ptrs()
                ev.evaluate(pos64, acc64, everyone, everyone)
                out = np.empty((self._n, 4), dtype=np.float64)
                self._drv.memcpy_dtoh(out, acc64)
            else:
                with self._device_arrays() as (pos, _speed):
                    ev.evaluate(pos, self._ptr("acc"), everyone, everyone)
                out = np.empty((self._n, 4), dtype=np.float32)
                self._drv.memcpy_dtoh(out, self._ptr("acc"))
        self._stepper.acc_valid = True  # a(x) of the current state is now in the buffer the step reads
        return out[:, :3].astype(np.float64)

    def force_error_sample(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(approx, exact), float64 (K, 3), for the bodies `rows` (original order) at the current positions:
        approx = the running fp32 kernel's a(x) (the stepper's cached one; evaluated now if it is not
        current), exact = the `shared` all-pairs kernel for those K targets against all N sources, on the
        device (force_sample.py, shared with the GPUs of --gpus)."""
        rows = np.asarray(rows, dtype=np.int64)
        n = self._n
        self._require_state()
        if self.precision != "fp32":
            raise NotImplementedError("the live force error samples fp32 records")
        with self._scope:
            self._prepare()
            with self._device_arrays() as (pos, _speed):
                if not self._stepper.acc_valid:
                    self.evaluator().evaluate(pos, self._ptr("acc"), Span.all(n), Span.all(n))
                    self._stepper.acc_valid = True
                approx = self._state.rows_at("acc", rows)
                exact = exact_rows(self.device, self.evaluator(EXACT_KERNEL), pos, n, rows)
        return approx[:, :3].astype(np.float64), exact

    def _read_render_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        everyone = Span.all(self._n)
        with self._scope, self._device_arrays() as (pos, spd):
            return self._state.rows("pos", everyone, pos), self._state.rows("speed", everyone, spd)

    def state(self) -> Bodies:
        self._require_state()
        ids = None if self._ids is None else self._ids.copy()
        if self.precision == "fp64" and self._fp64_valid:  # fp64 runs: its double state is the state
            pos64, vel64, _acc64 = self._fp64_ptrs()
            p = np.empty((self._n, 4), dtype=np.float64)
            v = np.empty((self._n, 4), dtype=np.float64)
            with self._scope:
                self._drv.memcpy_dtoh(p, pos64)
                self._drv.memcpy_dtoh(v, vel64)
            return Bodies(pos=p[:, :3].copy(), vel=v[:, :3].copy(), mass=self._mass.copy(), time=self.time,
                          ids=ids, components=self.components)
        pos4, _speed = self._read_render_arrays()
        with self._scope:
            vel4 = self._state.rows("vel", Span.all(self._n))
        return Bodies(pos=pos4[:, :3].astype(np.float64), vel=vel4[:, :3].astype(np.float64),
                      mass=self._mass.copy(), time=self.time, ids=ids, components=self.components)

    def diagnostics(self) -> Diagnostics:
        """Energies and momenta reduced on the device (kernels/diagnostics.cu): ten doubles come back,
        never the state. A DeviceDiagnostics, which adds angular_scale = Σ m|r||v|."""
        from app.backends.cuda.diagnostics import device_diagnostics

        return device_diagnostics(self)

    def diagnostics_async(self):
        """The same, started on the device without waiting: a PendingDiagnostics (done() / result())."""
        from app.backends.cuda.diagnostics import launch_diagnostics

        return launch_diagnostics(self)

    # --- the double state ----------------------------------------------------------------------------
    def _fp64_ptrs(self) -> tuple[int, int, int]:
        size = 32 * max(self._n, 1)
        return tuple(self.device.scratch(key, size) for key in ("pos64", "vel64", "acc64"))

    def _upload_fp64(self, pos, vel, mass) -> None:
        pos64, vel64, _acc64 = self._fp64_ptrs()
        p = np.zeros((self._n, 4), dtype=np.float64)
        p[:, :3] = pos
        p[:, 3] = mass
        v = np.zeros((self._n, 4), dtype=np.float64)
        v[:, :3] = vel
        self._drv.memcpy_htod(pos64, p)
        self._drv.memcpy_htod(vel64, v)
        self._fp64_valid = True

    def _promote_fp64(self) -> None:
        """The double state from the float32 one (positions/velocities promoted, masses exact)."""
        pos4, _speed = self._read_render_arrays()
        vel4 = self._state.rows("vel", Span.all(self._n))
        self._upload_fp64(pos4[:, :3].astype(np.float64), vel4[:, :3].astype(np.float64), self._mass)

    # --- the interaction matrix ----------------------------------------------------------------------
    def interaction_matrix(self) -> np.ndarray:
        """(N, N) float32 |a_ij| (body j's pull on body i) for the heatmap; N <= 8,192."""
        self._require_state()
        n = self._n
        if n > registry.PAIR_MATRIX_MAX_N:
            raise ConfigError(f"interaction matrix: N = {n:,} is over {registry.PAIR_MATRIX_MAX_N:,} "
                              f"(it would take {4 * n * n / 2**30:.1f} GiB)")
        repulsion, soft, eps2, g, h = force_arguments(self._physics)
        out = np.empty((n, n), dtype=np.float32)
        with self._scope:
            fn = self.device.function(registry.PAIR_MATRIX_SOURCE,
                                      f"pair_matrix_fill_{suffix(repulsion, soft)}", "PPifff")
            buf = self._drv.mem_alloc(max(4 * n * n, 16))
            try:
                with self._device_arrays() as (pos, _speed):
                    grid = (ceil_div(n, 16), ceil_div(n, 16))
                    fn.prepared_call(grid, (16, 16, 1), pos, int(buf), n, eps2, g, h)
                self._drv.memcpy_dtoh(out, buf)
            finally:
                buf.free()
        return out

    # --- rendering -------------------------------------------------------------------------------
    def host_render_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """float32 positions (N, 4) and speeds (N,) read back: the copy path when interop is off."""
        self._require_state()
        # The renderer's first read is the initial fill of its buffers, before it offers them for
        # interop; only a second read without interop means positions travel through the host every
        # frame (with interop, reads are occasional: the camera fitting the bodies, a screenshot).
        self._render_reads += 1
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
            new, reason = register_gl_buffers(position_vbo, speed_vbo)
            if new is None:
                return self._interop_off(reason)
            if self._n:
                try:
                    with new.mapped_for(self._n) as m:
                        self._drv.memcpy_dtod(m.pos, self._ptr("pos"), 16 * self._n)
                        self._drv.memcpy_dtod(m.speed, self._ptr("speed"), 4 * self._n)
                        self._drv.Context.synchronize()
                except Exception as e:
                    new.unregister()
                    return self._interop_off(str(e))
                for key in ("pos", "speed"):
                    self._state.release(key)
            self._gl = new
            self._gl_reason = None
        log.info("CUDA-GL interop active: kernels write GL buffers %d (positions) and %d (speeds)",
                 int(position_vbo), int(speed_vbo))
        return True

    def _interop_off(self, reason: str) -> bool:
        """Registration failed: the state stays in plain buffers and the renderer copies it each frame."""
        self._gl_reason = reason
        return fall_back(reason)

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
                self._state.adopt("pos", pos)
                self._state.adopt("speed", speed)
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
            return INTEROP_PATH
        if self._gl_reason is not None:
            return "device→host→GL copy"
        return "device only (no GL)"

    # --- facts -----------------------------------------------------------------------------------
    def device_info(self) -> dict:
        info = self.device.facts.as_dict()
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
