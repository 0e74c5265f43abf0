"""The viewer's per-frame timings, one record per drawn frame:

- `DrawTimer`: GPU time of a block of GL calls (timer queries, or glFinish + perf_counter): the
  viewer's particle pass and the panel's draw;
- `FrameStats`: what the viewer's last frame cost (`viewer.stats`), the source of each FrameRecord;
- `FrameRecord` / `FrameLog`: one record per drawn frame, kept in a ring, summarised by medians. The
  viewer fills it (`FrameLog.attach(viewer)` hooks the overlay list, which runs once per drawn frame);
  the headless run summary, `run --timings`, the panel's plots and bench read the same records;
- `History`: numpy rings of per-frame numbers against the FrameLog's clock, for the panel's plots and
  its live medians.

Importing this module imports no GL: `DrawTimer` imports PyOpenGL when it is made (in a current GL
context, after gl_setup.configure).
"""

from __future__ import annotations

import logging
import statistics
import time as _time
from collections import deque
from dataclasses import astuple, dataclass, field, fields
from typing import Any

import numpy as np

from app.core.errors import RuntimeFault
from app.engine.timing import StepTimings, rate

log = logging.getLogger(__name__)


# --- GL draws -------------------------------------------------------------------------------------------
class DrawTimer:
    """GPU time of a bracketed block: GL_TIME_ELAPSED queries when available, else glFinish + perf_counter.

    Queries are read back non-blocking from a small ring, so `ms` is one to three frames late.
    """

    RING = 4

    def __init__(self):
        self.method = "glFinish+perf_counter"
        self.ms = 0.0
        self._gl: Any = None  # PyOpenGL's GL module once imported (queries used only when it is)
        self._queries: list[int] = []
        self._pending: list[int] = []
        self._slot = 0
        self._t0 = 0.0
        try:
            from OpenGL import GL

            self._gl = GL
            ver = GL.glGetString(GL.GL_VERSION)
            major, minor = (int(x) for x in ver.split()[0].split(b".")[:2])
            ext_ok = (major, minor) >= (3, 3)
            if not ext_ok:
                n_ext = GL.glGetIntegerv(GL.GL_NUM_EXTENSIONS)
                names = (GL.glGetStringi(GL.GL_EXTENSIONS, i) for i in range(n_ext))
                ext_ok = b"GL_ARB_timer_query" in names
            if ext_ok:
                q = GL.glGenQueries(self.RING)
                self._queries = [int(x) for x in np.atleast_1d(q)]
                self.method = "GL_TIME_ELAPSED"
        except Exception as e:  # no PyOpenGL entry points for this context: fall back
            log.info("GL timer queries unavailable (%s); timing draws with glFinish", e)
            self._queries = []

    def _read(self, q: int, wait: bool) -> bool:
        import ctypes

        GL = self._gl
        if not wait and not GL.glGetQueryObjectuiv(q, GL.GL_QUERY_RESULT_AVAILABLE):
            return False
        ns = ctypes.c_uint64(0)
        GL.glGetQueryObjectui64v(q, GL.GL_QUERY_RESULT, ctypes.byref(ns))
        ms = ns.value * 1e-6
        if ms < 60_000.0:  # some drivers report garbage for a context's very first query
            self.ms = ms
        return True

    def begin(self) -> None:
        if self._queries:
            q = self._queries[self._slot]
            if q in self._pending:
                self._read(q, wait=True)
                self._pending.remove(q)
            self._gl.glBeginQuery(self._gl.GL_TIME_ELAPSED, q)
        else:
            self._finish()
            self._t0 = _time.perf_counter()

    def end(self) -> None:
        if self._queries:
            q = self._queries[self._slot]
            self._gl.glEndQuery(self._gl.GL_TIME_ELAPSED)
            self._pending.append(q)
            self._slot = (self._slot + 1) % len(self._queries)
            for p in list(self._pending):  # oldest first
                if not self._read(p, wait=False):
                    break
                self._pending.remove(p)
        else:
            self._finish()
            self.ms = (_time.perf_counter() - self._t0) * 1e3

    def _finish(self) -> None:
        if self._gl is not None:
            self._gl.glFinish()
        else:  # PyOpenGL could not be imported: vispy's own GL binding
            from vispy.gloo import gl

            gl.glFinish()


