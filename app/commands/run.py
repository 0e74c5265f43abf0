"""`nbody-live run`: the interactive viewer (a window; headless EGL; or a demo video with no display)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from app.commands import replay
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
from app.commands.running import report_viewer_outputs
from app.core.errors import ConfigError
from app.core.outputs import check_folder, check_outputs, check_suffix
from app.model.series import is_series_arg

log = logging.getLogger("nbody-live")
DEMO_FRAMES = 150  # the no-display demo's length

HELP = "open the viewer on a scene (with no display: record a short demo to out/ instead)"
KEYS = """\
keys and mouse in the viewer (the panel takes the mouse and keys while it uses them):
  left drag          orbit the camera (it keeps turning a little after release)
  right/shift drag   pan
  wheel              zoom
  space              pause / resume the simulation
  [ and ]            previous / next available kernel (takes effect on the next step)
  R                  reset the simulation to the scene's initial bodies (and the camera)
  C                  reset the camera to the scene's view
  F                  fit the camera to the bodies drawn, in the part of the window the panel leaves free
  V                  start / stop recording the view to DIR/recording-<time>.mp4 (--record-to, default out/)
  S                  save the current state to DIR/snapshot-<time>.npz (float64, original order)
  Tab                hide / show the control panel (hidden: the scene is centred on the whole window)
  Escape             quit (closing the window quits too); with a panel popup open or a field
                     being edited, the first Escape closes the popup or leaves the field
"""
DESCRIPTION = f"""\
Run SCENE live: every frame advances the simulation by run.steps_per_frame steps on the chosen
backend and draws the bodies as additive point sprites (size by mass, colour by speed). The window
title shows FPS, kernel, N and how positions reach the screen (CUDA-GL interop or host upload).

The ImGui control panel (shown unless --no-panel; Tab hides it) switches kernels mid-run (every
registry kernel, unavailable ones greyed with the reason) and sets the current kernel's tunables (a
combo for a set of values, a slider for a range such as cpu-tree's theta; Ctrl+click types a value, and
one out of range turns red; --tunable NAME=VALUE sets them at start), shows live frame and kernel
timings (for a tree also the time per stage and its live force error: median and 99th-percentile
relative error of 1,024 random bodies against an all-pairs sum, every second, and the interactions per
body), history plots with a marker at each switch, per-kernel medians, energy/momentum drift, and edits N,
dt, softening, G, integrator, force model, steps per frame and the view; "Benchmark all kernels" runs
each available kernel on a copy of the current state; "Screenshot" writes out/screenshot-<time>.png.
While the panel shows, the scene is centred in the part of the window it leaves free.

Components (Tipsy's gas / dark / star or Bonsai's disk / bulge / halo, the disk and collision
generators' bulges, disks and halos, a scene's [[components]] row ranges) are listed in the panel's View tab,
each with a colour swatch, a show/hide checkbox and a brightness slider; the same from the command line:
--set render.components.halo.visible=false, --set render.components.NAME.brightness=0.3,
--set render.color_by=component. Hidden bodies still feel and exert gravity. (docs/components.md)

Draw styles (View tab, --set render.style=sprites|splat|auto): splat adds each body's light into an integer
frame on the GPU and tone-maps it (no burn-out at large N; --set render.exposure=X, 0 automatic;
render.tone_map=exp|aces; render.bloom=S, a glow around the brightest parts, 0 off); auto, the
default, draws splat from render.splat_from bodies on CUDA with GL interop, sprites otherwise. Without
a GPU an explicit splat is drawn by its CPU twin. (docs/rendering.md)

The Compare tab (or --compare KERNEL at start) times a second kernel B of the same backend at the state
of every frame, into a scratch copy of the accelerations (the shown state is never touched): A's and B's
force times, B / A, and the median and 99th percentile of |a_A - a_B| / |a_B| over 1,024 sampled bodies;
the run's last lines repeat them. Its "colour by force error" colours each body by its relative force error
against the exact float64 sum (recomputed at most every second, in pieces of one frame each) or against B,
on a log scale from 1e-7 to 1e-1 shown as a legend (--set render.color_by=error or error-ab the same).

"Record" (or V) records what the viewer draws (the particles, not the panel) at the window size into
out/recording-<time>.mp4 (--record-to DIR): H.264 at --record-fps (60) sampled by wall time (real speed),
the `record` command's quality settings. The view keeps its frame rate: the frame is copied on the GPU
and read back asynchronously, and frames the encoder cannot take are dropped (counted) rather than
waited for. A red dot, the elapsed time, frames and drops show in the panel and the window title; V
again or quitting finalises the file (written under a hidden temporary name, renamed when complete).
Ctrl-C or SIGTERM quits as Escape does, finalising a recording, with exit status 130 / 143 (twice:
at once, abandoning it).

