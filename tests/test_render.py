"""Renderer tests: camera math and colormaps without GL; pixels, buffers, shaders and recording on
headless EGL (Mesa llvmpipe here, NVIDIA EGL on a GPU machine). GL tests skip with the reason when no
context can be created."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from fakes import FakeBackend

from app.core.errors import ConfigError, RuntimeFault
from app.model.bodies import Bodies
from app.model.physics import Physics
from app.render import camera as cam_mod
from app.render import gl_setup
from app.render.camera import OrbitCamera
from app.render.colormaps import NAMES, colormap
from app.scene import CameraSettings, RenderSettings, Scene

# --------------------------------------------------------------------------------------------------
# helpers


def plummer_pos4(n: int, seed: int = 7) -> np.ndarray:
    """A seeded Plummer sphere (scale radius 1, radii cut at 10) as [x, y, z, m] rows, equal masses."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(1e-3, 1.0, n)
    r = np.minimum(1.0 / np.sqrt(x ** (-2.0 / 3.0) - 1.0), 10.0)
    u = rng.normal(size=(n, 3))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    out = np.empty((n, 4), np.float32)
    out[:, :3] = u * r[:, None]
    out[:, 3] = 1.0 / n
    return out


FIXED_CAMERA = CameraSettings(azimuth=30.0, elevation=20.0, distance=6.0, target=(0.0, 0.0, 0.0), fov=45.0)
W, H = 320, 240


@pytest.fixture(scope="module")
def gl_env():
    """Headless EGL via gl_setup, or a skip naming why no context could be made."""
    try:
        gl_setup.configure(headless=True)
        from vispy import app

        probe = app.Canvas(size=(16, 16), show=False)
        probe.close()
    except Exception as e:  # noqa: BLE001 - any failure here means "no GL here"
        pytest.skip(f"no headless GL context: {type(e).__name__}: {e}")
    return gl_setup.backend_name()


@pytest.fixture
def make_viewer(gl_env):
    from app.render.canvas import Viewer

    made = []

    def make(pos4, speeds=None, size=(W, H), camera=FIXED_CAMERA, render=None, interop=False):
        scene = Scene(name="test", camera=camera, render=render or RenderSettings(point_size=4.0))
        backend = FakeBackend(pos4, speeds, interop=interop)
        v = Viewer(scene, backend, size=size, headless=True)
        made.append(v)
        return v

    yield make
    for v in made:
        v.close()


def brightest(img: np.ndarray) -> tuple[int, int]:
    lum = img.astype(np.int32).sum(axis=2)
    row, col = np.unravel_index(int(np.argmax(lum)), lum.shape)
    return int(row), int(col)


# --------------------------------------------------------------------------------------------------
# camera math (no GL)


def test_camera_projects_target_to_centre_and_axes_the_right_way():
    cam = OrbitCamera(azimuth=0.0, elevation=0.0, distance=5.0, fov=60.0)
    # eye on +x looking at the origin, z up: +y appears to the right, +z above the centre
    np.testing.assert_allclose(cam.project([0, 0, 0], (200, 100)), [100, 50], atol=1e-9)
    f = 1.0 / math.tan(math.radians(30.0))
    x_ndc = f / 2.0 * 1.0 / 5.0  # aspect 2, a point 1 to the side at depth 5
    np.testing.assert_allclose(cam.project([0, 1, 0], (200, 100)), [100 + x_ndc * 100, 50], atol=1e-9)
    up = cam.project([0, 0, 1], (200, 100))
    assert up[0] == pytest.approx(100) and up[1] == pytest.approx(50 - f / 5.0 * 50)
    assert np.isnan(cam.project([10, 0, 0], (200, 100))).all()  # behind the eye


def test_camera_eye_follows_azimuth_and_elevation():
    cam = OrbitCamera(azimuth=90.0, elevation=30.0, distance=2.0, target=np.array([1.0, 0, 0]))
    np.testing.assert_allclose(
        cam.eye, [1.0, 2 * math.cos(math.radians(30)), 2 * math.sin(math.radians(30))], atol=1e-12
    )
    v = cam.view_matrix()
    np.testing.assert_allclose(v @ np.r_[cam.eye, 1.0], [0, 0, 0, 1], atol=1e-12)  # eye at the view origin
    assert (v @ np.r_[cam.target, 1.0])[2] == pytest.approx(-2.0)  # target straight ahead


