"""`nbody-live record`: deterministic H.264 videos, PNG sequences and stills of a scene, headless."""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import signal
import sys
from pathlib import Path

from app.commands.assembly import make_backend, scene_from_args
from app.commands.options import (
    add_gpu_options,
    add_kernel_file_options,
    add_scene_options,
    parse_size,
    positive_float,
    positive_int,
    refuse_error_colours,
)
from app.commands.replay import RECORD_HELP as REPLAY_HELP
from app.commands.replay import open_replay, record_backend, record_line, replay_scene
from app.core.errors import ConfigError
from app.core.eta import duration
from app.core.outputs import check_output, check_suffix
from app.model.series import is_series_arg
from app.render.encoder import X264_PRESETS

log = logging.getLogger("nbody-live")

HELP = "render a scene to an H.264 mp4, a PNG sequence or a still: deterministic, headless"
DESCRIPTION = f"""\
Render SCENE offscreen at --size and encode it as H.264 (yuv420p) at --fps. Frames are a pure function
of the scene, the kernel and the frame number: frame i shows the simulation after i x K steps
(--steps-per-frame K; frame 0 is the initial state), seen by the camera path at t = i / fps seconds of
video. Wall time never enters, so a slow machine records the same frames as a fast one, only slower,
and the same command run twice on one machine writes byte-identical files.

Frames are drawn into an offscreen framebuffer (no window needed: EGL on NVIDIA, Mesa without a GPU),
read back through a ring of pixel-buffer objects and encoded by PyAV/libx264 on a worker thread.
Headless, the next frame's steps run on another worker thread while a frame is drawn and read back (a
splat frame's) or read back (the others'), where they touch nothing the frame in flight reads (the
same frames, sooner). The file is written under a hidden temporary name and renamed when finalised;
an unwritable path or a full disk ends with one line, exit status 1 and no file that looks complete.
Ctrl-C or SIGTERM stops after the current frame and finalises a playable file with the frames so far
(exit status 130 / 143; press twice to abandon it instead); one that comes after the last frame, while
the file is finalised, lets it complete with exit status 0. The last line reports frames per wall
second and where the time went (step, draw, readback, encode).

camera paths (--camera, or camera.path in the scene):
  static     the scene's [camera] view (fitted to the bodies when camera.distance is unset)
  orbit      turn around the target at --orbit-speed deg/s (camera.orbit_speed, default 12), at
             --orbit-elevation deg (camera.orbit_elevation, default camera.elevation)
  keys       the scene file's [[camera.keys]] tables
  FILE.toml  a file of [[keys]] tables; each key: t (s), position = [x, y, z], and optionally
             target = [x, y, z] and fov (deg). Positions and targets follow a smooth cubic
             (Catmull-Rom) spline through the keys, the fov eases between them, e.g.
               [[keys]]
               t = 0.0
               position = [0.0, -12.0, 4.0]
               [[keys]]
               t = 4.0
               position = [9.0, -3.0, 2.0]
               target = [0.5, 0.0, 0.0]
               fov = 35.0

{REPLAY_HELP}
examples:
  nbody-live record plummer --seconds 5 --out out/plummer.mp4
  nbody-live record collision --n 65536 --size 1920x1080 --fps 60 --seconds 8 --steps-per-frame 2 \\
      --camera orbit --hud --quality 20 --out docs/collision.mp4          # the GPU demo
  nbody-live record collision --camera flight.toml --frames 240 --out out/flight.mp4
  nbody-live record disk --backend cpu --size 640x360 --frames 60 --frames-dir out/disk_frames
  nbody-live record collision --still 3.5 --camera orbit --out out/collision_3.5s.png
  nbody-live record collision --set 'render.components.galaxy2-*.visible=false' --out out/one.mp4
                                  # components as the scene keys say (docs/components.md); never a panel
  nbody-live record out/collision --seconds 10 --camera orbit --out out/collision.mp4   # a series
"""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "record", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_scene_options(p, series=True)
    add_gpu_options(p)
    g = p.add_argument_group("recording")
    _add_frame_options(g)
    _add_output_options(g)
    add_kernel_file_options(p)
    p.set_defaults(func=main)


