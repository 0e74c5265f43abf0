"""The splat draw style in the viewer on a GPU (gpu-marked): a CUDA backend with GL interop, headless EGL.
The frame drawn from the interop vertex buffers, copied into the GL texture through CUDA-GL interop and
read back from the framebuffer equals the numba twin's image of the same bodies pixel for pixel; two
frames of the same state are the same bytes; several GPUs draw through GPU 0 the same image; the device
memory is flat across 100 resizes; with more frame tiles than the binned path holds the direct path
gives the same image."""

from __future__ import annotations

import numpy as np
import pytest
from test_splat_view import twin_of

pytestmark = pytest.mark.gpu  # (skipped where CUDA cannot run: tests/conftest.py)

SIZE = (640, 400)


def open_viewer(scene_name: str, n: int, **keys):
    from app.commands.assembly import make_backend
    from app.render import gl_setup
    from app.render.canvas import Viewer
    from app.scene import load_scene

    gl_setup.configure(headless=True)
    scene = load_scene(scene_name, {"initial.n": n, "run.backend": "cuda", "run.steps_per_frame": 1, **keys})
    backend = make_backend(scene)
    return Viewer(scene, backend, size=SIZE, headless=True)


@pytest.mark.parametrize(
    "scene_name, n, keys",
    [
        ("plummer", 200_000, {"render.style": "splat"}),
        (
            "collision",
            300_000,
            {"render.style": "auto", "render.splat_from": 100_000, "render.tone_map": "aces"},
        ),
        ("collision", 120_000, {"render.style": "splat", "render.color_by": "component-speed"}),
        ("plummer", 200_000, {"render.style": "splat", "run.gpus": 2}),
    ],
)
def test_the_viewer_s_splat_frame_is_the_twin_s_pixel_for_pixel(scene_name, n, keys):
    if keys.get("run.gpus", 1) > 1:
        from app.backends.cuda.context import device_count

        if device_count() < 2:
            pytest.skip("one GPU here")
    viewer = open_viewer(scene_name, n, **keys)
    try:
        viewer.step_and_render()
        viewer.step_and_render()
        assert viewer.interop, viewer.backend.data_path
        image = viewer.render_to_array(SIZE)
        assert viewer.stats.style == "splat", viewer.splat.why
        assert viewer.splat.layer.interop_failed is None
        expect = twin_of(viewer, SIZE)
        assert expect.max() > 128
        assert np.array_equal(image, expect), f"{int((image != expect).any(axis=2).sum())} pixels differ"
        assert np.array_equal(viewer.render_to_array(SIZE), image)
    finally:
        viewer.close()


def test_a_hundred_resizes_keep_the_device_memory_flat():
    viewer = open_viewer("plummer", 100_000, **{"render.style": "splat"})
    try:
        viewer.step_and_render()
        viewer.render_to_array((1920, 1080))
        device = viewer.splat.splatter.device
        free_before, _ = device.mem_get_info()
        rng = np.random.default_rng(5)
        for w, h in zip(rng.integers(64, 1921, 100), rng.integers(64, 1081, 100), strict=True):
            image = viewer.render_to_array((int(w), int(h)))
            assert image.shape == (h, w, 3) and image.any()
        free_after, _ = device.mem_get_info()
        # the GL textures of each size are freed by GL on the same GPU; allow one 1080p texture of slack
        assert free_before - free_after <= 1920 * 1080 * 4 + (2 << 20), (free_before - free_after) / 2**20
    finally:
        viewer.close()


def test_a_frame_too_big_for_the_tiles_is_drawn_by_the_direct_path_alike():
    viewer = open_viewer("plummer", 100_000, **{"render.style": "splat"})
    try:
        viewer.step_and_render()
        big = (2880, 1800)  # 91 x 57 tiles: more than splat.MAX_TILES
        from app.render import splat

        assert splat.tile_grid(*big)[1] > splat.MAX_TILES
        image = viewer.render_to_array(big)
        assert np.array_equal(image, twin_of(viewer, big))
    finally:
        viewer.close()


def test_sprites_after_splat_frames_draw_the_current_state_and_splat_resumes():
    """Splat frames keep the interop buffers mapped (GLBuffers.hold); a switch to sprites releases them
    before GL draws them, so the sprites show the current state: the same pixels as a viewer that drew
    sprites from the start, stepped alike. Back to splat, the buffers are held again and the frame is the
    twin's."""
    import dataclasses

    def set_style(viewer, style: str) -> None:  # what the View tab's combo does (ui/actions.py)
        viewer.renderer.apply_settings(dataclasses.replace(viewer.renderer.settings, style=style))

    viewers = [open_viewer("plummer", 200_000, **{"render.style": style}) for style in ("splat", "sprites")]
    try:
        for viewer in viewers:
            for _ in range(3):
                viewer.step_and_render()
        switched, sprites = viewers
        assert switched.stats.style == "splat" and switched.backend.gl_buffers.held
        set_style(switched, "sprites")
        image = switched.render_to_array(SIZE)
        assert switched.stats.style == "sprites" and not switched.backend.gl_buffers.held
        expect = sprites.render_to_array(SIZE)
        assert expect.max() > 64
        assert np.array_equal(image, expect), f"{int((image != expect).any(axis=2).sum())} pixels differ"
        set_style(switched, "splat")
        switched.step_and_render()
        assert switched.stats.style == "splat" and switched.backend.gl_buffers.held
        assert np.array_equal(switched.render_to_array(SIZE), twin_of(switched, SIZE))
    finally:
        for viewer in viewers:
            viewer.close()
