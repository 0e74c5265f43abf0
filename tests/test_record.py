"""`nbody-live record` and the recorder pieces, on the CPU backend and headless EGL (Mesa here).

Videos are decoded with PyAV. Scenes are small (a few hundred bodies, 160x96 pixels) so the whole file
runs in well under a minute on two slow cores; the real-process tests (SIGTERM, read-only mount, full
disk) start `python -m app` because signals and mounts need their own process.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from waiting import wait_for

from app.cli import main
from app.core.errors import ConfigError, RuntimeFault
from app.model import config
from app.render import camera_path as cp
from app.render import gl_setup
from app.render.camera import OrbitCamera

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["plummer", "--backend", "cpu", "--n", "384", "--size", "160x96", "--fps", "30", "--no-progress"]


@pytest.fixture(scope="module")
def gl_env():
    try:
        gl_setup.configure(headless=True)
        from vispy import app

        app.Canvas(size=(16, 16), show=False).close()
    except Exception as e:  # noqa: BLE001 - any failure here means "no GL here"
        pytest.skip(f"no headless GL context: {type(e).__name__}: {e}")


def decode(path) -> tuple[list[np.ndarray], dict]:
    import av

    with av.open(str(path)) as c:
        s = c.streams.video[0]
        cc = s.codec_context
        info = {
            "size": (s.width, s.height),
            "codec": cc.name,
            "pix_fmt": cc.pix_fmt,
            "duration": c.duration / 1e6,
            "rate": s.average_rate,
        }
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    return frames, info


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    rc = main(["record", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("nbody-live: ")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture(scope="module")
def two_clips(tmp_path_factory, gl_env):
    """The same 2-second orbit recorded twice (each with its own viewer and backend)."""
    d = tmp_path_factory.mktemp("clips")
    outs = []
    for name in ("a.mp4", "b.mp4"):
        rc = main(
            [
                "record",
                *SMALL,
                "--seconds",
                "2",
                "--camera",
                "orbit",
                "--orbit-speed",
                "45",
                "--out",
                str(d / name),
            ]
        )
        assert rc == 0
        outs.append(d / name)
    return outs


# --------------------------------------------------------------------------------------------------
# the acceptance clip


@pytest.mark.gl
def test_two_second_clip_has_the_frames_size_and_duration_asked(two_clips, capsys):
    frames, info = decode(two_clips[0])
    assert info["codec"] == "h264" and info["pix_fmt"] == "yuv420p"
    assert len(frames) == 60 and info["size"] == (160, 96) and info["rate"] == 30
    assert info["duration"] == pytest.approx(2.0, abs=1 / 30)
    assert all(f.shape == (96, 160, 3) for f in frames)
    for f in (frames[0], frames[30], frames[-1]):  # not black: a lit cloud in the middle
        assert f.mean() > 3 and f.max() > 150
        assert f[32:64, 60:100].mean() > 2 * f.mean() * 0.9
    assert np.abs(frames[0].astype(int) - frames[-1]).mean() > 1  # the camera orbited, the bodies moved
    assert sorted(p.name for p in two_clips[0].parent.iterdir()) == ["a.mp4", "b.mp4"]  # no .part left


@pytest.mark.gl
def test_two_recordings_of_the_same_scene_are_identical(two_clips):
    a, _ = decode(two_clips[0])
    b, _ = decode(two_clips[1])
    assert len(a) == len(b) == 60
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    # x264 is deterministic for a fixed thread count, and the mp4 muxer writes no dates: same bytes
    assert two_clips[0].read_bytes() == two_clips[1].read_bytes()


@pytest.mark.gl
def test_summary_reports_frames_per_wall_second(gl_env, tmp_path, capsys):
    rc, out, _ = run_cli(capsys, *SMALL, "--frames", "12", "--hud", "--out", str(tmp_path / "s.mp4"))
    assert rc == 0
    lines = out.strip().splitlines()
    assert lines[0].startswith("recording ") and "12 frames 160x96 at 30 fps" in lines[0]
    assert lines[-1].startswith("recorded 12 frames 160x96 in ")
    for word in ("frames per wall second", "step", "draw", "readback", "encode"):
        assert word in lines[-1]


# --------------------------------------------------------------------------------------------------
# PNG sequence, still, keyframed camera through the CLI

FLIGHT = """\
[[keys]]
t = 0.0
position = [0.0, -14.0, 3.0]
fov = 50.0
[[keys]]
t = 0.1
position = [10.0, -9.0, 6.0]
target = [0.3, 0.0, 0.0]
[[keys]]
t = 0.2
position = [12.0, 4.0, 2.0]
fov = 30.0
"""


@pytest.mark.gl
def test_frames_dir_and_still_follow_a_keyframed_camera(gl_env, tmp_path, capsys):
    from PIL import Image

    flight = tmp_path / "flight.toml"
    flight.write_text(FLIGHT)
    frames_dir = tmp_path / "frames" / "seq"  # created, parents too
    rc, _, _ = run_cli(
        capsys, *SMALL, "--frames", "7", "--camera", str(flight), "--hud", "--frames-dir", str(frames_dir)
    )
    assert rc == 0
    names = sorted(p.name for p in frames_dir.iterdir())
    assert names == [f"frame_{i:06d}.png" for i in range(7)]
    imgs = [np.asarray(Image.open(frames_dir / n)) for n in names]
    assert all(im.shape == (96, 160, 3) for im in imgs)
    assert all(im.mean() > 2 for im in imgs)
    assert np.abs(imgs[0].astype(int) - imgs[6]).mean() > 1  # the camera flew

    # --still T is frame round(T * fps) of that same sequence: same steps, camera and HUD, pixel for pixel
    still_png = tmp_path / "still.png"
    rc, out, _ = run_cli(
        capsys, *SMALL, "--still", "0.1", "--camera", str(flight), "--hud", "--out", str(still_png)
    )
    assert rc == 0 and "frame 3" in out
    still = np.asarray(Image.open(still_png))
    assert np.array_equal(still, imgs[3])
    # without the HUD only the top band changes (two lines of 10 px text in a 160x96 frame)
    rc, _, _ = run_cli(
        capsys, *SMALL, "--still", "0.1", "--camera", str(flight), "--out", str(tmp_path / "plain.png")
    )
    plain = np.asarray(Image.open(tmp_path / "plain.png"))
    diff = np.abs(plain.astype(int) - still).sum(axis=2)
    assert diff[:20, :80].sum() > 0 and diff[40:, :].sum() == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["flight.toml", "frames", "plain.png", "still.png"]


@pytest.mark.gl
def test_block_steps_record_frames_inside_each_max_step(gl_env, tmp_path, capsys):
    """--timesteps block --frames-per-step 4: every frame moves (the bodies drawn at a quarter max step
    each), the HUD counts the time in quarters, and frame 4, after one whole max step, is pixel for pixel
    frame 1 of the same recording with a frame per max step (drawing inside steps leaves the trajectory
    as it is)."""
    from PIL import Image

    block = [
        "collision",
        "--backend",
        "cpu",
        "--n",
        "2048",
        "--size",
        "160x96",
        "--fps",
        "30",
        "--no-progress",
        "--timesteps",
        "block",
        "--dt",
        "0.125",
        "--block-levels",
        "4",
        "--block-eta",
        "0.01",
        "--steps-per-frame",
        "1",
        "--hud",
        "--camera",
        "static",
    ]
    quarters, wholes = tmp_path / "quarters", tmp_path / "wholes"
    rc, _, _ = run_cli(
        capsys, *block, "--frames", "6", "--frames-per-step", "4", "--frames-dir", str(quarters)
    )
    assert rc == 0
    rc, _, _ = run_cli(capsys, *block, "--frames", "2", "--frames-dir", str(wholes))
    assert rc == 0
    q = [np.asarray(Image.open(quarters / f"frame_{i:06d}.png")).astype(int) for i in range(6)]
    w = [np.asarray(Image.open(wholes / f"frame_{i:06d}.png")).astype(int) for i in range(2)]
    body = slice(30, None)  # below the HUD's two lines (which name the frame)
    assert all(np.abs(q[i + 1][body] - q[i][body]).sum() > 0 for i in range(5))  # every frame moves
    assert np.array_equal(q[4][body], w[1][body])
    assert np.abs(q[2][body] - w[1][body]).sum() > 0  # (the control: half a max step is elsewhere)


@pytest.mark.gl
def test_pbo_readback_matches_the_viewers_own_readback(gl_env, tmp_path):
    """The ring's bottom-up copy flips rows exactly like vispy's read(); frames come out in order."""
    from app.commands.assembly import make_backend
    from app.render.canvas import Viewer
    from app.render.readback import PboCapture
    from app.scene import load_scene

    scene = load_scene("plummer", {"initial.n": 200, "run.backend": "cpu"})
    backend = make_backend(scene)
    v = Viewer(scene, backend, size=(96, 64), headless=True)
    try:
        ref = v.render_to_array((96, 64))
        cap = PboCapture(v, (96, 64), depth=3)
        got = []
        for i in range(5):
            ready = cap.capture(lambda size: v.draw_scene(size, overlays=False), meta=i)
            assert len(ready) == (1 if i >= 2 else 0)  # frame i - 2 comes back while i is drawn
            got += ready
        got += cap.drain()
        assert [m for _, m in got] == [0, 1, 2, 3, 4]
        assert all(np.array_equal(img[..., :3], ref) for img, _ in got)
        cap.close()

        # the live viewer's way: Recorder.capture(viewer) each drawn frame, never blocking on the encoder
        from app.render.recorder import Recorder

        rec = Recorder((96, 64), fps=30, block=False, hud=True).start(tmp_path / "live.mp4")
        for _ in range(8):
            v.advance()
            rec.capture(v)
        res = rec.stop()
        assert res.frames + res.dropped == 8 and res.frames >= 1
        frames, info = decode(tmp_path / "live.mp4")
        assert len(frames) == res.frames and info["size"] == (96, 64)
    finally:
        v.close()
        backend.close()


# --------------------------------------------------------------------------------------------------
# Recorder API (what the live viewer's Record button uses)


def test_recorder_api_start_add_frame_stop(tmp_path):
    from app.render.recorder import Recorder

    rec = Recorder((64, 48), fps=24, crf=0, hud=True)
    rec.start(tmp_path / "api.mp4")
    assert rec.recording and [p.name.endswith(".part") for p in tmp_path.iterdir()] == [True]
    for i in range(5):
        img = np.zeros((48, 64, 4), np.uint8)
        img[:, :, 1] = 40 * i
        assert rec.add_frame(img)
    res = rec.stop()
    assert not rec.recording and res.frames == 5 and res.size == (64, 48) and res.path == tmp_path / "api.mp4"
    frames, info = decode(res.path)
    assert len(frames) == 5 and info["rate"] == 24
    assert [round(float(f[40:, :, 1].mean())) for f in frames] == pytest.approx([0, 40, 80, 120, 160], abs=3)
    assert frames[0][:10, :30].max() > 100  # the HUD text
    assert rec.last_frame is not None

    # nothing recorded -> nothing written; abort() removes the partial file
    rec2 = Recorder((64, 48)).start(tmp_path / "empty.mp4")
    with pytest.raises(RuntimeFault, match="no frames"):
        rec2.stop()
    rec3 = Recorder((64, 48)).start(tmp_path / "aborted.mp4")
    rec3.add_frame(np.zeros((48, 64, 3), np.uint8))
    rec3.abort()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["api.mp4"]
    with pytest.raises(ValueError, match="uint8"):
        Recorder((64, 48)).start(tmp_path / "x.mp4").add_frame(np.zeros((48, 64), np.float32))


def test_non_blocking_recorder_says_when_its_queue_is_full_and_counts_drops(tmp_path, monkeypatch):
    """The public accessors the live viewer decides with (no reading the recorder's worker)."""
    import threading

    from app.render import encoder
    from app.render.recorder import Recorder

    gate = threading.Event()
    real = encoder.VideoEncoder._process

    def stalled(self, img, info):  # the encoder is busy until the gate opens
        gate.wait(10)
        real(self, img, info)

    monkeypatch.setattr(encoder.VideoEncoder, "_process", stalled)
    rec = Recorder((64, 48), fps=30, queue_size=2, block=False)
    assert not rec.queue_full and rec.dropped == 0  # not recording
    rec.start(tmp_path / "busy.mp4")
    accepted = [rec.add_frame(np.zeros((48, 64, 3), np.uint8)) for _ in range(6)]
    # one frame in the (stalled) worker, two in the queue: the rest were dropped, not waited for
    assert rec.queue_full and accepted.count(False) == rec.dropped >= 3
    gate.set()
    res = rec.stop()
    assert res.dropped == 6 - res.frames and not rec.queue_full and rec.dropped == 0


def test_full_disk_while_encoding_is_one_line_and_removes_the_partial_file(tmp_path, monkeypatch):
    import errno

    from app.render import encoder
    from app.render.recorder import Recorder

    calls = []

    def full(self, packets):
        for _ in packets:
            calls.append(1)
            if len(calls) > 2:
                raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(encoder.VideoEncoder, "_mux", full)
    rec = Recorder((64, 48), fps=30).start(tmp_path / "full.mp4")
    rng = np.random.default_rng(1)
    with pytest.raises(RuntimeFault) as err:
        for _ in range(200):
            rec.add_frame(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8))
        rec.stop()
    msg = str(err.value)
    assert "\n" not in msg and "disk is full" in msg and "full.mp4" in msg
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------------------------------
# faults through the command line