# --- frames ---------------------------------------------------------------------------------------------
@dataclass
class FrameStats:
    """What the last frame cost. `draw_timer` says how `draw_ms` was measured."""

    frame: int = 0  # frames drawn so far
    fps: float = 0.0  # smoothed over about a second
    frame_ms: float = 0.0  # wall time between the last two drawn frames
    draw_ms: float = 0.0  # GPU time of the particle pass (splat: the section, its CUDA work too); draw_timer
    draw_timer: str = "none"  # "GL_TIME_ELAPSED" (timer query, a frame or two late) | "glFinish+perf_counter"
    upload_ms: float = 0.0  # host path: host_render_arrays() + VBO upload; 0 with interop
    record_ms: float = 0.0  # live recording: CPU time of this frame's capture (blit, readback, queue)
    # host (perf_counter) time of the frame's advance (queuing the steps, and any wait on the GPU inside
    # them: a tree's reads) and of its particle pass (queuing the draw); the rest of frame_ms is the
    # overlays (the panel), the buffer swap and the event loop
    step_host_ms: float = 0.0
    draw_host_ms: float = 0.0
    step: StepTimings | None = None  # the last backend.step's (None while paused from the start)
    n: int = 0
    kernel: str = ""
    data_path: str = ""
    paused: bool = False
    style: str = ""  # how the last frame's bodies were drawn: sprites | splat
    extra: dict = field(default_factory=dict)


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
    interactions: int = 0  # what the frame's force evaluations did (StepTimings.interactions)
    style: str = ""  # how the bodies were drawn: sprites | splat (render.style; "" in CSVs before it)
    step_host_ms: float = 0.0  # host time of the frame's advance and particle pass (FrameStats says what;
    draw_host_ms: float = 0.0  # 0 in CSVs before session 23)

    @property
    def outside_force_ms(self) -> float:
        """Everything but the force kernel: map/unmap, integrate, draw, upload and Python."""
        return max(self.frame_ms - self.force_ms, 0.0)

    @property
    def interactions_per_s(self) -> float:
        return rate(self.interactions, self.force_ms)


SUMMARY_FIELDS = (
    "frame_ms",
    "force_ms",
    "integrate_ms",
    "map_ms",
    "unmap_ms",
    "draw_ms",
    "upload_ms",
    "outside_force_ms",
    "record_ms",
    "step_host_ms",
    "draw_host_ms",
)


CSV_FIELDS = (*(f.name for f in fields(FrameRecord)), "outside_force_ms")


