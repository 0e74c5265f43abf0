"""The numbers the panel's plots and tables read, kept frame by frame for the Controller
(app.ui.controller): the history rings (HISTORY_FIELDS), the kernel and N switches marked on them, per
(kernel, N) FrameLogs and their medians, and the live numbers (the medians of the last LIVE_WINDOW frames:
rates, the force split per stage, block steps' active fraction, several devices' force and exchange
times).

`LiveStats` is a mixin of the Controller: `_init_live_stats()` makes the rings, `_ingest(record, step)`
takes one frame's record, the rest answer the panel.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from app.engine.forces import STAGES
from app.engine.timing import FLOPS_PER_INTERACTION, StepTimings
from app.render.frames import FrameLog, FrameRecord, History

if TYPE_CHECKING:
    from app.render.canvas import Viewer

HISTORY_S = 10.0  # what the history plots show
HISTORY_CAP = 16384  # frames kept in the rings (10 s at up to ~1600 FPS)
PER_KERNEL_CAP = 8192  # frames kept per (kernel, N) for the median table
MEDIAN_EVERY_S = 1.0  # how often the median table is recomputed while it is on screen
LIVE_WINDOW = 15  # frames the live numbers are the median of
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


class LiveStats:
    """Needs `self.viewer`, `self.backend` and the frame's own costs the Controller keeps (`panel_ms`,
    `energy_ms`, `probe_ms`); `_skip_frames` is where it marks frames whose time is not the run's."""

    viewer: Viewer  # set by the class it is mixed into
    backend: Any
    panel_ms: float
    energy_ms: float
    probe_ms: float

    def _init_live_stats(self) -> None:
        self.history = History(HISTORY_FIELDS, HISTORY_CAP)
        self.markers: list[Marker] = []
        self.per_kernel: dict[tuple[str, int], FrameLog] = {}
        self.medians: dict[tuple[str, int], dict] = {}
        self._stale: set[tuple[str, int]] = set()
        self._medians_t = 0.0
        self._stages: deque[dict[str, float]] = deque(maxlen=LIVE_WINDOW)  # force split of the last frames
        self._active: deque[float] = deque(maxlen=LIVE_WINDOW)  # block steps: active fraction per frame
        # several devices (--gpus): each device's force ms and the exchange ms of the last frames
        self._devices: deque[tuple[dict[str, float], float]] = deque(maxlen=LIVE_WINDOW)
        self._live: dict | None = None
        self._live_t = 0.0
        self._live_count = -1
        self._last_frame: int | None = None
        self._last_kernel: str | None = None
        self._last_n: int | None = None
        self._skip_frames: set[int] = set()  # frames whose time includes a benchmark run

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