@pytest.mark.gl
def test_unwritable_targets_fail_with_one_line_and_exit_1(gl_env, tmp_path, capsys):
    (tmp_path / "a_file").write_text("x")
    bad = [
        # Tests run as root, and root writes into a chmod 0555 directory anyway. sysfs refuses to create
        # files even for root (EACCES), so /sys stands in for a read-only directory; the real read-only
        # bind mount is in test_read_only_mount_and_full_disk_in_a_private_namespace.
        Path("/sys/nbody_clip.mp4"),
        tmp_path / "a_file" / "clip.mp4",  # the parent is a regular file
        tmp_path / "no" / "such" / "dir" / "clip.mp4",
    ]
    for out in bad:
        rc, _, err = run_cli(capsys, *SMALL, "--frames", "2", "--out", str(out))
        assert rc == 1
        line = one_error_line(err)
        assert str(out) in line and "cannot write" in line
    rc, _, err = run_cli(capsys, *SMALL, "--frames", "2", "--frames-dir", str(tmp_path / "a_file" / "d"))
    assert rc == 1 and "cannot write frames" in one_error_line(err)
    rc, _, err = run_cli(capsys, *SMALL, "--still", "1", "--out", "/sys/nbody_still.png")
    assert rc == 1 and "/sys/nbody_still.png" in one_error_line(err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_bad_recording_flags_are_one_line_exit_2(capsys, tmp_path):
    for argv, words in (
        (["--quality", "60"], ["--quality", "51"]),
        (["--camera", str(tmp_path / "nope.toml")], ["nope.toml", "does not exist"]),
        (["--camera", "keys"], ["camera.keys"]),
        (["--orbit-elevation", "95"], ["camera.orbit_elevation", "89"]),
        (["--still", "1", "--frames", "3"], ["--still"]),
    ):
        rc, _, err = run_cli(capsys, *SMALL, *argv, "--out", str(tmp_path / "x.mp4"))
        assert rc == 2, argv
        line = one_error_line(err)
        for w in words:
            assert w in line, (w, line)
    assert list(tmp_path.iterdir()) == []


def _cli(*argv) -> list[str]:
    return [sys.executable, "-m", "app", "record", *argv]


@pytest.mark.gl
def test_sigterm_finalises_a_playable_file_with_the_frames_so_far(gl_env, tmp_path, capsys):
    out = tmp_path / "long.mp4"
    env = dict(os.environ, NBODY_HEADLESS="1", PYTHONUNBUFFERED="1")
    args = [*SMALL, "--quality", "0", "--camera", "orbit"]  # lossless: frames compare exactly
    p = subprocess.Popen(
        _cli(*args, "--frames", "100000", "--out", str(out)),
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = p.stdout.readline()
        assert first.startswith("recording "), first + p.stderr.read()
        # x264 emits its first packet after its lookahead (tens of frames): wait for bytes in the partial file
        wait_for(
            lambda: any(f.stat().st_size for f in tmp_path.glob(".long.mp4.*.part")),
            "the first encoded bytes in the partial file",
        )
        p.send_signal(signal.SIGTERM)
        rest, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 143, err
    assert "Traceback" not in err
    kept_line = next(ln for ln in rest.splitlines() if ln.startswith("interrupted"))
    kept = int(kept_line.split("kept ")[1].split()[0])
    assert kept >= 3 and "SIGTERM" in kept_line
    assert sorted(x.name for x in tmp_path.iterdir()) == ["long.mp4"]
    frames, info = decode(out)
    assert len(frames) == kept and info["size"] == (160, 96)
    # and they are the first `kept` frames of an uninterrupted recording
    ref = tmp_path / "ref.mp4"
    assert main(["record", *args, "--frames", str(kept), "--out", str(ref)]) == 0
    capsys.readouterr()
    ref_frames, _ = decode(ref)
    assert all(np.array_equal(a, b) for a, b in zip(frames, ref_frames, strict=True))


def _namespace_works() -> bool:
    if not shutil.which("unshare"):
        return False
    r = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    return r.returncode == 0


@pytest.mark.gl
@pytest.mark.skipif(not _namespace_works(), reason="needs `unshare -rm` (user + mount namespaces)")
def test_read_only_mount_and_full_disk_in_a_private_namespace(gl_env, tmp_path):
    """A real read-only directory (a read-only bind mount) and a real full disk (a 16 KiB tmpfs), made in
    a private user+mount namespace so nothing outside the test sees them."""
    ro, full = tmp_path / "ro", tmp_path / "full"
    ro.mkdir()
    full.mkdir()
    rec = " ".join(_cli(*SMALL, "--quality", "0"))
    script = f"""
set -u
mount --bind {ro} {ro} && mount -o remount,bind,ro {ro} {ro} || exit 90
mount -t tmpfs -o size=16k tmpfs {full} || exit 91
cd {ROOT}
{rec} --frames 2 --out {ro}/clip.mp4 2>{tmp_path}/ro.err; echo "ro_rc=$?"
{rec} --frames 40 --camera orbit --out {full}/clip.mp4 2>{tmp_path}/full.err; echo "full_rc=$?"
echo "full_ls=$(ls -A {full} | tr '\\n' ' ')"
"""
    r = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, NBODY_HEADLESS="1"),
    )
    if r.returncode in (90, 91):
        pytest.skip(f"mounts not permitted in a user namespace here: {r.stderr.strip()}")
    out = dict(ln.split("=", 1) for ln in r.stdout.splitlines() if "=" in ln)
    assert out["ro_rc"] == "1", r.stdout
    line = one_error_line((tmp_path / "ro.err").read_text())
    assert "Read-only file system" in line and str(ro) in line
    assert out["full_rc"] == "1", r.stdout
    line = one_error_line((tmp_path / "full.err").read_text())
    assert "disk is full" in line and "partial output was removed" in line
    assert out["full_ls"].strip() == ""  # no file left behind, complete-looking or not


