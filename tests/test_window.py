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
import re
import signal

import numpy as np
import pytest
from xwindow import NEEDS_X, Demo, x_retry, xdotool
from xwindow import display as display  # the fixture

pytestmark = [pytest.mark.gl, NEEDS_X]


def send_wm_delete(window: int, display: str) -> None:
    """What a window manager does when the user clicks the close button: a WM_DELETE_WINDOW message."""

    class XClientMessageEvent(ctypes.Structure):
        _fields_ = [
            ("type", ctypes.c_int),
            ("serial", ctypes.c_ulong),
            ("send_event", ctypes.c_int),
            ("display", ctypes.c_void_p),
            ("window", ctypes.c_ulong),
            ("message_type", ctypes.c_ulong),
            ("format", ctypes.c_int),
            ("l", ctypes.c_long * 5),
        ]

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
    x.XSendEvent.argtypes = [
        ctypes.c_void_p,
        ctypes.c_ulong,
        ctypes.c_int,
        ctypes.c_long,
        ctypes.POINTER(XEvent),
    ]
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
        demo.wait_until(
            lambda: np.abs(demo.screenshot() - before).mean() > 0.5, "dragging to change the view"
        )
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
    timings = tmp_path / "timings.csv"
    demo = Demo(tmp_path, display, "--record-to", str(rec_dir), "--timings", str(timings))
    try:
        xdotool("mousemove", "--window", demo.window, str(demo.w // 2), str(demo.h // 2))
        xdotool("key", "--window", demo.window, "v")

        def frames_recorded() -> bool:
            m = re.search(r"REC [\d:.]+ · (\d+) frames", demo.title())
            return m is not None and int(m.group(1)) >= 5

        demo.wait_until(frames_recorded, "5 frames drawn while recording (the title's REC indicator)")
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
    assert len(timings.read_text().splitlines()) >= 1 + 5  # the header, a row per frame drawn