class FrameLog:
    """The last `capacity` frames' records (the summary, the panel), and optionally every frame's row in
    a CSV file as it is drawn (`stream_csv`: `run --timings`)."""

    def __init__(self, capacity: int | None = 4096):  # None: keep every frame (a CSV read back)
        self.records: deque[FrameRecord] = deque(maxlen=capacity)
        self._t0: float | None = None
        self._csv: tuple[Any, Any] | None = None  # (the StreamedFile, its csv.writer) while streaming
        self.stream_error = ""  # why the streamed CSV stopped (a full disk): the caller reports it

    def stream_csv(self, path) -> FrameLog:
        """Write each frame's record to `path` as it is drawn, one flushed row at a time
        (app.core.outputs.StreamedFile): a long run keeps every frame, not only the last `capacity`, and an
        interrupted one every frame so far. RuntimeFault naming `path` if it cannot be written."""
        import csv

        from app.core.outputs import StreamedFile

        out = StreamedFile(path, "timings")
        writer = csv.writer(out)
        writer.writerow(CSV_FIELDS)
        self._csv = (out, writer)
        return self

    def close(self) -> None:
        """Close the streamed CSV, if any (safe to call twice)."""
        if self._csv is not None:
            self._csv[0].close()
            self._csv = None

    def attach(self, viewer) -> FrameLog:
        viewer.overlays.append(self._on_frame)
        return self

    def _on_frame(self, viewer) -> None:
        now = _time.perf_counter()
        if self._t0 is None:
            self._t0 = now
        s = viewer.stats
        st = s.step
        self.records.append(
            FrameRecord(
                frame=s.frame,
                t=now - self._t0,
                kernel=s.kernel,
                n=s.n,
                steps=getattr(st, "steps", 0) if st is not None and not s.paused else 0,
                frame_ms=s.frame_ms,
                force_ms=getattr(st, "force_ms", 0.0) if st is not None else 0.0,
                integrate_ms=getattr(st, "integrate_ms", 0.0) if st is not None else 0.0,
                map_ms=getattr(st, "map_ms", 0.0) if st is not None else 0.0,
                unmap_ms=getattr(st, "unmap_ms", 0.0) if st is not None else 0.0,
                draw_ms=s.draw_ms,
                upload_ms=s.upload_ms,
                record_ms=getattr(s, "record_ms", 0.0),
                interactions=getattr(st, "interactions", 0) if st is not None and not s.paused else 0,
                style=getattr(s, "style", ""),
                step_host_ms=getattr(s, "step_host_ms", 0.0),
                draw_host_ms=getattr(s, "draw_host_ms", 0.0),
            )
        )
        if self._csv is not None:
            r = self.records[-1]
            try:
                self._csv[1].writerow([*astuple(r), r.outside_force_ms])
            except RuntimeFault as e:  # inside the draw: stop streaming, keep drawing, say it at the end
                self.stream_error = str(e)
                self.close()
                log.warning("%s: no more timings are written", e)

    @classmethod
    def read_csv(cls, path) -> FrameLog:
        """The records of a CSV written by `stream_csv` (`run --timings`), to summarise or compare them;
        RuntimeFault naming the file when it is missing or not such a CSV."""
        import csv

        types = {f.name: str(f.type) for f in fields(FrameRecord)}  # annotations are texts here
        convert = {"str": str, "int": int, "float": float}
        log_ = cls(capacity=None)
        try:
            with open(path, newline="") as f:
                for row in csv.DictReader(f):
                    # a column added later (style) is absent from older CSVs: its default then
                    values = {k: convert[t](row[k]) for k, t in types.items() if k in row}
                    log_.records.append(FrameRecord(**values))
        except (OSError, KeyError, TypeError, ValueError) as e:
            raise RuntimeFault(
                f"{path}: not a per-frame timings CSV of `run --timings` ({type(e).__name__}: {e})"
            ) from e
        return log_

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
        return (
            f"median over {m['frames']} frames: frame {m['frame_ms']:.2f} ms, "
            f"force {m['force_ms']:.2f} ms, "
            f"integrate {m['integrate_ms']:.3f} ms, map+unmap {m['map_ms'] + m['unmap_ms']:.3f} ms, "
            f"draw {m['draw_ms']:.2f} ms, upload {m['upload_ms']:.2f} ms, outside force "
            f"{m['outside_force_ms']:.2f} ms, {m['interactions_per_s'] / 1e9:.1f} G interactions/s"
            + (f", record {m['record_ms']:.2f} ms" if m["record_ms"] > 0 else "")
        )


# --- the panel's rings ------------------------------------------------------------------------------------
class History:
    """Fixed-size numpy rings of per-frame numbers, one per name in `fields`, against a clock (the
    FrameLog's: seconds since it started). Cheap to push at any frame rate; read as the last seconds
    (plots) or the medians of the last frames (live numbers)."""

    def __init__(self, fields: tuple[str, ...], capacity: int = 16384):
        self.capacity = capacity
        self.fields = tuple(fields)
        self.t = np.zeros(capacity)
        self.data = {f: np.zeros(capacity) for f in self.fields}
        self.count = 0  # total pushed

    def push(self, t: float, **values: float) -> None:
        i = self.count % self.capacity
        self.t[i] = t
        for f, arr in self.data.items():
            arr[i] = values.get(f, 0.0)
        self.count += 1

    def _order(self, last: int | None = None) -> np.ndarray:
        """Ring indices of the newest `last` entries (all kept ones when None), oldest first."""
        n = min(self.count, self.capacity)
        if last is not None:
            n = min(n, last)
        end = self.count % self.capacity
        return (np.arange(end - n, end)) % self.capacity

    def window(self, seconds: float, fields=None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """(t, {field: values}) for the entries of the last `seconds`, oldest first."""
        fields = tuple(fields or self.fields)
        idx = self._order()
        if idx.size == 0:
            return np.zeros(0), {f: np.zeros(0) for f in fields}
        t = self.t[idx]
        first = int(np.searchsorted(t, t[-1] - seconds))  # t is increasing
        idx = idx[first:]
        return t[first:], {f: self.data[f][idx] for f in fields}

    def recent_medians(self, frames: int) -> dict[str, float]:
        """The median of each field over the newest `frames` entries (0 before the first push)."""
        idx = self._order(frames)
        if not idx.size:
            return dict.fromkeys(self.fields, 0.0)
        block = np.median(np.stack([self.data[f][idx] for f in self.fields]), axis=1)
        return {f: float(v) for f, v in zip(self.fields, block, strict=True)}