# --------------------------------------------------------------------------------------------------
# signals (in-process)


def test_interrupt_guard_first_signal_stops_second_abandons():
    from app.render.recorder import InterruptGuard

    before = signal.getsignal(signal.SIGTERM)
    with InterruptGuard() as g:
        assert not g.stop
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
        assert g.stop and g.signum == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
    assert signal.getsignal(signal.SIGTERM) is before


# --------------------------------------------------------------------------------------------------
# camera paths (pure numpy)


KEYS = [
    {"t": 0.0, "position": [0.0, -10.0, 2.0], "target": [0, 0, 0], "fov": 40.0},
    {"t": 1.0, "position": [10.0, 0.0, 4.0], "fov": 60.0},
    {"t": 3.0, "position": [0.0, 10.0, 1.0], "target": [1.0, 1.0, 0.0]},
    {"t": 3.5, "position": [-5.0, 5.0, 5.0], "fov": 20.0},
]


def base_camera():
    return OrbitCamera(azimuth=30.0, elevation=20.0, distance=8.0, target=(0.5, 0.0, 0.0), fov=45.0)


def test_keyframed_path_passes_through_its_keys_smoothly():
    path = cp.KeyframePath(base_camera(), config.parse_keys(KEYS))
    defaults_target = [np.zeros(3), [0.5, 0.0, 0.0], [1.0, 1.0, 0.0], [0.5, 0.0, 0.0]]
    defaults_fov = [40.0, 60.0, 45.0, 20.0]
    cam = OrbitCamera()
    for k, tgt, fov in zip(KEYS, defaults_target, defaults_fov, strict=True):
        pose = path.pose(k["t"])
        np.testing.assert_allclose(pose.eye, k["position"], atol=1e-12)
        np.testing.assert_allclose(pose.target, tgt, atol=1e-12)
        assert pose.fov == pytest.approx(fov)
        path.apply(cam, k["t"])  # and an OrbitCamera posed from it sits there, looking at the target
        np.testing.assert_allclose(cam.eye, k["position"], atol=1e-9)
        np.testing.assert_allclose(cam.target, tgt, atol=1e-12)
        assert cam.fov == pytest.approx(fov)
    # C1: the velocity is continuous through the inner keys; the ends ease (zero velocity)
    h = 1e-6
    for t in (1.0, 3.0):
        v_left = (path.pose(t).eye - path.pose(t - h).eye) / h
        v_right = (path.pose(t + h).eye - path.pose(t).eye) / h
        np.testing.assert_allclose(v_left, v_right, atol=1e-3)
        assert np.linalg.norm(v_left) > 1
    assert np.linalg.norm(path.pose(h).eye - path.pose(0).eye) / h < 1e-3
    # Catmull-Rom tangent at key 1: (p2 - p0) / (t2 - t0)
    np.testing.assert_allclose(
        (path.pose(1 + h).eye - path.pose(1 - h).eye) / (2 * h),
        (np.array(KEYS[2]["position"]) - KEYS[0]["position"]) / 3.0,
        atol=1e-4,
    )
    # fov: smoothstep, half way at the middle of a segment, flat at the keys
    assert path.pose(0.5).fov == pytest.approx(50.0)
    assert path.pose(0.25).fov == pytest.approx(40 + 20 * (3 * 0.25**2 - 2 * 0.25**3))
    # holds before the first and after the last key
    np.testing.assert_allclose(path.pose(-1.0).eye, KEYS[0]["position"])
    np.testing.assert_allclose(path.pose(99.0).eye, KEYS[-1]["position"])


