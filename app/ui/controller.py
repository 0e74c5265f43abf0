"""What the panel does to the viewer and its backend, with no ImGui in it (the panel only calls these).

    ctl = Controller(viewer, frame_log)      # frame_log: the run's FrameLog (one is attached if None)
    ctl.switch_kernel("cpu-fp64")            # the next step uses it; the state is left bitwise as it is
    ctl.set_value("physics.dt", "0.002")     # validated by app.scene.set_value, the CLI's own rules
    ctl.set_value("initial.n", "8192")       # new bodies from the scene, backend.load, new VBOs
    ctl.set_value("render.components.halo.visible", False)   # drawing only: gravity is untouched
    ctl.set_tunable("theta", 0.7)            # a tunable of the current kernel's record, next step on
    ctl.reset(); ctl.single_step(); ctl.load_preset("disk"); ctl.start_benchmark()
    ctl.toggle_recording()                   # V: out/recording-<time>.mp4 of what the viewer draws

Every action returns None on success or a one-line message saying why nothing changed (also kept in
`ctl.message`). `on_frame()` runs once per drawn frame (the panel's overlay calls it, shown or hidden):
it ingests the newest FrameLog record into the history rings and the per-kernel logs (and the step's
force split per stage, `live_stages()`), marks kernel and N switches, ticks the energy monitor and the
force-error probe (`force_error`: an approximate record's live error, app/engine/force_error.py) and runs one
kernel of a pending benchmark.

Live recording (`start_recording` / `stop_recording` / `toggle_recording`, key V) is
app.render.live_recording's ViewRecorder (`ctl.view_recorder`: the recording in progress, the finished
ones, the last error); its messages land in `ctl.message` like every other action's. The benchmark's
records are app.ui.benchmark's.

Beside the kernels, backends, tunables and parameters here, the Controller is made of four mixins:
app.ui.scene_actions (N, reset, presets, snapshots), app.ui.live_stats (the history rings, markers,
medians and live numbers that `on_frame` feeds; re-exported here for its importers),
app.ui.reload_actions (the hot reload of the user's kernel files and the shaders, `reload_tick` each
frame; a kernel file's kernel is tried before a switch runs it) and app.ui.compare_actions (A/B and the
force-error colours, `compare_tick` each frame).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from app.backends import all_kernel_records, backend_class
from app.core.errors import ConfigError
from app.engine.force_error import ForceErrorProbe
from app.render.frames import FrameLog
from app.render.live_recording import ViewRecorder
from app.ui.benchmark import Benchmark, BenchResult
from app.ui.compare_actions import CompareActions
from app.ui.energy import EnergyMonitor
from app.ui.live_stats import (
    HISTORY_CAP,
    HISTORY_FIELDS,
    HISTORY_S,
    LIVE_WINDOW,
    MEDIAN_EVERY_S,
    PER_KERNEL_CAP,
    LiveStats,
    Marker,
)
from app.ui.reload_actions import KernelReloads
from app.ui.scene_actions import SceneActions

__all__ = [  # what this module defines, and what its importers take from it that the mixins define
    "ENERGY_RESET_KEYS",
    "HISTORY_CAP",
    "HISTORY_FIELDS",
    "HISTORY_S",
    "LIVE_WINDOW",
    "MEDIAN_EVERY_S",
    "PER_KERNEL_CAP",
    "Controller",
    "Marker",
]

log = logging.getLogger(__name__)

ENERGY_RESET_KEYS = {"physics.G", "physics.softening", "physics.model", "physics.repulsion"}


class Controller(KernelReloads, SceneActions, LiveStats, CompareActions):
    LIVE_SECTIONS = ("run", "camera")

    def __init__(self, viewer, frame_log: FrameLog | None = None, energy_every: int = 30):
        self.viewer = viewer
        self.log = frame_log if frame_log is not None else FrameLog().attach(viewer)
        self.records = all_kernel_records()
        self._why_not: dict[str, str | None] = {}
        self.refresh_availability()
        self._init_live_stats()
        self.energy = EnergyMonitor(every=energy_every)
        # an approximate record's live force error (app/engine/force_error.py)
        self.force_error = ForceErrorProbe()
        self.bench: Benchmark | None = None
        self.bench_steps = 10
        self.message = ""
        self.panel_ms = 0.0  # set by the panel: its own cost in the last frame (CPU)
        self.energy_ms = 0.0  # the energy monitor's part of the last frame (a host read-back every k frames)
        self.bench_ms = 0.0  # a benchmark kernel run in the last frame
        self.probe_ms = 0.0  # the force-error probe's part of the last frame (a sample every second)
        self._single_step: tuple[int, int] | None = None  # (frame at request, saved steps_per_frame)
        self.view_recorder = ViewRecorder(viewer, self._report)
        self.last_snapshot: Path | None = None
        self._init_reloads()  # the user's kernel files watched (app/ui/reload_actions.py)
        viewer.key_actions.update(
            {
                "R": self.reset,
                "[": lambda: self.cycle_kernel(-1),
                "]": lambda: self.cycle_kernel(+1),
                "V": self.toggle_recording,
                "S": self.save_snapshot,
            }
        )

    # --- what there is ---------------------------------------------------------------------------
    @property
    def backend(self):
        return self.viewer.backend

    def refresh_availability(self) -> None:
        """Ask every backend why each of its kernels cannot run (may compile CUDA sources, memoised)."""
        for rec in self.records:
            try:
                self._why_not[rec.name] = backend_class(rec.backend).kernel_why_not(rec.name)
            except Exception as e:  # noqa: BLE001 - a broken backend greys its kernels, nothing more
                self._why_not[rec.name] = f"{type(e).__name__}: {e}"

    def why_not(self, name: str) -> str | None:
        """None when `name` can run now (its backend, its compile, N within its max_n), else why not."""
        reason = self._why_not.get(name, f"{name!r} is not in the registry")
        if reason:
            return reason
        rec = self.record(name)
        if self.backend.timesteps == "block":
            reason = type(self.backend).kernel_why_not(name)  # block steps walk the tree only
            if reason:
                return reason
        if self.backend.ranks > 1:
            if rec.backend != self.backend.name:
                return (
                    f"the {self.backend.ranks} MPI ranks run the {self.backend.name} backend (chosen at "
                    "start: --backend)"
                )
            reason = type(self.backend).kernel_why_not(name)  # what ranks add (GPU ranks: fp32 only)
            if reason:
                return reason
        if rec.max_n is not None and self.backend.n > rec.max_n:
            return f"N = {self.backend.n:,} exceeds this kernel's limit of {rec.max_n:,}"
        return None

    def record(self, name: str):
        for rec in self.records:
            if rec.name == name:
                return rec
        raise ConfigError(f"unknown kernel {name!r}")

    def available(self) -> list[str]:
        return [r.name for r in self.records if self.why_not(r.name) is None]

    # --- kernels ---------------------------------------------------------------------------------
    def switch_kernel(self, name: str) -> str | None:
        """Use `name` from the next step on. Same backend: set_kernel (state untouched). Another backend:
        a fresh instance loaded with `state()` (float64 copy: fp32 values round-trip exactly)."""
        backend = self.backend
        if name == backend.kernel:
            return None
        reason = self.why_not(name)
        if reason:
            return self._fail(f"kernel {name} is unavailable: {reason}")
        rec = self.record(name)
        old = self.record(backend.kernel) if any(r.name == backend.kernel for r in self.records) else None
        refused = self.tried_first(name)  # a kernel file's: its trial first (app/ui/reload_actions.py)
        if refused:
            return self._fail(f"kernel {name} is refused: {refused}")
        try:
            if rec.backend == backend.name:
                backend.set_kernel(name)
            else:
                self._switch_backend(rec)
        except Exception as e:  # noqa: BLE001 - a compile error etc.: keep the current kernel
            self._why_not[name] = f"{type(e).__name__}: {e}"
            return self._fail(f"switching to {name} failed: {e}")
        note = ""
        if old is not None and old.precision == "fp64" and rec.precision == "fp32":
            note = " (fp64 state rounded to fp32 there)"
        self._ok(f"kernel: {name} from the next step{note}")
        return None

    def _switch_backend(self, rec, cls=None, physics=None) -> None:
        """The current state into a fresh backend of `cls` (default: the record's backend) running
        `rec`, with `physics` (default: the current one)."""
        old = self.backend
        state = old.state()
        new = (cls or backend_class(rec.backend))()
        try:
            new.load(state, physics or old.physics, rec.name)
            new.components = old.components
        except Exception:
            new.close()
            raise
        self.viewer.set_current()
        old.close()  # releases its GL registration before the new backend attaches the buffers
        self.viewer.backend = new
        self.viewer.sync_buffers(force=True)
        log.info("backend %s -> %s (%s)", old.name, new.name, new.data_path)

    def cycle_kernel(self, step: int) -> str | None:
        names = self.available()
        if not names:
            return self._fail("no kernel is available")
        cur = self.backend.kernel
        i = names.index(cur) if cur in names else (-1 if step > 0 else 0)
        return self.switch_kernel(names[(i + step) % len(names)])

    # --- tunables of the current kernel (app.engine.forces: IntChoice, FloatRange, Choice) ------------------
    def set_tunable(self, name: str, value) -> str | None:
        """`name = value` for the current kernel from the next step on, validated by its record; a bad
        value (not in the set, out of the range) is the ConfigError's text and the old value stays."""
        backend = self.backend
        try:
            backend.set_tunables(**{name: value})
        except ConfigError as e:
            return self._fail(str(e))
        now = backend.tunables()[name]
        shown = f"{now:g}" if isinstance(now, float) else now
        self._ok(f"{backend.kernel}.{name} = {shown} from the next step")
        return None

    # --- parameters (set_value: app.ui.actions, validated like --set) ----------------------------------
    def current_value(self, key: str):
        section, name = key.split(".", 1)
        if section == "physics":
            return getattr(self.backend.physics, name)
        if key == "initial.n":
            return self.backend.n
        return super().current_value(key)

    def apply_value(self, key: str, trial) -> str | None:
        """Physics from the next step (a new energy baseline where the energy's definition changed), N
        with new bodies and buffers, and what every panel applies (render, camera) plus run."""
        if key == "initial.n":
            return self._set_n(trial)
        if key == "physics.timesteps" and trial.physics.timesteps != self.backend.physics.timesteps:
            return self._switch_timesteps(trial.physics)
        if key.split(".", 1)[0] == "physics":
            self.backend.set_physics(trial.physics)
            if key in ENERGY_RESET_KEYS:
                self.energy.rebase()
            return None
        return super().apply_value(key, trial)

    def _switch_timesteps(self, physics) -> str | None:
        """Shared <-> block time steps from the next step: the state into the other form of the current
        backend (block: app/backends/block.py, the tree on one device; shared: the backend itself, still
        on the tree), every body's x and v kept."""
        from app.backends.block import block_steps_backend_class

        backend = self.backend
        if physics.timesteps == "block" and (backend.ranks > 1 or backend.devices > 1):
            raise ConfigError("block time steps run on one device; restart without --gpus or mpiexec")
        block = block_steps_backend_class(backend_class(backend.name))
        kernel = block.tree_kernel()  # the tree either way: block steps walk it, shared steps keep it
        cls = block if physics.timesteps == "block" else backend_class(backend.name)
        self._switch_backend(self.record(kernel), cls, physics)
        self.energy.rebase()
        return f"time steps: {physics.timesteps} ({kernel}) from the next step"

    # --- MPI ranks (app/backends/ranks.py) ----------------------------------------------------------
    def set_gather_every(self, frames) -> str | None:
        """Frames between rank 0's gathers of every rank's velocities (positions arrive every step)."""
        if self.backend.ranks <= 1:
            return self._fail("gather every: this run has one process, not MPI ranks")
        try:
            k = int(frames)
        except (TypeError, ValueError):
            k = 0
        if k < 1 or k != frames:
            return self._fail(f"gather every: {frames!r} must be a whole number of frames >= 1")
        self.backend.gather_every = k
        self._ok(f"rank 0 gathers the velocities every {k} frame{'s' if k > 1 else ''}")
        return None

    # --- running ---------------------------------------------------------------------------------
    def toggle_pause(self) -> None:
        self.viewer.toggle_pause()

    def single_step(self) -> None:
        """Advance by exactly one integrator step at the next frame, then stay paused."""
        if self._single_step is not None:
            return
        v = self.viewer
        self._single_step = (v.stats.frame, int(self.scene.run.steps_per_frame))
        self.scene.run.steps_per_frame = 1
        if v.paused:
            v.toggle_pause()

    def _finish_single_step(self) -> None:
        if self._single_step is None:
            return
        requested, spf = self._single_step
        if self.viewer.stats.frame > requested:  # the frame after the request stepped once
            self.scene.run.steps_per_frame = spf
            if not self.viewer.paused:
                self.viewer.toggle_pause()
            self._single_step = None

    # --- benchmark -------------------------------------------------------------------------------
    def start_benchmark(self, steps: int | None = None) -> str | None:
        if self.backend.ranks > 1:
            return self._fail(
                f"the benchmark runs on one process, not on {self.backend.ranks} MPI ranks: "
                f"mpiexec -n {self.backend.ranks} nbody-live bench"
            )
        names = self.available()
        if not names:
            return self._fail("no kernel is available to benchmark")
        steps = int(steps or self.bench_steps)
        if steps < 1:
            return self._fail("benchmark steps must be at least 1")
        self.bench_steps = steps
        self.bench = Benchmark(
            steps=steps,
            n=self.backend.n,
            pending=[self.record(n) for n in names],
            state=self.backend.state(),
            physics=self.backend.physics,
        )
        self._ok(f"benchmark: {len(names)} kernels x {steps} steps at N = {self.backend.n:,}")
        return None

    def bench_tick(self) -> BenchResult | None:
        """Run the next pending kernel of the benchmark (one per frame keeps the window alive)."""
        if self.bench is None:
            return None
        res = self.bench.run_next()
        if res is None:
            return None
        self._skip_frames.add(self.viewer.stats.frame + 1)  # that frame's time includes the benchmark
        if not self.bench.running:
            self._ok(self.bench.summary())
        return res

    # --- live recording (app.render.live_recording) ------------------------------------------------
    def toggle_recording(self) -> str | None:
        return self.view_recorder.toggle()

    def start_recording(self, path: str | Path | None = None) -> str | None:
        return self.view_recorder.start(path)

    def stop_recording(self) -> str | None:
        return self.view_recorder.stop()

    # --- per frame -------------------------------------------------------------------------------
    def on_frame(self) -> None:
        """Ingest the newest frame record, then energy, benchmark and single-step bookkeeping."""
        recs = self.log.records
        step = self.viewer.stats.step
        if recs:
            rec = recs[-1]
            if rec.frame != self._last_frame:
                self._last_frame = rec.frame
                self._ingest(rec, step)
        self._finish_single_step()
        self.reload_tick()
        t0 = time.perf_counter()
        if not self.viewer.paused or self.energy.latest is None:
            self.energy.tick(self.backend)
        t1 = time.perf_counter()
        self.force_error.tick(self.backend, step)
        self.compare_tick()  # A/B and the error colours (app/ui/compare_actions.py): timed as the probe's
        t2 = time.perf_counter()
        self.bench_tick()
        self.energy_ms = (t1 - t0) * 1e3
        self.probe_ms = (t2 - t1) * 1e3
        self.bench_ms = (time.perf_counter() - t2) * 1e3

    def close(self) -> None:
        """Finalise a recording still running (the viewer's GL context must still exist), stop the energy
        monitor."""
        self.view_recorder.close()
        self.energy.close()
        self.close_compare()  # A/B's scratch buffers (app/ui/compare_actions.py)
        self.close_reloads()
