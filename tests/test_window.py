"""A real glfw window under Xvfb (pytest-xvfb provides $DISPLAY): drag it with xdotool, see the image
change, then quit with Escape or a window-manager close (WM_DELETE_WINDOW) and exit with status 0.

Screenshots: Pillow's `ImageGrab.grab(xdisplay=...)` (its XCB support reads the X root window, i.e.
what the X server shows), cropped to the window's geometry from `xdotool getwindowgeometry`.
The subprocess is the real `nbody-live run` (CPU backend, no panel) on a Plummer sphere whose time
step is so small that the cloud stands still, so any change in the picture comes from the camera.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from waiting import BOUND_S, wait_for

ROOT = Path(__file__).resolve().parent.parent
TITLE = "NBody Live"
# every xdotool call and screen grab is a new X connection, and Xvfb refuses some when they come fast
# (about one in eight, back to back): poll the window at a pace that leaves the demo's own connection be
X_POLL_S = 0.25

pytestmark = [
    pytest.mark.gl,
    pytest.mark.skipif(not (shutil.which("xdotool") and shutil.which("Xvfb")),
                       reason="needs xdotool and Xvfb (Debian: apt-get install xdotool xvfb)"),
]


@pytest.fixture
def display() -> str:
    d = os.environ.get("DISPLAY")
    if not d:
        pytest.skip("no $DISPLAY: pytest-xvfb did not start Xvfb (or ran with --no-xvfb)")
    from PIL import features

    if not features.check("xcb"):
        pytest.skip("Pillow was built without XCB support: ImageGrab cannot read the X screen")
    return d


def xdotool(*args: str, timeout: float = 15) -> str:
    return x_retry(lambda: subprocess.run(["xdotool", *args], check=True, capture_output=True, text=True,
                                          timeout=timeout).stdout)


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


class Demo:
    """The demo window as a subprocess, found by its pid and title."""

    def __init__(self, tmp_path: Path, display: str, *extra: str):
        env = os.environ.copy()
        env["DISPLAY"] = display
        # a desktop session: no headless forcing, no EGL settings inherited from this test process
        for key in ("NBODY_HEADLESS", "PYOPENGL_PLATFORM", "EGL_PLATFORM", "WAYLAND_DISPLAY"):
            env.pop(key, None)
        self.log = tmp_path / "demo.log"
        self._log_file = open(self.log, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app", "run", "plummer", "--n", "3000", "--dt", "1e-9", "--backend", "cpu",
             "--size", "480x320", "--no-panel", *extra],
            cwd=ROOT, env=env, stdout=self._log_file, stderr=subprocess.STDOUT)
        self.window = self._find_window()
        geo = xdotool("getwindowgeometry", "--shell", self.window)
        vals = dict(line.split("=", 1) for line in geo.split() if "=" in line)
        self.x, self.y, self.w, self.h = (int(vals[k]) for k in ("X", "Y", "WIDTH", "HEIGHT"))

    def _find_window(self) -> str:
        def window() -> str | None:
            if self.proc.poll() is not None:
                pytest.fail(f"demo exited early with {self.proc.returncode}:\n{self.output()}")
            r = subprocess.run(["xdotool", "search", "--onlyvisible", "--pid", str(self.proc.pid),
                                "--name", TITLE], capture_output=True, text=True, timeout=10)
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

    def wait_until_drawing(self) -> None:
        """Until the title shows a frame rate: the window has drawn frames (however slowly)."""
        def fps() -> bool:
            m = re.search(r"([\d.]+) FPS", self.title())
            return m is not None and float(m.group(1)) > 0

        wait_for(fps, "the window to draw frames (a frame rate in its title)", poll=X_POLL_S,
                 context=self.output)

    def still_image(self) -> np.ndarray:
        """The window's picture once it stops changing (the cloud stands still: only input moves it)."""
        shots = [self.screenshot()]

        def settled() -> bool:
            shots.append(self.screenshot())
            return shots[-1].any() and np.abs(shots[-1] - shots[-2]).mean() < 0.05

        wait_for(settled, "a still, non-empty picture in the window", poll=X_POLL_S, context=self.output)
        return shots[-1]

    def frames_drawn(self) -> int:
        m = re.search(r"drew (\d+) frames", self.output())
        return int(m.group(1)) if m else -1

    def screenshot(self) -> np.ndarray:
        from PIL import ImageGrab

        img = np.asarray(x_retry(lambda: ImageGrab.grab(xdisplay=os.environ["DISPLAY"])).convert("RGB"))
        return img[self.y:self.y + self.h, self.x:self.x + self.w].astype(np.int16)

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