def test_orbit_and_static_paths_depend_on_video_time_only():
    base = base_camera()
    orbit = cp.OrbitPath(base, speed=20.0, elevation=35.0)
    cam = OrbitCamera()
    orbit.apply(cam, 2.0)
    assert cam.azimuth == pytest.approx(70.0) and cam.elevation == 35.0 and cam.distance == 8.0
    orbit.apply(cam, 9.0)  # 30 + 180 wraps to -150
    assert cam.azimuth == pytest.approx(-150.0)
    cp.StaticPath(base).apply(cam, 5.0)
    assert (cam.azimuth, cam.elevation, cam.fov) == (30.0, 20.0, 45.0)


@pytest.mark.parametrize(
    "keys,words",
    [
        (
            [{"t": 0, "position": [0, 0, 1]}, {"t": 0, "position": [0, 1, 1]}],
            ["camera.keys[1].t", "increase"],
        ),
        ([{"t": 0}], ["camera.keys[0].position", "must be set"]),
        ([{"position": [1, 2, 3]}], ["camera.keys[0].t"]),
        ([{"t": 0, "position": [1, 2]}], ["camera.keys[0].position", "three numbers"]),
        ([{"t": 0, "position": [1, 2, 3], "fov": 200}], ["camera.keys[0].fov", "<= 170"]),
        ([{"t": -1, "position": [1, 2, 3]}], ["camera.keys[0].t", ">= 0"]),
        ([{"t": 0, "position": [1, 2, 3], "zoom": 2}], ["camera.keys[0]", "'zoom'", "fov"]),
        ([{"t": 0, "position": [1, 2, 3], "target": [1, 2, 3]}], ["camera.keys[0]", "same point"]),
        ([], ["camera.keys", "one or more"]),
        ("0,0,0", ["camera.keys", "[[camera.keys]]"]),
    ],
)
def test_keyframes_are_validated_with_the_key_named(keys, words):
    with pytest.raises(ConfigError) as err:
        config.parse_keys(keys)
    for w in words:
        assert w in str(err.value), (w, str(err.value))


