"""The splat draw style in the viewer, on the CPU: which style a frame gets (render.style), the GL layer
showing the numba twin's image pixel for pixel (orientation, no filtering, the background in it), the one
log line where auto cannot splat, resizes and repeat frames. The CUDA half of the same frames is
tests/test_splat_gpu.py's; the whole viewer path on a GPU is tests/test_splat_view_gpu.py's."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from test_render import gl_env, make_viewer, plummer_pos4  # noqa: F401 - the fixtures

from app.render.splat import SplatParams, SplatView
from app.render.splat_cpu import splat_image
from app.render.splat_light import body_light
from app.render.splat_style import params_of, wanted
from app.scene import RenderSettings

SIZE = (320, 240)


def twin_of(viewer, size: tuple[int, int]) -> np.ndarray:
    """The twin's image of the viewer's bodies through its camera, computed here from the contract (also
    tests/test_splat_view_gpu.py's reference)."""
    w, h = size
    r = viewer.renderer
    m = viewer.projection((w, h), False) @ viewer.camera.view_matrix()
    view = SplatView(np.ascontiguousarray(m, np.float32), float(np.float32(viewer.camera.near)))
    light = body_light(r.settings, r.drawn, viewer.backend.n, r.speed_scale, r.mean_mass)
    pos4, speeds = viewer.backend.host_render_arrays()
    comp = r.components.index if r.components is not None else None
    return splat_image(pos4, view, light, params_of(r.settings, size), comp=comp, values=speeds).image


def test_which_style_a_frame_asks_for():
    assert not wanted(RenderSettings(style="sprites"), 10**8)
    assert wanted(RenderSettings(style="splat"), 1)
    auto = RenderSettings(style="auto", splat_from=1000)
    assert not wanted(auto, 999) and wanted(auto, 1000)
    p = params_of(RenderSettings(exposure=0.0, tone_map="aces", background=(0.1, 0.2, 0.3)), (64, 32))
    assert p == SplatParams(64, 32, exposure=None, tone_map="aces", background=(0.1, 0.2, 0.3))
    assert params_of(RenderSettings(exposure=4.0), (8, 8)).exposure == 4.0


@pytest.mark.parametrize("tone_map, background", [("exp", (0.0, 0.0, 0.0)), ("aces", (0.05, 0.0, 0.1))])
def test_an_explicit_splat_on_the_cpu_shows_the_twin_s_image(make_viewer, tone_map, background):  # noqa: F811
    pos4 = plummer_pos4(20_000)
    speeds = np.random.default_rng(3).gamma(2.0, 0.3, len(pos4)).astype(np.float32)
    render = RenderSettings(style="splat", tone_map=tone_map, background=background)
    v = make_viewer(pos4, speeds, size=SIZE, render=render)
    image = v.render_to_array(SIZE)
    assert v.stats.style == "splat" and v.splat.why is None
    assert v.stats.draw_ms >= v.splat.last_ms > 0  # the section's time spans the twin's own
    expect = twin_of(v, SIZE)
    assert expect.max() > 200 and (expect != expect[0, 0]).any()  # a lit, structured frame
    assert np.array_equal(image, expect), f"{int((image != expect).any(axis=2).sum())} pixels differ"
    assert np.array_equal(v.render_to_array(SIZE), image)  # the same bytes again


def test_a_resized_frame_is_the_twin_s_of_the_new_size(make_viewer):  # noqa: F811
    v = make_viewer(plummer_pos4(5_000), size=SIZE, render=RenderSettings(style="splat"))
    for size in ((200, 300), (321, 181), SIZE):
        image = v.render_to_array(size)
        assert image.shape == (size[1], size[0], 3)
        assert np.array_equal(image, twin_of(v, size)), size
    assert v.splat.layer.size == SIZE


def test_auto_on_a_backend_without_gpu_buffers_draws_sprites_and_says_so_once(make_viewer, caplog):  # noqa: F811
    v = make_viewer(plummer_pos4(2_000), render=RenderSettings(style="auto", splat_from=1_000))
    with caplog.at_level(logging.INFO, logger="app.render.splat_style"):
        sprites = v.render_to_array(SIZE)
        v.render_to_array(SIZE)
    assert v.stats.style == "sprites" and "auto draws splat where a GPU fills the GL buffers" in v.splat.why
    said = [r for r in caplog.records if "render.style" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]
    v.renderer.apply_settings(RenderSettings(style="auto", splat_from=10_000))  # below it: quietly sprites
    assert np.array_equal(v.render_to_array(SIZE), sprites) and v.splat.why is None


def test_a_splat_that_fails_falls_back_to_sprites_for_the_run(make_viewer, monkeypatch, caplog):  # noqa: F811
    v = make_viewer(plummer_pos4(2_000), render=RenderSettings(style="splat"))

    def broken(*a, **k):
        raise RuntimeError("the splat kernels did not build")

    monkeypatch.setattr(v.splat, "_twin_frame", broken)
    with caplog.at_level(logging.ERROR, logger="app.render.splat_style"):
        v.render_to_array(SIZE)
    assert v.stats.style == "sprites" and "did not build" in v.splat.failed
    monkeypatch.undo()
    v.render_to_array(SIZE)
    assert v.stats.style == "sprites"  # for the rest of the run
    assert any("did not build" in r.getMessage() for r in caplog.records)


def test_the_view_tab_switches_to_splat_and_to_a_manual_exposure_through_clicks(gl_env):  # noqa: F811
    """Through real input: "splat" in the View tab's style combo draws the next frames as splat (here the
    CPU twin: the fake-free CPU backend fills no GL buffers); unticking "auto exposure" continues at the
    exposure automatic was giving, so the picture does not jump; "aces" in the tone-map combo applies; a
    bloom typed into its field brightens the frame around its brightest parts."""
    from test_panel import UI

    ui = UI(n=4096, height=900)
    try:
        ui.tab("View")
        assert ui.viewer.stats.style == "sprites"
        ui.click("render.style")
        ui.click("render.style=splat")
        ui.frame(2)
        assert ui.viewer.scene.render.style == "splat" and ui.viewer.stats.style == "splat", ui.ctl.message
        ui.key(" ", " ")  # paused: the same state from here on
        auto, auto_x = ui.viewer.splat.manual_equivalent, ui.viewer.splat.last_exposure
        ui.click("render.exposure.auto")
        assert ui.viewer.scene.render.exposure == pytest.approx(auto, rel=1e-9) and auto > 0
        assert ui.viewer.splat.last_exposure == pytest.approx(auto_x, rel=1e-6)  # the same exposure
        assert "render.exposure" in ui.panel.item_rects  # the slider shows once manual
        after = ui.viewer.render_to_array(SIZE)
        ui.click("render.tone_map")
        ui.click("render.tone_map=aces")
        assert ui.viewer.renderer.settings.tone_map == "aces"
        toned = ui.viewer.render_to_array(SIZE)
        assert not np.array_equal(toned, after)
        ui.click("render.bloom")  # typed, as the CLI's --set render.bloom=2 (0: off)
        ui.type("2")
        ui.enter()
        assert ui.viewer.renderer.settings.bloom == 2.0, ui.ctl.message
        glowing = ui.viewer.render_to_array(SIZE)
        assert (glowing >= toned).all() and (glowing > toned).any()  # a glow adds light, never takes it
    finally:
        ui.close()
