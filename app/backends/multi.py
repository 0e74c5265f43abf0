"""`--gpus N`: a Backend over K devices of one kind, so that run, simulate, record, bench and the panel
drive several devices exactly as they drive one.

    cls = multi_backend_class(select_backend("cuda"), k=2, driver="auto", exchange="auto")
    backend = cls()                       # no arguments, like every backend class (bench makes its own)
    backend.load(bodies, physics, "shared")
    timings = backend.step(10)            # timings.devices: each device's force ms; timings.exchange_ms

The devices are the multi-device driver's (app/parallel/multidevice.py): GPUs from app/backends/cuda/multi.py,
or for the CPU backend its CPU "devices" (app/backends/cpu_multi.py), the CI twin: `--backend cpu
--gpus 3` runs the same driver, exchange and re-balancing on three shares of the host. The backend keeps
the name of the backend it splits ("cuda", "cpu"), so the panel switches among that backend's kernels
in place (a switch reloads the devices from the current state); a kernel of another backend leaves the
multi-device run for one device of that backend.

Every `check_every` steps each device checks its share for non-finite bodies (as one GPU does, on the
device, its answer read without a host wait while drawing); one found stops stepping with the
NonFiniteState of one GPU naming the body (its index in the loaded state) and the device, which the viewer
turns into a pause.

After each step() call the shares are re-balanced when the devices' force times differ by more than
REBALANCE_SPREAD (rows change hands with their velocities and cached accelerations; the trajectory is
unchanged).

Rendering: `attach_gl_buffers` asks the device kind for a render target. GPUs have one: GPU 0 registers
the renderer's VBOs (CUDA–GL interop) and after each step() call the devices copy the positions and
their speed rows into them on the GPUs (app/backends/cuda/multi_interop.py; no host round trip per
frame). CPU devices have none: the renderer uploads `host_render_arrays()`, the state gathered from the
devices, each frame (the "host upload" path).
"""

from __future__ import annotations

import logging
from typing import ClassVar

import numpy as np

from app.backends.base import (
    INTEROP_PATH,
    Backend,
    DeviceKind,
    KernelRecord,
    RenderTarget,
    StepTimings,
    TunablesPerKernel,
    check_physics,
    wrapped_capabilities,
)
from app.core.errors import ConfigError, NonFiniteState, StateOutOfMemory
from app.engine.forces import Span
from app.engine.integrator import CHECK_EVERY
from app.engine.timing import device_entries
from app.model.bodies import Bodies
from app.model.config import DRIVERS, EXCHANGES
from app.model.physics import Physics
from app.parallel.multidevice import MultiDeviceRun, resolve_device_count

log = logging.getLogger(__name__)
REBALANCE_SPREAD = 1.10  # slowest / fastest device force time above which the shares are re-balanced


def multi_backend_class(base: type[Backend], k, driver: str = "auto", exchange: str = "auto"):
    """A Backend class over `k` devices of `base`'s kind (`k` a number or "all"); ConfigError (exit 2)
    when more devices are asked for than exist, or for an unknown driver or exchange."""
    if driver not in DRIVERS:
        raise ConfigError(f"--gpu-driver {driver!r}: choose from {', '.join(DRIVERS)}")
    if exchange not in EXCHANGES:
        raise ConfigError(f"--exchange {exchange!r}: choose from {', '.join(EXCHANGES)}")
    kind = base.device_kind()
    if kind is None:
        raise ConfigError(f"--gpus: backend {base.name!r} has no multi-device form; use one device")
    kind.check_exchange(exchange)
    count = resolve_device_count(k, kind.count(), kind.what, all_count=kind.all_count())
    if count == 1 and issubclass(base, MultiDeviceBackend) and (driver, exchange) == ("auto", "auto"):
        return base  # one GPU is the K = 1 run already (app/backends/cuda/backend.py)
    return type(
        f"Multi{base.__name__}",
        (MultiDeviceBackend,),
        {
            **wrapped_capabilities(base),
            "base": base,
            "kind": kind,
            "k": count,
            "driver": driver,
            "exchange": exchange,
        },
    )


