"""Components in a replay: a series keeps its bodies' components (simulate writes them, the series reads
the first snapshot's), and the replay panel shows the live panel's component section: hiding a component
removes its pixels, its brightness slider dims it, `record DIR` honours the render.components keys, the
colour swatch's popup closes on Escape before Escape quits, and in a real window under Xvfb an xdotool
click on a component's checkbox hides it."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from test_panel import gl_env as gl_env  # the module-scoped fixture of the GL tests
from test_series import Clock, ReplayUI
from xwindow import NEEDS_X, Demo, xdotool
from xwindow import display as display  # the fixture

from app.backends.replay import ReplayBackend
from app.cli import main
from app.model import formats
from app.model.bodies import Bodies
from app.model.components import Components, same
from app.model.series import open_series

SIDE = [
    "--set",
    "camera.distance=8",
    "--set",
    "camera.target=0,0,0",
    "--set",
    "camera.azimuth=-90",
    "--set",
    "camera.elevation=0",
]  # looking along +y: +x is to the right of the picture


def two_cluster_series(directory: Path, n: int = 300, snapshots: int = 3) -> Components:
    """Snapshots of cluster `left` (x = -1.5) and cluster `right` (x = +1.5), drifting a little in y;
    the components interleave rows (not blocks), as no generator writes them."""
    rng = np.random.default_rng(8)
    pos = rng.normal(scale=0.25, size=(2 * n, 3))
    index = np.arange(2 * n) % 2
    pos[:, 0] += np.where(index == 0, -1.5, 1.5)
    comp = Components(("left", "right"), index)
    directory.mkdir()
    for k in range(snapshots):
        moved = pos + [0.0, 0.02 * k, 0.0]
        formats.write(
            directory / f"s_{k}.npz",
            Bodies.from_arrays(moved, np.zeros_like(pos), np.full(2 * n, 1.0 / n), 0.5 * k, components=comp),
        )
    return comp


def lit(img: np.ndarray) -> np.ndarray:
    return img.astype(np.int32).sum(axis=2) > 0


def test_a_series_keeps_its_components_for_the_replay(tmp_path):
    comp = two_cluster_series(tmp_path / "s")
    replay = ReplayBackend(open_series(str(tmp_path / "s")))
    assert same(replay.components, comp)
    assert same(replay.state().components, comp)  # (a snapshot of a replay keeps them too)
    # written by simulate: every snapshot of the series has the scene's components
    out = tmp_path / "collision"
    assert (
        main(
            [
                "simulate",
                "collision",
                "--n",
                "200",
                "--steps",
                "4",
                "--snapshot-every",
                "2",
                "--backend",
                "cpu",
                "--no-progress",
                "--out-dir",
                str(out),
            ]
        )
        == 0
    )
    names = tuple(f"galaxy{k}-{part}" for k in (1, 2) for part in ("bulge", "disk", "halo"))
    assert ReplayBackend(open_series(str(out))).components.names == names


@pytest.mark.gl
def test_record_of_a_series_honours_the_component_keys(gl_env, tmp_path):  # noqa: F811
    from PIL import Image

    two_cluster_series(tmp_path / "s")
    common = ["record", str(tmp_path / "s"), "--size", "160x96", "--still", "0", "--no-progress", *SIDE]
    assert main([*common, "--out", str(tmp_path / "both.png")]) == 0
    hide = ["--set", "render.components.right.visible=false"]
    assert main([*common, "--out", str(tmp_path / "left.png"), *hide]) == 0
    both, left = (np.asarray(Image.open(tmp_path / f"{n}.png").convert("RGB")) for n in ("both", "left"))
    assert lit(both)[:, :80].sum() > 50 and lit(both)[:, 80:].sum() > 50
    assert not lit(left)[:, 80:].any(), "the hidden component still has pixels"
    assert np.array_equal(left[:, :70], both[:, :70])  # the shown one is drawn as before


@pytest.fixture
def replay_ui(gl_env, tmp_path):  # noqa: F811
    two_cluster_series(tmp_path / "s")
    ui = ReplayUI(tmp_path / "s", Clock(1 / 30))
    ui.click("play")  # paused: only the UI changes the picture
    yield ui
    ui.close()


def _particles(ui) -> np.ndarray:
    return ui.viewer.render_to_array(overlays=False).astype(np.int32)


def test_replay_panel_checkbox_hides_a_component_and_the_slider_dims_it(replay_ui):
    ui = replay_ui
    assert not ui.viewer.backend.playing
    assert [k for k in ui.panel.item_rects if k.startswith("component:")] == [
        "component:left:color",
        "component:left:visible",
        "component:left:brightness",
        "component:right:color",
        "component:right:visible",
        "component:right:brightness",
    ]
    t0 = ui.viewer.backend.t
    before = _particles(ui)
    ui.click("component:right:visible")
    assert ui.scene.render.components["right"].visible is False
    assert ui.ctl.message == "render.components.right.visible = False"
    hidden = _particles(ui)
    assert 0 < hidden.sum() < 0.7 * before.sum()  # half the bodies' light is gone
    ui.click("component:right:visible")
    assert np.array_equal(_particles(ui), before)  # shown again: the same picture
    x0, y0, x1, y1 = ui.panel.item_rects["component:left:brightness"]
    ui.click((x0 + 3, (y0 + y1) / 2))  # the slider's low end
    assert ui.viewer.renderer.drawn[0].brightness < 0.1 and ui.viewer.renderer.drawn[1].brightness == 1.0
    assert _particles(ui).sum() < 0.8 * before.sum()
    assert ui.viewer.backend.t == t0  # the replay stayed where it was


def test_replay_panel_leaves_the_view_free_and_escape_closes_the_colour_picker_first(replay_ui):
    from vispy.util import keys

    ui = replay_ui
    x0, _, x1, _ = ui.panel.item_rects["window"]
    assert ui.viewer.view_covers and ui.panel.covered()[2] == x1  # the scene is drawn right of the panel
    ui.click("component:left:color")
    assert ui.panel.modal_input, "the colour picker did not open"
    ui.key(keys.ESCAPE)
    assert not ui.viewer.quit_requested, "Escape with the colour picker open quit the replay"
    ui.frame(2)
    assert not ui.panel.modal_input, "the colour picker stayed open"
    ui.key(keys.ESCAPE)
    assert ui.viewer.quit_requested


# --------------------------------------------------------------------------------------------------
# a real window under Xvfb


RW, RH = 900, 640


def _layout(directory: Path) -> dict:
    """item_rects of the replay panel at RW x RH, laid out headless in this process (the layout is the
    same in the real window: same size, same content)."""
    from app.render.canvas import Viewer
    from app.scene import load_scene
    from app.ui.replay import ReplayPanel

    backend = ReplayBackend(open_series(str(directory)))
    viewer = Viewer(load_scene(None), backend, size=(RW, RH), headless=True)
    panel = ReplayPanel(viewer)
    try:
        for _ in range(3):
            viewer.step_and_render()
        return dict(panel.item_rects)
    finally:
        panel.close()
        viewer.close()


@pytest.mark.gl
@NEEDS_X
def test_xdotool_click_on_a_component_checkbox_hides_it_in_a_real_window(gl_env, tmp_path, display):  # noqa: F811
    two_cluster_series(tmp_path / "s", snapshots=2)
    rects = _layout(tmp_path / "s")
    demo = Demo(tmp_path, display, args=(str(tmp_path / "s"), "--size", f"{RW}x{RH}", *SIDE))
    try:
        assert (demo.w, demo.h) == (RW, RH)
        demo.wait_until_drawing()
        xdotool("mousemove", "--window", demo.window, str(RW - 50), str(RH // 2))
        xdotool("key", "space")  # pause: the picture stands still
        free = int(rects["window"][2]) + 4
        before = demo.still_image()[:, free:]
        x0, y0, x1, y1 = rects["component:right:visible"]
        xdotool("mousemove", "--window", demo.window, str(int(x0 + 8)), str(int((y0 + y1) / 2)))
        time.sleep(0.3)  # (input pacing: ImGui sees the hover on a frame before the click)
        xdotool("click", "1")
        demo.wait_until(
            lambda: "render.components.right.visible = False" in demo.output(),
            "the click to reach the checkbox (its line in the log)",
        )
        xdotool("mousemove", "--window", demo.window, str(RW - 50), str(RH // 2))  # (no tooltip)
        after = demo.still_image()[:, free:]
        xdotool("key", "Escape")
        rc = demo.wait()
    finally:
        demo.stop()
    assert rc == 0, demo.output()
    assert "drew" in demo.output() and "frames of the replay" in demo.output()
    # the free part's right half holds the right cluster (its left half the left one, and perhaps the
    # fading tooltip of the checkbox)
    half = before.shape[1] // 2
    assert lit(before[:, :half]).sum() > 200 and lit(before[:, half:]).sum() > 200, "no clusters drawn"
    assert lit(after[:, half:]).sum() < 0.05 * lit(before[:, half:]).sum(), "the right cluster is still there"
    assert lit(after[:, :half]).sum() > 0.5 * lit(before[:, :half]).sum(), "the left cluster went too"
