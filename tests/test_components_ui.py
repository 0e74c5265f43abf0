"""The panel's component list driven through input events (synthesised vispy mouse events on the viewer's
own emitters, as in tests/test_panel.py): a Tipsy file with three sections lists three components, the
show/hide checkbox removes a component's pixels and puts it back, the brightness slider changes its light,
and both go through the scene keys (render.components.NAME.*) without touching the simulation."""

from __future__ import annotations

import numpy as np
import pytest
from test_components import write_tipsy_sections
from test_panel import UI, H, W, gl_env  # noqa: F401 - the fixture

pytestmark = pytest.mark.gl


class SceneUI(UI):
    """The panel's test user on a scene of our choosing (CPU backend, paused: only the UI changes)."""

    def __init__(self, scene):
        from app.commands.assembly import make_backend
        from app.render.canvas import Viewer
        from app.ui import Panel

        self.scene = scene
        self.viewer = Viewer(scene, make_backend(scene), size=(W, H), headless=True)
        self.viewer.toggle_pause()
        self.panel = Panel(self.viewer)
        self.ctl = self.panel.controller
        self.panel.bridge.refresh_hz = 0.0
        self.frame(2)


@pytest.fixture
def scene_ui(gl_env):  # noqa: F811
    made = []

    def make(scene):
        u = SceneUI(scene)
        made.append(u)
        return u

    yield make
    for u in made:
        u.close()


def _particles(ui) -> np.ndarray:
    """The picture without the panel, the way the window's free part shows it."""
    return ui.viewer.render_to_array(overlays=False).astype(np.int32)


def test_tipsy_with_three_sections_lists_three_components(scene_ui, tmp_path):
    from app.scene import load_scene

    path = tmp_path / "three.tipsy"
    write_tipsy_sections(path, {"gas": 50, "dark": 60, "star": 70})
    ui = scene_ui(
        load_scene(None, {"initial.file": str(path), "initial.generator": None, "run.backend": "cpu"})
    )
    ui.tab("View")
    shown = sorted(k for k in ui.panel.item_rects if k.startswith("component:") and k.endswith(":visible"))
    assert shown == ["component:dark:visible", "component:gas:visible", "component:star:visible"]
    assert [d.count for d in ui.viewer.renderer.drawn] == [50, 60, 70]


def test_component_checkbox_hides_and_shows_its_bodies(scene_ui):
    from app.scene import load_scene

    ui = scene_ui(load_scene("collision", {"initial.n": 2000, "run.backend": "cpu"}))
    ui.tab("View")
    before = _particles(ui)
    state = ui.backend.state()
    ui.click("component:galaxy2-disk:visible")
    assert ui.scene.render.components["galaxy2-disk"].visible is False
    # galaxy1-bulge, -disk, -halo, galaxy2-bulge, -disk, -halo; the halos hidden by the scene (collision.toml)
    assert [d.visible for d in ui.viewer.renderer.drawn] == [True, True, False, True, False, False]
    hidden = _particles(ui)
    assert hidden.sum() < 0.9 * before.sum()  # its light is gone
    assert ui.ctl.message == "render.components.galaxy2-disk.visible = False"
    ui.click("component:galaxy2-bulge:visible")  # the rest of galaxy 2
    assert [d.visible for d in ui.viewer.renderer.drawn] == [True, True, False, False, False, False]
    assert _particles(ui).sum() < hidden.sum()
    ui.click("component:galaxy2-disk:visible")
    ui.click("component:galaxy2-bulge:visible")
    assert np.array_equal(_particles(ui), before)  # shown again: the same picture
    after = ui.backend.state()
    assert after.pos.tobytes() == state.pos.tobytes()  # only drawing changed


def test_component_brightness_slider(scene_ui):
    from app.scene import load_scene

    ui = scene_ui(load_scene("disk", {"initial.n": 2000, "run.backend": "cpu"}))
    ui.tab("View")
    before = _particles(ui)
    x0, y0, x1, y1 = ui.panel.item_rects["component:disk:brightness"]
    ui.click((x0 + 3, (y0 + y1) / 2))  # the slider's low end
    low = ui.viewer.renderer.drawn[1]
    assert low.name == "disk" and low.brightness < 0.1
    assert ui.scene.render.components["disk"].brightness == pytest.approx(low.brightness)
    dim = _particles(ui)
    assert dim.sum() < 0.8 * before.sum()
    x0, y0, x1, y1 = ui.panel.item_rects["component:disk:brightness"]  # (the message line moved it)
    ui.click((x1 - 3, (y0 + y1) / 2))  # the high end
    assert ui.viewer.renderer.drawn[1].brightness > 5.0
    assert _particles(ui).sum() > before.sum()
    assert ui.viewer.renderer.drawn[0].brightness == 1.0  # the bulge's own slider was not touched


def test_save_snapshot_keeps_the_components(scene_ui, tmp_path):
    from app.model import formats
    from app.scene import load_scene

    ui = scene_ui(load_scene("collision", {"initial.n": 1000, "run.backend": "cpu"}))
    ui.ctl.view_recorder.directory = tmp_path
    ui.tab("Simulation")
    ui.click("save_snapshot")
    back = formats.read(ui.ctl.last_snapshot)
    comp = ui.viewer.renderer.components
    assert back.components.names == comp.names and np.array_equal(back.components.index, comp.index)
    assert back.pos.tobytes() == ui.backend.state().pos.tobytes()
