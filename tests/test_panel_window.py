"""The panel in a real glfw window under Xvfb (pytest-xvfb provides $DISPLAY): xdotool clicks open the
kernel combo and pick cpu-fp64, a screenshot of the X screen shows the panel, and the app's own summary
after Escape shows the switch and non-zero kernel timings.

Where to click: the panel's layout is deterministic for a given size, so this test first lays the same
panel out headless (EGL, in this process) and reads `panel.item_rects`, then clicks those spots in the
real window (a different process, the glfw backend).
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest
from xwindow import NEEDS_X, Demo, headless_panel
from xwindow import display as display  # the fixture

ROOT = Path(__file__).resolve().parent.parent
W, H = 900, 640

pytestmark = [pytest.mark.gl, NEEDS_X]


@pytest.fixture(scope="module")
def layout() -> dict:
    """item_rects of the panel at W x H with its kernel combo open, laid out headless in this process."""
    with headless_panel(W, H) as (viewer, panel):
        rects = dict(panel.item_rects)
        x0, y0, x1, y1 = rects["kernel_combo"]
        pos = ((x0 + x1) / 2, (y0 + y1) / 2)
        ev = viewer.events
        ev.mouse_move(pos=pos, button=None, buttons=[], modifiers=())
        for step in (
            lambda: ev.mouse_press(pos=pos, button=1, buttons=[1], modifiers=()),
            lambda: ev.mouse_release(pos=pos, button=1, buttons=[], modifiers=()),
        ):
            viewer.step_and_render()
            step()
        for _ in range(5):
            viewer.step_and_render()
        rects.update(panel.item_rects)
    assert "kernel:cpu-fp64" in rects, sorted(rects)
    return rects


def test_xdotool_clicks_switch_the_kernel_in_a_real_window(tmp_path, display, layout):
    timings = tmp_path / "timings.csv"
    demo = Demo(
        tmp_path,
        display,
        "--timings",
        str(timings),
        "--screenshot",
        str(tmp_path / "exit.png"),
        args=("plummer", "--n", "1024", "--backend", "cpu", "--size", f"{W}x{H}"),
    )
    try:
        assert (demo.w, demo.h) == (W, H)
        demo.wait_until(lambda: "cpu-simd" in demo.title(), "frames drawn with cpu-simd (in the title)")
        for target in ("kernel_combo", "kernel:cpu-fp64"):
            demo.click_at(layout[target])
        demo.wait_until(lambda: "cpu-fp64" in demo.title(), "frames drawn with cpu-fp64 (in the title)")
        shot, rc = demo.screenshot_and_quit(tmp_path / "screen.png")
    finally:
        demo.stop()
    output = demo.output()
    assert rc == 0, output
    # the panel is on screen: its window region is lit, more than the sky beside it
    px0, py0, px1, py1 = (int(v) for v in layout["window"])
    panel = shot[py0:py1, px0:px1].astype(float)
    assert panel.mean() > 15 and (panel.max(axis=2) > 100).mean() > 0.02, "no panel drawn"
    # the app's own account: it switched, and the kernels' times are real
    assert "kernels used: cpu-simd -> cpu-fp64" in output, output
    m = re.search(
        r"^drew \d+ frames; cpu-fp64 N=1024 \(host upload\): median over \d+ frames: "
        r"frame ([0-9.]+) ms, "
        r"force ([0-9.]+) ms",
        output,
        re.M,
    )
    assert m and float(m.group(1)) > 0 and float(m.group(2)) > 0, output
    with open(timings) as f:
        rows = list(csv.DictReader(f))
    by_kernel = {k: [r for r in rows if r["kernel"] == k] for k in ("cpu-simd", "cpu-fp64")}
    assert by_kernel["cpu-simd"] and by_kernel["cpu-fp64"], output
    for k, rs in by_kernel.items():
        assert max(float(r["force_ms"]) for r in rs) > 0, k
        assert max(float(r["frame_ms"]) for r in rs) > 0, k
