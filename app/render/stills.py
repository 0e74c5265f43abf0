"""A still: frame round(T * fps) of the headless `record` sequence (app.render.recorder.record_scene: the
same steps, camera and HUD) rendered to a PNG.
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

import numpy as np

from app.core.errors import ConfigError
from app.core.outputs import check_output
from app.render.encoder import write_png
from app.render.frame_schedule import frame_info
from app.render.interrupts import InterruptGuard
from app.render.record_sinks import RecordResult

ETA_AFTER_S = 2.0  # advance this long before estimating the rest
ETA_WORTH_SAYING_S = 60.0  # say the estimate when the rest takes longer than this


def eta_line(done: int, total: int, elapsed: float) -> str | None:
    """Once `elapsed` passes ETA_AFTER_S: a line with the time the remaining frames will take at the rate
    so far, when that is over a minute (a --still far in the future, e.g. 1e9 s), else None."""
    if elapsed < ETA_AFTER_S or done <= 0 or done >= total:
        return None
    rest = (total - done) * elapsed / done
    if rest < ETA_WORTH_SAYING_S:
        return None
    return (
        f"the still is frame {total:,}: {total - done:,} frames to advance at {done / elapsed:,.1f} frames/s "
        f"takes about {_duration(rest)} more; Ctrl-C stops (no file is written), or ask for an earlier time"
    )


def _duration(seconds: float) -> str:
    for unit, size in (("years", 365.25 * 86400), ("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:,.1f} {unit}"
    return f"{seconds:.0f} s"


def render_still(
    viewer,
    path,
    t: float,
    fps: float,
    camera=None,
    hud: bool = False,
    progress: bool = True,
    guard: InterruptGuard | None = None,
) -> RecordResult:
    """Frame round(t * fps) of the `record_scene` sequence (same steps, camera, HUD) as a PNG at `path`."""
    from tqdm import tqdm

    from app.render.encoder import Hud
    from app.render.readback import PboCapture

    if not (t >= 0 and np.isfinite(t)):
        raise ConfigError(f"--still {t}: the time must be a number of seconds >= 0")
    path = check_output(Path(path).expanduser().resolve(), "still")  # before the minutes of stepping
    index = int(round(float(t) * fps))
    capture = None
    own_guard = guard is None
    guard = guard or InterruptGuard()
    try:
        with guard if own_guard else contextlib.nullcontext():
            t0 = time.perf_counter()
            told = False
            for done in tqdm(
                range(index),
                desc=f"advancing to frame {index}",
                unit="frame",
                leave=False,
                disable=not progress or index == 0,
            ):
                if guard.stop:
                    r = RecordResult(None, None, 0, viewer.physical_size, time.perf_counter() - t0)
                    r.interrupted = guard.signum
                    return r
                viewer.advance()
                if not told and (line := eta_line(done + 1, index, time.perf_counter() - t0)):
                    told = True
                    print(line, file=sys.stderr, flush=True)
            if camera is not None:
                camera.apply(viewer.camera, index / fps)
            w, h = viewer.physical_size
            capture = PboCapture(viewer, (int(w), int(h)), depth=1)
            info = frame_info(viewer, index, fps)
            [(img, _)] = capture.capture(lambda size: viewer.draw_scene(size, overlays=False), info)
            if hud:
                Hud(img.shape[0]).draw(img, info.hud_lines())
            write_png(img, path, what="still")
            size = capture.size
    finally:
        if capture is not None:
            capture.close()
    return RecordResult(path, path, 1, size, time.perf_counter() - t0)
