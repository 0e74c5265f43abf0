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
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.backends import all_kernel_records, backend_class
from app.core.errors import ConfigError
from app.engine.force_error import ForceErrorProbe
from app.engine.forces import STAGES
from app.engine.timing import FLOPS_PER_INTERACTION, StepTimings
from app.render.frames import FrameLog, FrameRecord, History
from app.render.live_recording import ViewRecorder
from app.ui.actions import Actions
from app.ui.benchmark import Benchmark, BenchResult
from app.ui.energy import EnergyMonitor

log = logging.getLogger(__name__)

HISTORY_S = 10.0  # what the history plots show
HISTORY_CAP = 16384  # frames kept in the rings (10 s at up to ~1600 FPS)
PER_KERNEL_CAP = 8192  # frames kept per (kernel, N) for the median table
MEDIAN_EVERY_S = 1.0  # how often the median table is recomputed while it is on screen
LIVE_WINDOW = 15  # frames the live numbers are the median of
ENERGY_RESET_KEYS = {"physics.G", "physics.softening", "physics.model", "physics.repulsion"}
HISTORY_FIELDS = (
    "frame_ms",
    "force_ms",
    "integrate_ms",
    "mapunmap_ms",
    "draw_ms",
    "upload_ms",
    "record_ms",
    "panel_ms",
    "energy_ms",
    "probe_ms",
    "python_ms",
    "interactions_per_s",
)


@dataclass
class Marker:
    t: float  # FrameLog clock
    label: str


