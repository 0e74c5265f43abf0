"""Per-frame timings: one record per drawn frame, kept in a ring, summarised by medians.

The viewer fills it (`FrameLog.attach(viewer)` hooks the overlay list, which runs once per drawn
frame); the headless run summary and the panel's plots read the same records.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class FrameRecord:
    frame: int
    t: float  # seconds since the log started (wall clock)
    kernel: str
    n: int
    steps: int
    frame_ms: float  # wall time between this frame and the previous one
    force_ms: float  # device (CUDA events) or host (perf_counter) time of the force kernel(s)
    integrate_ms: float
    map_ms: float
    unmap_ms: float
    draw_ms: float
    upload_ms: float  # host path only: read back + VBO upload
    record_ms: float = 0.0  # live recording: CPU time of the frame's capture (0 when not recording)

    @property
    def outside_force_ms(self) -> float:
        """Everything but the force kernel: map/unmap, integrate, draw, upload and Python."""
        return max(self.frame_ms - self.force_ms, 0.0)

    @property
    def interactions_per_s(self) -> float:
        return self.steps * self.n * self.n / (self.force_ms * 1e-3) if self.force_ms > 0 else 0.0


SUMMARY_FIELDS = ("frame_ms", "force_ms", "integrate_ms", "map_ms", "unmap_ms", "draw_ms", "upload_ms",
                  "outside_force_ms", "record_ms")


class FrameLog:
    def __init__(self, capacity: int = 4096):
        self.records: deque[FrameRecord] = deque(maxlen=capacity)
        self._t0: float | None = None

    def attach(self, viewer) -> FrameLog:
        viewer.overlays.append(self._on_frame)
        return self

    def _on_frame(self, viewer) -> None:
        import time

        now = time.perf_counter()
        if self._t0 is None:
            self._t0 = now
        s = viewer.stats
        st = s.step
        self.records.append(FrameRecord(
            frame=s.frame, t=now - self._t0, kernel=s.kernel, n=s.n,
            steps=getattr(st, "steps", 0) if st is not None and not s.paused else 0,
            frame_ms=s.frame_ms, force_ms=getattr(st, "force_ms", 0.0) if st is not None else 0.0,
            integrate_ms=getattr(st, "integrate_ms", 0.0) if st is not None else 0.0,
            map_ms=getattr(st, "map_ms", 0.0) if st is not None else 0.0,
            unmap_ms=getattr(st, "unmap_ms", 0.0) if st is not None else 0.0,
            draw_ms=s.draw_ms, upload_ms=s.upload_ms, record_ms=getattr(s, "record_ms", 0.0)))

    def medians(self, skip: int = 5) -> dict[str, float]:
        """Median of each field over the frames after the first `skip` (warm-up: compiles, first maps)."""
        rows = list(self.records)[skip:] or list(self.records)
        if not rows:
            return {}
        out = {f: statistics.median(getattr(r, f) for r in rows) for f in SUMMARY_FIELDS}
        out["interactions_per_s"] = statistics.median(r.interactions_per_s for r in rows)
        out["frames"] = len(rows)
        return out

    def summary_line(self, skip: int = 5) -> str:
        m = self.medians(skip)
        if not m:
            return "no frames drawn"
        return (f"median over {m['frames']} frames: frame {m['frame_ms']:.2f} ms, "
                f"force {m['force_ms']:.2f} ms, "
                f"integrate {m['integrate_ms']:.3f} ms, map+unmap {m['map_ms'] + m['unmap_ms']:.3f} ms, "
                f"draw {m['draw_ms']:.2f} ms, upload {m['upload_ms']:.2f} ms, outside force "
                f"{m['outside_force_ms']:.2f} ms, {m['interactions_per_s'] / 1e9:.1f} G interactions/s"
                + (f", record {m['record_ms']:.2f} ms" if m["record_ms"] > 0 else ""))

    def write_csv(self, path) -> None:
        import csv

        with open(path, "w", newline="") as f:
            rows = [asdict(r) | {"outside_force_ms": r.outside_force_ms} for r in self.records]
            if rows:
                w = csv.DictWriter(f, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows(rows)
