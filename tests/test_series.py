"""Snapshot series: `simulate --snapshot-every K --out-dir DIR` writes them (atomically, float64, original
order, resumable), `run DIR` replays them (the time slider through real input events), `record DIR`
renders them to a clip with the frame count the options say. Bad series are one line naming the file."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import one_line_error
from test_panel import UI, H, W
from test_panel import gl_env as gl_env  # the module-scoped fixture of the GL tests
from test_record import decode

from app.backends.replay import MAX_FRAME_S, ReplayBackend
from app.cli import main
from app.commands import simulate
from app.model import formats
from app.model.bodies import Bodies
from app.model.series import MANIFEST, open_series

CPU = ["--backend", "cpu", "--no-progress"]
FP64 = ["plummer", "--n", "96", "--kernel", "cpu-fp64", *CPU]
ROOT = Path(__file__).resolve().parent.parent


def series(tmp_path, steps=40, every=10, name="series", *extra) -> Path:
    out = tmp_path / name
    assert (
        main(
            [
                "simulate",
                *FP64,
                "--dt",
                "0.01",
                "--steps",
                str(steps),
                "--snapshot-every",
                str(every),
                "--out-dir",
                str(out),
                *extra,
            ]
        )
        == 0
    )
    return out


def manifest(directory: Path) -> dict:
    return json.loads((directory / MANIFEST).read_text())


def same(a: Bodies, b: Bodies) -> bool:
    return a.pos.tobytes() == b.pos.tobytes() and a.vel.tobytes() == b.vel.tobytes() and a.time == b.time


# --------------------------------------------------------------------------------------------------
# writing


def test_simulate_writes_a_numbered_float64_series_with_a_manifest(tmp_path, capsys):
    d = series(tmp_path, steps=25, every=10)
    assert "series: 4 snapshots" in capsys.readouterr().out
    m = manifest(d)
    assert m["complete"] and m["n"] == 96 and m["dt"] == 0.01
    assert [(e["file"], e["step"]) for e in m["snapshots"]] == [
        ("snap_00000000.npz", 0),
        ("snap_00000010.npz", 10),
        ("snap_00000020.npz", 20),
        ("snap_00000025.npz", 25),
    ]  # every 10 steps, and the last step
    assert sorted(p.name for p in d.iterdir()) == ["last.npz", MANIFEST, *(e["file"] for e in m["snapshots"])]
    assert same(formats.read(d / "snap_00000025.npz"), formats.read(d / "last.npz"))
    # snapshot 10 is the state a 10-step run ends in, bitwise, in the original body order
    assert main(["simulate", *FP64, "--dt", "0.01", "--steps", "10", "--out", str(tmp_path / "ten.npz")]) == 0
    ten = formats.read(d / "snap_00000010.npz")
    assert same(ten, formats.read(tmp_path / "ten.npz")) and ten.pos.dtype == np.float64
    assert ten.time == pytest.approx(0.1)


def test_a_stopped_and_resumed_series_is_the_uninterrupted_one(tmp_path):
    whole = series(tmp_path, 50, 10, "whole")
    part = series(tmp_path, 23, 10, "part")
    assert (
        main(
            [
                "simulate",
                "plummer",
                "--kernel",
                "cpu-fp64",
                *CPU,
                "--dt",
                "0.01",
                "--steps",
                "27",
                "--snapshot-every",
                "10",
                "--out-dir",
                str(part),
                "--resume",
                str(part / "last.npz"),
            ]
        )
        == 0
    )
    steps = [e["step"] for e in manifest(part)["snapshots"]]
    assert steps == [0, 10, 20, 23, 30, 40, 50] and manifest(part)["complete"]  # 23: where part one ended
    for e in manifest(whole)["snapshots"]:
        assert (whole / e["file"]).read_bytes() == (part / e["file"]).read_bytes(), e


@pytest.fixture
def no_work(monkeypatch):
    def refuse(*_a, **_k):
        raise AssertionError("a backend was made before the outputs were checked")

    monkeypatch.setattr(simulate, "make_backend", refuse)


def test_series_outputs_are_refused_before_any_work(tmp_path, capsys, no_work):
    (tmp_path / "a_file").write_text("x")
    a_file = str(tmp_path / "a_file")
    rc = main(["simulate", "--steps", "5", "--snapshot-every", "1", "--out-dir", a_file, *CPU])
    one_line_error(capsys, rc, 2, "a_file", "is a file")
    rc = main(["simulate", "--steps", "5", "--snapshot-every", "1", "--out-dir", "/proc/series", *CPU])
    one_line_error(capsys, rc, 1, "/proc/series")
    rc = main(["simulate", "--steps", "5", "--snapshot-every", "2", "--out", str(tmp_path / "o.npz"), *CPU])
    one_line_error(capsys, rc, 2, "--snapshot-every K and --out-dir DIR go together")
    rc = main(["simulate", "--steps", "5", *CPU])
    one_line_error(capsys, rc, 2, "--out FILE is required")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / MANIFEST).write_text("{}")
    rc = main(["simulate", "--steps", "5", "--snapshot-every", "1", "--out-dir", str(taken), *CPU])
    one_line_error(capsys, rc, 2, str(taken), "already holds a snapshot series", "--resume")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file", "taken"]


def test_a_signal_leaves_complete_snapshots_marked_incomplete(tmp_path):
    d = tmp_path / "s"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app",
            "-q",
            "simulate",
            "plummer",
            "--n",
            "256",
            "--steps",
            "10000000",
            "--snapshot-every",
            "2",
            "--out-dir",
            str(d),
            "--backend",
            "cpu",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(_listed(d)) < 3:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "SIGTERM" in lines[0] and "marked incomplete" in lines[0], err
    m = manifest(d)
    assert not m["complete"] and len(m["snapshots"]) >= 3
    assert not [p for p in d.iterdir() if p.name.startswith(".")]  # no temporary left
    for e in m["snapshots"]:
        assert formats.read(d / e["file"]).n == 256
    assert "interrupted run" in open_series(str(d)).describe()


def _listed(d: Path) -> list:
    try:
        return manifest(d)["snapshots"]
    except (OSError, ValueError):
        return []


# --------------------------------------------------------------------------------------------------
# reading


def _write(path: Path, n: int, t: float, shift: float = 0.0, ids=None) -> Bodies:
    rng = np.random.default_rng(n)
    b = Bodies.from_arrays(rng.normal(size=(n, 3)) + shift, rng.normal(size=(n, 3)), np.ones(n), t, ids)
    formats.write(path, b)
    return b


def test_positions_are_interpolated_linearly_in_time_and_matched_by_id(tmp_path):
    a = _write(tmp_path / "a_1.npz", 8, 1.0, ids=np.arange(8))
    b = _write(tmp_path / "a_2.npz", 8, 3.0, shift=2.0, ids=np.arange(8))
    perm = np.array([3, 1, 7, 0, 2, 6, 5, 4])  # the third file lists the same bodies in another order
    c_pos = a.pos[perm] + 4.0
    formats.write(tmp_path / "a_10.npz", Bodies.from_arrays(c_pos, a.vel[perm], np.ones(8), 4.0, perm))
    s = open_series(str(tmp_path))
    assert [p.name for p in s.paths] == ["a_1.npz", "a_2.npz", "a_10.npz"]  # natural order, not "a_10" first
    assert list(s.times) == [1.0, 3.0, 4.0]
    pos4, _ = s.render_arrays(1.5)  # a quarter of the way from t = 1 to t = 3
    np.testing.assert_allclose(pos4[:, :3], a.pos + 0.25 * (b.pos - a.pos), rtol=1e-5, atol=1e-6)
    pos4, _ = s.render_arrays(4.0)  # rows back in the first file's order, by ID
    np.testing.assert_allclose(pos4[:, :3], a.pos + 4.0, rtol=1e-6)
    assert s.index_at(3.5) == (1, 0.5) and s.nearest(3.6) == 2


def test_bad_series_are_one_line_naming_the_file(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    rc = main(["record", str(empty), "--frames", "2", "--out", str(tmp_path / "x.mp4")])
    one_line_error(capsys, rc, 2, str(empty), "no snapshot files", "--out-dir")
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    _write(mixed / "s_1.npz", 8, 0.0)
    _write(mixed / "s_2.npz", 9, 1.0)
    rc = main(["run", str(mixed), "--headless", "--frames", "2"])
    one_line_error(capsys, rc, 2, "s_2.npz", "N = 9", "N = 8", "remove that file")
    (mixed / "s_2.npz").write_bytes(b"not a snapshot")
    rc = main(["record", str(mixed), "--frames", "2", "--out", str(tmp_path / "x.mp4")])
    one_line_error(capsys, rc, 2, "s_2.npz", "snapshot 2 of 2", "remove or fix that file")
    rc = main(["record", str(tmp_path / "nothing" / "*.npz"), "--frames", "2"])
    one_line_error(capsys, rc, 2, "matches no files", "quote it")
    rc = main(["run", str(empty), "--dt", "0.1", "--headless", "--frames", "2"])
    one_line_error(capsys, rc, 2, "--dt does not apply to a replay")
    rc = main(["record", str(empty), "--timesteps", "block", "--frames", "2"])
    one_line_error(capsys, rc, 2, "--timesteps does not apply to a replay")
    assert not (tmp_path / "x.mp4").exists()


# --------------------------------------------------------------------------------------------------
# the replay backend


class Clock:
    """The wall clock a live replay reads, advanced by the test: each call is one frame `dt` later."""

    def __init__(self, dt: float = 1 / 30):
        self.dt, self.now = dt, 0.0

    def __call__(self) -> float:
        self.now += self.dt
        return self.now


def test_replay_plays_at_its_rate_pauses_loops_and_records_exactly(tmp_path):
    s = open_series(str(series(tmp_path)))  # t = 0 .. 0.4, 5 snapshots
    r = ReplayBackend(s, clock=Clock(0.02))
    r.rate = 0.5  # simulation time per wall second
    r.step()  # the first frame only starts the clock
    for _ in range(3):
        r.step()
    assert r.t == pytest.approx(3 * 0.02 * 0.5)
    r.set_playing(False)
    r.step()
    r.step()
    assert r.t == pytest.approx(0.03)
    r.clock.dt = 10.0  # a stall: one frame advances by at most MAX_FRAME_S of wall time
    r.set_playing(True)
    r.step()
    r.step()
    assert r.t == pytest.approx(0.03 + 0.5 * MAX_FRAME_S)
    r.seek(0.39)
    r.step()
    assert 0.0 <= r.t < 0.1 and r.playing  # looped to the start
    frames = 9
    rec = ReplayBackend(s, clock=None, per_frame=(s.end - s.start) / (frames - 1))
    rec.loop = False
    seen = [rec.t]
    for _ in range(frames - 1):
        rec.step()
        seen.append(rec.t)
    assert seen[0] == s.start and seen[-1] == s.end and seen[4] == pytest.approx(0.2)
    pos4, _ = rec.host_render_arrays()
    assert np.array_equal(pos4[:, :3], formats.read(s.paths[-1]).pos.astype(np.float32))


# --------------------------------------------------------------------------------------------------
# the CLI and the panel on a real (headless) viewer


@pytest.mark.gl
def test_a_series_written_by_simulate_replays_and_records_with_the_frames_asked(gl_env, tmp_path, capsys):
    d = series(tmp_path)
    capsys.readouterr()
    assert main(["run", str(d), "--headless", "--frames", "6", "--size", "160x96"]) == 0
    assert "drew 6 frames of the replay of series: 5 snapshots of N = 96" in capsys.readouterr().out
    for options, frames in ((["--frames", "9"], 9), (["--seconds", "0.5", "--fps", "20"], 10)):
        out = tmp_path / f"clip{frames}.mp4"
        assert (
            main(
                ["record", str(d), "--size", "160x96", "--no-progress", "--hud", "--out", str(out), *options]
            )
            == 0
        )
        got, info = decode(out)
        assert len(got) == frames and info["size"] == (160, 96)
        first = capsys.readouterr().out.splitlines()[0]
        assert f"{frames} frames 160x96" in first and "replay of 5 snapshots, t = 0 .. 0.4" in first
    assert np.abs(got[0].astype(int) - got[-1]).mean() > 0.5  # the bodies moved between first and last


class ReplayUI(UI):
    """The `UI` user of test_panel, on a replay viewer with the replay panel and a test-driven clock."""

    def __init__(self, directory: Path, clock):
        from app.render.canvas import Viewer
        from app.scene import load_scene
        from app.ui.replay import ReplayPanel

        self.scene = load_scene(None)
        self.viewer = Viewer(
            self.scene, ReplayBackend(open_series(str(directory)), clock=clock), size=(W, H), headless=True
        )
        self.uploads: list[np.ndarray] = []
        upload = self.viewer.renderer.upload
        self.viewer.renderer.upload = lambda pos4, speeds: (
            self.uploads.append(np.array(pos4)),
            upload(pos4, speeds),
        )
        self.panel = ReplayPanel(self.viewer)
        self.ctl = self.panel.controller
        self.panel.bridge.refresh_hz = 0.0
        self.frame(2)


@pytest.mark.gl
def test_the_time_slider_moves_the_replay_and_frames_are_interpolated(gl_env, tmp_path):
    from vispy.util import keys

    d = series(tmp_path)  # 5 snapshots, t = 0, 0.1, .. 0.4
    ui = ReplayUI(d, Clock(1 / 30))
    try:
        r = ui.viewer.backend
        assert r.playing and r.t > 0  # it plays from the start
        ui.click("play")  # the Pause button
        assert not r.playing
        x0, y0, x1, y1 = ui.panel.item_rects["time_slider"]
        ui.click((x0 + 0.625 * (x1 - x0), (y0 + y1) / 2))  # 62.5 %: half-way between snapshots 3 and 4
        assert 0.23 < r.t < 0.27, r.t
        i, f = r.series.index_at(r.t)
        assert i == 2 and 0.3 < f < 0.7
        ui.frame()
        a, b = (formats.read(d / f"snap_000000{k}0.npz").pos.astype(np.float32) for k in (2, 3))
        np.testing.assert_allclose(ui.uploads[-1][:, :3], a + np.float32(f) * (b - a), rtol=1e-5, atol=1e-6)
        assert not np.allclose(ui.uploads[-1][:, :3], a, atol=1e-4)  # not a snapshot: in between
        ui.key(keys.RIGHT)
        assert r.t == pytest.approx(0.3) and not r.playing
        ui.key(keys.SPACE, " ")
        assert r.playing
        before = r.t
        ui.frame(3)
        assert r.t == pytest.approx(before + 3 * r.rate / 30)  # the rate, at the test's clock
        ui.click("last")
        assert r.t == pytest.approx(0.4) and not r.playing
        ui.key(keys.SPACE, " ")  # playing from the end starts again at the first snapshot
        assert r.playing and r.t < 0.1
    finally:
        ui.close()


def test_ranks_write_the_series_one_process_writes(tmp_path):
    from test_mpi import MPIEXEC, nbody

    if MPIEXEC is None:
        pytest.skip("mpiexec not found: pip install 'nbody-live[mpi]'")
    args = (
        "simulate",
        "plummer",
        "--n",
        101,
        "--steps",
        30,
        "--backend",
        "cpu",
        "--kernel",
        "cpu-fp64",
        "--snapshot-every",
        10,
        "--no-progress",
    )
    one = nbody(*args, "--out-dir", tmp_path / "one")
    many = nbody(*args, "--out-dir", tmp_path / "many", launcher=(MPIEXEC, "-n", "2"))
    assert one.returncode == 0 and many.returncode == 0, many.stderr
    assert many.stdout.count("series: 4 snapshots") == 1  # rank 0 writes and speaks
    assert manifest(tmp_path / "one") == manifest(tmp_path / "many")
    for e in manifest(tmp_path / "one")["snapshots"]:
        assert (tmp_path / "one" / e["file"]).read_bytes() == (tmp_path / "many" / e["file"]).read_bytes()
