"""Recording from the live viewer: the panel's Record button and the V key, driven like a user drives them
(synthesised vispy events on the viewer's own emitters, as in test_panel.py), on headless EGL (Mesa
llvmpipe here) with the CPU backend. The mp4s are decoded with PyAV.

What is checked: a click starts a recording and the indicator shows (panel and window title), V finalises
a playable mp4 with one frame per video-frame interval less the dropped ones, at the window size, showing
the particles without the panel; quitting the viewer while recording finalises the file; an unwritable
directory and a full disk are a message in the panel, and the viewer keeps running. The recorder samples
the drawn frames by its clock, which the tests move themselves (`Clock`): what is sampled depends on the
test, not on this machine's speed; how many frames the encoder drops does, and is only counted.
"""

from __future__ import annotations

import errno
import math
from pathlib import Path

import numpy as np
import pytest
from waiting import wait_for

from app.render import gl_setup

pytestmark = pytest.mark.gl

W, H = 720, 480
FRAME = 1.0001 / 60  # a hair over one video frame (60 fps): every frame drawn a FRAME apart is sampled once


class Clock:
    """The live recorder's wall clock, moved by the test: which drawn frames the recording samples then
    depends on the test alone, not on how fast this machine draws."""

    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def gl_env():
    try:
        gl_setup.configure(headless=True)
        from vispy import app

        app.Canvas(size=(16, 16), show=False).close()
    except Exception as e:  # noqa: BLE001 - no GL here: skip with the reason
        pytest.skip(f"no headless GL context: {type(e).__name__}: {e}")
    try:
        import av  # noqa: F401
        import imgui_bundle  # noqa: F401
    except ImportError as e:
        pytest.skip(f"imgui-bundle or PyAV is not importable: {e}")


class UI:
    """A viewer with its panel and FrameLog (as `nbody-live run` wires them), and a user with a mouse and
    a keyboard (vispy events, two frames after each, as in test_panel.py)."""

    def __init__(self, record_dir: Path, n: int = 384):
        from app.commands.assembly import make_backend
        from app.render.canvas import Viewer
        from app.render.frames import FrameLog
        from app.scene import load_scene
        from app.ui import Panel

        scene = load_scene("plummer", {"initial.n": n, "run.backend": "cpu", "run.steps_per_frame": 1})
        self.viewer = Viewer(scene, make_backend(scene), size=(W, H), headless=True)
        self.log = FrameLog().attach(self.viewer)
        self.panel = Panel(self.viewer, frame_log=self.log)
        self.ctl = self.panel.controller
        self.rec = self.ctl.view_recorder  # the live recording's state
        self.rec.directory = record_dir
        self.clock = self.rec.clock = Clock()
        # rebuild the widgets every frame: a recording can stop without input (a full disk), and the panel
        # otherwise rebuilds at most 30 times a second (item_rects would be a frame or two stale)
        self.panel.bridge.refresh_hz = 0.0
        self.frame(2)

    def frame(self, n: int = 1, dt: float = FRAME) -> None:
        """Draw `n` frames, the recorder's clock moving `dt` before each."""
        for _ in range(n):
            self.clock.t += dt
            self.viewer.step_and_render()

    def settle(self) -> None:
        """Until the encoder has taken every frame handed to it: the next frames cannot find it full."""
        r = self.rec.recording
        wait_for(lambda: r.recorder.queued == 0, "the encoder to take the queued frames", poll=0.01)

    def click(self, name: str) -> None:
        assert name in self.panel.item_rects, f"{name!r} was not drawn: {sorted(self.panel.item_rects)}"
        x0, y0, x1, y1 = self.panel.item_rects[name]
        pos = ((x0 + x1) / 2, (y0 + y1) / 2)
        ev = self.viewer.events
        ev.mouse_move(pos=pos, button=None, buttons=[], modifiers=())
        self.frame(2)
        ev.mouse_press(pos=pos, button=1, buttons=[1], modifiers=())
        self.frame(2)
        ev.mouse_release(pos=pos, button=1, buttons=[], modifiers=())
        self.frame(2)

    def key(self, name: str, text: str = "") -> None:
        from vispy.util import keys

        key = {"Space": keys.SPACE, "Escape": keys.ESCAPE}.get(name) or keys.Key(name)
        self.viewer.events.key_press(key=key, text=text, modifiers=())
        self.viewer.events.key_release(key=key, text="", modifiers=())

    def close(self) -> None:
        self.panel.close()
        b = self.viewer.backend
        self.viewer.close()
        b.close()


@pytest.fixture
def ui(gl_env, tmp_path):
    u = UI(tmp_path)
    yield u
    u.close()


