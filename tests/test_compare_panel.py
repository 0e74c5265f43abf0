"""The Compare tab driven as a user drives it (tests/test_panel.py's UI: synthesised vispy mouse events on
the viewer's own emitters, headless EGL): clicks pick kernel B and turn A/B on, and the tab shows both
times, B / A and the difference, the numbers of the comparison; the error views' radio buttons colour the
bodies by their error (the speed buffer then holds each body's place on the legend) with the legend drawn;
a kernel of another backend is refused with one line; the state is bitwise that of a run without A/B."""

from __future__ import annotations

import numpy as np
import pytest
from test_panel import UI
from test_panel import gl_env as gl_env  # the fixture

from app.engine.error_colours import error_positions
from app.model.physics import accelerations, relative_errors

pytestmark = pytest.mark.gl
TALL = 960  # the tab's lower widgets below the live numbers: a window tall enough to show them unscrolled


@pytest.fixture
def ui(gl_env):
    u = UI(n=512, kernel="cpu-tree", height=TALL)
    u.frame(3)  # the tree's live force error and stage split shown: the tabs below them settled
    yield u
    u.close()


def _speed_buffer(ui) -> np.ndarray:
    """What the renderer's per-body float holds now (read back from GL)."""
    from OpenGL import GL

    ui.viewer.set_current()
    ui.viewer.context.flush_commands()
    vbo = ui.viewer.renderer.gl_names()[1]
    GL.glBindBuffer(GL.GL_ARRAY_BUFFER, vbo)
    data = GL.glGetBufferSubData(GL.GL_ARRAY_BUFFER, 0, 4 * ui.viewer.renderer.n)
    GL.glBindBuffer(GL.GL_ARRAY_BUFFER, 0)
    return np.frombuffer(bytes(data), np.float32).copy()


def test_clicks_pick_b_turn_ab_on_and_the_tab_shows_both_times_the_ratio_and_the_difference(ui):
    ui.ctl.set_tunable("theta", 1.0)  # a tree whose error shows against fp64
    ui.frame(3)  # (its live force error, now over the record's budget, takes a line more)
    ui.tab("Compare")
    assert ui.ctl.compare.ab.kernel_b is None and not ui.ctl.compare.on
    ui.click("compare:kernel_b")
    ui.click("compare:kernel_b=cpu-fp64")
    assert ui.ctl.compare.ab.kernel_b == "cpu-fp64" and not ui.ctl.compare.on
    ui.click("compare:on")
    ui.frame(3)
    state = ui.ctl.compare
    r = state.ab.latest
    assert state.on and r is not None and (r.kernel_a, r.kernel_b) == ("cpu-tree", "cpu-fp64")
    assert r.a_ms > 0 and r.b_ms > 0 and r.n == r.k == 512
    # what the tab shows is the comparison's own numbers
    texts = ui.panel.texts
    assert texts["compare:a_ms"] == f"{r.a_ms:.3f} ms" and texts["compare:b_ms"] == f"{r.b_ms:.3f} ms"
    assert texts["compare:ratio"] == f"{r.ratio:.2f}x"
    assert texts["compare:median"] == f"{r.median:.2e}" and texts["compare:p99"] == f"{r.p99:.2e}"
    # and they are the tree's error against float64 (B at the state the tab shows)
    backend = ui.backend
    s = backend.state()
    assert r.sim_time == backend.time
    errors = relative_errors(backend.accelerations(), accelerations(s.pos, s.mass, backend.physics))
    assert r.median == pytest.approx(float(np.median(errors)), rel=1e-5) and r.median > 1e-5
    # every k-th frame: typed into its field
    x0, y0, _, y1 = ui.panel.item_rects["compare:every"]
    ui.click((x0 + 20, (y0 + y1) / 2))  # its text, left of the - and + buttons
    ui.type("4")
    ui.enter()
    assert state.ab.every == 4 and ui.ctl.message == "A/B: B evaluated every 4 frames"
    ui.click("compare:on")
    assert not ui.ctl.compare.on and ui.ctl.message == "A/B off"


def test_a_kernel_of_another_backend_is_refused_with_one_line(ui):
    ui.ctl._why_not["shared"] = None  # as if a GPU were here: the CUDA kernels can be picked in the combo
    ui.tab("Compare")
    ui.click("compare:kernel_b")
    ui.click("compare:kernel_b=shared")
    assert ui.ctl.compare.ab.kernel_b is None
    message = ui.ctl.message
    assert (
        message.startswith("A/B: shared is a cuda kernel and A (cpu-tree) a cpu one") and "\n" not in message
    )
    ui.click("compare:on")  # B defaults to the backend's float64 reference
    assert ui.ctl.compare.on and ui.ctl.compare.ab.kernel_b == "cpu-fp64"