@pytest.mark.parametrize("aspect_size", [(320, 240), (100, 300)])
def test_camera_fit_keeps_the_sphere_in_view(aspect_size):
    w, h = aspect_size
    cam = OrbitCamera(azimuth=-40.0, elevation=35.0, fov=45.0)
    center = np.array([3.0, -2.0, 1.0])
    cam.fit(2.5, center, aspect=w / h)
    np.testing.assert_allclose(cam.target, center)
    rng = np.random.default_rng(0)
    u = rng.normal(size=(500, 3))
    pts = center + 2.5 * u / np.linalg.norm(u, axis=1, keepdims=True)
    px = cam.project(pts, (w, h))
    assert np.all((px[:, 0] > 0) & (px[:, 0] < w) & (px[:, 1] > 0) & (px[:, 1] < h))
    # and it is a tight fit, not miles away
    assert (px[:, 0].max() - px[:, 0].min() > 0.5 * w) or (px[:, 1].max() - px[:, 1].min() > 0.5 * h)


def test_camera_from_settings_fits_when_distance_unset():
    cam = OrbitCamera.from_settings(CameraSettings(), extent=3.0, center=(1, 1, 1))
    np.testing.assert_allclose(cam.target, [1, 1, 1])
    assert cam.distance > 3.0
    fixed = OrbitCamera.from_settings(FIXED_CAMERA, extent=100.0)
    assert fixed.distance == 6.0 and fixed.azimuth == 30.0


def test_drag_changes_azimuth_and_elevation_and_clamps():
    cam = OrbitCamera(azimuth=10.0, elevation=0.0)
    cam.drag(10, 0)
    assert cam.azimuth == pytest.approx(10.0 - 10 * cam_mod.ROTATE_DEG_PER_PX)
    cam.drag(0, 20)
    assert cam.elevation == pytest.approx(20 * cam_mod.ROTATE_DEG_PER_PX)
    cam.drag(0, 10_000)
    assert cam.elevation == cam_mod.ELEVATION_LIMIT


def test_inertia_continues_the_drag_then_decays_within_half_a_second():
    cam = OrbitCamera(azimuth=0.0, elevation=0.0)
    t = 0.0
    for _ in range(5):  # 20 px per 1/60 s to the right: the azimuth decreases
        t += 1 / 60
        cam.drag(20, 0, t)
    cam.release(t + 0.01)
    v0 = cam.spin[0]
    assert v0 < -100.0  # degrees per second
    az0 = cam.azimuth
    for _ in range(30):  # 0.5 s at 60 Hz
        cam.update(1 / 60)
    assert cam.azimuth < az0  # kept turning the same way
    assert abs(cam.spin[0]) < 0.05 * abs(v0)
    for _ in range(60):
        cam.update(1 / 60)
    assert not cam.spin.any() and not cam.update(1 / 60)


def test_release_after_the_mouse_stopped_leaves_no_spin():
    cam = OrbitCamera()
    cam.drag(20, 0, 0.0)
    cam.drag(20, 0, 0.016)
    cam.release(0.5)
    assert not cam.spin.any()


def test_pan_moves_target_in_the_image_plane_and_zoom_scales_distance():
    cam = OrbitCamera(azimuth=0.0, elevation=0.0, distance=4.0)
    cam.pan(-50, 0, 200)  # drag left: the scene follows the cursor, so the target moves right (+y)
    assert cam.target[1] > 0 and cam.target[0] == pytest.approx(0) and cam.target[2] == pytest.approx(0)
    cam.zoom(1)
    assert cam.distance == pytest.approx(4.0 * cam_mod.ZOOM_PER_WHEEL_STEP)
    cam.zoom(-2)
    assert cam.distance > 4.0