def decode(path):
    import av

    with av.open(str(path)) as c:
        s = c.streams.video[0]
        info = {"size": (s.width, s.height), "rate": s.average_rate, "codec": s.codec_context.name}
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    return frames, info


def test_record_button_indicator_and_v_finalise_a_playable_mp4_of_the_particles(ui, tmp_path):
    assert "V" in ui.viewer.key_actions and ui.viewer.key_actions["V"] == ui.ctl.toggle_recording
    ui.click("record")
    rec = ui.rec.recording
    assert rec is not None, ui.ctl.message
    # the indicator: red dot, elapsed time, frames, dropped in the panel's top area and in the title
    assert "rec_indicator" in ui.panel.item_rects
    assert ui.viewer.status_line().startswith("● REC 0:") and " frames" in ui.viewer.status_line()
    assert ui.viewer.stats.record_ms > 0 and ui.log.records[-1].record_ms > 0  # the app's own timing
    # while recording only a hidden temporary file exists: nothing that looks finished
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == []
    drawn0, frame0, offered0 = rec.drawn, ui.viewer.stats.frame, rec.offered
    ui.frame(12)  # drawn at 60 fps by the recorder's clock: each one is a video frame
    assert rec.offered == offered0 + 12
    # frame k of the clip is the first drawn at or after k / 60 s: with the clock standing still, the
    # clip catches up with it (started between two frames, it is one behind) ...
    ui.frame(2, dt=0.0)
    assert rec.next_slot == math.floor(rec.elapsed * 60) + 1
    ui.frame(3, dt=0.0)  # ... and then frames drawn faster than 60 fps are not sampled
    assert rec.next_slot == math.floor(rec.elapsed * 60) + 1
    ui.key("Space", " ")  # pause: the last frames show a state we can render again for comparison
    offered = rec.offered
    ui.frame(2)
    ui.settle()  # the encoder keeps up with the last two frames whatever this machine's speed
    ui.frame(2)
    assert rec.drawn == drawn0 + ui.viewer.stats.frame - frame0  # every drawn frame is seen
    assert rec.offered == offered + 4
    ui.key("V", "v")  # stop: drain, finalise, rename
    assert ui.rec.recording is None and not ui.rec.error, ui.ctl.message
    res = ui.rec.recordings[-1]
    assert res.path.parent == tmp_path and res.path.match("recording-*.mp4")
    assert sorted(tmp_path.iterdir()) == [res.path]  # the temporary file was renamed, nothing left over
    assert ui.viewer.stats.record_ms == 0 and "REC" not in ui.viewer.status_line()
    frames, info = decode(res.path)
    assert info["size"] == (W, H) and info["codec"] == "h264" and info["rate"] == 60
    # frames the encoder could not take are dropped and counted (how many depends on this machine)
    assert len(frames) == res.frames == rec.offered - res.dropped and len(frames) >= 2
    # the panel shows the path
    ui.frame()
    assert "last_recording" in ui.panel.item_rects and str(res.path) in ui.ctl.message
    # the particles only: the last frame matches a render of the same state without the panel
    bare = ui.viewer.render_to_array(overlays=False).astype(np.int16)
    shown = ui.viewer.render_to_array(overlays=True).astype(np.int16)
    last = frames[-1].astype(np.int16)
    assert last.max() > 100 and (last.max(axis=2) > 40).mean() > 0.002  # bodies, not black
    assert np.abs(last - bare).mean() < 2.0 and np.abs(last - shown).mean() > 10.0


def test_quitting_while_recording_finalises_the_file(gl_env, tmp_path):
    ui = UI(tmp_path)
    try:
        ui.key("V", "v")  # start with the key this time
        rec = ui.rec.recording
        assert rec is not None, ui.ctl.message
        quit_at = ui.viewer.stats.frame + 6

        def press_escape(viewer):  # the user presses Escape while the loop runs
            ui.clock.t += FRAME  # (after the recorder's overlay: the loop draws at 60 fps by its clock)
            if viewer.stats.frame == quit_at:
                ui.key("Escape")

        ui.viewer.overlays.append(press_escape)
        ui.viewer.run()  # the real loop: Escape -> close at the next tick -> the close event finalises
        assert ui.viewer._closed and ui.rec.recording is None, ui.ctl.message
        res = ui.rec.recordings[-1]
        assert sorted(tmp_path.iterdir()) == [res.path]
        frames, info = decode(res.path)
        assert info["size"] == (W, H) and len(frames) == res.frames >= 1
        # every frame drawn until Escape was seen and, a video frame apart by the clock, sampled; each is
        # in the clip or counted as dropped (the encoder's speed decides which)
        assert rec.drawn >= 6 and rec.offered == rec.drawn and res.frames + res.dropped == rec.offered
    finally:
        ui.panel.close()
        ui.viewer.backend.close()


