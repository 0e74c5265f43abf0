"""A replay "backend": it computes no forces; it feeds the viewer the positions of a snapshot series
(app.model.series), linearly interpolated in time, so that the Viewer, the recorder and the panel work on a
replay exactly as on a simulation. Not in the backend registry (`--backend` never picks it): `run DIR`
and `record DIR` construct it.

    replay = ReplayBackend(series)               # at the first snapshot, playing
    replay.seek(t); replay.playing = False       # what the time slider and play/pause do
    replay.step()                                # one drawn frame: advance the replay time

What one `step()` (one drawn frame) advances:
  * live (`run DIR`): `rate` units of simulation time per second of wall time, read from `clock` (capped
    at MAX_FRAME_S per frame, so a stall or a pause never jumps ahead);
  * deterministic (`record DIR`): `per_frame` units of simulation time per call, no clock at all.
At the last snapshot it loops to the first (`loop`) or stops playing there.
"""

from __future__ import annotations

import time as _time
from collections.abc import Callable

import numpy as np

from app.backends.base import Backend, KernelRecord, StepTimings
from app.core.errors import ConfigError
from app.model.bodies import Bodies
from app.model.physics import Physics

MAX_FRAME_S = 0.1  # wall time one frame may advance the replay by at most
PLAY_S = 10.0  # the default rate plays the whole series in this many seconds ...
MIN_SNAPSHOTS_PER_S, MAX_SNAPSHOTS_PER_S = 1.0, 30.0  # ... at between 1 and 30 snapshots per second

RECORD = KernelRecord(
    name="replay",
    doc="a snapshot series played back: positions interpolated linearly "
    "in time between snapshots, no forces computed",
    backend="replay",
    precision="fp32",
)


class ReplayBackend(Backend):
    name = "replay"
    replays = True  # the recorder's HUD and the commands ask for this rather than the class

    def __init__(
        self, series, clock: Callable[[], float] | None = _time.perf_counter, per_frame: float | None = None
    ):
        self.series = series
        self.components = series.components  # drawn as in the run: the panel lists them
        self.clock = clock
        self.per_frame = per_frame
        self.t = series.start
        self.playing = True
        self.loop = True
        self.rate = default_rate(series)
        self._last: float | None = None
        self._origin, self._ticks = self.t, 0
        self._physics = Physics()
        self.frames = 0

    # --- what the Backend interface asks; nothing of it computes -----------------------------------
    @classmethod
    def why_not(cls):
        return None

    @classmethod
    def kernels(cls):
        return [RECORD]

    def load(self, bodies: Bodies, physics: Physics, kernel: str | None = None) -> None:
        raise ConfigError("a replay shows the snapshots of its series; it cannot load other bodies")

    @property
    def kernel(self) -> str:
        return RECORD.name

    def set_kernel(self, name: str) -> None:
        if name != RECORD.name:
            raise ConfigError(f"a replay computes no forces: kernel {name!r} does not apply")

    def tunables(self) -> dict:
        return {}

    def set_tunables(self, **values) -> None:
        if values:
            raise ConfigError("a replay has no tunables")

    def clear_tunables(self) -> None:
        return None

    def set_physics(self, physics: Physics) -> None:
        self._physics = physics

    @property
    def time(self) -> float:
        return float(self.t)

    @property
    def n(self) -> int:
        return self.series.n

    def accelerations(self) -> np.ndarray:
        raise ConfigError("a replay computes no forces: its accelerations are not known")

    def state(self) -> Bodies:
        return self.series.state_at(self.t)

    def host_render_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return self.series.render_arrays(self.t)

    # --- playing ---------------------------------------------------------------------------------
    def step(self, steps: int = 1) -> StepTimings:
        """One drawn frame: advance the replay time (see the module's doc); `steps` is ignored."""
        t0 = _time.perf_counter()
        self.frames += 1
        if self.per_frame is not None:  # frame k after a seek to t0 shows t0 + k x per_frame, exactly
            if self.playing:
                self._ticks += 1
                self._move_to(self._origin + self._ticks * self.per_frame)
        else:
            assert self.clock is not None, "a replay without per_frame follows its clock"
            now = self.clock()
            wall = 0.0 if self._last is None else min(max(now - self._last, 0.0), MAX_FRAME_S)
            self._last = now
            if self.playing and wall > 0:
                self._move_to(self.t + self.rate * wall)
        ms = (_time.perf_counter() - t0) * 1e3
        return StepTimings(kernel=RECORD.name, steps=0, n=self.n, integrate_ms=ms)

    def _move_to(self, t: float) -> None:
        """Time t while playing: past the end it loops to the start (live, `loop`) or stops at the end."""
        start, end = self.series.start, self.series.end
        if t >= end:
            if self.loop and end > start and self.per_frame is None:
                t = start + (t - end) % (end - start) if t > end else end
            else:
                t = end
                self.playing = False
        self.t = t

    def seek(self, t: float) -> None:
        """Show time t (clamped to the series); playing or not stays as it is."""
        self.t = float(min(max(t, self.series.start), self.series.end))
        self._origin, self._ticks = self.t, 0

    def seek_snapshot(self, i: int) -> None:
        self.seek(float(self.series.times[int(min(max(i, 0), len(self.series) - 1))]))

    def set_playing(self, playing: bool) -> None:
        """Play or pause; playing from the last snapshot starts again at the first."""
        if playing and self.t >= self.series.end:
            self.seek(self.series.start)
        self.playing = bool(playing)
        self._last = None  # the wall time spent paused is not played


def default_rate(series) -> float:
    """Simulation time per wall second: the whole series in PLAY_S seconds, between 1 and 30 snapshots
    per second."""
    span = series.end - series.start
    if span <= 0 or len(series) < 2:
        return 1.0
    per_snapshot = span / (len(series) - 1)
    snapshots_per_s = min(max((len(series) - 1) / PLAY_S, MIN_SNAPSHOTS_PER_S), MAX_SNAPSHOTS_PER_S)
    return per_snapshot * snapshots_per_s