# --------------------------------------------------------------------------------------------------
# colormaps and setup (no GL)


@pytest.mark.parametrize("name", NAMES)
def test_colormaps_are_256_rgb_in_range(name):
    c = colormap(name)
    assert c.shape == (256, 3) and c.dtype == np.float32
    assert c.min() >= 0.0 and c.max() <= 1.0


def test_viridis_fit_matches_the_published_table():
    from vispy.color.colormap import _viridis_data

    ref = np.asarray(_viridis_data)
    ours = colormap("viridis", size=len(ref))
    assert np.abs(ours - ref).max() < 0.02
    inferno = colormap("inferno")
    np.testing.assert_allclose(inferno[0], [0.0015, 0.0005, 0.0139], atol=0.02)
    np.testing.assert_allclose(inferno[-1], [0.988, 0.998, 0.645], atol=0.02)


def test_unknown_colormap_is_a_config_error():
    with pytest.raises(ConfigError, match="colormap"):
        colormap("jet")


def test_headless_resolution(monkeypatch):
    from test_display import dead_display

    live = os.environ.get("DISPLAY")  # pytest-xvfb's server, when it runs
    monkeypatch.delenv("NBODY_HEADLESS", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    monkeypatch.delenv("DISPLAY", raising=False)
    assert gl_setup.wants_headless(None)
    monkeypatch.setenv("DISPLAY", dead_display())  # named, but no server: headless all the same
    assert gl_setup.wants_headless(None)
    if live:
        monkeypatch.setenv("DISPLAY", live)
        assert not gl_setup.wants_headless(None) and gl_setup.wants_headless(True)
    monkeypatch.setenv("NBODY_HEADLESS", "1")
    assert gl_setup.wants_headless(None)
    monkeypatch.setenv("__EGL_VENDOR_LIBRARY_FILENAMES", "/usr/share/glvnd/egl_vendor.d/10_nvidia.json")
    assert gl_setup.nvidia_egl_present()
    monkeypatch.setenv("__EGL_VENDOR_LIBRARY_FILENAMES", "/usr/share/glvnd/egl_vendor.d/50_mesa.json")
    assert not gl_setup.nvidia_egl_present()


# --------------------------------------------------------------------------------------------------
# pixels (headless GL)


@pytest.mark.gl
def test_gl_info_names_the_renderer(gl_env):
    info = gl_setup.gl_info()
    assert info["backend"] == "egl" and info["renderer"] and info["version"]


@pytest.mark.gl
@pytest.mark.parametrize("xyz", [(0.0, 0.0, 0.0), (1.2, -0.7, 0.4), (-0.9, 1.1, -0.8)])
def test_single_body_lands_on_the_projected_pixel_on_black(make_viewer, xyz):
    v = make_viewer([[*xyz, 1.0]])
    img = v.render_to_array()
    assert img.shape == (H, W, 3) and img.dtype == np.uint8
    expect = v.camera.project(np.array(xyz), (W, H))  # continuous image coordinates
    row, col = brightest(img)
    assert img[row, col].max() > 100
    assert math.hypot(col + 0.5 - expect[0], row + 0.5 - expect[1]) <= 1.5, (row, col, expect)
    # away from the sprite (4 px nominal, 8 px drawn) the frame is exactly black
    yy, xx = np.mgrid[0:H, 0:W]
    far = np.hypot(xx + 0.5 - expect[0], yy + 0.5 - expect[1]) > 6
    assert not img[far].any()


@pytest.mark.gl
def test_plummer_cloud_is_brighter_at_the_centre_than_the_corners(make_viewer, tmp_path):
    v = make_viewer(plummer_pos4(4000), camera=CameraSettings(fov=45.0), size=(W, H))
    img = v.render_to_array()
    from PIL import Image

    Image.fromarray(img).save(tmp_path / "plummer.png")
    lum = img.astype(float).mean(axis=2)
    c = lum[H // 2 - 20 : H // 2 + 20, W // 2 - 20 : W // 2 + 20].mean()
    corners = [lum[:30, :30], lum[:30, -30:], lum[-30:, :30], lum[-30:, -30:]]
    assert c > 60.0
    assert all(c > 5.0 * max(k.mean(), 1.0) for k in corners)
    assert (lum == 0).mean() > 0.3  # plenty of untouched black sky between the outer stars


@pytest.mark.gl
def test_brightness_and_background_settings(make_viewer):
    body = [[0.0, 0.0, 0.0, 1.0]]
    dim = make_viewer(body, render=RenderSettings(point_size=4.0, brightness=0.3)).render_to_array()
    bright = make_viewer(body, render=RenderSettings(point_size=4.0, brightness=3.0)).render_to_array()
    assert int(bright.sum()) > int(dim.sum()) > 0
    bg = make_viewer(body, render=RenderSettings(background=(0.2, 0.0, 0.0))).render_to_array()
    assert tuple(bg[0, 0]) == (51, 0, 0)


@pytest.mark.gl
@pytest.mark.parametrize("background", [(0.0, 0.0, 0.0), (0.2, 0.1, 0.0)])
def test_stacked_sprites_add_light_through_the_exponential_tone_map(make_viewer, background):
    """k bodies on one spot show b + (1 - b)(1 - exp(-k x)): light adds, then 1 - exp(-x) maps it."""
    settings = RenderSettings(point_size=4.0, brightness=0.6, color_by="none", background=background)
    centre = []
    for k in (1, 2, 4):
        v = make_viewer([[0.0, 0.0, 0.0, 1.0]] * k, render=settings)
        img = v.render_to_array()
        centre.append(img[brightest(img)].astype(float) / 255.0)
    bg = np.array(background)
    s1 = (centre[0] - bg) / (1.0 - bg)  # one sprite's tone-mapped light, 1 - exp(-x)
    assert 0.15 < s1.max() < 0.85, s1  # well inside the curve, where k-fold light is not saturated
    for k, seen in zip((2, 4), centre[1:], strict=True):
        expect = bg + (1.0 - bg) * (1.0 - (1.0 - s1) ** k)
        assert np.abs(seen - expect).max() <= 3.5 / 255, (k, seen * 255, expect * 255)
        assert np.all(seen <= np.minimum(bg + (1.0 - bg) * k * s1, 1.0) + 1.5 / 255)  # below plain adding


@pytest.mark.gl
def test_draw_limit_draws_every_kth_body_with_k_times_the_light(make_viewer):
    """render.draw_limit: 8 bodies in a row, limit 4 -> bodies 0, 2, 4, 6 drawn, each twice as bright."""
    xs = np.linspace(-2.0, 2.0, 8)
    pos4 = [[x, 0.0, 0.0, 1.0] for x in xs]
    camera = CameraSettings(azimuth=90.0, elevation=0.0, distance=8.0, target=(0.0, 0.0, 0.0), fov=45.0)
    base = dict(point_size=4.0, brightness=0.3, color_by="none", size_by_mass=False)
    full = make_viewer(pos4, camera=camera, render=RenderSettings(**base))
    half = make_viewer(pos4, camera=camera, render=RenderSettings(**base, draw_limit=4))
    img_full, img_half = full.render_to_array(), half.render_to_array()
    assert half.renderer.draw_stride() == 2 and full.renderer.draw_stride() == 1
    for i, x in enumerate(xs):
        col, row = (int(c) for c in full.camera.project(np.array([x, 0.0, 0.0]), (W, H)))
        one = float(img_full[row - 1 : row + 2, col - 1 : col + 2].max())
        seen = float(img_half[row - 1 : row + 2, col - 1 : col + 2].max())
        assert one > 40, (i, one)
        if i % 2:
            assert seen == 0, (i, seen)  # left out
        else:  # 1 - exp(-2x) against 1 - exp(-x): twice the light, through the tone map
            s1 = one / 255.0
            assert abs(seen / 255.0 - (1.0 - (1.0 - s1) ** 2)) <= 4 / 255, (i, one, seen)


@pytest.mark.gl
def test_min_sprite_draws_small_bodies_on_fewer_pixels_with_the_same_light(make_viewer):
    """A 1-px nominal body is drawn min_sprite px wide, dimmed by the area ratio: fewer pixels lit at
    min_sprite 1 than at 3, and about the same summed light (before the tone map saturates)."""
    rng = np.random.default_rng(3)
    pos4 = np.c_[rng.uniform(-2, 2, (40, 3)), np.ones(40)]
    base = dict(point_size=0.5, brightness=0.2, color_by="none", size_by_mass=False)
    lit, light = [], []
    for m in (3.0, 1.0):
        img = make_viewer(pos4, render=RenderSettings(**base, min_sprite=m)).render_to_array()
        lum = img.astype(float).max(axis=2) / 255.0
        lit.append(int((lum > 0).sum()))
        light.append(float(-np.log1p(-np.minimum(lum, 0.999)).sum()))  # undo 1 - exp(-x)
    assert lit[1] < lit[0] / 2, lit
    assert light[1] == pytest.approx(light[0], rel=0.35), light


@pytest.mark.gl
def test_step_and_render_fills_stats_and_calls_overlays_after_particles(make_viewer):
    from vispy import gloo

    v = make_viewer([[0.0, 0.0, 0.0, 1.0]])
    seen = []

    def overlay(viewer):
        seen.append(int(gloo.read_pixels(alpha=False).max()))  # the particles are already there

    v.overlays.append(overlay)
    v.scene.run.steps_per_frame = 3
    v.step_and_render()
    v.step_and_render()
    assert v.backend.steps == 6
    assert len(seen) == 2 and seen[0] > 0
    s = v.stats
    assert s.frame == 2 and s.step.kernel == "fake" and s.step.steps == 3
    assert s.n == 1 and s.data_path == "host upload" and s.kernel == "fake"
    assert s.draw_timer in ("GL_TIME_ELAPSED", "glFinish+perf_counter") and s.draw_ms >= 0
    assert s.frame_ms > 0
    v.toggle_pause()
    v.step_and_render()
    assert v.backend.steps == 6 and v.stats.paused
    assert "fake" in v.status_line() and "N=1" in v.status_line()


@pytest.mark.gl
def test_vbo_names_are_gl_buffers_and_follow_n(make_viewer):
    from vispy.gloo import gl

    v = make_viewer(plummer_pos4(100))
    names = v.backend.attached[-1]
    assert names == v.renderer.gl_names() and len(set(names)) == 2
    v.set_current()
    assert all(gl.glIsBuffer(n) for n in names)
    v.backend.set_bodies(plummer_pos4(250))
    v.advance()  # N changed: new buffers, offered to the backend again
    assert v.renderer.n == 250 and v.stats.n == 250 and len(v.backend.attached) == 2
    assert v.backend.attached[-1] == v.renderer.gl_names()
    assert v.render_to_array().any()


@pytest.mark.gl
def test_interop_backend_is_never_asked_for_host_arrays_per_frame(make_viewer):
    v = make_viewer(plummer_pos4(64), interop=True)
    assert v.interop and v.stats.data_path == "CUDA-GL interop"
    reads = v.backend.host_reads
    for _ in range(3):
        v.step_and_render()
    assert v.backend.host_reads == reads
    v.renderer.set_speed_scale(2.5)
    assert v.renderer.speed_scale == 2.5


@pytest.mark.gl
def test_glsl_compile_error_names_the_file(make_viewer, tmp_path):
    from app.core.paths import SHADERS
    from app.render.shaders import ShaderError, build_program

    v = make_viewer([[0.0, 0.0, 0.0, 1.0]])
    v.set_current()
    (tmp_path / "broken.vert").write_text(
        "#version 120\nattribute vec4 a_pos;\nvoid main() {\n    gl_Position = a_pos\n}\n"
    )
    (tmp_path / "ok.frag").write_text((SHADERS / "particles.frag").read_text())
    with pytest.raises(ShaderError) as err:
        build_program("broken.vert", "ok.frag", directory=tmp_path, canvas=v)
    msg = str(err.value)
    assert "broken.vert" in msg and "error" in msg.lower()
    assert isinstance(err.value, RuntimeFault) and err.value.log
    with pytest.raises(ShaderError, match="missing.frag"):
        build_program("broken.vert", "missing.frag", directory=tmp_path, canvas=v)


# --------------------------------------------------------------------------------------------------
# recorder (headless GL + PyAV)


@pytest.mark.gl
def test_record_writes_h264_mp4_and_png_still(make_viewer, tmp_path):
    import av
    from PIL import Image

    from app.render.recorder import record

    v = make_viewer(plummer_pos4(500), camera=CameraSettings(), size=(161, 121))
    out = tmp_path / "clip.mp4"
    res = record(v, out, frames=6, fps=30, still_path=tmp_path / "still.png", progress=False)
    assert res.size == (160, 120) and out.is_file() and (tmp_path / "still.png").is_file()
    assert v.backend.steps == 6
    with av.open(str(out)) as c:
        s = c.streams.video[0]
        assert s.codec_context.name == "h264" and s.codec_context.pix_fmt == "yuv420p"
        assert (s.width, s.height) == (160, 120)
        assert sum(1 for _ in c.decode(video=0)) == 6
    assert Image.open(tmp_path / "still.png").size == (160, 120)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clip.mp4", "still.png"]


@pytest.mark.gl
def test_record_to_unwritable_place_is_one_clear_line(make_viewer, tmp_path):
    from app.render.recorder import record

    v = make_viewer([[0.0, 0.0, 0.0, 1.0]], size=(64, 48))
    (tmp_path / "a_file").write_text("x")
    for bad in (tmp_path / "a_file" / "clip.mp4", tmp_path / "no" / "such" / "dir" / "clip.mp4"):
        with pytest.raises(RuntimeFault) as err:
            record(v, bad, frames=2, progress=False)
        assert "\n" not in str(err.value) and str(bad.parent) in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


@pytest.mark.gl
def test_record_failure_leaves_no_file(make_viewer, tmp_path):
    from app.render.recorder import record

    v = make_viewer([[0.0, 0.0, 0.0, 1.0]], size=(64, 48))
    real = v.render_to_array
    calls = []

    def flaky(size=None, overlays=False):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("GPU fell over")
        return real(size, overlays)

    v.render_to_array = flaky
    with pytest.raises(RuntimeError, match="fell over"):
        record(v, tmp_path / "clip.mp4", frames=5, still_path=tmp_path / "s.png", progress=False)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.gl
def test_headless_run_stops_after_frames_and_writes_the_exit_screenshot(make_viewer, tmp_path):
    v = make_viewer(plummer_pos4(200), camera=CameraSettings(), size=(96, 64))
    v.screenshot_on_exit = tmp_path / "last.png"
    assert v.run(frames=5) == 0
    assert v.stats.frame == 5 and v.backend.steps == 5
    from PIL import Image

    assert Image.open(tmp_path / "last.png").size == (96, 64)


class _Ev:
    """Just the fields the viewer's input handlers read from vispy's mouse/key events."""

    def __init__(self, pos=(0, 0), button=1, modifiers=(), delta=(0, 0), key=None, dragging=True):
        self.pos, self.button, self.modifiers, self.delta = pos, button, modifiers, delta
        self.is_dragging = dragging
        self.key = key


@pytest.mark.gl
def test_mouse_and_keys_drive_the_camera(make_viewer):
    from vispy.util import keys

    v = make_viewer(plummer_pos4(100), camera=CameraSettings())
    az, target, dist = v.camera.azimuth, v.camera.target.copy(), v.camera.distance
    v.on_mouse_press(_Ev((100, 100)))
    v.on_mouse_move(_Ev((130, 100)))
    v.on_mouse_release(_Ev((130, 100)))
    assert v.camera.azimuth == pytest.approx(az - 30 * cam_mod.ROTATE_DEG_PER_PX)
    for mods, button in (((keys.SHIFT,), 1), ((), 2)):  # shift+left and right drag pan
        before = v.camera.target.copy()
        v.on_mouse_press(_Ev((100, 100), button=button, modifiers=mods))
        v.on_mouse_move(_Ev((120, 90), button=button, modifiers=mods))
        v.on_mouse_release(_Ev((120, 90), button=button))
        assert not np.allclose(v.camera.target, before)
    v.on_mouse_wheel(_Ev(delta=(0, 2)))
    assert v.camera.distance < dist
    v.capture_mouse.append(lambda: True)  # e.g. the ImGui panel wants the mouse
    az = v.camera.azimuth
    v.on_mouse_press(_Ev((100, 100)))
    v.on_mouse_move(_Ev((200, 100)))
    assert v.camera.azimuth == az
    v.on_key_press(_Ev(key=keys.SPACE))
    assert v.paused
    v.on_key_press(_Ev(key=keys.Key("R")))
    np.testing.assert_allclose(v.camera.target, target, atol=1e-6)
    assert v.camera.distance == pytest.approx(dist)
    v.camera.target = target + 5.0
    v.on_key_press(_Ev(key=keys.Key("F")))
    np.testing.assert_allclose(v.camera.target, target, atol=1e-6)
    v.on_key_press(_Ev(key=keys.ESCAPE))
    assert v.quit_requested


@pytest.mark.gl
def test_non_finite_state_pauses_the_viewer_with_the_body_named(gl_env):
    """A blown-up simulation keeps the window alive on its last good frame, paused, saying why."""
    from app.backends.cpu import BACKEND
    from app.render.canvas import Viewer

    rng = np.random.default_rng(3)
    bodies = Bodies(rng.normal(size=(128, 3)), np.zeros((128, 3)), np.full(128, 1 / 128))
    backend = BACKEND()
    backend.load(bodies, Physics(softening=0.05))
    v = Viewer(Scene(name="nan"), backend, size=(64, 48), headless=True)
    try:
        v.advance()
        backend._pos[42, 1] = np.inf
        v.advance()
        assert v.paused and v.stats.paused
        assert "body 42" in v.stats.extra["message"] and "body 42" in v.status_line()
        v.advance()  # stays paused: no exception, nothing stepped
        v.render_to_array()
    finally:
        v.close()


def test_a_shader_saved_while_the_viewer_runs_is_compiled_in_place_or_refused(make_viewer, tmp_path):
    """The hot reload's shader half: the particles' program takes its stages again from the files, its
    buffers and uniforms kept (the body still lands on its pixel), in the colour the new fragment stage
    writes; a stage that does not compile is a ShaderError naming the file, and the program draws on
    as it did."""
    from app.core.paths import SHADERS
    from app.render.shaders import ShaderError, reload_shaders

    v = make_viewer([[0.0, 0.0, 0.0, 1.0]])
    before = v.render_to_array()
    row, col = brightest(before)
    assert before[row, col].sum() > 150
    for name in ("particles.vert", "particles.frag"):
        (tmp_path / name).write_text((SHADERS / name).read_text())
    red = (
        (SHADERS / "particles.frag")
        .read_text()
        .replace(
            "gl_FragColor = vec4(1.0 - exp(-v_color * g), 1.0);", "gl_FragColor = vec4(g, 0.0, 0.0, 1.0);"
        )
    )
    assert red != (SHADERS / "particles.frag").read_text()
    (tmp_path / "particles.frag").write_text(red)
    v.set_current()
    reload_shaders(v.renderer.program, "particles.vert", "particles.frag", tmp_path, v)
    img = v.render_to_array()
    r, g, b = (int(c) for c in img[row, col][:3])
    assert r > 200 and g < 30 and b < 30, img[row, col]  # the same pixel, in the new stage's red

    (tmp_path / "particles.frag").write_text(red.replace("gl_FragColor", "gl_FragColour"))
    v.set_current()
    with pytest.raises(ShaderError, match="particles.frag"):
        reload_shaders(v.renderer.program, "particles.vert", "particles.frag", tmp_path, v)
    again = v.render_to_array()
    assert (again[row, col][:3] == img[row, col][:3]).all()  # the program it had still draws
