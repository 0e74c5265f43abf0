"""The one small interface every backend implements, and the kernel record the registry is made of.

A backend owns the simulation state (on the host for `cpu`, on the device for `cuda`), advances it with
the kernel currently selected, and reports what each step cost in its own clock (CUDA events on the GPU,
perf_counter on the CPU). The panel, the CLI and the tests only ever walk `kernels()` and call `step`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from app.bodies import Bodies
from app.errors import ConfigError
from app.physics import FLOPS_PER_INTERACTION, INTEGRATORS, MODELS, Physics


def check_physics(physics: Physics) -> Physics:
    """`physics` if every backend can run it, else a ConfigError naming the key and the allowed values."""
    if physics.integrator not in INTEGRATORS:
        raise ConfigError(f"physics.integrator: {physics.integrator!r} is not one of "
                          f"{', '.join(INTEGRATORS)}")
    if physics.model not in MODELS:
        raise ConfigError(f"physics.model: {physics.model!r} is not one of {', '.join(MODELS)}")
    if not physics.softening >= 0:
        raise ConfigError(f"physics.softening: {physics.softening} must be >= 0")
    return physics


@dataclass(frozen=True)
class KernelRecord:
    """One selectable kernel variant (REBOUND's integrator-table pattern)."""

    name: str  # unique across all backends: the CLI's --kernel, the panel's combo entry
    doc: str  # one line: what the variant does differently
    backend: str  # "cpu" or "cuda"
    precision: str = "fp32"  # "fp32" or "fp64"
    source: str | None = None  # file under kernels/ (CUDA) or the Python module (CPU)
    entry: str | None = None  # kernel symbol / function name
    block_size: int | None = None  # default launch block size, where it applies
    tunables: Mapping[str, tuple] = field(default_factory=dict)  # name -> allowed values
    max_n: int | None = None  # largest N the variant accepts (None: any)
    origin: str = ""  # which write-up it comes from


@dataclass
class StepTimings:
    """What `steps` steps cost, in milliseconds of the backend's own clock."""

    kernel: str
    steps: int
    n: int
    force_ms: float = 0.0
    integrate_ms: float = 0.0
    map_ms: float = 0.0
    unmap_ms: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def interactions(self) -> int:
        return self.steps * self.n * self.n

    @property
    def interactions_per_s(self) -> float:
        return self.interactions / (self.force_ms * 1e-3) if self.force_ms > 0 else 0.0

    @property
    def gflops(self) -> float:
        """GFLOP/s by the 20-flops-per-interaction convention (GPU Gems 3, CUDA samples)."""
        return self.interactions_per_s * FLOPS_PER_INTERACTION * 1e-9


class Backend(ABC):
    """Simulation state plus kernels. Construct, `load`, then `step` as often as you like."""

    name: str = ""

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

    @abstractmethod
    def set_physics(self, physics: Physics) -> None:
        """Change parameters from the next step on (the state is kept)."""

    @property
    @abstractmethod
    def physics(self) -> Physics: ...

    @property
    @abstractmethod
    def n(self) -> int: ...

    @abstractmethod
    def step(self, steps: int = 1) -> StepTimings:
        """Advance by `steps` integrator steps with the current kernel and say what it cost."""

    @abstractmethod
    def accelerations(self) -> np.ndarray:
        """(N, 3) accelerations at the current positions by the current kernel, as float64."""

    @abstractmethod
    def state(self) -> Bodies:
        """A float64 host copy of the current state (a synchronising read-back on the GPU)."""

    # --- rendering -------------------------------------------------------------------------------
    def host_render_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(positions (N, 4) float32 [x, y, z, m], speeds (N,) float32) for a host→GL upload.

        Backends that write the GL buffers themselves (`attach_gl_buffers` returned True) are never
        asked for these per frame.
        """
        b = self.state()
        return b.pos4(np.float32), np.linalg.norm(b.vel, axis=1).astype(np.float32)

    def attach_gl_buffers(self, position_vbo: int, speed_vbo: int) -> bool:
        """Offer the GL names of the position (float4) and speed (float) vertex buffers.

        Return True when the backend will keep them current itself (CUDA–GL interop); False when
        the renderer must upload `host_render_arrays()` each frame.
        """
        return False

    @property
    def data_path(self) -> str:
        """How positions reach the screen: 'host upload' or 'CUDA-GL interop'."""
        return "host upload"

    def close(self) -> None:
        """Release device resources (contexts, buffers); safe to call twice."""
        return None
