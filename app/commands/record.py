"""`nbody-live record`: a deterministic H.264 video (and a PNG still) of a scene, headless."""

from __future__ import annotations

import argparse
from pathlib import Path

from app.commands.common import add_scene_options, make_backend, parse_size, positive_int, scene_from_args

HELP = "render a scene to an H.264 mp4 and a PNG still, headless and deterministic"
DESCRIPTION = """\
Render --frames frames of SCENE offscreen (EGL; no window needed) at --size, advancing exactly
run.steps_per_frame steps per frame whatever the wall time, and encode them as H.264 (yuv420p) at
--fps. The last frame is also written as a PNG (--still). The video is written under a temporary
name and renamed only when complete.

examples:
  nbody-live record plummer --frames 300 --out out/plummer.mp4
  nbody-live record collision --n 32768 --steps-per-frame 4 --size 1920x1080 --fps 60 --out out/c.mp4
"""


def add_parser(sub) -> None:
    p = sub.add_parser("record", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_scene_options(p)
    p.add_argument("--out", type=Path, default=Path("out/record.mp4"), metavar="FILE.mp4",
                   help="video file (default out/record.mp4)")
    p.add_argument("--frames", type=positive_int, default=150, metavar="N", help="frames (default 150)")
    p.add_argument("--fps", type=positive_int, default=30, metavar="F", help="frame rate (default 30)")
    p.add_argument("--size", default="1280x720", metavar="WxH", help="frame size (default 1280x720)")
    p.add_argument("--still", type=Path, metavar="FILE.png",
                   help="PNG of the last frame (default: the video's name with .png)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=main)


def record_demo(scene, out: Path, still: Path, size=(1280, 720), frames: int = 150, fps: int = 30,
                progress: bool = True) -> int:
    from app.render.gl_setup import configure

    configure(headless=True)
    from app.render.canvas import Viewer
    from app.render.recorder import record

    backend = make_backend(scene)
    try:
        viewer = Viewer(scene, backend, size=size, headless=True)
        record(viewer, out, frames, fps=fps, still_path=still, progress=progress)
    finally:
        backend.close()
    print(f"wrote {out} ({frames} frames at {fps} fps) and {still}")
    return 0


def main(args) -> int:
    size = parse_size(args.size)
    scene = scene_from_args(args)
    still = args.still or args.out.with_suffix(".png")
    return record_demo(scene, args.out, still, size=size, frames=args.frames, fps=args.fps,
                       progress=not args.no_progress)