def test_camera_keys_in_the_scene_toml_and_in_a_file(tmp_path):
    from app.scene import load_scene

    scene_file = tmp_path / "s.toml"
    scene_file.write_text(
        '[initial]\ngenerator = "plummer"\nn = 64\n[camera]\npath = "keys"\n'
        "orbit_speed = 30\n[[camera.keys]]\nt = 0.0\nposition = [0, -5, 1]\n"
        "[[camera.keys]]\nt = 2.0\nposition = [5, 0, 1]\nfov = 30\n"
    )
    scene = load_scene(str(scene_file))
    assert scene.camera.path == "keys" and scene.camera.orbit_speed == 30.0
    assert [k.t for k in scene.camera.keys] == [0.0, 2.0] and scene.camera.keys[1].fov == 30.0
    path = cp.make_path(scene.camera, base_camera())
    assert isinstance(path, cp.KeyframePath) and len(path.keys) == 2

    scene_file.write_text('[camera]\npath = "keys"\n[[camera.keys]]\nt = 1.0\n')
    with pytest.raises(ConfigError, match=r"s\.toml: camera\.keys\[0\]\.position must be set"):
        load_scene(str(scene_file))
    scene_file.write_text('[camera]\npath = "keys"\n')
    with pytest.raises(ConfigError, match=r"camera.path = 'keys' needs \[\[camera.keys\]\]"):
        load_scene(str(scene_file))

    flight = tmp_path / "flight.toml"
    flight.write_text(FLIGHT)
    keys = config.load_keys_file(flight)
    assert [k.t for k in keys] == [0.0, 0.1, 0.2] and keys[1].target == (0.3, 0.0, 0.0)
    flight.write_text("[[keys]]\nt = 0.0\nposition = [0, 0, 1]\nfov = 0.5\n")
    with pytest.raises(ConfigError, match=r"flight\.toml: keys\[0\]\.fov"):
        config.load_keys_file(flight)
    flight.write_text("[camera]\nfov = 3\n")
    with pytest.raises(ConfigError, match="no \\[\\[keys\\]\\] tables"):
        config.load_keys_file(flight)


def test_record_help_teaches_every_flag(capsys):
    with pytest.raises(SystemExit) as e:
        main(["record", "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for flag in (
        "--out",
        "--size",
        "--fps",
        "--seconds",
        "--frames",
        "--steps-per-frame",
        "--camera",
        "--orbit-speed",
        "--orbit-elevation",
        "--hud",
        "--no-hud",
        "--backend",
        "--kernel",
        "--quality",
        "--preset",
        "--frames-dir",
        "--still",
        "--pbo-ring",
        "--window",
        "examples:",
        "[[keys]]",
        "130 / 143",
    ):
        assert flag in text, flag