Kernel files (--kernel-file, --kernel-dir) are watched while the viewer runs on one GPU: a save is
compiled (the one form the run launches, by NVRTC where cuda-core is installed, else nvcc), tried in a
sandbox process on a copy of the state (a launch that does not end within its bound, a write past the
accelerations or a NaN anywhere refuses it), validated against float64 on 1,024 sampled bodies within
the kernel's budget, and only then swapped in at the next step, the state untouched. The Kernel tab
lists each reload with its compile, validate and swap times and the compiler's or the validation's
message; the old build keeps running until a good one arrives (docs/writing-kernels.md).

With no display ($DISPLAY and $WAYLAND_DISPLAY unset, or naming a display that does not answer, as a
stale $DISPLAY over SSH or in a container) and no --headless/--frames, it records a short demo to
out/demo.mp4 and out/demo.png instead of failing, and prints their paths; with --frames it renders
headless (EGL). A log line says which display was missing.

{replay.RUN_HELP}
{KEYS}
examples:
  nbody-live run                                   # Plummer sphere, best backend found
  nbody-live run collision --n 65536 --kernel shared
  nbody-live run ../shared/data/bonsai_model3_child_compact.tipsy --softening 0.05
  nbody-live run ../shared/data/bonsai_model3_child_compact.tipsy --set render.components.halo.visible=false
  nbody-live run plummer --frames 300 --headless   # no window: EGL, prints per-frame timings
  nbody-live run --frames 400 --headless --panel-cost   # frame time with the panel shown vs hidden
  nbody-live run --frames 400 --headless --record-cost  # frame time not recording vs recording
  nbody-live run out/collision                     # replay a series written by simulate --out-dir
  nbody-live run 'out/collision/snap_*.npz'        # the same, by a (quoted) glob
  mpiexec -n 2 nbody-live run plummer --n 65536 --backend cpu   # MPI ranks: rank 0 draws, all compute