def _add_frame_options(g) -> None:
    """What is recorded: the output, the frames' size, rate and number, the camera path, the HUD."""
    g.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="FILE",
        help="the video (.mp4), or with --still the PNG (default out/record.mp4; with --still "
        "out/still.png); the name must end in .mp4, or .png with --still",
    )
    g.add_argument(
        "--size",
        default="1280x720",
        metavar="WxH",
        help="frame size in pixels (default 1280x720; videos round down to even numbers)",
    )
    g.add_argument(
        "--fps",
        type=positive_float,
        default=30.0,
        metavar="F",
        help="frames per second of video (default 30); the camera path runs on t = frame / F",
    )
    length = g.add_mutually_exclusive_group()
    length.add_argument(
        "--seconds",
        type=positive_float,
        metavar="S",
        help="length in seconds of video: round(S x fps) frames (default 5)",
    )
    length.add_argument("--frames", type=positive_int, metavar="N", help="length in frames")
    g.add_argument(
        "--camera",
        metavar="PATH",
        help="static | orbit | keys | FILE.toml of [[keys]] (default: the scene's camera.path, "
        "static unless set)",
    )
    g.add_argument("--orbit-speed", metavar="DEG_S", help="orbit: degrees per second of video (default 12)")
    g.add_argument(
        "--orbit-elevation", metavar="DEG", help="orbit: elevation in degrees (default: the scene camera's)"
    )
    g.add_argument(
        "--hud",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="write scene, kernel, N, simulation time, step and frame in the top-left corner "
        "(default: no HUD)",
    )


def _add_output_options(g) -> None:
    """How it is written: the encoder's settings, a PNG sequence or a still, the readback ring, a window."""
    g.add_argument(
        "--quality",
        type=int,
        default=20,
        metavar="CRF",
        help="x264 constant rate factor, 0 (lossless) to 51; lower is better and bigger (default 20)",
    )
    g.add_argument(
        "--preset",
        default="fast",
        choices=X264_PRESETS,
        help="x264 speed/size trade-off (default fast)",
    )
    g.add_argument(
        "--encoder-threads",
        type=int,
        default=0,
        metavar="N",
        help="x264 threads (default 0 = auto, from the core count). The same command on the "
        "same machine writes byte-identical files; x264's output depends on its thread "
        "count, so fix it (e.g. 8) to compare files across machines",
    )
    g.add_argument(
        "--frames-dir",
        type=Path,
        metavar="DIR",
        help="write DIR/frame_000000.png, ... instead of a video (created if missing)",
    )
    g.add_argument(
        "--still",
        type=_nonneg_float,
        metavar="T",
        help="write one PNG of the frame at T seconds of video (frame round(T x fps)) and exit",
    )
    g.add_argument(
        "--pbo-ring",
        type=positive_int,
        default=3,
        metavar="K",
        help="pixel-buffer objects in the readback ring (default 3: frame i is copied out "
        "while frames i+1 and i+2 are drawn)",
    )
    g.add_argument(
        "--window",
        action="store_true",
        help="record from a visible window (needs a display) and show the frames as they are "
        "recorded; closing the window stops the recording and keeps the frames",
    )
    g.add_argument("--no-progress", action="store_true", help="no progress bar")


def _nonneg_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (v >= 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"{text} must be a number of seconds >= 0")
    return v


def _scene(args, series=None):
    from app.scene import set_value, validate

    scene = scene_from_args(args) if series is None else replay_scene(args, series)
    changed = False
    for flag, key in (
        ("camera", "camera.path"),
        ("orbit_speed", "camera.orbit_speed"),
        ("orbit_elevation", "camera.orbit_elevation"),
    ):
        value = getattr(args, flag, None)
        if value is not None:
            set_value(scene, key, value, f"--{flag.replace('_', '-')}")
            changed = True
    if changed:
        validate(scene)
    refuse_error_colours(scene, "record")
    return scene


@contextlib.contextmanager
def _viewer(scene, size, window: bool, backend=None):
    """A Viewer (headless EGL, or a visible window) on `backend` (default: the scene's); both closed on
    exit."""
    from app.render.gl_setup import configure, display_problem

    no_display = display_problem() if window else None
    if no_display:
        raise ConfigError(f"--window needs a display ({no_display}); leave it out to record headless")
    configure(headless=not window)
    from app.render.canvas import open_viewer

    backend = backend or make_backend(scene)
    viewer = None
    try:
        viewer = open_viewer(scene, backend, size, headless=not window, show=window)
        yield viewer
    finally:
        if viewer is not None:
            with contextlib.suppress(Exception):
                viewer.close()
        backend.close()


