"""A/B in a real glfw window under Xvfb (pytest-xvfb provides $DISPLAY), as tests/test_panel_window.py
drives the kernel combo: xdotool clicks open the Compare tab, pick kernel B in its combo and tick "A/B on";
the app's own report after Escape gives both kernels' force times, B / A and the difference, and a
screenshot of the X screen shows the tab's table lit where the headless layout put it.

Where to click: the panel's layout is deterministic for a given size, so the same panel is first laid out
headless (EGL, in this process), its Compare tab and kernel-B combo opened by synthesised events, and
`panel.item_rects` read; the real window (another process, the glfw backend) is clicked at those spots.
"""

from __future__ import annotations

import re
import time

import pytest
from xwindow import NEEDS_X, Demo, headless_panel
from xwindow import display as display  # the fixture

W, H = 900, 760
ARGS = ("plummer", "--n", "1024", "--backend", "cpu", "--size", f"{W}x{H}")

pytestmark = [pytest.mark.gl, NEEDS_X]


def _click_headless(viewer, rect) -> None:
    x0, y0, x1, y1 = rect
    pos = ((x0 + x1) / 2, (y0 + y1) / 2)
    ev = viewer.events
    ev.mouse_move(pos=pos, button=None, buttons=[], modifiers=())
    viewer.step_and_render()
    viewer.step_and_render()
    ev.mouse_press(pos=pos, button=1, buttons=[1], modifiers=())
    viewer.step_and_render()
    viewer.step_and_render()
    ev.mouse_release(pos=pos, button=1, buttons=[], modifiers=())
    for _ in range(4):
        viewer.step_and_render()


@pytest.fixture(scope="module")
def layout() -> dict:
    """item_rects of the panel at W x H: the Compare tab shown, its kernel-B combo open, then B picked."""
    with headless_panel(W, H) as (viewer, panel):
        rects = dict(panel.item_rects)
        _click_headless(viewer, rects["tab:Compare"])
        rects.update(panel.item_rects)
        _click_headless(viewer, rects["compare:kernel_b"])
        rects.update({k: v for k, v in panel.item_rects.items() if k.startswith("compare:kernel_b=")})
        # picking B leaves a line in the panel's summary, which moves what is below it: the checkbox is
        # where it is drawn after the pick
        _click_headless(viewer, rects["compare:kernel_b=cpu-fp64"])
        rects["compare:on"] = panel.item_rects["compare:on"]
    assert "compare:kernel_b=cpu-fp64" in rects and "compare:on" in rects, sorted(rects)
    return rects


def test_xdotool_clicks_turn_ab_on_and_the_run_reports_both_kernels(tmp_path, display, layout):
    demo = Demo(tmp_path, display, "--screenshot", str(tmp_path / "exit.png"), args=ARGS)
    try:
        assert (demo.w, demo.h) == (W, H)
        demo.wait_until_drawing()
        for target in ("tab:Compare", "compare:kernel_b", "compare:kernel_b=cpu-fp64", "compare:on"):
            demo.click_at(layout[target])
        time.sleep(2.0)  # frames with A/B on
        shot, rc = demo.screenshot_and_quit(tmp_path / "screen.png")
    finally:
        demo.stop()
    output = demo.output()
    assert rc == 0, output
    m = re.search(
        r"^A/B at N = 1,024: cpu-simd ([0-9.]+) ms vs cpu-fp64 ([0-9.]+) ms a force evaluation "
        r"\(B/A ([0-9.]+)x\); \|a_A - a_B\| / \|a_B\| over 1,024 bodies: "
        r"median ([0-9.e+-]+), p99 ([0-9.e+-]+)",
        output,
        re.M,
    )
    assert m, output
    a_ms, b_ms, ratio, median, p99 = (float(g) for g in m.groups())
    assert a_ms > 0 and b_ms > 0 and ratio == pytest.approx(b_ms / a_ms, rel=0.02, abs=0.01)
    assert 0 < median <= p99 < 1e-5  # cpu-simd's float32 sums against float64: round-off
    # the tab's table (A, B, B / A, median, p99) is drawn below the checkbox: lit text there
    x0, _, _, y1 = layout["compare:on"]
    table = shot[int(y1) + 4 : int(y1) + 100, int(x0) : int(x0) + 400].astype(float)
    assert (table.max(axis=2) > 120).mean() > 0.01, "no A/B table drawn"