class MultiDeviceBackend(TunablesPerKernel, Backend):
    """K devices as one Backend (made by multi_backend_class, which fills the class fields below)."""

    base: type[Backend]
    timing = (
        "each device's own clock (CUDA events on GPUs); force and integrate: the slowest device's, "
        "read a frame late while drawing"
    )
    kind: ClassVar[DeviceKind]
    k = 1
    driver = "auto"
    exchange = "auto"
    check_every = CHECK_EVERY  # steps between the devices' non-finite checks (0: never), as on one GPU
    render_ordinal = 0  # the device that holds the renderer's buffers (the run's first)

    @property
    def devices(self) -> int:
        return self.k

    @classmethod
    def why_not(cls) -> str | None:
        return cls.base.why_not()

    @classmethod
    def kernels(cls) -> list[KernelRecord]:
        return [r for r in cls.base.kernels() if cls.kind.why_not(r) is None]

    @classmethod
    def kernel_why_not(cls, name: str) -> str | None:
        try:
            record = cls.base.record(name)
        except ConfigError as e:
            return str(e)
        return cls.kind.why_not(record) or cls.base.kernel_why_not(name)

    @classmethod
    def record(cls, name: str) -> KernelRecord:
        record = cls.base.record(name)
        reason = cls.kind.why_not(record)
        if reason:
            raise ConfigError(reason)
        return record

    def __init__(self):
        self._run: MultiDeviceRun | None = None
        self._kernel = self.kind.default_kernel
        self._physics = Physics()
        self._mass, self._ids = np.zeros(0), None
        self._t0, self._steps = 0.0, 0
        self._tunables: dict[str, dict] = {}
        # the kind's render target while the renderer's VBOs are attached
        self._gl_target: RenderTarget | None = None

    # --- state -----------------------------------------------------------------------------------
    def load(self, bodies: Bodies, physics: Physics, kernel: str | None = None) -> None:
        physics = check_physics(physics)
        name = self.record(kernel or self.kind.default_kernel).name
        run = MultiDeviceRun(
            self._factory(), self.k, self.driver, make_exchange=self.kind.exchange(self.exchange)
        )
        run.check_every = self.check_every
        previous_n = self.n if self._run is not None else 0
        try:
            run.load(bodies, physics, name)  # beside the current run: a failure leaves it as it is ...
        except StateOutOfMemory:
            if self._run is None:
                raise
            # ... except where the current state holds the memory the new one needs: given back first
            log.warning("N = %d does not fit beside the current state: it is released to make room", bodies.n)
            self._close_run()
            self._mass = np.zeros(0)
            run.load(bodies, physics, name)
        self._close_run()
        self._run, self._kernel, self._physics = run, name, physics
        self._mass = bodies.mass.astype(np.float64, copy=True)
        self._ids = None if bodies.ids is None else bodies.ids.copy()
        self._t0, self._steps = float(bodies.time), 0
        self._tunables_changed()
        if self._gl_target is not None:
            # the same N (a reload), or buffers attached before the first load that hold it: they show the
            # new state; else the renderer resizes its buffers and attaches them again
            if bodies.n == previous_n or (not previous_n and self._gl_target.capacity() >= bodies.n):
                self._gl_target.publish(run.devices, self.n, run.render_whole)
            else:
                log.info("N = %d: CUDA-GL buffers detached until attach_gl_buffers is called again", bodies.n)
                self.detach_gl_buffers()

    def _factory(self):
        """The run's device factory (app/parallel/multidevice.py DeviceFactory): devices 0..k-1 of the
        kind."""
        return self.kind.factory(self.k)

    def _reload(self, physics: Physics, kernel: str) -> None:
        """The devices made again from the current state (a kernel or a force parameter changed)."""
        self.load(self.state(), physics, kernel)

    def _require_state(self) -> MultiDeviceRun:
        if self._run is None:
            raise RuntimeError(f"{type(self).__name__}: call load() before stepping or reading the state")
        return self._run

    @property
    def kernel(self) -> str:
        return self._kernel

    def set_kernel(self, name: str) -> None:
        name = self.record(name).name
        if name != self._kernel and self._run is not None:
            self._reload(self._physics, name)
        self._kernel = name

    def set_physics(self, physics: Physics) -> None:
        """In place: the devices' evaluators take new force parameters (MultiDeviceRun.set_physics)."""
        self._swap_physics(physics)
        if self._run is not None:
            self._run.set_physics(self._physics)

    @property
    def n(self) -> int:
        return int(self._mass.shape[0])

    @property
    def device_names(self) -> list[str]:
        return [d.name for d in self._run.devices] if self._run is not None else []

    # --- tunables (kept per kernel by TunablesPerKernel, applied to every device's evaluator) ------------
    def _tunables_changed(self) -> None:
        if self._run is None:
            return
        values = TunablesPerKernel.tunables(self)  # the values set, over the record's defaults
        for device in self._run.devices:
            device.evaluator.set_tunables(**values)
        self._run.integrator.invalidate()

    # --- stepping --------------------------------------------------------------------------------
    def step(self, steps: int = 1) -> StepTimings:
        """Queue `steps` steps on the devices; no host wait on a device (see app/parallel/multidevice.py).
        Times are each device's own clock; while drawing (VBOs attached) those of the newest earlier step()
        call the devices have finished, as on one GPU, else this call's (one wait at its end)."""
        if steps < 0:
            raise ValueError(f"steps must be >= 0, not {steps}")
        run = self._require_state()
        run.check_every = self.check_every  # (set on the backend, or on its class, at any time)
        before = run.steps_done
        try:
            work = run.step(steps)
        finally:
            self._steps += run.steps_done - before  # the whole steps, also of a failed call
        map_ms = unmap_ms = 0.0
        if self._gl_target is not None and steps:  # after the last exchange: every position is on GPU 0
            self._gl_target.publish(run.devices, self.n, run.render_whole)
            map_ms, unmap_ms = self._gl_target.map_ms, self._gl_target.unmap_ms
        lagged = self._gl_target is not None
        assert run.ops is not None, "a loaded run has its ops"
        times = run.ops.take_times(lagged=lagged)
        device_ms = times["force"]
        timings = StepTimings(
            kernel=self._kernel,
            steps=steps,
            n=self.n,
            force_ms=max(device_ms),
            integrate_ms=max(times["integrate"]),
            interactions=work.interactions,
            pair_equivalent=work.pair_equivalent,
            force_evals=work.evaluations,
            body_cell=work.body_cell,
            map_ms=map_ms,
            unmap_ms=unmap_ms,
            extra=self._step_entries(device_ms, max(times["exchange"])),
        )
        if lagged:
            timings.extra["timings_lagged"] = 1.0
        found = run.first_nonfinite(wait=not lagged)  # while drawing: the checks the devices have finished
        if found is not None:
            raise self._nonfinite(*found)
        if needs_rebalance(device_ms):
            run.rebalance()
        return timings

    def _step_entries(self, device_ms: list[float], exchange_ms: float) -> dict[str, float]:
        """StepTimings.extra of a step: each device's force time and the exchange's."""
        return device_entries(self.device_names, device_ms, exchange_ms)

    def _nonfinite(self, device: int, body: int) -> NonFiniteState:
        """What a non-finite body found by device `device` raises (the device named)."""
        assert self._run is not None, "found by a step of the loaded run"
        return NonFiniteState(
            body, step=self._steps, time=self.time, device=device, device_name=self._run.devices[device].name
        )

    def accelerations(self) -> np.ndarray:
        return self._require_state().accelerations()

    def force_error_sample(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(approx, exact), float64 (K, 3), at the current positions: approx = each row as its device
        computed it (the cached a(x)), exact = device 0's all-pairs sum over all N (GPUs: `shared`, fp32, as
        on one GPU; CPU devices: the CPU backend's); MultiDeviceRun.force_error_sample."""
        return self._require_state().force_error_sample(rows)

    def state(self) -> Bodies:
        run = self._require_state()
        return Bodies(
            pos=run.in_body_order(run.gathered("pos")[:, :3].astype(np.float64)),
            vel=run.in_body_order(run.gathered("vel")[:, :3].astype(np.float64)),
            mass=self._mass.copy(),
            time=self.time,
            ids=None if self._ids is None else self._ids.copy(),
            components=self.components,
        )

    def shares(self) -> list[Span]:
        return [d.share for d in self._require_state().devices]

    def rebalance(self) -> list[Span]:
        """Re-share now from each device's last measured force time (step() does it by itself when the
        devices' times differ by more than REBALANCE_SPREAD); the state and its order are unchanged."""
        return self._require_state().rebalance()

    # --- rendering, facts ------------------------------------------------------------------------
    def host_render_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        run = self._require_state()
        pos = np.ascontiguousarray(run.in_body_order(run.gathered("pos")), dtype=np.float32)
        speed = run.in_body_order(run.gathered("speed").reshape(-1))
        return pos, np.ascontiguousarray(speed, dtype=np.float32)

    def attach_gl_buffers(self, position_vbo: int, speed_vbo: int) -> bool:
        """The renderer's VBOs (GL context current): True when the devices keep them current themselves
        (GPU 0's interop), False when the renderer must upload `host_render_arrays()` each frame."""
        self.detach_gl_buffers()
        devices = self._run.devices if self._run is not None else []
        whole = self._run is not None and self._run.render_whole
        self._gl_target = self.kind.gl_target(
            position_vbo, speed_vbo, devices, self.n, whole, self.render_ordinal
        )
        return self._gl_target is not None

    def detach_gl_buffers(self) -> None:
        """The renderer is about to delete or resize its buffers (the state lives on the devices)."""
        if self._gl_target is not None:
            target, self._gl_target = self._gl_target, None
            target.close()

    @property
    def gl_buffers(self):
        """The attached GLBuffers (GPU 0's registration), or None."""
        return self._gl_target.gl if self._gl_target is not None else None

    @property
    def data_path(self) -> str:
        if self._gl_target is not None:
            return f"{INTEROP_PATH} on GPU 0 from {self.k} {self.kind.what}"
        return f"host upload from {self.k} {self.kind.what}"

    def device_info(self) -> dict:
        names = self.device_names or self.kind.names(self.k)
        return {
            "name": " + ".join(names),
            "devices": names,
            "gpus": self.k,
            "gpu_driver": self.driver_name,
            "exchange": self.exchange_name,
            "split": self.split_name,
            "backend": self.name,
        }

    @property
    def split_name(self) -> str:
        """How the running kernel's forces are split over the devices (app/parallel/decomposition.py), once
        loaded."""
        return self._run.decomposition.name if self._run is not None else "?"

    @property
    def driver_name(self) -> str:
        """The driver in use ("threads", "single"; auto resolved by the kernel's split), once loaded."""
        return self._run.ops.driver.name if self._run and self._run.ops else self.driver

    @property
    def exchange_name(self) -> str:
        """The exchange in use ("peer", "nccl", "host"; auto resolved), once loaded."""
        return getattr(self._run.ops.exchange, "name", "?") if self._run and self._run.ops else self.exchange

    def _close_run(self) -> None:
        if self._run is not None:
            self._run.close()
            self._run = None

    def close(self) -> None:
        self.detach_gl_buffers()  # while GPU 0's context is still retained by its device
        self._close_run()


def needs_rebalance(device_ms: list[float], spread: float = REBALANCE_SPREAD) -> bool:
    """Whether the slowest device's force time exceeds the fastest's by more than `spread` (never with
    one device, or while a device has no measurement)."""
    if len(device_ms) < 2 or min(device_ms) <= 0:
        return False
    return max(device_ms) / min(device_ms) > spread


def devices_line(backend) -> str:
    """ " on 2 GPUs (threads driver, peer exchange, split by domains)" for a multi-device backend, "" for one
    device's own backend."""
    if not isinstance(backend, MultiDeviceBackend) or isinstance(backend, backend.base):
        return ""  # (one GPU, CudaBackend, is the K = 1 run: its own backend, not a form of it)
    return (
        f" on {backend.k} {backend.kind.what} ({backend.driver_name} driver, {backend.exchange_name} "
        f"exchange, split by {backend.split_name})"
    )