def send_wm_delete(window: int, display: str) -> None:
    """What a window manager does when the user clicks the close button: a WM_DELETE_WINDOW message."""

    class XClientMessageEvent(ctypes.Structure):
        _fields_ = [("type", ctypes.c_int), ("serial", ctypes.c_ulong), ("send_event", ctypes.c_int),
                    ("display", ctypes.c_void_p), ("window", ctypes.c_ulong),
                    ("message_type", ctypes.c_ulong), ("format", ctypes.c_int), ("l", ctypes.c_long * 5)]

    class XEvent(ctypes.Union):
        _fields_ = [("xclient", XClientMessageEvent), ("pad", ctypes.c_long * 24)]

    lib = ctypes.util.find_library("X11")
    if not lib:
        pytest.skip("libX11 not found for sending WM_DELETE_WINDOW")
    x = ctypes.CDLL(lib)
    x.XOpenDisplay.restype = ctypes.c_void_p
    x.XOpenDisplay.argtypes = [ctypes.c_char_p]
    x.XInternAtom.restype = ctypes.c_ulong
    x.XInternAtom.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
    x.XSendEvent.argtypes = [ctypes.c_void_p, ctypes.c_ulong, ctypes.c_int, ctypes.c_long,
                             ctypes.POINTER(XEvent)]
    x.XFlush.argtypes = [ctypes.c_void_p]
    x.XCloseDisplay.argtypes = [ctypes.c_void_p]

    def open_display():
        dpy = x.XOpenDisplay(display.encode())
        if not dpy:
            raise OSError(f"cannot open display {display}")
        return dpy

    dpy = x_retry(open_display)
    try:
        ev = XEvent()
        ev.xclient.type = 33  # ClientMessage
        ev.xclient.window = window
        ev.xclient.message_type = x.XInternAtom(dpy, b"WM_PROTOCOLS", 0)
        ev.xclient.format = 32
        ev.xclient.l[0] = x.XInternAtom(dpy, b"WM_DELETE_WINDOW", 0)
        x.XSendEvent(dpy, window, 0, 0, ctypes.byref(ev))
        x.XFlush(dpy)
    finally:
        x.XCloseDisplay(dpy)


def test_drag_rotates_the_view_and_escape_exits_cleanly(tmp_path, display):
    shot = tmp_path / "exit.png"
    demo = Demo(tmp_path, display, "--frames", "100000", "--screenshot", str(shot))
    try:
        demo.wait_until_drawing()
        before = demo.still_image()  # also: the still cloud does not change without input
        demo.drag(150, 40)
        wait_for(lambda: np.abs(demo.screenshot() - before).mean() > 0.5, "dragging to change the view",
                 poll=X_POLL_S, context=demo.output)
        xdotool("mousemove", "--window", demo.window, str(demo.w // 2), str(demo.h // 2))
        xdotool("key", "Escape")
        rc = demo.wait()
    finally:
        demo.stop()
    out = demo.output()
    assert rc == 0, out
    assert demo.frames_drawn() >= 3, out  # before, still, dragged (the exact count: the --frames 120 test)
    from PIL import Image

    assert Image.open(shot).size == (480, 320)
    assert np.asarray(Image.open(shot)).any()


def test_run_frames_120_in_a_real_window_exits_by_itself(tmp_path, display):
    demo = Demo(tmp_path, display, "--frames", "120")
    rc = demo.wait()
    assert rc == 0, demo.output()
    assert demo.frames_drawn() == 120, demo.output()


def test_window_manager_close_exits_cleanly(tmp_path, display):
    demo = Demo(tmp_path, display)
    try:
        demo.wait_until_drawing()
        send_wm_delete(int(demo.window), display)
        rc = demo.wait()
    finally:
        demo.stop()
    assert rc == 0, demo.output()
    assert demo.frames_drawn() > 0, demo.output()


def test_sigterm_while_recording_finalises_the_file_and_exits_143(tmp_path, display):
    """The Record key V, then SIGTERM (a service manager's or `kill`'s stop): the viewer quits as on
    Escape, the recording is finalised into a playable mp4, and the status is 143 (128 + SIGTERM), as
    for `nbody-live record`."""
    import av

    rec_dir = tmp_path / "rec"
    rec_dir.mkdir()
    demo = Demo(tmp_path, display, "--record-to", str(rec_dir))
    try:
        xdotool("mousemove", "--window", demo.window, str(demo.w // 2), str(demo.h // 2))
        xdotool("key", "--window", demo.window, "v")

        def frames_recorded() -> bool:
            m = re.search(r"REC [\d:.]+ · (\d+) frames", demo.title())
            return m is not None and int(m.group(1)) >= 5

        wait_for(frames_recorded, "5 frames drawn while recording (the title's REC indicator)",
                 poll=X_POLL_S, context=demo.output)
        demo.proc.send_signal(signal.SIGTERM)
        rc = demo.wait()
    finally:
        demo.stop()
    out = demo.output()
    assert rc == 128 + signal.SIGTERM, out
    [mp4] = rec_dir.iterdir()  # the finished file only: the temporary was renamed
    assert mp4.match("recording-*.mp4") and f"wrote {mp4}" in out, out
    with av.open(str(mp4)) as c:
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    assert len(frames) >= 1 and frames[0].shape == (320, 480, 3)
