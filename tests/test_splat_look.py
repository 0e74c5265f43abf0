"""Issue 24's "not burnt out", on the numba twin (whose image the CUDA kernels match bit for bit:
tests/test_splat_gpu.py): the `collision` preset as `record` draws it at 1920x1080 (its camera, its
render settings: colour by speed, magma, the halos hidden) at 1M bodies, and the same state at 8M bodies
(each body copied 8 times with a small seeded offset, as bench/splat_cost.py grows N). With the default
automatic exposure under 2% of the lit pixels are white, and the mean brightness over the lit pixels of
the 8M frame is within 20% of the 1M frame's. The frames at the start only: after the first passage
needs ~3,000 steps of the 8M state, which is the GPU's (docs/rendering.md, "Not yet")."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from splat_cost import base_state, grown  # noqa: E402

from app.model import components as comps  # noqa: E402
from app.render.camera import OrbitCamera  # noqa: E402
from app.render.canvas import bodies_extent  # noqa: E402
from app.render.splat import SplatParams, SplatView  # noqa: E402
from app.render.splat_cpu import splat_image  # noqa: E402
from app.render.splat_light import body_light  # noqa: E402

SIZE = (1920, 1080)


@pytest.fixture(scope="module")
def collision_frames():
    scene, pos, speeds, parts = base_state("collision", 1 << 20, 11)
    ext, com = bodies_extent(pos)
    camera = OrbitCamera.from_settings(scene.camera, ext, com, aspect=SIZE[0] / SIZE[1])
    view = SplatView.of(camera, SIZE)
    speed_scale = float(np.percentile(speeds, 95))
    frames = {}
    for copies in (1, 8):
        n = copies * len(pos)
        p, s = grown(pos, speeds, n, 0.004 * ext, 5)
        comp = np.tile(parts.index, copies).astype(np.uint8)
        drawn = comps.drawn(comps.Components(parts.names, comp), scene.render.components)
        light = body_light(scene.render, drawn, n, speed_scale=speed_scale, mean_mass=float(p[0, 3]))
        frames[n] = splat_image(p, view, light, SplatParams(*SIZE), comp=comp, values=s)
    return frames


def look_figures(
    images: dict[int, np.ndarray],
) -> tuple[dict[int, float], dict[int, float], dict[int, float]]:
    """(lit share of the frame, white share of the lit pixels, mean brightness over the pixels lit in any
    of the frames) per N, for (H, W, 3+) uint8 images keyed by N (also tests/test_splat_record_gpu.py's).
    White: a channel at 255; brightness: the brightest channel."""
    lit = {n: im[..., :3].max(axis=2) > 0 for n, im in images.items()}
    either = np.logical_or.reduce(list(lit.values()))
    lit_share, white_share, means = {}, {}, {}
    for n, im in images.items():
        rgb = im[..., :3]
        white = (rgb == 255).any(axis=2) & lit[n]
        lit_share[n] = float(lit[n].mean())
        white_share[n] = float(white.sum() / max(lit[n].sum(), 1))
        means[n] = float(rgb.astype(np.float64).max(axis=2)[either].mean())
    return lit_share, white_share, means


def test_the_collision_at_1m_and_8m_is_not_burnt_out_and_as_bright(collision_frames):
    """The mean is taken over the pixels lit in either frame (the same pixels for both, as the twin's
    galaxy test does): 8M bodies light more of the faint outskirts, so a mean over each frame's own lit
    pixels falls with N although the light is the same (0.79x here, 1M: 2.3% of the frame lit)."""
    lit, white, means = look_figures({n: f.image for n, f in collision_frames.items()})
    for n in lit:
        assert lit[n] > 0.01, n  # a scene, not a black frame (the galaxies fill ~2% at 1M)
        assert white[n] < 0.02, f"N = {n:,}: {white[n]:.2%} white"
    small, large = (means[n] for n in sorted(means))
    assert 0.8 < large / small < 1.2, means
