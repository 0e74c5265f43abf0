"""Where frame i of a recording stands: the steps (or, for block steps drawn inside a max step, the parts of
a step) and the simulated time after i * steps_per_frame steps, as the FrameInfo its HUD shows. The
headless `record` loop (app.render.recorder.record_scene), `render_still` and the `record` command count
frames with it.
"""

from __future__ import annotations

from app.render.encoder import FrameInfo


def frame_parts(run, index: int, draws_within_steps: bool = True) -> tuple[int, int]:
    """(parts, per_step): frame `index` of a simulated run stands `parts` 1/per_step-ths of a step from the
    start (steps_per_frame parts a frame; per_step is run.frames_per_step where the backend draws inside
    steps, block steps: canvas.advance, else 1)."""
    per_step = max(int(run.frames_per_step), 1) if draws_within_steps else 1
    return index * max(int(run.steps_per_frame), 1), per_step


def frame_info(viewer, index: int, fps: float) -> FrameInfo:
    if viewer.backend.replays:  # a series replay: its own time, no steps
        return FrameInfo(
            index=index,
            t=index / fps,
            scene=viewer.scene.name,
            kernel=viewer.backend.kernel,
            n=int(viewer.backend.n),
            steps=None,
            sim_time=viewer.backend.time,
        )
    parts, per_step = frame_parts(viewer.scene.run, index, viewer.backend.draws_within_steps)
    return FrameInfo(
        index=index,
        t=index / fps,
        scene=viewer.scene.name,
        kernel=viewer.stats.kernel or viewer.backend.kernel,
        n=int(viewer.backend.n),
        steps=parts // per_step,
        sim_time=parts / per_step * float(viewer.scene.physics.dt),
    )
