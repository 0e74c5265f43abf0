"""A real window of `nbody-live run` under Xvfb, driven and watched through xdotool and screen grabs.

Every wait is for something seen (a window, a frame rate in its title, a still picture) under the
generous bound of tests/waiting.py, so that a loaded machine makes the tests slower, not failing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from waiting import BOUND_S, wait_for

ROOT = Path(__file__).resolve().parent.parent
TITLE = "NBody Live"
NEEDS_X = pytest.mark.skipif(
    not (shutil.which("xdotool") and shutil.which("Xvfb")),
    reason="needs xdotool and Xvfb (Debian: apt-get install xdotool xvfb)",
)
# every xdotool call and screen grab is a new X connection, and Xvfb refuses some when they come fast
# (about one in eight, back to back): poll the window at a pace that leaves the demo's own connection be
X_POLL_S = 0.25


@pytest.fixture
def display() -> str:
    """The X display pytest-xvfb started (skips without one, or without Pillow's XCB screen grabs)."""
    d = os.environ.get("DISPLAY")
    if not d:
        pytest.skip("no $DISPLAY: pytest-xvfb did not start Xvfb (or ran with --no-xvfb)")
    from PIL import features

    if not features.check("xcb"):
        pytest.skip("Pillow was built without XCB support: ImageGrab cannot read the X screen")
    return d


def xdotool(*args: str, timeout: float = 15) -> str:
    return x_retry(
        lambda: (
            subprocess.run(
                ["xdotool", *args], check=True, capture_output=True, text=True, timeout=timeout
            ).stdout
        )
    )


def x_retry(call, attempts: int = 5):
    """`call()`, again after a pause if it fails: Xvfb under load closes some new connections at once
    (every xdotool call and screen grab is one)."""
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except (subprocess.CalledProcessError, OSError):
            if attempt == attempts:
                raise
            time.sleep(0.3 * attempt)


# the demo: a Plummer sphere whose time step is so small that the cloud stands still
DEMO_ARGS = ("plummer", "--n", "3000", "--dt", "1e-9", "--backend", "cpu", "--size", "480x320", "--no-panel")


class Demo:
    """`nbody-live run` in a real window as a subprocess, found by its pid and title. With a `launcher`
    (mpiexec -n R) the window is rank 0's, a child of the launcher: found by its title alone."""

    def __init__(
        self,
        tmp_path: Path,
        display: str,
        *extra: str,
        args: tuple[str, ...] = DEMO_ARGS,
        launcher: tuple[str, ...] = (),
    ):
        self.launcher = launcher
        env = os.environ.copy()
        env["DISPLAY"] = display
        # a desktop session: no headless forcing, no EGL settings inherited from this test process
        for key in ("NBODY_HEADLESS", "PYOPENGL_PLATFORM", "EGL_PLATFORM", "WAYLAND_DISPLAY"):
            env.pop(key, None)
        self.log = tmp_path / "demo.log"
        self._log_file = open(self.log, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [*launcher, sys.executable, "-m", "app", "run", *args, *extra],
            cwd=ROOT,
            env=env,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )
        self.window = self._find_window()
        geo = xdotool("getwindowgeometry", "--shell", self.window)
        vals = dict(line.split("=", 1) for line in geo.split() if "=" in line)
        self.x, self.y, self.w, self.h = (int(vals[k]) for k in ("X", "Y", "WIDTH", "HEIGHT"))

    def _find_window(self) -> str:
        def window() -> str | None:
            if self.proc.poll() is not None:
                pytest.fail(f"demo exited early with {self.proc.returncode}:\n{self.output()}")
            owner = () if self.launcher else ("--pid", str(self.proc.pid))
            r = subprocess.run(
                ["xdotool", "search", "--onlyvisible", *owner, "--name", TITLE],
                capture_output=True,
                text=True,
                timeout=10,
            )
            ids = r.stdout.split()
            return ids[-1] if ids else None

        return wait_for(window, f"a window titled {TITLE!r}", poll=X_POLL_S, context=self.output)

    def output(self) -> str:
        if not self._log_file.closed:
            self._log_file.flush()
        return self.log.read_text()

    def title(self) -> str:
        """The window's title (FPS, kernel, the REC indicator); fails if the demo has exited."""
        if self.proc.poll() is not None:
            pytest.fail(f"demo exited early with {self.proc.returncode}:\n{self.output()}")
        return xdotool("getwindowname", self.window)

    def wait_until(self, condition, what: str):
        """`wait_for` at the pace of X connections, with the demo's output if it times out."""
        return wait_for(condition, what, poll=X_POLL_S, context=self.output)

    def wait_until_drawing(self) -> None:
        """Until the title shows a frame rate: the window has drawn frames (however slowly)."""

        def fps() -> bool:
            m = re.search(r"([\d.]+) FPS", self.title())
            return m is not None and float(m.group(1)) > 0

        self.wait_until(fps, "the window to draw frames (a frame rate in its title)")

    def still_image(self) -> np.ndarray:
        """The window's picture once it stops changing (the cloud stands still: only input moves it)."""
        shots = [self.screenshot()]

        def settled() -> bool:
            shots.append(self.screenshot())
            return shots[-1].any() and np.abs(shots[-1] - shots[-2]).mean() < 0.05

        self.wait_until(settled, "a still, non-empty picture in the window")
        return shots[-1]

    def frames_drawn(self) -> int:
        m = re.search(r"drew (\d+) frames", self.output())
        return int(m.group(1)) if m else -1

    def screenshot(self) -> np.ndarray:
        from PIL import ImageGrab

        img = np.asarray(x_retry(lambda: ImageGrab.grab(xdisplay=os.environ["DISPLAY"])).convert("RGB"))
        return img[self.y : self.y + self.h, self.x : self.x + self.w].astype(np.int16)

    def click_at(self, rect) -> None:
        """A left click at the centre of `rect` (a headless layout's item rect, headless_panel)."""
        x0, y0, x1, y1 = rect
        xdotool("mousemove", "--window", self.window, str(int((x0 + x1) / 2)), str(int((y0 + y1) / 2)))
        time.sleep(0.3)  # (input pacing: ImGui sees the hover on a frame before the click)
        xdotool("click", "1")
        time.sleep(0.8)

    def screenshot_and_quit(self, path: Path) -> tuple[np.ndarray, int]:
        """The X screen saved to `path`, then Escape with the pointer off the panel; (the screenshot, the
        exit status)."""
        shot = self.screenshot().astype(np.uint8)
        from PIL import Image

        Image.fromarray(shot).save(path)
        xdotool("mousemove", "--window", self.window, str(self.w - 50), str(self.h // 2))
        xdotool("key", "Escape")
        return shot, self.wait()

    def drag(self, dx: int, dy: int, steps: int = 12) -> None:
        xdotool("mousemove", "--window", self.window, str(self.w // 2), str(self.h // 2))
        xdotool("mousedown", "1")
        for _ in range(steps):
            xdotool("mousemove_relative", "--", str(dx // steps), str(dy // steps))
            time.sleep(0.02)
        time.sleep(0.2)  # stop before releasing: no inertia, the image settles
        xdotool("mouseup", "1")

    def wait(self, timeout: float = BOUND_S) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self.stop()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._log_file.close()


@contextmanager
def headless_panel(width: int, height: int):
    """(viewer, panel) laid out headless (EGL) in this process at width x height, paused, after three
    frames: where the real window of that size draws each widget (a skip where there is no GL)."""
    from app.render import gl_setup

    try:
        gl_setup.configure(headless=True)
        from app.commands.assembly import make_backend
        from app.render.canvas import Viewer
        from app.scene import load_scene
        from app.ui import Panel
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"no headless GL to lay the panel out: {type(e).__name__}: {e}")
    scene = load_scene("plummer", {"initial.n": 1024, "run.backend": "cpu"})
    viewer = Viewer(scene, make_backend(scene), size=(width, height), headless=True)
    panel = Panel(viewer)
    try:
        viewer.toggle_pause()
        for _ in range(3):
            viewer.step_and_render()
        yield viewer, panel
    finally:
        panel.close()
        backend = viewer.backend
        viewer.close()
        backend.close()