def _default_out(name: str) -> Path:
    """The default output under out/, whose folder is created (a path the user gives is not)."""
    path = Path(name)
    with contextlib.suppress(OSError):  # an unwritable place is reported by the recorder, in one line
        path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _interrupt_name(interrupted) -> str:
    return "the window was closed" if interrupted == "window" else signal.Signals(interrupted).name


def _per_frame(scene) -> str:
    """What a frame advances: steps, or parts of a block step's max step (run.frames_per_step)."""
    spf, per_step = scene.run.steps_per_frame, scene.run.frames_per_step
    if per_step > 1:
        return f"{spf}/{per_step} of a max step per frame"
    return f"{spf} steps per frame"


def _frame_advance(scene, index: int) -> str:
    """Where frame `index` of a simulated recording stands (as render.recorder.frame_info counts it; a
    frames_per_step over 1 is refused unless the backend draws inside steps)."""
    from app.render.recorder import frame_parts

    parts, per_step = frame_parts(scene.run, index)
    if per_step > 1:
        whole, part = divmod(parts, per_step)
        return f"t = {parts / per_step * scene.physics.dt:g}, max step {whole} + {part}/{per_step}"
    return f"step {parts}"


def main(args) -> int:
    size = parse_size(args.size)
    _check_options(args)
    series = open_replay(args) if is_series_arg(args.scene) else None  # a replay: no forces
    scene = _scene(args, series)
    fps = float(args.fps)
    frames = args.frames or max(1, round((args.seconds or 5.0) * fps))
    _say_the_horizon(
        round(args.still * fps) if args.still is not None else frames, fps, args.still is not None
    )
    replay = (lambda: record_backend(series, frames)) if series is not None else lambda: None
    progress = not args.no_progress and sys.stderr.isatty()
    if args.still is not None:
        return _still(args, scene, size, fps, frames, series, replay, progress)
    return _video(args, scene, size, fps, frames, series, replay, progress)


HORIZON_FRAMES = 108_000  # an hour of video at 30 fps: past it, say what is asked before the setup


def _say_the_horizon(frames: int, fps: float, still: bool) -> None:
    """Before any setup: a length past HORIZON_FRAMES in words (a --still 1e9 is 3e10 frames to step
    through), so that the wait is expected; how long follows once the rate is known (app.core.eta)."""
    if frames <= HORIZON_FRAMES:
        return
    length = f"{frames:,} frames ({duration(frames / fps)} of video at {fps:g} fps)"
    what = (
        f"the still is the last of {length}: each is stepped here first"
        if still
        else f"the video is {length}: each is stepped and drawn here"
    )
    log.info("%s; how long that takes is said once the first frames are timed; Ctrl-C stops", what)


def _check_options(args) -> None:
    """The encoder's settings in range, and --still alone of the lengths and outputs of a sequence."""
    if not 0 <= args.quality <= 51:
        raise ConfigError(f"--quality {args.quality}: the x264 CRF must be in [0, 51]")
    if args.encoder_threads < 0:
        raise ConfigError(f"--encoder-threads {args.encoder_threads}: must be >= 0 (0 = auto)")
    if args.still is not None and (args.frames_dir or args.frames or args.seconds):
        raise ConfigError("--still T writes one PNG: leave out --frames, --seconds and --frames-dir")


def _still(args, scene, size, fps: float, frames: int, series, replay, progress: bool) -> int:
    """--still T: one PNG of the frame at T seconds of video (`frames` and `series`: what a replay's line
    says of it)."""
    from app.render import camera_path
    from app.render.recorder import InterruptGuard, exit_status, render_still

    check_suffix(args.out, (".png",), "still", "--out")  # an .mp4 name wants a video: no --still
    out = args.out or _default_out("out/still.png")
    out = check_output(out.expanduser().resolve(), "still")  # fail fast, before any setup
    with InterruptGuard() as guard, _viewer(scene, size, args.window, replay()) as viewer:
        path = camera_path.make_path(scene.camera, viewer.camera)
        res = render_still(viewer, out, args.still, fps, path, hud=args.hud, progress=progress, guard=guard)
    if res.interrupted is not None:
        print(
            f"interrupted ({_interrupt_name(res.interrupted)}) before the still was drawn; "
            f"{out} was not written"
        )
        return exit_status(res.interrupted)
    index = round(args.still * fps)
    where = _frame_advance(scene, index) if series is None else f"of {frames}: {record_line(series, frames)}"
    print(f"wrote {out} ({res.size[0]}x{res.size[1]}, t = {args.still:g} s = frame {index}, {where})")
    return 0