Under mpiexec rank 0 opens the viewer and every rank computes its share; the panel's changes reach every
rank at the next step, its MPI section shows each rank's force and exchange time; closing the window ends
every rank (docs/distributed.md).
"""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "run", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_scene_options(p, series=True)
    add_gpu_options(p)
    p.add_argument("--frames", type=positive_int, metavar="N", help="exit after N frames")
    p.add_argument("--size", default="1280x720", metavar="WxH", help="window size (default 1280x720)")
    p.add_argument("--headless", action="store_true", help="render offscreen (EGL) even with a display")
    p.add_argument(
        "--screenshot",
        type=Path,
        metavar="FILE.png",
        help="save the last frame as PNG on exit (with the panel when it is shown)",
    )
    p.add_argument(
        "--timings",
        type=Path,
        metavar="FILE.csv",
        help="write one row of timings per frame as it is drawn (frame, force, integrate, map, "
        "draw ms); an interrupted run keeps its rows",
    )
    p.add_argument(
        "--no-panel",
        dest="panel",
        action="store_false",
        help="start without the ImGui control panel (Tab still shows it)",
    )
    p.add_argument(
        "--panel-cost",
        action="store_true",
        help="measure the panel's cost: alternate blocks of frames with the panel shown and "
        "hidden (headless, --frames N, default 400) and print both median frame times",
    )
    p.add_argument(
        "--record-to",
        type=Path,
        default=None,
        metavar="DIR",
        help="where the Record button / V writes recording-<time>.mp4 (default out/)",
    )
    p.add_argument(
        "--record-fps",
        type=positive_float,
        default=60.0,
        metavar="F",
        help="live recordings' frame rate, sampled from the drawn frames by wall time (60)",
    )
    p.add_argument(
        "--record-cost",
        action="store_true",
        help="measure what live recording costs: N frames not recording, then N frames recording "
        "at the window size (headless, --frames N, default 400); prints both median frame "
        "times, the difference and the capture's own median time (record_ms)",
    )
    p.add_argument(
        "--gather-every",
        type=positive_int,
        metavar="K",
        help="under mpiexec: frames between rank 0's gathers of every rank's velocities (colour "
        "by speed, energy, snapshots; positions reach rank 0 every step); default 1",
    )
    p.add_argument(
        "--compare",
        metavar="KERNEL",
        help="start with A/B on: KERNEL, a kernel of the run's backend, timed beside the running one at "
        "every frame's state on a scratch copy (the panel's Compare tab); the last lines report both",
    )
    add_kernel_file_options(p)
    p.add_argument(
        "--reload-sanitizer",
        action="store_true",
        help="run each saved kernel file's trial under compute-sanitizer's memcheck, which names a bad "
        "access exactly (a trial takes several times longer; without it, canary rows around the "
        "accelerations still catch a write past either end)",
    )
    p.set_defaults(func=main)


def main(args) -> int:
    from app.backends import distributed

    return distributed.as_job(_run, args)


def _run(args, comm) -> int:
    """The viewer; under MPI (`comm`) rank 0 opens it and every other rank follows its frames."""
    size = parse_size(args.size)
    lead = comm is None or comm.rank == 0
    replaying = _check_options(args, comm, lead)
    series = replay.open_replay(args) if replaying else None
    scene = scene_from_args(args) if series is None else replay.replay_scene(args, series)
    if series is not None:
        refuse_error_colours(scene, "a replay")
    if not lead:
        return _follow(scene, comm)
    from app.render.gl_setup import configure, display_problem

    if args.panel_cost or args.record_cost:
        args.headless = True
        args.frames = args.frames or 400
    # a display that is named but does not answer (a stale $DISPLAY) is no display: never a glfw traceback
    no_display = None if args.headless else display_problem()
    if no_display and args.frames is None:
        return _demo(args, comm, scene, series, size, no_display)
    if no_display:
        log.info("%s: rendering headless (EGL)", no_display)
    headless = args.headless or bool(no_display)
    _require_imgui()  # the panel (a replay's too), before GL and the backend: one line, not a traceback
    configure(headless=headless)
    if series is not None:
        return replay.run_replay(args, scene, series, size, headless)
    return _live(args, comm, scene, size, headless)


def _check_options(args, comm, lead: bool) -> bool:
    """Every output checked before any work (a bad path is one line now, not a traceback) and the options
    that exclude each other; returns whether SCENE is a series to replay (a folder or a glob of
    snapshots: no forces)."""
    if lead:
        check_outputs((args.timings, "timings"), (args.screenshot, "screenshot"))
        if args.record_to is not None:  # named: a recording there must not fail only when V is pressed
            check_folder(args.record_to, "live recordings")
        check_suffix(args.screenshot, (".png",), "screenshot", "--screenshot")
        check_suffix(args.timings, (".csv",), "timings", "--timings")
    replaying = is_series_arg(args.scene)
    if replaying and (args.panel_cost or args.record_cost):
        raise ConfigError(
            "--panel-cost and --record-cost measure a live simulation; leave them out for a replay"
        )
    if comm is None and args.gather_every is not None:
        raise ConfigError("--gather-every applies to MPI runs (mpiexec -n R nbody-live run ...) only")
    if comm is not None and replaying:
        raise ConfigError("a replay computes nothing to share among MPI ranks: run it without mpiexec")
    if args.compare and (replaying or comm is not None):
        raise ConfigError(
            "--compare times two kernels of one process's live run: not a replay, not MPI ranks"
        )
    return replaying


def _demo(args, comm, scene, series, size, no_display: str) -> int:
    """No display and no --frames: a short demo video and still under out/ instead of a window (refused
    where it would silently leave out what was asked for)."""
    if comm is not None:
        raise ConfigError(f"{no_display}: under mpiexec, rank 0 needs a display, or --headless --frames N")
    if args.timings or args.screenshot:  # the demo would silently not write them
        raise ConfigError(
            f"{no_display}: without --frames N, run records a demo instead of opening a "
            "window, which writes no --timings or --screenshot; add --frames N to run "
            "headless"
        )
    from app.commands.record import record_demo

    log.info("%s: recording a short demo instead of opening a window", no_display)
    return record_demo(
        scene,
        Path("out/demo.mp4"),
        Path("out/demo.png"),
        size=size,
        frames=DEMO_FRAMES,
        backend=None if series is None else replay.record_backend(series, DEMO_FRAMES),
    )


def _live(args, comm, scene, size, headless: bool) -> int:
    """The live viewer on the scene's backend (with its panel), until it quits, then its report; every
    part it opened is closed, the backend the panel may have switched to included."""
    from app.render.canvas import open_viewer
    from app.render.frames import FrameLog

    backend = make_backend(scene, comm=comm)
    if comm is not None:
        backend.gather_every = args.gather_every or 1
    viewer = panel = frame_log = interrupted = None
    try:
        title = "NBody Live" if comm is None else f"NBody Live - rank 0 of {comm.size} MPI ranks"
        viewer = open_viewer(scene, backend, size, headless, title=title)
        frame_log = FrameLog().attach(viewer)
        if args.timings:  # a row per frame as it is drawn: an interrupted run keeps its rows
            frame_log.stream_csv(args.timings)
        from app.ui import Panel

        # the panel's controller owns the keys ([ ] R V Tab) and the kernel switching, shown or not
        panel = Panel(viewer, frame_log=frame_log, visible=args.panel)
        if args.reload_sanitizer:
            panel.controller.watch_kernel_files(sanitizer=True)
        recorder = panel.controller.view_recorder
        recorder.directory, recorder.fps = args.record_to or Path("out"), args.record_fps
        if args.compare:  # (checked first: a refusal is the one line of a ConfigError, exit 2)
            reason = panel.controller.why_not_b(args.compare)
            if reason:
                raise ConfigError(f"--compare {args.compare}: {reason}")
            panel.controller.start_compare(args.compare)
        viewer.screenshot_on_exit = args.screenshot
        viewer.screenshot_overlays = True  # what the user sees, panel included
        import gc

        # the ~10^5 long-lived objects of numba, vispy and imgui need no more scanning: without this a
        # full collection now and then stalls a frame for ~50-100 ms
        gc.collect()
        gc.freeze()
        interrupted = _drive(args, viewer, panel, recorder)
        backend = viewer.backend  # the panel may have switched to another backend's kernel
        if comm is not None:
            backend.quit_all()  # every other rank's _follow returns
        _report(args, comm, viewer, backend, frame_log, recorder)
        compared = panel.controller.compare_line()  # A/B (the Compare tab, --compare), when it ran
        if compared:
            print(compared)
    finally:
        if frame_log is not None:
            frame_log.close()
        if panel is not None:
            panel.close()
        if viewer is not None and viewer.backend is not backend:
            viewer.backend.close()
        backend.close()
    from app.render.recorder import exit_status

    return exit_status(interrupted)


def _require_imgui() -> None:
    """The panel's controller owns the viewer's keys and its recorder, shown or not: without imgui-bundle
    there is no viewer to keep alive, so one line saying how to install it (not a traceback)."""
    try:
        import imgui_bundle  # noqa: F401 - only whether it imports
    except ImportError as e:
        raise ConfigError(
            f"the viewer needs imgui-bundle (its panel and keys), which does not import here ({e}); "
            "`make` installs it; `nbody-live record` draws without it"
        ) from None


def _drive(args, viewer, panel, recorder):
    """Runs the viewer: the panel's or the recording's cost measured (then closed), or frames until it
    quits (Escape, the window closed, --frames, a signal); returns the signal that quit it, if one did."""
    if args.panel_cost:
        from app.ui.panel import measure_panel_cost, panel_cost_line

        print(panel_cost_line(measure_panel_cost(viewer, panel, frames=args.frames)))
        if args.screenshot:
            viewer.save_png(args.screenshot, overlays=True)
        viewer.close()
        return None
    if args.record_cost:
        from app.render.live_recording import measure_record_cost, record_cost_line

        cost = measure_record_cost(viewer, recorder, frames=args.frames)
        print(record_cost_line(cost, device=_device_name(viewer.backend, panel)))
        if args.screenshot:
            viewer.save_png(args.screenshot, overlays=True)
        viewer.close()
        return None
    from app.render.recorder import InterruptGuard

    # SIGTERM (a window manager's or a service's stop) or Ctrl-C: quit at the next tick, as
    # Escape does, so that a recording still running is finalised; the status says which signal
    with InterruptGuard(lambda _: viewer.request_quit(), "quitting and finalising any recording") as guard:
        viewer.run(frames=args.frames)
    return guard.signum


def _report(args, comm, viewer, backend, frame_log, recorder) -> None:
    """The run's last lines: frames and timings, the kernels used, the MPI split, the files written."""
    kernels = list(dict.fromkeys(r.kernel for r in frame_log.records if r.kernel))
    print(
        f"drew {viewer.stats.frame} frames; {viewer.stats.kernel or backend.kernel} N={backend.n} "
        f"({backend.data_path}): " + frame_log.summary_line()
    )
    if len(kernels) > 1:
        print("kernels used: " + " -> ".join(kernels))
    if comm is not None:
        print(backend.split_line())
    report_viewer_outputs(args, viewer, frame_log, recorder, recordings=not args.record_cost)


def _follow(scene, comm) -> int:
    """A rank other than 0: load the same bodies, then compute rank 0's frames until it quits."""
    backend = make_backend(scene, comm=comm)
    try:
        backend.follow()
    finally:
        backend.close()
    return 0


def _device_name(backend, panel) -> str:
    """The GPU (CUDA backend) or the GL renderer, for measurement lines."""
    try:
        name = (backend.device_info() or {}).get("name")
    except Exception:  # noqa: BLE001 - a name is a nicety
        name = None
    if name:
        return str(name)
    return f"GL {panel.gl.get('renderer', '?')}"
