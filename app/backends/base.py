"""The one small interface every backend implements, and the kernel record the registry is made of.

A backend owns the simulation state (on the host for `cpu`, on the device for `cuda`), advances it with
the kernel currently selected, and reports what each step cost in its own clock (CUDA events on the GPU,
perf_counter on the CPU). The panel, the CLI and the tests only ever walk `kernels()` and call `step`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from app.core.errors import ConfigError
from app.engine.forces import ForceEvaluator, KernelRecord, Tunable
from app.engine.timing import StepTimings  # noqa: F401  (re-exported: backends build it)
from app.model.bodies import Bodies, speeds
from app.model.config import INTEGRATORS, MODELS
from app.model.physics import Physics

if TYPE_CHECKING:
    from app.engine.compare import CompareOps
    from app.parallel.multidevice import DeviceFactory, DeviceState

INTEROP_PATH = "CUDA-GL interop"  # data_path's start when a backend writes the renderer's VBOs itself
REFERENCE_ROWS = 1024  # targets per evaluation of reference_rows, so that a progress bar moves


def check_physics(physics: Physics) -> Physics:
    """`physics` if every backend can run it, else a ConfigError naming the key and the allowed values."""
    if physics.integrator not in INTEGRATORS:
        raise ConfigError(
            f"physics.integrator: {physics.integrator!r} is not one of {', '.join(INTEGRATORS)}"
        )
    if physics.model not in MODELS:
        raise ConfigError(f"physics.model: {physics.model!r} is not one of {', '.join(MODELS)}")
    if not physics.softening >= 0:
        raise ConfigError(f"physics.softening: {physics.softening} must be >= 0")
    return physics


class _KernelsWithStore(Protocol):
    """What TunablesPerKernel uses of the Backend it is mixed into (its methods' self type)."""

    @property
    def kernel(self) -> str: ...

    def record(self, name: str) -> KernelRecord: ...

    def _tunable_store(self) -> dict[str, dict]: ...

    def _tunables_changed(self) -> None: ...


class TunablesPerKernel:
    """The Backend ABC's tunables, the one store of them: per kernel, the values set (checked against its
    record) over the record's defaults, kept on the host. Mixed in before `Backend`. The one rule for a
    change: `_tunables_changed` passes the values on to the evaluators and drops the stepper's cached
    a(x), so the next step evaluates the forces afresh with the new values (an evaluator that keeps work
    between steps, a tree's refit, builds again: its own set_tunables)."""

    def _tunable_store(self) -> dict[str, dict]:
        return self.__dict__.setdefault("_tunables", {})  # kernel -> the values set over its defaults

    def tunables(self: _KernelsWithStore) -> dict:
        return self.record(self.kernel).with_tunables(self._tunable_store().get(self.kernel, {}))

    def tunables_for(self: _KernelsWithStore, name: str) -> dict:
        """The values kernel `name` runs with here (set for it, over its record's defaults), whichever
        kernel runs now: A/B's other kernel (app/engine/compare.py) runs with them."""
        return self.record(name).with_tunables(self._tunable_store().get(name, {}))

    def set_tunables(self: _KernelsWithStore, **values) -> None:
        checked = self.record(self.kernel).validate_tunables(values)
        store = self._tunable_store()
        store[self.kernel] = {**store.get(self.kernel, {}), **checked}
        self._tunables_changed()

    def clear_tunables(self: _KernelsWithStore) -> None:
        self._tunable_store().clear()
        self._tunables_changed()

    def _tunables_changed(self) -> None:
        """After set_tunables / clear_tunables: nothing to pass on by default."""


class RenderTarget(Protocol):
    """The renderer's VBOs kept current on the devices themselves (DeviceKind.gl_target): GPU 0's
    CUDA-GL interop (app/backends/cuda/multi_interop.py GpuRenderTarget)."""

    gl: Any  # the registered buffers (app/backends/cuda/interop.py GLBuffers)

    @property
    def map_ms(self) -> float: ...

    @property
    def unmap_ms(self) -> float: ...

    def capacity(self) -> int: ...  # how many bodies the VBOs hold

    def publish(self, devices: list, n: int, whole: bool = False) -> None: ...  # the state into the VBOs

    def close(self) -> None: ...


class DeviceKind(Protocol):
    """The kind of device `--gpus K` and MPI ranks split a backend over (`Backend.device_kind`): GPUs
    (app/backends/cuda/multi.py GpuDevices) or shares of the host (app/backends/cpu_multi.py CpuDevices)."""

    what: str  # the devices in a sentence: "GPUs", "CPU devices"
    default_kernel: str  # the kernel a load without one runs

    def count(self) -> int: ...  # how many exist here (the most --gpus K may ask for)

    def all_count(self) -> int: ...  # how many `--gpus all` means

    def names(self, k: int) -> list[str]: ...  # the names devices 0..k-1 will have

    def rank_device_name(self) -> str: ...  # what each MPI rank's device is

    # make_device(rank, bodies, physics, kernel, share) for this MPI rank (app/backends/distributed.py)
    def rank_maker(self, comm) -> Callable[..., DeviceState]: ...

    def why_not(self, record: KernelRecord) -> str | None: ...  # why these devices cannot run a record

    def check_exchange(self, name: str) -> None: ...  # ConfigError for an exchange they cannot make

    def factory(self, k: int) -> DeviceFactory: ...  # the multi-device run's devices 0..k-1

    def exchange(self, name: str) -> Callable[[list], object]: ...  # make_exchange(devices) of a name

    def gl_target(
        self, position_vbo: int, speed_vbo: int, devices: list, n: int, whole: bool = False, ordinal: int = 0
    ) -> RenderTarget | None: ...  # the renderer's VBOs filled on device `ordinal`, or None: host upload


def wrapped_capabilities(base: type[Backend]) -> dict:
    """What a form over `base` (`--gpus`, block steps, MPI ranks: a class made with `type`) answers as
    `base` does: its name, where its state lives, whether its kernels take every core."""
    return {"name": base.name, "memory": base.memory, "uses_all_cores": base.uses_all_cores}


class Backend(ABC):
    """Simulation state plus kernels. Construct, `load`, then `step` as often as you like."""

    name: str = ""
    # the loaded bodies' components (app.model.components), for drawing only: whoever loads bodies sets it
    # (commands.assembly.make_backend, the panel's Controller); gravity never reads it
    components = None
    # processes that share this state (the MPI ranks of app/backends/ranks.py): anything that would run a
    # copy of it on one process alone (the panel's benchmark, another backend's kernel) needs 1
    ranks = 1
    k = 1  # its devices (`devices`), known to the class (a multi-device form's K)
    base: type[Backend] | None = None  # the one-device backend a multi-device or block-step form wraps
    # the time-step scheme: "shared" (every body takes dt), or "block" (app/backends/block.py, which also
    # answers levels_histogram() and block_summary())
    timesteps = "shared"
    # draws frames inside a step (`step_parts`, `synchronised`): block steps' max steps (run.frames_per_step)
    draws_within_steps = False

    # --- what callers ask of a backend: capabilities with their defaults, never its name (issue 26) ------
    default_kernel = ""  # the kernel a load without one runs
    # where the state and the kernels' work live: "host" (main memory) or "device" (a GPU's)
    memory = "host"
    # how StepTimings.force_ms is measured (bench's JSON "timing")
    timing = "time.perf_counter around each force evaluation"
    # the kernels run on every core of the host, so that a host thread working beside them (the energy
    # monitor's O(N²) sum) takes half of the cores
    uses_all_cores = False
    # a series replay (app/backends/replay.py): its time comes from the snapshots, no steps are made
    replays = False

    @property
    def devices(self) -> int:
        """Devices of one process that share this state (--gpus N: app/backends/multi.py)."""
        return 1

    @classmethod
    def block_ops(cls, bodies: Bodies, physics: Physics, tunables: dict, held: dict):
        """Block time steps' ops (app/engine/blocksteps.py BlockOps) over `bodies` with this backend's
        record in the role "block-steps" (app/backends/block.py steps them); `held` keeps across loads
        what they may reuse (a GPU device), each with close(). A backend with such a record overrides it."""
        raise NotImplementedError(f"backend {cls.name!r} has no block-step ops")

    @classmethod
    def device_kind(cls) -> DeviceKind | None:
        """The kind of device `--gpus K` and MPI ranks split this backend over (app/backends/multi.py:
        count, names, factory, exchanges, render target, rank devices), or None: one device only."""
        return None

    @classmethod
    def system_lines(cls) -> list[str]:
        """Lines `info` prints under the backend: its devices and links (GPUs: topology, NCCL)."""
        return []

    def device_info(self) -> dict | None:
        """Facts of the device the state lives on ("name", and what else the device knows), or None."""
        return None

    @property
    def resolved_kernel(self) -> str | None:
        """What actually runs when the kernel chooses among variants (`best`), else None."""
        return None

    # diagnostics() reduces the energies and momenta where the state lives (a GPU: ten doubles come back,
    # never the state); without it the caller sums them on the host from state()
    reduces_diagnostics = False

    def reference_rows(self, stacked: np.ndarray, k: int, physics: Physics, progress) -> np.ndarray:
        """Float64 (k, 3) accelerations of the first k rows of `stacked` ((k + N, 4) float64 [x, y, z, m])
        due to the N rows after them, by this backend's record in the role "reference" (validate's
        float64 reference: app/commands/reference.py), `progress(rows)` after each piece of targets."""
        raise NotImplementedError(f"the {self.name} backend has no float64 reference")

    def diagnostics(self):
        """Energies and momenta (app.model.physics.Diagnostics) reduced where the state lives
        (reduces_diagnostics)."""
        raise NotImplementedError(f"the {self.name} backend reduces no diagnostics; use state()")

    def diagnostics_async(self):
        """diagnostics() started without waiting: a handle with done() and result(), or None when the
        backend has no such form (then diagnostics() answers at once)."""
        return None

    # --- discovery -------------------------------------------------------------------------------
    @classmethod
    @abstractmethod
    def why_not(cls) -> str | None:
        """None when this backend can run here, else one line saying why not and what to do."""

    @classmethod
    def available(cls) -> bool:
        return cls.why_not() is None

    @classmethod
    @abstractmethod
    def kernels(cls) -> list[KernelRecord]:
        """Every kernel record this backend offers (also when unavailable: the panel greys them)."""

    @classmethod
    def kernel_why_not(cls, name: str) -> str | None:
        """Why one kernel cannot run (failed compile, N too large); None when it can."""
        return cls.why_not()

    # --- state -----------------------------------------------------------------------------------
    @abstractmethod
    def load(self, bodies: Bodies, physics: Physics, kernel: str | None = None) -> None:
        """Take a copy of `bodies` as the state; `kernel` None means this backend's default."""

    @property
    @abstractmethod
    def kernel(self) -> str:
        """The name of the kernel the next step uses."""

    @abstractmethod
    def set_kernel(self, name: str) -> None:
        """Use `name` from the next step on; the state is left exactly as it is."""

    # --- tunables of the current kernel (typed: app.core.values.IntChoice / FloatRange / Choice) ----------
    def tunable_specs(self) -> tuple[Tunable, ...]:
        """The tunables of the current kernel's record, which the panel renders and `tune` sweeps."""
        return self.record(self.kernel).tunables

    @abstractmethod
    def tunables(self) -> dict:
        """The tunable values the next step uses."""

    @abstractmethod
    def set_tunables(self, **values) -> None:
        """Validated against the current record (ConfigError naming record.key); from the next step on."""

    @abstractmethod
    def clear_tunables(self) -> None:
        """Back to every record's defaults."""

    @classmethod
    def record(cls, name: str) -> KernelRecord:
        for rec in cls.kernels():
            if rec.name == name:
                return rec
        names = ", ".join(r.name for r in cls.kernels())
        raise ConfigError(f"kernel: {name!r} is not a {cls.name} kernel; choose from {names}")

    @abstractmethod
    def set_physics(self, physics: Physics) -> None:
        """Change parameters from the next step on (the state is kept)."""

    @property
    def physics(self) -> Physics:
        return self._physics

    # Simulation time is t0 + steps·dt: `_t0`, `_steps` and `_physics` are the backend's own fields.
    _t0: float
    _steps: int
    _physics: Physics

    @property
    def time(self) -> float:
        return self._t0 + self._steps * self._physics.dt

    def _swap_physics(self, physics: Physics) -> Physics:
        """Check and install `physics`, re-basing the time at a dt change so that it never jumps;
        returns the previous physics (the backend decides what else the change invalidates)."""
        physics = check_physics(physics)
        old = self._physics
        if physics.dt != old.dt:
            self._t0, self._steps = self._t0 + self._steps * old.dt, 0
        self._physics = physics
        return old

    @property
    @abstractmethod
    def n(self) -> int: ...

    @abstractmethod
    def step(self, steps: int = 1) -> StepTimings:
        """Advance by `steps` integrator steps with the current kernel and say what it cost."""

    def step_parts(self, parts: int, per_step: int) -> StepTimings:
        """Advance by `parts` / `per_step` steps, a frame drawn inside a step (draws_within_steps)."""
        raise NotImplementedError(f"the {self.name} backend draws frames only between steps")

    @property
    def synchronised(self) -> bool:
        """x, v and a(x) are at one time (what an energy sample needs): always, unless a step is part done
        (step_parts)."""
        return True

    def lead_says(self, value):
        """What every process of this backend acts on, for a decision each could make differently (one
        read from a wall clock): `value` itself in one process; under MPI ranks, rank 0's (RanksBackend),
        so that no rank stops a loop of collective steps that the others go on with."""
        return value

    def idle(self) -> None:  # noqa: B027 - a hook most backends leave empty
        """A frame passes without steps (the viewer is paused): a backend whose state other processes
        share lets them know; the others have nothing to do."""

    def kernel_reload(self, sanitizer: bool = False):
        """The stages of a kernel file's hot reload on this backend (app.engine.kernel_reload: paths,
        build, snapshot, validate, swap, close), or None where its kernels are not read from the user's
        files (the CPU backends, several devices, MPI ranks). `sanitizer`: trials under
        compute-sanitizer."""
        return None

    @abstractmethod
    def accelerations(self) -> np.ndarray:
        """(N, 3) accelerations at the current positions by the current kernel, as float64."""

    def evaluator(self, name: str | None = None) -> ForceEvaluator:
        """The ForceEvaluator of a record (default: the current kernel) on this backend's device."""
        raise NotImplementedError(f"the {self.name} backend does not hand out its evaluators")

    def force_error_sample(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(approx, exact): float64 (K, 3) accelerations of the bodies `rows` (original order) at the
        current positions, approx by the running kernel (what it computed for the current state) and
        exact by an all-pairs sum over every source; the live force error (app/engine/force_error.py) compares
        them for an approximate record. A backend that cannot says so by raising NotImplementedError."""
        raise NotImplementedError(f"the {self.name} backend cannot sample its force error")

    def compare_ops(self) -> CompareOps:
        """Its side of the panel's A/B and error colours (app/engine/compare.py CompareOps): another kernel
        of this backend and the exact sum evaluated into scratch buffers beside the state, never into it,
        and the per-body colour buffer. A backend that cannot says so by raising NotImplementedError."""
        form = (
            f" on {self.devices} devices"
            if self.devices > 1
            else f" over {self.ranks} MPI ranks"
            if self.ranks > 1
            else " with block time steps"
            if self.timesteps == "block"
            else ""
        )
        raise NotImplementedError(f"the {self.name} backend{form} does not compare kernels")

    @abstractmethod
    def state(self) -> Bodies:
        """A float64 host copy of the current state (a synchronising read-back on the GPU), with the
        bodies' `components`: what a snapshot of it keeps."""

    # --- rendering -------------------------------------------------------------------------------
    def host_render_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(positions (N, 4) float32 [x, y, z, m], speeds (N,) float32) for a host→GL upload.

        Backends that write the GL buffers themselves (`attach_gl_buffers` returned True) are never
        asked for these per frame.
        """
        b = self.state()
        return b.pos4(np.float32), speeds(b.vel)

    render_ordinal = 0  # the GPU whose context holds the renderer's buffers, where a backend fills them

    @property
    def gl_buffers(self):
        """The renderer's buffers as this backend maps them on its GPU `render_ordinal` (app/backends/cuda/
        interop.py GLBuffers) when it fills them itself; None when they are uploaded from the host (the
        splat draw style reads them there: app/render/splat_style.py)."""
        return None

    def attach_gl_buffers(self, position_vbo: int, speed_vbo: int) -> bool:
        """Offer the GL names of the position (float4) and speed (float) vertex buffers.

        Return True when the backend will keep them current itself (CUDA–GL interop); False when
        the renderer must upload `host_render_arrays()` each frame.
        """
        return False

    @property
    def data_path(self) -> str:
        """How positions reach the screen: 'host upload', or INTEROP_PATH (at the start) when the backend
        writes the renderer's buffers itself."""
        return "host upload"

    def close(self) -> None:
        """Release device resources (contexts, buffers); safe to call twice."""
        return None
