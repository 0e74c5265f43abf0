"""Energy and momentum drift for the panel: conserved quantities sampled every few frames.

A backend with a `diagnostics()` method (the CUDA backend: kernels/diagnostics.cu reduces energy and
momenta on the device; only ten doubles come back) is asked every `every` frames, on the thread that
owns it; with `diagnostics_async()` a later tick collects the result, once the GPU got there (on CUDA
a large N's potential runs in slices, at most one per tick and paced to 5% of the GPU's time, and none
past ~4M bodies, where `note` says so and only the momenta are judged: app/backends/cuda/diagnostics.py);
a sample still in flight skips the next due. Other
backends (the CPU one) have their state copied and reduced in a background thread (a numba kernel
that releases the GIL), so a frame never waits for the O(N²) potential energy.

Drifts are relative to a baseline, the first sample after `rebase()` (a new N, reset, a physics change):
    energy    |E - E0| / |E0|
    momentum  |P - P0| / Σ m|v|          (the scale linear momentum is judged against)
    angular   |L - L0| / Σ m |r| |v|
"""

from __future__ import annotations

import logging
import math
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.engine.energy import potential_energy as fast_potential
from app.model.physics import (
    Diagnostics,
    Physics,
    angular_momentum,
    kinetic_energy,
    linear_momentum,
    momentum_scale,
)

log = logging.getLogger(__name__)

HOST_MAX_N = 65_536  # above this the host O(N²) potential takes seconds: energy needs the device reduction


def potential_energy(pos: np.ndarray, mass: np.ndarray, physics: Physics, parallel: bool = False) -> float:
    """The host potential of app/engine/energy.py, with coincident pairs skipped as the forces skip them."""
    return fast_potential(pos, mass, physics, parallel, coincident_inf=False)


@dataclass(frozen=True)
class Sample:
    """One measurement: simulation time and the three relative drifts (energy None when not computed)."""

    time: float
    energy: float | None
    momentum: float
    angular: float
    e_total: float | None


def host_diagnostics(
    bodies, physics: Physics, with_energy: bool = True, parallel: bool = False
) -> tuple[Diagnostics, float]:
    """(Diagnostics, Σ m|r||v|) of a host state; potential energy NaN when `with_energy` is False."""
    pot = potential_energy(bodies.pos, bodies.mass, physics, parallel) if with_energy else float("nan")
    d = Diagnostics(
        time=bodies.time,
        kinetic=kinetic_energy(bodies.vel, bodies.mass),
        potential=pot,
        momentum=tuple(linear_momentum(bodies.vel, bodies.mass)),
        angular_momentum=tuple(angular_momentum(bodies.pos, bodies.vel, bodies.mass)),
        momentum_scale=momentum_scale(bodies.vel, bodies.mass),
    )
    r, v = np.linalg.norm(bodies.pos, axis=1), np.linalg.norm(bodies.vel, axis=1)
    lscale = float(np.sum(bodies.mass * r * v))
    return d, lscale


def _as_diagnostics(obj) -> Diagnostics:
    if isinstance(obj, Diagnostics):
        return obj
    return Diagnostics(**dict(obj))


def _angular_scale(d) -> float:
    return float(getattr(d, "angular_scale", None) or d.momentum_scale)


class _DeviceSample:
    """A PendingDiagnostics behind the Future interface tick() and wait() use: (generation, result)."""

    def __init__(self, pending, generation: int):
        self._pending = pending
        self._generation = generation

    def done(self) -> bool:
        return self._pending.done()

    def result(self, timeout: float | None = None):
        d = _as_diagnostics(self._pending.result())
        return self._generation, (d, _angular_scale(d))

    @property
    def progress(self) -> float:
        """The share of the sample queued on the GPU (a live one runs its potential in paced slices)."""
        return float(getattr(self._pending, "progress", 1.0))