def test_unwritable_directory_is_a_message_and_the_viewer_keeps_running(ui, tmp_path):
    # tests run as root, who writes into a chmod 0555 directory anyway; sysfs refuses file creation
    ui.rec.directory = Path("/sys")
    ui.click("record")
    assert ui.rec.recording is None
    err = ui.rec.error
    assert "cannot write" in err and "/sys/recording-" in err and "\n" not in err
    assert "record_error" in ui.panel.item_rects  # shown in the panel, in red
    t0, f0 = ui.viewer.backend.time, ui.viewer.stats.frame
    ui.frame(3)
    assert ui.viewer.stats.frame == f0 + 3 and ui.viewer.backend.time > t0 and not ui.viewer._closed
    # a writable directory again: recording works and the error is gone
    ui.rec.directory = tmp_path
    ui.key("V", "v")
    ui.frame(3)
    ui.key("V", "v")
    assert not ui.rec.error and ui.rec.recordings and ui.rec.recordings[-1].path.exists()


def test_full_disk_while_recording_stops_it_with_a_message(ui, tmp_path, monkeypatch):
    from app.render import encoder

    real = encoder.VideoEncoder._process
    calls = []

    def full(self, img, info):
        calls.append(1)
        if len(calls) > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, img, info)

    monkeypatch.setattr(encoder.VideoEncoder, "_process", full)
    ui.key("V", "v")
    assert ui.rec.recording is not None
    # the worker's error reaches the GL thread at a hand-over after the encoder met it: draw until then
    wait_for(lambda: ui.rec.recording is None, "the full disk to stop the recording", step=ui.frame)
    err = ui.rec.error
    assert "disk is full" in err and "partial output was removed" in err
    assert list(tmp_path.iterdir()) == []  # no file that looks complete, no temporary file
    ui.frame(2)
    assert "record_error" in ui.panel.item_rects and ui.viewer.stats.record_ms == 0
    assert not ui.viewer._closed and "REC" not in ui.viewer.status_line()


def test_run_command_record_cost_timings_and_help(gl_env, tmp_path, capsys):
    import csv

    from app.cli import main

    csv_path = tmp_path / "t.csv"
    rc = main(
        [
            "-q",
            "run",
            "plummer",
            "--n",
            "256",
            "--backend",
            "cpu",
            "--frames",
            "8",
            "--record-cost",
            "--size",
            "320x240",
            "--record-to",
            str(tmp_path),
            "--timings",
            str(csv_path),
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "record cost over 8+8 frames" in out and "not recording vs" in out and "record_ms median" in out
    [mp4] = tmp_path.glob("recording-*.mp4")
    frames, info = decode(mp4)
    assert info["size"] == (320, 240) and len(frames) >= 1
    rows = list(csv.DictReader(csv_path.open()))
    assert "record_ms" in rows[0] and any(float(r["record_ms"]) > 0 for r in rows)
    assert float(rows[5]["record_ms"]) == 0.0  # not recording yet
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    help_text = capsys.readouterr().out
    assert "--record-to" in help_text and "--record-cost" in help_text
    assert any(line.split()[:1] == ["V"] and "record" in line for line in help_text.splitlines())


@pytest.mark.parametrize("view_fps", [20, 45, 60])
def test_the_clip_lasts_the_wall_time_it_recorded_at_any_view_rate(ui, view_fps):
    """Issue 28: a view drawn at 20 fps gave a 60 fps clip of a third of the time (4 s of viewing, 0.6 s of
    clip). Each sampled frame now carries its wall-clock slot, so a slow view's frames last as long as they
    were on screen: 2 s of viewing (the recorder's clock) plays 2 s, within 5%, at 20, 45 and 60 fps."""
    import av

    ui.ctl.toggle_recording()
    rec = ui.rec.recording
    assert rec is not None, ui.ctl.message
    start = rec.elapsed
    frames = round(2.0 * view_fps)
    for k in range(frames):
        ui.frame(1, dt=1.0 / view_fps)
        if k % 8 == 7 or k == frames - 1:
            ui.settle()  # no drops: the test is about time, not about this machine's encoder speed
    wall = rec.elapsed - start
    ui.ctl.toggle_recording()
    res = ui.rec.recordings[-1]
    with av.open(str(res.path)) as c:
        s = c.streams.video[0]
        times = [float(f.pts * f.time_base) for f in c.decode(video=0)]
    clip = times[-1] - times[0] + 1.0 / 60.0  # the last frame lasts one video frame
    assert res.dropped == 0
    assert len(times) == res.frames and s.average_rate is not None
    assert clip == pytest.approx(wall, rel=0.05), (view_fps, len(times), clip, wall)
