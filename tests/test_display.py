"""Display detection: a $DISPLAY that names no server (a stale one, over SSH or in a container) is no
display: `run` falls back to headless EGL (or the demo recording) with one log line saying why, `info`
opens an EGL context, and nothing ends in a glfw traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.render import gl_setup

ROOT = Path(__file__).resolve().parent.parent


def dead_display() -> str:
    """A display number no X server listens on here."""
    n = next(n for n in range(55, 200) if not Path(f"/tmp/.X11-unix/X{n}").exists())
    return f":{n}"


def env_with(display: str | None) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DISPLAY", "WAYLAND_DISPLAY", "NBODY_HEADLESS", "PYOPENGL_PLATFORM", "EGL_PLATFORM")
    }
    if display is not None:
        env["DISPLAY"] = display
    return env


def nbody(*args: str, display: str | None, cwd=ROOT, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        cwd=cwd,
        env=env_with(display),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_display_problem_names_what_is_missing(monkeypatch):
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    assert "unset" in gl_setup.display_problem() and not gl_setup.has_display()
    dead = dead_display()
    monkeypatch.setenv("DISPLAY", dead)
    assert f"cannot open display $DISPLAY='{dead}'" in gl_setup.display_problem()
    monkeypatch.setenv("WAYLAND_DISPLAY", "wayland-nowhere")
    why = gl_setup.display_problem()
    assert "no Wayland socket 'wayland-nowhere'" in why and dead in why and not gl_setup.has_display()


def test_a_live_display_is_one(monkeypatch):
    live = os.environ.get("DISPLAY")
    if not live:
        pytest.skip("no $DISPLAY: pytest-xvfb did not start Xvfb (or ran with --no-xvfb)")
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    assert gl_setup.display_problem() is None and gl_setup.has_display()


@pytest.mark.gl
def test_run_frames_with_a_stale_display_renders_headless(tmp_path):
    dead = dead_display()
    r = nbody(
        "run", "plummer", "--n", "128", "--backend", "cpu", "--frames", "3", "--size", "64x64", display=dead
    )
    assert r.returncode == 0 and "drew 3 frames" in r.stdout, r.stderr
    assert "Traceback" not in r.stderr and "glfw" not in r.stderr, r.stderr
    why = [line for line in r.stderr.splitlines() if "cannot open display" in line]
    assert len(why) == 1 and dead in why[0] and "headless (EGL)" in why[0], r.stderr


@pytest.mark.gl
def test_info_with_a_stale_display_reports_the_egl_context():
    dead = dead_display()
    r = nbody("info", display=dead)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    [gl] = [line for line in r.stdout.splitlines() if line.startswith("GL:")]
    assert "no context" not in gl and "via egl" in gl and f"cannot open display $DISPLAY='{dead}'" in gl, gl


def test_the_no_display_demo_refuses_outputs_it_would_not_write(tmp_path):
    r = nbody("run", "--backend", "cpu", "--timings", str(tmp_path / "t.csv"), display=dead_display())
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "cannot open display" in lines[-1] and "--frames N" in lines[-1], r.stderr
    assert list(tmp_path.iterdir()) == []


def test_record_window_with_a_stale_display_says_why(tmp_path):
    r = nbody(
        "record",
        "--backend",
        "cpu",
        "--window",
        "--frames",
        "2",
        "--out",
        str(tmp_path / "r.mp4"),
        display=dead_display(),
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "--window needs a display (cannot open display" in r.stderr.strip().splitlines()[-1], r.stderr
    assert list(tmp_path.iterdir()) == []  # the video's temporary was removed