class EnergyMonitor:
    """Samples conserved quantities every `every` frames; `samples` holds the drifts since the baseline."""

    def __init__(self, every: int = 30, max_samples: int = 2000):
        self.every = max(int(every), 1)
        self.max_samples = max_samples
        self.samples: list[Sample] = []
        self.note = ""  # why energy is not shown (N too large for the host path), else ""
        self.source = ""  # "device diagnostics()" | "host read-back"
        self._base: tuple[Diagnostics, float] | None = None
        self._future: Future | _DeviceSample | None = None  # the sample in flight
        self._generation = 0
        self._frames = 0
        self._due = False  # a sample is due at the next frame whose state is synchronised

    def rebase(self) -> None:
        """The next sample becomes the baseline (new bodies, or physics that changes what E means)."""
        self._generation += 1
        self._base = None
        self.samples.clear()
        self._frames = 0
        self._due = False

    def tick(self, backend) -> None:
        """Call once per frame: collects a finished sample, starts the next one every `every` frames."""
        if self._future is not None and self._future.done():
            fut, self._future = self._future, None
            try:
                gen, result = fut.result()
            except Exception as e:  # noqa: BLE001 - a diagnostic must never stop the viewer
                log.warning("energy diagnostics failed: %s", e)
            else:
                if gen == self._generation:
                    self._record(*result)
        self._frames += 1
        if self._frames % self.every == 1 or self.every == 1:
            self._due = True
        if not self._due:
            return
        if not backend.synchronised:
            return  # a max step drawn in parts: velocities are mid-step; sample at its end (still due)
        self._due = False
        if self._future is not None:
            return  # the previous reduction is still running: skip this one
        physics = backend.physics
        if backend.reduces_diagnostics:
            self.source = "device diagnostics()"
            self.note = ""
            try:
                pending = backend.diagnostics_async()  # read a frame or two later: no wait on the GPU
                if pending is not None:
                    self.note = getattr(pending, "note", "")  # (a large N's sample: momenta only)
                    self._future = _DeviceSample(pending, self._generation)
                    return
                d = _as_diagnostics(backend.diagnostics())
            except Exception as e:  # noqa: BLE001 - a failed reduction costs one drift sample, not the run
                self.note = f"device diagnostics failed: {e}"
                log.warning("energy/momentum drift: %s", self.note)
                return
            self._record(d, _angular_scale(d))
            return
        self.source = "host read-back"
        bodies = backend.state()
        with_energy = bodies.n <= HOST_MAX_N
        self.note = (
            ""
            if with_energy
            else (
                f"N = {bodies.n:,} > {HOST_MAX_N:,}: the host O(N²) energy is "
                "off (needs the device-side reduction)"
            )
        )
        gen = self._generation
        parallel = not backend.uses_all_cores  # (else its kernels and this sum would fight over the cores)
        host_sum: Future = Future()

        def work():  # a daemon thread: a long O(N²) sum never holds up the app's exit
            try:
                if parallel:  # half the cores: the render loop's thread must not be crowded out
                    import numba

                    config: Any = numba.config  # (it sets its NUMBA_* names through globals())
                    numba.set_num_threads(max(1, config.NUMBA_NUM_THREADS // 2))
                host_sum.set_result((gen, host_diagnostics(bodies, physics, with_energy, parallel)))
            except Exception as e:  # noqa: BLE001 - reported by tick()
                host_sum.set_exception(e)

        self._future = host_sum
        threading.Thread(target=work, name="nbody-energy", daemon=True).start()

    def wait(self, timeout: float = 30.0) -> None:
        """Block until the sample in flight (if any) is recorded (tests, the end of a run)."""
        if self._future is not None:
            self._future.result(timeout)
            fut, self._future = self._future, None
            gen, result = fut.result()
            if gen == self._generation:
                self._record(*result)

    def _record(self, d: Diagnostics, lscale: float) -> None:
        if self._base is None:
            self._base = (d, lscale)
        b, bl = self._base
        e0 = b.energy
        energy = None
        if math.isfinite(d.potential) and math.isfinite(e0) and e0 != 0:
            energy = abs(d.energy - e0) / abs(e0)
        dp = float(np.linalg.norm(np.subtract(d.momentum, b.momentum)))
        dl = float(np.linalg.norm(np.subtract(d.angular_momentum, b.angular_momentum)))
        s = Sample(
            time=d.time,
            energy=energy,
            momentum=dp / b.momentum_scale if b.momentum_scale > 0 else 0.0,
            angular=dl / bl if bl > 0 else 0.0,
            e_total=d.energy if math.isfinite(d.potential) else None,
        )
        self.samples.append(s)
        if len(self.samples) > self.max_samples:
            del self.samples[: len(self.samples) - self.max_samples]

    @property
    def in_flight(self) -> float | None:
        """How far the sample in flight is (0 .. 1 of its launches queued), None when none is."""
        if self._future is None:
            return None
        return self._future.progress if isinstance(self._future, _DeviceSample) else 0.0

    @property
    def latest(self) -> Sample | None:
        return self.samples[-1] if self.samples else None

    def close(self) -> None:
        self._generation += 1  # a result still in flight is dropped
        self._future = None