class Controller(Actions):
    LIVE_SECTIONS = ("run", "camera")

    def __init__(self, viewer, frame_log: FrameLog | None = None, energy_every: int = 30):
        self.viewer = viewer
        self.log = frame_log if frame_log is not None else FrameLog().attach(viewer)
        self.records = all_kernel_records()
        self._why_not: dict[str, str | None] = {}
        self.refresh_availability()
        self.history = History(HISTORY_FIELDS, HISTORY_CAP)
        self.markers: list[Marker] = []
        self.per_kernel: dict[tuple[str, int], FrameLog] = {}
        self.medians: dict[tuple[str, int], dict] = {}
        self._stale: set[tuple[str, int]] = set()
        self._medians_t = 0.0
        self.energy = EnergyMonitor(every=energy_every)
        # an approximate record's live force error (app/engine/force_error.py)
        self.force_error = ForceErrorProbe()
        self._stages: deque[dict[str, float]] = deque(maxlen=LIVE_WINDOW)  # force split of the last frames
        self._active: deque[float] = deque(maxlen=LIVE_WINDOW)  # block steps: active fraction per frame
        # several devices (--gpus): each device's force ms and the exchange ms of the last frames
        self._devices: deque[tuple[dict[str, float], float]] = deque(maxlen=LIVE_WINDOW)
        self.bench: Benchmark | None = None
        self.bench_steps = 10
        self.message = ""
        self.panel_ms = 0.0  # set by the panel: its own cost in the last frame (CPU)
        self.energy_ms = 0.0  # the energy monitor's part of the last frame (a host read-back every k frames)
        self.bench_ms = 0.0  # a benchmark kernel run in the last frame
        self.probe_ms = 0.0  # the force-error probe's part of the last frame (a sample every second)
        self._live: dict | None = None
        self._live_t = 0.0
        self._live_count = -1
        self._last_frame: int | None = None
        self._last_kernel: str | None = None
        self._last_n: int | None = None
        self._skip_frames: set[int] = set()  # frames whose time includes a benchmark run
        self._single_step: tuple[int, int] | None = None  # (frame at request, saved steps_per_frame)
        self.view_recorder = ViewRecorder(viewer, self._report)
        self.last_snapshot: Path | None = None
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

    def _set_n(self, trial) -> str | None:
        from app.scene import make_bodies

        if trial.initial.file:
            raise ConfigError("N is fixed by the snapshot file the bodies come from")
        n = trial.initial.n
        if n == self.backend.n:
            return None
        self._load(make_bodies(trial))
        return f"N = {n:,}: buffers re-allocated"

    def _load(self, bodies, physics=None) -> None:
        """New bodies into the running backend; new VBOs when N changed (re-registered with CUDA)."""
        self.viewer.set_current()
        b = self.backend
        b.load(bodies, physics or b.physics, b.kernel)
        b.components = bodies.components
        self.viewer.sync_buffers(force=True)
        self.energy.rebase()

    def reset(self) -> str | None:
        """The scene's initial bodies again (same seed, current N, current kernel), camera reset."""
        from app.scene import make_bodies

        try:
            self._load(make_bodies(self.scene), self.scene.physics)
        except Exception as e:  # noqa: BLE001
            return self._fail(f"reset failed: {e}")
        self.viewer.reset_camera()
        self._ok("reset to the scene's initial bodies")
        return None

    def save_snapshot(self) -> str | None:
        """Write the current state (float64, original body order, the time, the components) to
        <recording folder>/snapshot-<time>.npz atomically; loads back bitwise with `formats.read`."""
        from app.core.outputs import check_output
        from app.model import formats

        stamp = time.strftime("%Y%m%d-%H%M%S")
        folder = self.view_recorder.directory
        path, i = folder / f"snapshot-{stamp}.npz", 1
        while path.exists():
            path, i = folder / f"snapshot-{stamp}-{i}.npz", i + 1
        try:
            folder.mkdir(parents=True, exist_ok=True)
            formats.write(check_output(path, "snapshot"), self.backend.state())  # (with the components)
        except Exception as e:  # noqa: BLE001 - a failed save is reported; the viewer goes on
            return self._fail(f"snapshot not saved: {e}")
        self.last_snapshot = path
        self._ok(f"wrote {path}")
        return None

    def load_preset(self, name: str) -> str | None:
        """A preset's bodies, physics, camera and render settings; N, backend, kernel and time steps
        (shared or block, with L and η) are kept."""
        from app.scene import load_scene, make_bodies

        cur = self.scene
        try:
            new = load_scene(name, {"initial.n": cur.initial.n})
            new.run.backend, new.run.kernel = cur.run.backend, self.backend.kernel
            ph = self.backend.physics
            new.physics = new.physics.with_(
                timesteps=ph.timesteps,
                block_levels=ph.block_levels,
                block_eta=ph.block_eta,
                block_coarsen=ph.block_coarsen,
            )
            bodies = make_bodies(new)
            self.backend.set_physics(new.physics)
            self.viewer.scene = new
            self.viewer.renderer.apply_settings(new.render)
            self._load(bodies, new.physics)
        except Exception as e:  # noqa: BLE001
            self.viewer.scene = cur
            return self._fail(f"preset {name}: {e}")
        self.viewer.reset_camera()
        self._ok(f"scene {name} (N = {bodies.n:,})")
        return None

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
        res = self.bench.run_next() if self.bench is not None else None
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
        t0 = time.perf_counter()
        if not self.viewer.paused or self.energy.latest is None:
            self.energy.tick(self.backend)
        t1 = time.perf_counter()
        self.force_error.tick(self.backend, step)
        t2 = time.perf_counter()
        self.bench_tick()
        self.energy_ms = (t1 - t0) * 1e3
        self.probe_ms = (t2 - t1) * 1e3
        self.bench_ms = (time.perf_counter() - t2) * 1e3

    def _ingest(self, rec: FrameRecord, step: StepTimings | None = None) -> None:
        if rec.kernel and rec.kernel != self._last_kernel:
            self.markers.append(Marker(rec.t, rec.kernel))
            self._last_kernel = rec.kernel
            self._stages.clear()
            self._devices.clear()
        elif rec.n != self._last_n and self._last_n is not None:
            self.markers.append(Marker(rec.t, f"N={rec.n:,}"))
        self._last_n = rec.n
        if len(self.markers) > 256:
            del self.markers[:-256]
        if rec.frame <= 2 or rec.frame in self._skip_frames:
            self._skip_frames.discard(rec.frame)
            return  # start-up frames (compiles, first uploads) and benchmark frames are not the run's
        # panel_ms / energy_ms still hold the previous overlay's: the one inside this record's frame time
        measured = (
            rec.force_ms
            + rec.integrate_ms
            + rec.map_ms
            + rec.unmap_ms
            + rec.draw_ms
            + rec.upload_ms
            + rec.record_ms
            + self.panel_ms
            + self.energy_ms
            + self.probe_ms
        )
        python_ms = max(rec.frame_ms - measured, 0.0) if rec.frame_ms > 0 else 0.0
        self.history.push(
            rec.t,
            frame_ms=rec.frame_ms,
            force_ms=rec.force_ms,
            integrate_ms=rec.integrate_ms,
            mapunmap_ms=rec.map_ms + rec.unmap_ms,
            draw_ms=rec.draw_ms,
            upload_ms=rec.upload_ms,
            record_ms=rec.record_ms,
            panel_ms=self.panel_ms,
            energy_ms=self.energy_ms,
            probe_ms=self.probe_ms,
            python_ms=python_ms,
            interactions_per_s=rec.interactions_per_s,
        )
        if rec.steps > 0 and step is not None and step.kernel == rec.kernel:
            self._stages.append(step.stages)
            if "active_fraction" in step.extra:
                self._active.append(step.extra["active_fraction"])
            if step.devices:
                self._devices.append((step.devices, step.exchange_ms))
        if rec.steps > 0 and rec.frame_ms > 0:
            key = (rec.kernel, rec.n)
            self.per_kernel.setdefault(key, FrameLog(capacity=PER_KERNEL_CAP)).records.append(rec)
            self._stale.add(key)

    def update_medians(self, max_age_s: float = 0.0) -> dict[tuple[str, int], dict]:
        """Per-(kernel, N) medians via FrameLog.medians (the first 3 frames of each are warm-up), for the
        (kernel, N) pairs that got frames since the last update; at most every `max_age_s` seconds.
        The panel asks while its table is on screen; nothing is computed otherwise."""
        now = time.perf_counter()
        if now - self._medians_t >= max_age_s:
            self._medians_t = now
            for key in list(self._stale):
                self.medians[key] = self.per_kernel[key].medians(skip=3)
            self._stale.clear()
        return self.medians

    def live(self, max_age_s: float = 0.1) -> dict[str, float]:
        """The live numbers: medians of the last LIVE_WINDOW frames (steadier than one frame), recomputed
        at most every `max_age_s` (readable, and cheap at any frame rate)."""
        now = time.perf_counter()
        fresh = now - self._live_t < max_age_s or self._live_count == self.history.count
        if self._live is not None and fresh:
            return self._live
        out = self.history.recent_medians(LIVE_WINDOW)
        out["gflops"] = out["interactions_per_s"] * FLOPS_PER_INTERACTION * 1e-9
        out["fps"] = self.viewer.stats.fps
        self._live, self._live_t, self._live_count = out, now, self.history.count
        return out

    def live_stages(self) -> dict[str, float]:
        """The force evaluation's split (StepTimings.stages, ms per frame) of the current kernel: the
        mean per stage over the last frames that reported one, every one of a tree's STAGES in their
        order, a stage a frame did not run counting 0 (a tree refitted between builds has no keys or sort
        on most frames: the mean is what its builds cost a frame), then any of its own; {} when the
        kernel reports none."""
        kernel = self.backend.kernel
        rows = [s for s in self._stages if s]
        if not rows or self._last_kernel != kernel:
            return {}
        seen = set().union(*rows)
        names = list(STAGES) + sorted(seen.difference(STAGES))
        return {name: float(np.mean([s.get(name, 0.0) for s in rows])) for name in names}

    def live_block(self) -> tuple[float, np.ndarray] | None:
        """Block time steps: (the median active fraction of the last frames' max steps, bodies per level
        now); None under shared steps."""
        if self.backend.timesteps != "block":
            return None
        fraction = float(np.median(self._active)) if self._active else float("nan")
        return fraction, self.backend.levels_histogram()

    def live_devices(self) -> tuple[dict[str, float], float]:
        """Several devices (--gpus): ({"<index> <name>": median force ms per frame}, median exchange ms
        per frame) over the last frames; ({}, 0.0) with one device."""
        rows = [d for d in self._devices if d[0]]
        if not rows:
            return {}, 0.0
        names = list(rows[-1][0])
        return (
            {name: float(np.median([d.get(name, 0.0) for d, _ in rows])) for name in names},
            float(np.median([x for _, x in rows])),
        )

    def close(self) -> None:
        """Finalise a recording still running (the viewer's GL context must still exist), stop the energy
        monitor."""
        self.view_recorder.close()
        self.energy.close()
