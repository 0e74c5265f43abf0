"""A still: frame round(T * fps) of the headless `record` sequence (app.render.recorder.record_scene: the
same steps, camera and HUD) rendered to a PNG.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import numpy as np

from app.core.errors import ConfigError
from app.core.eta import Eta
from app.core.outputs import check_output
from app.render.encoder import write_png
from app.render.frame_schedule import frame_info
from app.render.interrupts import InterruptGuard
from app.render.record_sinks import RecordResult


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
            eta = Eta(
                index,
                "frame",
                lead=f"the still is frame {index:,}: ",
                stops="Ctrl-C stops (no file is written), or ask for an earlier time",
            )
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
                eta.update(done + 1)
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
