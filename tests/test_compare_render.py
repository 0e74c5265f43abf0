"""The force error's colours in pixels, on headless EGL (Mesa llvmpipe here): with render.color_by = error
a body's colour is its place on the legend's log scale of the colormap, so a body with a large error is drawn
in the colormap's high end and one with a small error in its low end; through the whole path (a CPU tree at
a large opening angle, the Controller's exact sum, the colours painted after each frame's upload) every
body's colour, read back from the frame, is where its own error against a float64 sum computed here puts
it on the legend."""

from __future__ import annotations

import numpy as np
import pytest
from test_render import gl_env, make_viewer  # noqa: F401 - the fixtures

from app.engine.error_colours import error_positions
from app.model.physics import accelerations, relative_errors
from app.render.colormaps import colormap
from app.render.particles import CMAP_LOW
from app.scene import CameraSettings, RenderSettings

pytestmark = pytest.mark.gl

W, H = 320, 240
# looking along +y (azimuth -90): +x to the right on screen, +z up
SIDE = CameraSettings(azimuth=-90.0, elevation=0.0, distance=12.0, target=(0.0, 0.0, 0.0), fov=45.0)
SETTINGS = dict(point_size=4.0, size_by_mass=False, color_by="error", colormap="viridis", brightness=0.8)


def legend_place(rgb: np.ndarray, name: str = "viridis") -> float:
    """Where on the legend (0..1) a sprite's centre pixel lies: its light is x = k * colour per channel
    (k the same for all three), tone-mapped to 1 - exp(-x) over black, so -ln(1 - s) points along the
    colour; the colormap entry (from its low offset up, as the shader samples it) nearest in direction."""
    s = np.asarray(rgb, dtype=np.float64) / 255.0
    v = -np.log(np.clip(1.0 - s, 1e-3, 1.0))
    v /= np.linalg.norm(v)
    places = np.linspace(0.0, 1.0, 201)
    cm = colormap(name)
    entries = cm[np.rint((CMAP_LOW + (1.0 - CMAP_LOW) * places) * (len(cm) - 1)).astype(int)].astype(
        np.float64
    )
    entries /= np.linalg.norm(entries, axis=1, keepdims=True)
    return float(places[int(np.argmax(entries @ v))])


def centre_pixel(img: np.ndarray, xy) -> np.ndarray:
    """The brightest pixel within 2 px of a projected body (its sprite's centre)."""
    x, y = (int(round(c)) for c in xy)
    patch = img[y - 2 : y + 3, x - 2 : x + 3].reshape(-1, 3).astype(np.int32)
    return patch[int(np.argmax(patch.sum(axis=1)))]


def test_known_errors_land_at_their_ends_of_the_colormap(make_viewer):  # noqa: F811
    pos4 = np.array([[-2.0, 0.0, 0.0, 1.0], [2.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 1.0]], np.float32)
    v = make_viewer(pos4, camera=SIDE, render=RenderSettings(**SETTINGS))
    places = error_positions(np.array([1e-7, 1e-1, 1e-4]))  # small, large, middling
    v.renderer.upload_values(places)
    img = v.render_to_array()
    got = [legend_place(centre_pixel(img, v.camera.project(p[:3], (W, H)))) for p in pos4]
    assert got[0] < 0.1 and got[1] > 0.9 and 0.4 < got[2] < 0.6, got
    # the high end of viridis is yellow (red and green over blue), its low end purple-blue (blue first)
    low, high = (centre_pixel(img, v.camera.project(p[:3], (W, H))) for p in pos4[:2])
    assert high[0] > high[2] and high[1] > high[2] and low[2] > low[1]
    # and the speeds, not used by the error view: colour by speed with the same buffer differs
    v.renderer.apply_settings(RenderSettings(**{**SETTINGS, "color_by": "speed"}))
    v.renderer.set_speed_scale(1e6)  # every value at the bottom of the speed scale
    slow = v.render_to_array()
    assert legend_place(centre_pixel(slow, v.camera.project(pos4[1, :3], (W, H)))) < 0.1


def planted(seed: int = 3):
    """64 bodies on a jittered 8 x 8 grid in the x-z plane, one unit apart: each sprite on its own."""
    from app.model.bodies import Bodies

    rng = np.random.default_rng(seed)
    g = np.arange(8) - 3.5
    x, z = np.meshgrid(g, g)
    pos = np.stack([x.ravel(), np.zeros(64), z.ravel()], 1) + rng.uniform(-0.25, 0.25, (64, 3))
    return Bodies(pos=pos, vel=np.zeros((64, 3)), mass=np.full(64, 1 / 64))


def test_each_bodys_colour_is_its_error_against_the_exact_sum_through_the_controller(gl_env):  # noqa: F811
    from app.backends.cpu import CPUBackend
    from app.model.physics import Physics
    from app.render.canvas import Viewer
    from app.scene import Scene
    from app.ui.controller import Controller

    backend = CPUBackend()
    backend.load(planted(), Physics(softening=0.01, dt=1e-3), "cpu-tree")
    backend.set_tunables(theta=1.5, leaf=8, group=16)  # a tree whose bodies' errors spread far
    scene = Scene(name="planted", camera=SIDE, render=RenderSettings(**{**SETTINGS, "color_by": "speed"}))
    viewer = Viewer(scene, backend, size=(W, H), headless=True)
    ctl = Controller(viewer)
    viewer.overlays.append(lambda v: ctl.on_frame())  # (the panel's overlay calls it, shown or hidden)
    try:
        viewer.toggle_pause()  # the state stays: the colours are of the state the test reads
        assert ctl.set_error_view("error") is None and scene.render.color_by == "error"
        for _ in range(10):
            viewer.step_and_render()
            if ctl.compare.exact.latest is not None:
                break
        assert ctl.compare.exact.latest is not None, ctl.compare.note
        viewer.step_and_render()  # the frame after the sum: its colours painted after the buffers' fill
        img = viewer.render_to_array()
        s = backend.state()
        expect = error_positions(
            relative_errors(backend.accelerations(), accelerations(s.pos, s.mass, backend.physics))
        )
        assert expect.max() - expect.min() > 0.4  # (measured: 0.40 .. 0.99)
        drawn = np.array([legend_place(centre_pixel(img, viewer.camera.project(p, (W, H)))) for p in s.pos])
        assert np.abs(drawn - expect).max() < 0.08, np.c_[expect, drawn]
        assert drawn[np.argmax(expect)] > 0.9 and drawn[np.argmin(expect)] < 0.5  # the worst body: the top
        # colour by speed again: the buffer holds speeds (all 0 here), the bodies drop to the low end
        assert ctl.set_error_view("off") is None and scene.render.color_by == "speed"
        viewer.step_and_render()
        img = viewer.render_to_array()
        assert max(legend_place(centre_pixel(img, viewer.camera.project(p, (W, H)))) for p in s.pos) < 0.1
    finally:
        ctl.close()
        viewer.close()
        backend.close()
