"""The `cuda` backend: one GPU, the K = 1 case of the run over GPUs (app/backends/multi.py).

`run`, `simulate`, `bench` and the panel on one GPU drive the same MultiDeviceRun as `--gpus K` and
the MPI ranks, over one CudaShareDevice (multi.py): one state class (state.py, GpuState), one stepper
(app/engine/integrator.py: the integrator, the non-finite check every `check_every` steps, the timings), one
force split per record (app/parallel/decomposition.py; with one device, a domain split keeps the state in the
tree's key order as Bonsai does, and `ids` name the bodies). What one GPU adds to the run:
- every record, the fp64 one included (its double state is the device's, state.py);
- a kernel switch and new force parameters in place, on the device's state (MultiDeviceRun.use_kernel);
- evaluators handed out for tools and tests (`evaluator(name)`), the device's state pointers
  (`state_arrays`: the energies of diagnostics.py are reduced on the device), the interaction matrix;
- the tree's stage times (keys, sort, build, moments, walk) in each step's timings.

Nothing crosses to the host per step but the CUDA-event timings (and every `check_every` steps a
4-byte check result). Drawing: the run's GPU copies positions and speeds into the renderer's GL buffers
after each step() call (multi_interop.py), without a host round trip. pycuda is imported on first use,
never at module import.
"""

from __future__ import annotations

import atexit
import logging
import time
import weakref
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np

from app.backends.base import INTEROP_PATH, REFERENCE_ROWS, KernelRecord
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
from app.backends.cuda.multi import KIND, gpu_devices
from app.backends.cuda.policies import ceil_div, force_arguments, suffix
from app.backends.cuda.state_ops import INTEGRATE_SOURCE
from app.backends.multi import MultiDeviceBackend
from app.core.errors import BackendUnavailable, ConfigError
from app.engine.forces import with_role
from app.engine.timing import stage_entries
from app.model.bodies import Bodies
from app.model.physics import Diagnostics, Physics

if TYPE_CHECKING:
    from app.backends.cuda.evaluator import GpuEvaluator

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


