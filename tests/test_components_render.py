"""Components and the free view area in pixels, on headless EGL (Mesa llvmpipe here): hiding a component
removes its pixels, per-component colours land where its bodies are, `record` honours the
render.components keys given with --set, hidden bodies still take part in gravity, and with the panel
shown the scene's centre is drawn at the centre of the part of the window the panel leaves free."""

from __future__ import annotations

import numpy as np
import pytest
from test_render import gl_env, make_viewer  # noqa: F401 - the fixtures

from app.model.components import Components, set_style
from app.scene import CameraSettings, RenderSettings, Scene

pytestmark = pytest.mark.gl

W, H = 320, 240
# looking along +y (azimuth -90): +x is to the right on screen, +z up
SIDE_CAMERA = CameraSettings(azimuth=-90.0, elevation=0.0, distance=8.0, target=(0.0, 0.0, 0.0), fov=45.0)


def two_clusters(n: int = 300, seed: int = 4):
    """Cluster `left` around x = -1.5 and cluster `right` around x = +1.5 (components 0 and 1)."""
    rng = np.random.default_rng(seed)
    pos4 = np.zeros((2 * n, 4), np.float32)
    pos4[:, :3] = rng.normal(scale=0.25, size=(2 * n, 3))
    pos4[:n, 0] -= 1.5
    pos4[n:, 0] += 1.5
    pos4[:, 3] = 1.0 / (2 * n)
    return pos4, Components(("left", "right"), np.repeat([0, 1], n))


@pytest.fixture
def viewer(make_viewer):  # noqa: F811
    def make(render=None, speeds=None):
        pos4, comp = two_clusters()
        v = make_viewer(pos4, speeds, camera=SIDE_CAMERA, render=render or RenderSettings(point_size=4.0))
        v.backend.components = comp  # picked up at the next buffer sync, as after a load
        v.sync_buffers()
        return v

    return make


def styled(render: RenderSettings, **keys) -> RenderSettings:
    """`render` with render.components keys set as the scene loader sets them ({'right.visible': False})."""
    for key, value in keys.items():
        render.components = set_style(render.components, f"components.{key}", value)
    return render


def lit(img: np.ndarray) -> np.ndarray:
    return img.astype(np.int32).sum(axis=2) > 0


