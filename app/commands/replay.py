"""The replay side of `run` and `record`: SCENE names a snapshot series (a folder or a glob), whose
positions a ReplayBackend feeds the viewer (app.model.series, app.backends.replay). No forces are computed."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from app.commands.options import SHORTCUTS
from app.core.errors import ConfigError

log = logging.getLogger("nbody-live")

# scene flags that make a simulation: a replay's bodies and times come from its snapshots
REPLAY_SECTIONS = ("render", "camera", "scene")
# every scene-override flag that makes a simulation (initial.*, physics.*, run.*): refused for a replay
SIMULATION_FLAGS = tuple(
    attr for attr, key in SHORTCUTS.items() if key.split(".", 1)[0] not in REPLAY_SECTIONS
)

RUN_HELP = """\
Replays: when SCENE is a snapshot series (a folder, e.g. one written by `simulate --snapshot-every K
--out-dir DIR`, or a quoted glob such as 'out/run1/snap_*.npz'), run opens it as a replay. No forces are
computed: a panel with a time slider, play/pause and snapshot steps moves through the series, and every
drawn frame shows the positions interpolated linearly in time between the two snapshots around it
(default speed: the whole series in 10 s, at 1 to 30 snapshots per second; the panel sets it). The
panel also lists the series' components (colour, show/hide, brightness; --set render.components.NAME.*).
Keys: Space play/pause, Left/Right previous/next snapshot (pausing), Home or R the first, End the last,
V record, Tab, Escape. Every file is read and checked before the window opens (readable, the same N as the
first); only --set render.* / camera.* keys apply.
"""

RECORD_HELP = """\
Replays: when SCENE is a snapshot series (a folder written by `simulate --snapshot-every K --out-dir
DIR`, or a quoted glob), the clip spans the series once: frame 0 shows its first snapshot, the last frame
its last, and frame i the time t_first + i / (F - 1) x (t_last - t_first), positions interpolated
linearly between the snapshots around it. F, the number of frames, is what the options say, as for a
scene: --frames N, else round(--seconds S x --fps) (default 5 s: 150 frames at 30 fps); so --frames 101
on a series of 101 snapshots shows each snapshot once. No forces are computed; only --set render.* /
camera.* keys and the camera options apply.
"""


def check_replay_args(args: argparse.Namespace) -> None:
    """ConfigError for a flag that makes a simulation: a replay's bodies come from its snapshots."""
    for attr in SIMULATION_FLAGS:
        if getattr(args, attr, None) is not None:
            flag = "--" + attr.replace("_", "-")
            raise ConfigError(
                f"{flag} does not apply to a replay of {args.scene}: its bodies and times come "
                "from the snapshots (run `nbody-live simulate` again to change them)"
            )
    from app.model.typed_text import parse_assignment

    for text in getattr(args, "assignments", []):
        key, _ = parse_assignment(text)
        if key.split(".", 1)[0] not in REPLAY_SECTIONS:
            raise ConfigError(
                f"--set {key}: a replay takes only render.*, camera.* and scene.* keys; its "
                "bodies and physics come from the snapshots"
            )


def open_replay(args: argparse.Namespace):
    """The checked Series of SCENE (InputFileError naming a bad file), with a progress bar on a terminal."""
    from app.commands.running import progress_bar
    from app.model.series import open_series, series_paths

    check_replay_args(args)
    total = len(series_paths(args.scene)[0])
    with progress_bar(args, total=total, unit="snapshot", desc="reading the series", leave=False) as bar:
        series = open_series(args.scene, format=getattr(args, "format", None), progress=bar.update)
    log.info("replay of %s", series.describe())
    return series


def replay_scene(args: argparse.Namespace, series):
    """The default scene named after the series, with the --set render / camera keys."""
    from app.model.typed_text import parse_assignment
    from app.scene import load_scene

    overrides: dict[str, object] = dict(parse_assignment(text) for text in getattr(args, "assignments", []))
    scene = load_scene(None, overrides)
    if "scene.name" not in overrides:
        scene.name = series.name
    return scene


def record_backend(series, frames: int):
    """A ReplayBackend that advances 1 / (frames - 1) of the series per frame, with no clock."""
    from app.backends.replay import ReplayBackend

    span = series.end - series.start
    backend = ReplayBackend(series, clock=None, per_frame=span / (frames - 1) if frames > 1 else 0.0)
    backend.loop = False
    return backend


def record_line(series, frames: int) -> str:
    """What a frame of `record DIR` shows, for its first line."""
    dt = (series.end - series.start) / (frames - 1) if frames > 1 else 0.0
    return f"replay of {len(series)} snapshots, t = {series.start:g} .. {series.end:g} ({dt:.4g} per frame)"


def run_replay(args: argparse.Namespace, scene, series, size, headless: bool) -> int:
    """`run DIR` once the outputs and the display are settled: the viewer on a ReplayBackend with the
    replay panel (app.ui.replay)."""
    from app.backends.replay import ReplayBackend
    from app.commands.running import report_viewer_outputs
    from app.render.canvas import open_viewer
    from app.render.frames import FrameLog
    from app.render.recorder import InterruptGuard, exit_status
    from app.ui.replay import ReplayPanel

    backend = ReplayBackend(series)
    viewer = panel = frame_log = None
    try:
        viewer = open_viewer(scene, backend, size, headless)
        frame_log = FrameLog().attach(viewer)
        if args.timings:
            frame_log.stream_csv(args.timings)
        panel = ReplayPanel(viewer, visible=args.panel)
        recorder = panel.controller.view_recorder
        recorder.directory, recorder.fps = args.record_to or Path("out"), args.record_fps
        viewer.screenshot_on_exit = args.screenshot
        viewer.screenshot_overlays = True
        quit_ = "quitting and finalising any recording"
        with InterruptGuard(lambda _: viewer.request_quit(), quit_) as guard:
            viewer.run(frames=args.frames)
        print(
            f"drew {viewer.stats.frame} frames of the replay of {series.describe()}; t = {backend.t:.6g} "
            "at the end"
        )
        report_viewer_outputs(args, viewer, frame_log, recorder)
    finally:
        if frame_log is not None:
            frame_log.close()
        if panel is not None:
            panel.close()
        backend.close()
    return exit_status(guard.signum)