class CudaBackend(MultiDeviceBackend):
    """One GPU (see the module docstring)."""

    name = "cuda"
    kind = KIND
    k = 1
    timing = "CUDA events around each launch on the GPU; read a frame late while drawing"
    memory = "device"
    reduces_diagnostics = True

    @classmethod
    def device_kind(cls):
        return KIND

    @classmethod
    def system_lines(cls) -> list[str]:
        """Every GPU, the peer-access matrix and the links (several GPUs: --gpus), and the NCCL found."""
        try:
            from app.backends.cuda.nccl import summary
            from app.backends.cuda.topology import format_topology, query_topology

            return [*format_topology(query_topology()), f"NCCL (--exchange nccl): {summary()}"]
        except Exception as e:  # noqa: BLE001 - info reports whatever breaks, it never crashes on it
            return [f"GPUs: unknown ({type(e).__name__}: {e})"]

    # --- discovery -------------------------------------------------------------------------------
    @classmethod
    def why_not(cls) -> str | None:
        reason = driver_why_not()
        if reason:
            return reason
        if find_nvcc() is None:
            return (
                "nvcc not found: the kernels are compiled on first use; install the CUDA toolkit "
                "(or set CUDA_HOME / NBODY_NVCC)"
            )
        return None

    @classmethod
    def kernels(cls) -> list[KernelRecord]:
        return list(registry.RECORDS)  # one GPU runs every record, the fp64 one included

    @classmethod
    def block_ops(cls, bodies: Bodies, physics: Physics, tunables: dict, held: dict):
        """The GPU tree's block-step ops on GPU 0, whose CudaDevice `held` keeps for the next load."""
        from app.backends.cuda.blockops import CudaBlockOps

        if "device" not in held:
            held["device"] = CudaDevice(0)
        return CudaBlockOps(bodies, physics, held["device"], tunables)

    @classmethod
    def record(cls, name: str) -> KernelRecord:
        # Backend's lookup, past MultiDeviceBackend's (the --gpus K form asks its kind about each record)
        return super(MultiDeviceBackend, cls).record(name)

    @classmethod
    def kernel_why_not(cls, name: str) -> str | None:
        reason = cls.why_not()
        if reason:
            return reason
        try:
            rec = cls.record(name)
        except ConfigError as e:
            return str(e)
        assert rec.source is not None, "every CUDA record names its kernel file (registry._record)"
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
            # held for the backend's life: the evaluators it hands out, diagnostics, the interaction matrix
            self.device = CudaDevice(default_ordinal() if device is None else device)
        except CudaUnavailable as e:
            raise BackendUnavailable(f"backend 'cuda' is not available: {e}") from e
        super().__init__()
        self.render_ordinal = self.device.ordinal
        self._closed = False
        self._records = {r.name: r for r in self.kernels()}
        self._evaluators: dict[str, GpuEvaluator] = {}
        self._gl_reason: str | None = None  # why interop is not used (after an attach attempt)
        self._warned_copy = False
        self._render_reads = 0
        self.diag_pending = None  # the device diagnostics in flight (diagnostics.py)
        _LIVE.add(self)
        if not _ATEXIT:
            atexit.register(_close_all_at_exit)
            _ATEXIT = True

    def _factory(self):
        return gpu_devices([self.device.ordinal])

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        _LIVE.discard(self)
        try:
            super().close()
            with self.device.scope:
                self._evaluators.clear()
                self.diag_pending = None
            self.device.close()
        except Exception as e:
            log.warning("releasing CUDA resources failed: %s", e)

    def _require_state(self):
        if self._closed:
            raise RuntimeError("this CUDA backend was closed")
        return super()._require_state()

    # --- records, evaluators, tunables -------------------------------------------------------------
    def evaluator(self, name: str | None = None) -> GpuEvaluator:
        """An evaluator of a record (default: the current kernel) on this backend's GPU, with the current
        physics, for tools and tests that evaluate forces on the state's pointers (`state_arrays`)."""
        rec = self.record(name or self._kernel)
        ev = self._evaluators.get(rec.name)
        if ev is None:
            ev = self._evaluators[rec.name] = make_evaluator(rec, self.device, self._records)
        ev.set_physics(self._physics)
        ev.set_tunables(**rec.with_tunables(self._tunable_store().get(rec.name, {})))  # as the run has them
        return ev

    @property
    def _running(self) -> GpuEvaluator | None:
        """The evaluator the steps run (for `best`: the record it picked), once loaded."""
        return self._run.devices[0].evaluator if self._run is not None else None

    def active_record(self) -> KernelRecord:
        """The record the next force launch runs (`best` resolved for the current N)."""
        running = self._running
        return running.record if running is not None else self.record(self._kernel)

    @property
    def precision(self) -> str:
        return self.active_record().precision

    def tunables(self) -> dict:
        """The tunables the next launch uses (for `best`: the resolved variant's)."""
        running = self._running
        if running is None:
            return super().tunables()
        return dict(running.active(self.n)[1])

    @property
    def resolved_kernel(self) -> str:
        """'register-blocked block_size=128 k=4 slices=0': what actually runs (useful for `best`)."""
        running = self._running
        return running.describe(self.n) if running is not None else self.evaluator().describe(0)

    def set_kernel(self, name: str) -> None:
        """In place on the GPU's state (compiled first: a failure leaves the current kernel)."""
        rec = self.record(name)
        if self._run is not None:
            self._run.use_kernel(rec.name, self._mass)
            self._kernel = rec.name
            self._tunables_changed()
        else:
            if not rec.policy.resolves:
                assert rec.source is not None, "every CUDA record names its kernel file (registry._record)"
                self.device.compiled(rec.source, rec.policy.nvcc_options)
            self._kernel = rec.name

    # --- a kernel file's hot reload (hot_reload.py) ---------------------------------------------------
    def kernel_reload(self, sanitizer: bool = False):
        """CudaReload, the hot reload's stages on this GPU, while any kernel comes from a user's file."""
        from app.backends.cuda.hot_reload import CudaReload
        from app.backends.cuda.user_kernels import is_user

        if not any(is_user(r) for r in self.kernels()):
            return None
        return CudaReload(self, sanitizer)

    def install_build(self, record: KernelRecord, cubin: bytes, symbols) -> None:
        """A validated build of a kernel file in place of its record, from the next step: the record (its
        header as saved) in the registry and on every device of the run, `symbols` loaded from `cubin`.
        The state, the cached a(x) and the tunables set stay as they are (values the new header no longer
        offers fall back to its defaults)."""
        registry.RECORDS = tuple(record if r.name == record.name else r for r in registry.RECORDS)
        self._records[record.name] = record
        self._evaluators.pop(record.name, None)
        assert record.source is not None  # (a kernel file's record names it)
        # the tools' evaluators (evaluator()) load the file again when next asked: a module load now
        # waits for the steps in flight (2.4 s at N = 1M on an H200, an all-pairs step there being 0.7 s)
        self.device.forget(record.source)
        self.last_install_ms: dict[str, float] = {}  # what the swap cost on each GPU of the run
        store = self._tunable_store()
        try:
            record.validate_tunables(store.get(record.name, {}))
        except ConfigError:
            store.pop(record.name, None)
        if self._run is not None:
            tunables = record.with_tunables(store.get(record.name, {}))
            for device in self._run.devices:
                t0 = time.perf_counter()
                device.reload_record(record, cubin, symbols, tunables)
                self.last_install_ms[device.name] = (time.perf_counter() - t0) * 1e3

    # --- stepping (MultiDeviceBackend.step), what one GPU reports -------------------------------------
    def _step_entries(self, device_ms: list[float], exchange_ms: float) -> dict[str, float]:
        running = self._running
        assert running is not None, "called by step(), on the loaded run"
        return stage_entries(running.stage_ms())  # a tree's split of its force time; {} otherwise

    def _nonfinite(self, device: int, body: int) -> NonFiniteState:
        assert self._run is not None, "found by a check of the loaded run"
        return NonFiniteState(body, step=self._run.steps_done, time=self.time)

    def check_finite(self) -> None:
        """Run the GPU non-finite check now; raises NonFiniteState with the first bad body."""
        run = self._require_state()
        run.ops.launch_checks()
        found = run.first_nonfinite(wait=True)
        if found is not None:
            raise self._nonfinite(*found)

    def force_error_sample(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(approx, exact), float64 (K, 3), for the bodies `rows` (load order) at the current positions:
        approx = the running fp32 kernel's a(x) (the cached one; evaluated now if it is not current),
        exact = the `shared` all-pairs kernel for those K targets against all N sources, on the GPU
        (force_sample.py, as on every GPU of --gpus)."""
        self._require_state()
        if self.precision != "fp32":
            raise NotImplementedError("the live force error samples fp32 records")
        return super().force_error_sample(rows)

    # --- the state on the device -----------------------------------------------------------------------
    @contextmanager
    def state_arrays(self):
        """Public device view of the current state for device-side consumers (diagnostics): yields
        (precision, pos, vel) pointers (float4 rows for 'fp32', dvec4 rows for 'fp64') with the GPU's
        context current. Rows are in state order: after a tree's step, its key order."""
        run = self._require_state()
        with self.device.scope:  # (device work queued later on its stream comes after the steps)
            yield run.devices[0].state_pointers()

    def reference_rows(self, stacked: np.ndarray, k: int, physics: Physics, progress) -> np.ndarray:
        """The record in the role "reference" (fp64, float64 throughout) on this GPU, over scratch copies
        of `stacked`, a piece of targets a launch."""
        from app.backends.cuda.evaluator import reference_accelerations

        evaluator = self.evaluator(with_role(self.kernels(), "reference").name)
        evaluator.set_physics(physics)
        return reference_accelerations(evaluator, self.device, stacked, k, REFERENCE_ROWS, progress)

    def diagnostics(self) -> Diagnostics:
        """Energies and momenta reduced on the device (kernels/diagnostics.cu): ten doubles come back,
        never the state. A DeviceDiagnostics, which adds angular_scale = Σ m|r||v|."""
        from app.backends.cuda.diagnostics import device_diagnostics

        return device_diagnostics(self)

    def diagnostics_async(self):
        """The same, started on the device without waiting: a PendingDiagnostics (done() / result()). A
        live sample: above ~45k bodies its O(N²) potential runs in slices, one queued by each done() that
        finds the last one through (diagnostics.py, `live_slice_pairs`)."""
        from app.backends.cuda.diagnostics import launch_diagnostics, live_slice_pairs

        return launch_diagnostics(self, slice_pairs=live_slice_pairs(self.n))

    def interaction_matrix(self) -> np.ndarray:
        """(N, N) float32 |a_ij| (body j's pull on body i, load order) for the heatmap; N <= 8,192."""
        run = self._require_state()
        n = self.n
        if n > registry.PAIR_MATRIX_MAX_N:
            raise ConfigError(
                f"interaction matrix: N = {n:,} is over {registry.PAIR_MATRIX_MAX_N:,} "
                f"(it would take {4 * n * n / 2**30:.1f} GiB)"
            )
        repulsion, soft, eps2, g, h = force_arguments(self._physics)
        out = np.empty((n, n), dtype=np.float32)
        pos = run.devices[0].ptr["pos"]
        with self.device.scope:
            fn = self.device.function(
                registry.PAIR_MATRIX_SOURCE, f"pair_matrix_fill_{suffix(repulsion, soft)}", "PPifff"
            )
            buf = self.device.drv.mem_alloc(max(4 * n * n, 16))
            try:
                grid = (ceil_div(n, 16), ceil_div(n, 16))
                fn.prepared_call(grid, (16, 16, 1), pos, int(buf), n, eps2, g, h)
                self.device.drv.memcpy_dtoh(out, buf)
            finally:
                buf.free()
        rows = run.state_rows(np.arange(n))  # the row of each body
        return out[np.ix_(rows, rows)]

    # --- rendering -------------------------------------------------------------------------------
    def host_render_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """float32 positions (N, 4) and speeds (N,) read back: the copy path when interop is off."""
        # The renderer's first read is the initial fill of its buffers, before it offers them for
        # interop; only a second read without interop means positions travel through the host every
        # frame (with interop, reads are occasional: the camera fitting the bodies, a screenshot).
        self._render_reads += 1
        if not self._warned_copy and self._render_reads > 1 and self._gl_target is None:
            self._warned_copy = True
            why = f" ({self._gl_reason})" if self._gl_reason else ""
            log.warning("CUDA-GL interop is not active%s: positions go device→host→GL every frame", why)
        return super().host_render_arrays()

    def attach_gl_buffers(self, position_vbo: int, speed_vbo: int) -> bool:
        """Register the renderer's VBOs with CUDA (GL context current); each step() call then fills them
        on the GPU. Protocol for the renderer: (re)allocate the buffers for `n` bodies, then attach; before
        deleting or resizing attached buffers call `detach_gl_buffers()`; `load()` with a new N detaches
        by itself, so after it the renderer resizes and attaches again."""
        if self._closed:
            raise RuntimeError("this CUDA backend was closed")
        attached = super().attach_gl_buffers(position_vbo, speed_vbo)
        self._gl_reason = None if attached else "CUDA-GL registration failed (see the warning above)"
        return attached

    @property
    def data_path(self) -> str:
        if self._gl_target is not None:
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

    def compare_ops(self):
        """A/B's other kernel and the error colours on this GPU, in device buffers beside the state
        (compare.py); the state and the run's evaluators are only read."""
        from app.backends.cuda.compare import CudaCompare

        return CudaCompare(self, self._require_state)


CudaBackend.base = CudaBackend  # one GPU's discovery is its own (the --gpus K form's `base` is this class)


def _first_error(log_text: str) -> str:
    for line in log_text.splitlines():
        if "error" in line.lower():
            return line.strip()
    lines = [ln for ln in log_text.splitlines() if ln.strip()]
    return lines[0].strip() if lines else "no output"