def test_hiding_a_component_removes_its_pixels(viewer):
    v = viewer()
    both = v.render_to_array()
    left, right = lit(both)[:, : W // 2], lit(both)[:, W // 2 :]
    assert left.sum() > 200 and right.sum() > 200
    v.renderer.apply_settings(styled(RenderSettings(point_size=4.0), **{"right.visible": False}))
    hidden = v.render_to_array()
    assert not lit(hidden)[:, W // 2 :].any(), "the hidden component still has pixels"
    assert np.array_equal(hidden[:, : W // 2 - 20], both[:, : W // 2 - 20])  # the other one is unchanged
    v.renderer.apply_settings(styled(RenderSettings(point_size=4.0), **{"*.visible": False}))
    assert not lit(v.render_to_array()).any()
    v.renderer.apply_settings(RenderSettings(point_size=4.0))
    assert np.array_equal(v.render_to_array(), both)


def test_per_component_colours_appear_where_its_bodies_are(viewer):
    render = styled(
        RenderSettings(point_size=4.0, color_by="component"),
        **{"left.color": (1.0, 0.0, 0.0), "right.color": (0.0, 0.0, 1.0)},
    )
    img = viewer(render).render_to_array().astype(np.int32)
    left, right = img[:, : W // 2].reshape(-1, 3), img[:, W // 2 :].reshape(-1, 3)
    assert left[:, 0].sum() > 5000 and left[:, 1:].sum() == 0, "left is not red only"
    assert right[:, 2].sum() > 5000 and right[:, :2].sum() == 0, "right is not blue only"


def test_component_brightness_scales_its_light(viewer):
    v = viewer()
    full = v.render_to_array().astype(np.int32)
    v.renderer.apply_settings(styled(RenderSettings(point_size=4.0), **{"right.brightness": 0.2}))
    dim = v.render_to_array().astype(np.int32)
    assert dim[:, W // 2 + 20 :].sum() < 0.5 * full[:, W // 2 + 20 :].sum()
    assert np.array_equal(dim[:, : W // 2 - 20], full[:, : W // 2 - 20])


def test_component_speed_shades_the_component_colour(viewer):
    speeds = np.where(np.arange(600) % 2 == 0, 0.0, 10.0).astype(np.float32)
    render = styled(
        RenderSettings(point_size=4.0, color_by="component-speed"),
        **{"left.color": (0.0, 1.0, 0.0), "right.color": (0.0, 1.0, 0.0)},
    )
    v = viewer(render, speeds)
    backend = v.backend
    v.renderer.set_speed_scale(10.0)
    img = v.render_to_array().astype(np.int32)
    assert img[..., 1].sum() > 0 and img[..., 0].sum() == 0 and img[..., 2].sum() == 0
    slow = img[..., 1].sum()
    backend.speeds[:] = 10.0
    v._upload_host()
    assert v.render_to_array().astype(np.int32)[..., 1].sum() > slow  # faster: brighter, same hue


def test_fit_leaves_hidden_components_out(viewer):
    v = viewer()
    v.fit()
    both = v.camera.distance
    v.renderer.apply_settings(styled(RenderSettings(point_size=4.0), **{"right.visible": False}))
    v.fit()
    assert v.camera.distance < 0.6 * both
    assert v.camera.target[0] == pytest.approx(-1.5, abs=0.1)


def test_hidden_bodies_still_feel_and_exert_gravity(gl_env):  # noqa: F811
    from app.commands.assembly import make_backend
    from app.render.canvas import Viewer
    from app.scene import load_scene

    states = []
    for hidden in (False, True):
        over = {"initial.n": 400, "run.backend": "cpu", "run.kernel": "cpu-fp64", "physics.dt": "0.01"}
        if hidden:
            over["render.components.galaxy2-*.visible"] = "false"
        scene = load_scene("collision", over)
        v = Viewer(scene, make_backend(scene), size=(64, 48), headless=True)
        try:
            # the halos are hidden by the scene (collision.toml), galaxy 2 by the key
            assert [d.gain == 0 for d in v.renderer.drawn] == [False, False, True, hidden, hidden, True]
            for _ in range(3):
                v.step_and_render()
            states.append(v.backend.state())
        finally:
            v.close()
            v.backend.close()
    assert states[0].pos.tobytes() == states[1].pos.tobytes()
    assert states[0].vel.tobytes() == states[1].vel.tobytes()


def test_record_honours_component_keys_from_set(gl_env, tmp_path):  # noqa: F811
    from PIL import Image

    from app.cli import main
    from app.scene import load_scene, make_bodies

    # a fixed camera (an unset distance fits the bodies drawn, which hiding changes)
    common = [
        "record",
        "collision",
        "--n",
        "1000",
        "--backend",
        "cpu",
        "--size",
        "160x96",
        "--still",
        "0",
        "--set",
        "camera.distance=14",
        "--set",
        "camera.target=0,0,0",
        "--set",
        "camera.azimuth=-90",
        "--set",
        "camera.elevation=0",
    ]  # +x to the right
    assert main([*common, "--out", str(tmp_path / "all.png")]) == 0
    assert (
        main([*common, "--out", str(tmp_path / "none.png"), "--set", "render.components.*.visible=false"])
        == 0
    )
    assert (
        main(
            [*common, "--out", str(tmp_path / "g1.png"), "--set", "render.components.galaxy2-*.visible=false"]
        )
        == 0
    )
    every, none, g1 = (
        np.asarray(Image.open(tmp_path / f"{n}.png").convert("RGB")).astype(int)
        for n in ("all", "none", "g1")
    )
    assert lit(every).sum() > 100 and not lit(none).any()
    assert 0 < lit(g1).sum() < 0.8 * lit(every).sum()
    # galaxy 1 starts at x = +2 (the Kepler orbit puts galaxy 2 at -2): the right of the picture
    start = make_bodies(load_scene("collision", {"initial.n": 1000}))
    g = start.components.index < 3
    assert np.average(start.pos[g, 0], weights=start.mass[g]) == pytest.approx(2.0)
    assert lit(g1)[:, :80].sum() < 0.2 * lit(g1).sum()


def test_a_recording_on_cpu_devices_colours_the_bodies_as_one_device_through_the_trees_re_sorts(
    gl_env,  # noqa: F811
    tmp_path,
):
    """Under `--gpus` the tree keeps the state in key order, re-sorted every step; the frames (each body
    coloured by its component, galaxy 2 hidden) are the one device's, byte for byte."""
    from PIL import Image

    from app.cli import main

    common = [
        "record",
        "collision",
        "--n",
        "2000",
        "--backend",
        "cpu",
        "--kernel",
        "cpu-tree",
        "--size",
        "160x96",
        "--fps",
        "10",
        "--still",
        "0.4",
        "--set",
        "render.color_by=component",
        "--set",
        "render.components.galaxy2-*.visible=false",
        "--set",
        "camera.distance=14",
    ]
    assert main([*common, "--out", str(tmp_path / "one.png")]) == 0
    assert main([*common, "--gpus", "2", "--out", str(tmp_path / "two.png")]) == 0
    one, two = (np.asarray(Image.open(tmp_path / f"{n}.png").convert("RGB")) for n in ("one", "two"))
    assert lit(one).sum() > 100 and np.array_equal(one, two)


# --------------------------------------------------------------------------------------------------
# the view fills the part of the window the panel leaves free


def _centroid_x(img: np.ndarray, x0: int) -> tuple[float, float]:
    """Light-weighted centre (x, y) of what is drawn right of column x0."""
    lum = img[:, x0:].astype(np.float64).sum(axis=2)
    ys, xs = np.mgrid[0 : lum.shape[0], 0 : lum.shape[1]]
    total = lum.sum()
    assert total > 0, "nothing drawn in the free area"
    return float((lum * (xs + 0.5)).sum() / total + x0), float((lum * (ys + 0.5)).sum() / total)


@pytest.fixture
def paneled(gl_env):  # noqa: F811
    pytest.importorskip("imgui_bundle")
    from app.commands.assembly import make_backend
    from app.model.bodies import Bodies
    from app.render.canvas import Viewer
    from app.scene import RunSettings
    from app.ui import Panel

    size = (960, 540)
    # one body at rest at the camera target: the scene's centre
    scene = Scene(
        name="centre",
        camera=SIDE_CAMERA,
        render=RenderSettings(point_size=6.0),
        run=RunSettings(backend="cpu"),
    )
    one = Bodies.from_arrays(np.zeros((1, 3)), np.zeros((1, 3)), np.ones(1))
    v = Viewer(scene, make_backend(scene, one), size=size, headless=True)
    v.toggle_pause()
    panel = Panel(v)
    panel.bridge.refresh_hz = 0.0
    for _ in range(3):
        v.step_and_render()
    yield v, panel
    panel.close()
    v.close()
    v.backend.close()


def test_offset_projection_puts_the_scene_centre_in_the_free_area(paneled):
    v, panel = paneled
    w, h = v.physical_size
    x0, x1 = v.free_span()
    assert x0 == pytest.approx(panel.window_rect[2] * v.pixel_scale) and x1 == w
    img = v.render_to_array(overlays=True)  # what the window shows: the panel over the left
    cx, cy = _centroid_x(img, int(np.ceil(x0)) + 2)
    assert abs(cx - (x0 + x1) / 2) <= 2.0 and abs(cy - h / 2) <= 2.0, (cx, cy, (x0 + x1) / 2)
    # a recording (no overlays) is centred on the whole frame, the panel shown or not
    cx, cy = _centroid_x(v.render_to_array(overlays=False), 0)
    assert abs(cx - w / 2) <= 2.0 and abs(cy - h / 2) <= 2.0
    # Tab hides the panel: the full view again
    panel.toggle()
    v.step_and_render()
    cx, cy = _centroid_x(v.render_to_array(overlays=True), 0)
    assert abs(cx - w / 2) <= 2.0 and abs(cy - h / 2) <= 2.0


def test_fit_fills_the_free_area(paneled):
    from app.model.bodies import Bodies
    from app.render.camera import OrbitCamera
    from app.render.canvas import bodies_extent

    v, panel = paneled
    x = np.array([[-1.0, 0, 0], [1, 0, 0], [0, 0, 0.5]])
    v.backend.load(Bodies.from_arrays(x, np.zeros((3, 3)), np.ones(3)), v.backend.physics)
    v.step_and_render()
    v.fit()
    x0, x1 = v.free_span()
    ext, com = bodies_extent(v.backend.host_render_arrays()[0])
    want = OrbitCamera(azimuth=v.camera.azimuth, elevation=v.camera.elevation)
    want.fit(ext, com, aspect=(x1 - x0) / v.physical_size[1])
    assert v.camera.distance == pytest.approx(want.distance)
    shown = v.camera.distance
    panel.toggle()
    v.fit()
    assert v.camera.distance < shown  # the whole window is wider than the free part