def _video(args, scene, size, fps: float, frames: int, series, replay, progress: bool) -> int:
    """`frames` frames into an H.264 video, or a PNG sequence with --frames-dir; the sink is started (its
    target checked) before the backend and GL start, and aborted if the recording fails."""
    from app.render import camera_path
    from app.render.recorder import (
        InterruptGuard,
        PngSequence,
        Recorder,
        even_size,
        exit_status,
        record_scene,
    )

    sink: PngSequence | Recorder
    if args.frames_dir:
        sink = PngSequence(size, fps, hud=args.hud, ring=args.pbo_ring)
        target = args.frames_dir
        what = f"{args.frames_dir}/frame_*.png"
    else:
        size = even_size(size)
        sink = Recorder(
            size,
            fps,
            crf=args.quality,
            preset=args.preset,
            threads=args.encoder_threads,
            hud=args.hud,
            ring=args.pbo_ring,
        )
        check_suffix(args.out, (".mp4",), "video (H.264 in MP4)", "--out")  # a PNG wants --still
        target = args.out or _default_out("out/record.mp4")
        what = str(target)
    sink.start(target)  # fail fast on an unwritable target, before the backend and GL start
    try:
        with InterruptGuard() as guard, _viewer(scene, size, args.window, replay()) as viewer:
            backend = viewer.backend
            path = camera_path.make_path(scene.camera, viewer.camera)
            advance = _per_frame(scene) if series is None else record_line(series, frames)
            print(
                f"recording {what}: {frames:,} frames {size[0]}x{size[1]} at {fps:g} fps, "
                f"{advance}, {path.describe()}, "
                f"{viewer.stats.kernel or backend.kernel} N={backend.n:,} ({backend.data_path})",
                flush=True,
            )
            res = record_scene(
                viewer, sink, target, frames, camera=path, progress=progress, guard=guard, window=args.window
            )
    except BaseException:
        sink.abort()
        raise
    _report(res, frames, fps)
    return exit_status(res.interrupted)


def _report(res, frames: int, fps: float) -> None:
    """The recording's last lines: what an interruption kept, or what was written; then its timings."""
    if res.interrupted is not None:
        if res.frames == 0:
            print(
                f"interrupted ({_interrupt_name(res.interrupted)}) before the first frame; nothing "
                "was written"
            )
        else:
            print(
                f"interrupted ({_interrupt_name(res.interrupted)}): kept {res.frames:,} of {frames:,} "
                f"frames in {res.path}"
            )
    else:
        print(f"wrote {res.path} ({res.frames} frames at {fps:g} fps, {res.frames / fps:.2f} s)")
    if res.frames:
        print("recorded " + res.summary_line(), flush=True)


def record_demo(
    scene,
    out: Path,
    still: Path,
    size=(1280, 720),
    frames: int = 150,
    fps: int = 30,
    progress: bool = True,
    backend=None,
) -> int:
    """The `run` command's no-display fallback: a short video of the scene (on `backend`, default the
    scene's) plus a PNG of its last frame."""
    from app.render import camera_path
    from app.render.recorder import Recorder, even_size, exit_status, record_scene

    size = even_size(size)
    for p in (Path(out), Path(still)):  # our default out/ folder: create it
        with contextlib.suppress(OSError):
            p.parent.mkdir(parents=True, exist_ok=True)
    rec = Recorder(size, fps)
    check_output(Path(still).expanduser().resolve(), "still")
    rec.start(out)
    try:
        with _viewer(scene, size, window=False, backend=backend) as viewer:
            path = camera_path.make_path(scene.camera, viewer.camera)
            res = record_scene(
                viewer, rec, out, frames, camera=path, progress=progress and sys.stderr.isatty()
            )
    except BaseException:
        rec.abort()
        raise
    if res.frames == 0:
        print(f"interrupted before the first frame; {out} was not written")
        return exit_status(res.interrupted)
    from app.render.encoder import write_png

    assert rec.last_frame is not None  # set by the frames recorded
    write_png(rec.last_frame, Path(still), what="still")
    print(f"wrote {out} ({res.frames} frames at {fps} fps) and {still}")
    return exit_status(res.interrupted)