def test_the_error_views_colour_each_body_by_its_error_with_the_legend(ui):
    ui.ctl.set_tunable("opening", "cube")  # θ's test at every step (under rel only the first step's)
    ui.ctl.set_tunable("theta", 1.0)
    ui.frame(3)
    ui.tab("Compare")
    ui.click("compare:view=error")
    assert ui.viewer.scene.render.color_by == "error"
    ui.frame(2)
    for _ in range(20):  # the exact sum: a few pieces at most at N = 512
        if ui.ctl.compare.exact.latest is not None:
            break
        ui.frame()
    summary = ui.ctl.compare.exact.latest
    assert summary is not None and summary.kernel == "cpu-tree" and summary.n == 512
    assert ui.panel.texts["compare:legend"] == "1e-7 1e-6 1e-5 1e-4 1e-3 1e-2 1e-1"
    assert "against the exact sum over all 512 bodies" in ui.panel.texts["compare:exact"]
    # pause, so that the buffer holds the colours of the state the test reads
    from vispy.util import keys

    ui.key(keys.SPACE, " ")
    ui.click("compare:view=off")  # and on again: a sum of the paused state, then its colours in the buffer
    assert ui.viewer.scene.render.color_by == "speed"
    ui.click("compare:view=error")
    ui.frame(4)
    backend = ui.backend
    s = backend.state()
    expect = error_positions(
        relative_errors(backend.accelerations(), accelerations(s.pos, s.mass, backend.physics))
    )
    got = _speed_buffer(ui)
    np.testing.assert_allclose(got, expect, atol=1e-4)
    assert got.min() < 0.3 and got.max() > 0.7
    # against kernel B: A/B turns on with the default B, the colours are A against B
    ui.click("compare:view=error-ab")
    assert ui.viewer.scene.render.color_by == "error-ab" and ui.ctl.compare.on
    ui.key(keys.SPACE, " ")
    ui.frame(3)
    ui.key(keys.SPACE, " ")
    ui.frame(2)
    s = backend.state()
    expect = error_positions(
        relative_errors(backend.accelerations(), accelerations(s.pos, s.mass, backend.physics))
    )
    np.testing.assert_allclose(_speed_buffer(ui), expect, atol=1e-4)  # B is cpu-fp64: float64 to 1e-15
    ui.click("compare:view=off")
    assert ui.viewer.scene.render.color_by == "speed"


def test_the_state_is_bitwise_a_run_without_ab(ui):
    from app.backends.cpu import CPUBackend
    from app.scene import make_bodies

    ui.tab("Compare")
    ui.click("compare:on")
    ui.click("compare:view=error-ab")
    ui.frame(5)
    assert ui.ctl.compare.ab.latest is not None and ui.ctl.compare.ab.colours_written
    backend = ui.backend
    steps = round(backend.time / backend.physics.dt)
    plain = CPUBackend()
    plain.load(make_bodies(ui.scene), backend.physics, "cpu-tree")
    for _ in range(steps):
        plain.step(1)
    a, b = plain.state(), backend.state()
    assert steps > 10 and a.pos.tobytes() == b.pos.tobytes() and a.vel.tobytes() == b.vel.tobytes()


def test_run_compare_starts_with_ab_on_and_reports_it_and_refuses_another_backends_kernel(gl_env, capsys):
    from app.cli import main

    args = ["run", "plummer", "--n", "256", "--backend", "cpu", "--headless", "--frames", "12"]
    assert main([*args, "--compare", "cpu-fp64"]) == 0
    out = capsys.readouterr().out
    assert "A/B at N = 256: cpu-simd " in out and " vs cpu-fp64 " in out and "(B/A " in out, out
    assert main([*args, "--compare", "shared"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "nbody-live run: error: --compare shared: A/B: shared is a cuda kernel and A (cpu-simd) a cpu one: "
        "A and B must be kernels of one backend"
    ]


def test_a_form_that_cannot_compare_says_so_in_the_tab(gl_env):
    from app.commands.assembly import make_backend
    from app.scene import load_scene

    scene = load_scene("plummer", {"initial.n": 512, "run.backend": "cpu", "run.gpus": "2"})
    u = UI(n=512, backend=make_backend(scene), height=TALL)
    try:
        u.frame(3)
        u.tab("Compare")
        u.click("compare:on")
        u.frame(2)
        assert u.ctl.compare.ab.latest is None
        assert u.panel.texts["compare:note"] == (
            "A/B and error colours: the cpu backend on 2 devices does not compare kernels"
        )
        u.frame(2)
        assert u.backend.devices == 2  # and the run goes on
    finally:
        u.close()
