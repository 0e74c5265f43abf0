"""The ImGui panel driven like a user drives it: synthesised vispy events (mouse_move / mouse_press /
mouse_release / key_press / key_release) emitted on the viewer's own event emitters, the path a glfw
window delivers them through, on headless EGL (Mesa llvmpipe here). The tests never call into the
panel's state to act: they read where the widgets were drawn (`panel.item_rects`, the layout of the last
frame) to know where to click, and read state afterwards to check the effect.

Backend: the CPU backend (cpu-simd, cpu-fp64); the CUDA records are listed greyed without pycuda. The
tunables test uses a test double whose one kernel has a float and an int tunable.
"""

from __future__ import annotations

import numpy as np
import pytest
from fakes import FakeBackend

from app.core.values import FloatRange, IntChoice
from app.engine.forces import KernelRecord
from app.render import gl_setup

pytestmark = pytest.mark.gl

W, H = 960, 640


@pytest.fixture(scope="module")
def gl_env():
    try:
        gl_setup.configure(headless=True)
        from vispy import app

        probe = app.Canvas(size=(16, 16), show=False)
        probe.close()
    except Exception as e:  # noqa: BLE001 - no GL here: skip with the reason
        pytest.skip(f"no headless GL context: {type(e).__name__}: {e}")
    try:
        import imgui_bundle  # noqa: F401
    except ImportError as e:
        pytest.skip(f"imgui-bundle is not importable: {e}")
    return gl_setup.backend_name()


class UI:
    """A viewer with the panel, and a 'user' who moves the mouse, clicks and types through vispy events."""

    def __init__(self, n: int = 512, backend=None, kernel: str = "auto", height: int = H):
        from app.commands.assembly import make_backend
        from app.render.canvas import Viewer
        from app.scene import load_scene
        from app.ui import Panel

        self.scene = load_scene(
            "plummer", {"initial.n": n, "run.backend": "cpu", "run.steps_per_frame": 1, "run.kernel": kernel}
        )
        self.viewer = Viewer(self.scene, backend or make_backend(self.scene), size=(W, height), headless=True)
        self.panel = Panel(self.viewer)
        self.ctl = self.panel.controller
        # rebuild the widgets every frame: what a test changes without input (a kernel, a failure) shows at
        # the next frame, not when 1/30 s of wall time has passed (test_frames_between_rebuilds_... sets it)
        self.panel.bridge.refresh_hz = 0.0
        self.frame(2)

    @property
    def backend(self):
        return self.viewer.backend

    def frame(self, n: int = 1) -> None:
        for _ in range(n):
            self.viewer.step_and_render()

    def center(self, name: str) -> tuple[float, float]:
        drawn = sorted(self.panel.item_rects)
        assert name in self.panel.item_rects, f"{name!r} was not drawn; drawn: {drawn}"
        x0, y0, x1, y1 = self.panel.item_rects[name]
        return (x0 + x1) / 2, (y0 + y1) / 2

    def tab(self, name: str) -> None:
        self.click(f"tab:{name}")

    # ImGui trickles queued input over frames (a press and a release queued together still make a
    # click), so the user below lets two frames pass after each event, as a person's hand would.
    def move(self, pos) -> None:
        self.viewer.events.mouse_move(pos=pos, button=None, buttons=[], modifiers=())
        self.frame(2)

    def click(self, target, button: int = 1) -> None:
        pos = self.center(target) if isinstance(target, str) else target
        aimed = self.panel.item_rects.get(target) if isinstance(target, str) else None
        self.move(pos)
        if aimed is not None:  # a widget that moved while the pointer went to it: the click lands elsewhere
            now = self.panel.item_rects.get(target)
            assert now == aimed, f"{target!r} moved under the pointer from {aimed} to {now}"
        self.viewer.events.mouse_press(pos=pos, button=button, buttons=[button], modifiers=())
        self.frame(2)
        self.viewer.events.mouse_release(pos=pos, button=button, buttons=[], modifiers=())
        self.frame(3)  # ImGui lays a new popup out in its first frame, then places it: let it settle

    def key(self, key, text: str = "", frame: bool = True) -> None:
        self.viewer.events.key_press(key=key, text=text, modifiers=())
        if frame:
            self.frame(2)
        self.viewer.events.key_release(key=key, text="", modifiers=())
        if frame:
            self.frame(2)

    def type(self, text: str) -> None:
        from vispy.util import keys

        for ch in text:
            self.key(keys.Key(ch.upper() if ch.isalpha() else ch), ch, frame=False)
        self.frame(2 * len(text) + 1)

    def enter(self) -> None:
        from vispy.util import keys

        self.key(keys.ENTER)
        self.frame()

    def close(self) -> None:
        self.panel.close()
        b = self.viewer.backend
        self.viewer.close()
        b.close()


@pytest.fixture
def ui(gl_env):
    u = UI()
    yield u
    u.close()


class TunableBackend(FakeBackend):
    """One kernel with a tree's kind of tunables; each step() notes the values it ran with."""

    RECORD = KernelRecord(
        name="fake-tree",
        doc="a test double with tunables",
        backend="fake",
        tunables=(
            FloatRange("theta", 0.0, 1.5, 0.5, lo_open=True, doc="opening angle"),
            IntChoice("leaf", (8, 16, 32), 16, doc="bodies per leaf"),
        ),
    )
    kernel = RECORD.name

    def __init__(self, n: int):
        from app.model.ics import generate

        super().__init__(generate("plummer", n, 1).pos4())
        self.seen: list[dict] = []

    @classmethod
    def kernels(cls):
        return [cls.RECORD]

    def step(self, steps=1):
        self.seen.append(self.tunables())
        return super().step(steps)


@pytest.fixture
def tunable_ui(gl_env, monkeypatch):
    from app.ui import controller

    # the registry the controller lists is this double's alone
    monkeypatch.setattr(controller, "all_kernel_records", TunableBackend.kernels)
    monkeypatch.setattr(controller, "backend_class", lambda name: TunableBackend)
    u = UI(backend=TunableBackend(512))
    yield u
    u.close()


def test_tunables_are_a_slider_and_a_combo_and_reach_the_next_step(tunable_ui):
    from vispy.util import keys

    ui = tunable_ui
    b = ui.backend
    assert b.tunables() == {"theta": 0.5, "leaf": 16} and len(b.seen) == 2  # the two start-up frames
    ui.key(keys.SPACE, " ")  # paused: nothing steps while the user sets the values
    seen = len(b.seen)
    x0, y0, _, y1 = ui.panel.item_rects["tunable:theta"]
    ui.click((x0 + 0.8 * 150.0, (y0 + y1) / 2))  # the slider (150 px wide, its label right of it) at 80 %
    theta = b.tunables()["theta"]
    assert 1.05 < theta < 1.35, (theta, ui.ctl.message)
    assert ui.ctl.message == f"fake-tree.theta = {theta:g} from the next step"
    ui.click("tunable:leaf")
    assert "tunable:leaf=32" in ui.panel.item_rects, "the combo did not open"
    ui.click("tunable:leaf=32")
    assert b.tunables() == {"theta": theta, "leaf": 32} and len(b.seen) == seen
    ui.key(keys.SPACE, " ")
    ui.frame()
    assert b.seen[seen] == {"theta": theta, "leaf": 32}  # the next step ran with both
    assert not ui.panel.red_fields
    # a value the record refuses is its ConfigError's text, and the value in effect stays
    err = ui.ctl.set_tunable("leaf", 12)
    assert err == "fake-tree.leaf: 12 is not one of 8, 16, 32" and b.tunables()["leaf"] == 32
    assert "no tunable 'block'" in ui.ctl.set_tunable("block", 128)


def _state(backend):
    s = backend.state()
    return s.pos.copy(), s.vel.copy()


def test_kernel_combo_click_switches_next_step_and_state_is_bitwise_untouched(ui):
    from vispy.util import keys

    assert ui.backend.kernel == "cpu-simd"
    ui.key(keys.SPACE, " ")  # pause through the viewer's key path
    assert ui.viewer.paused
    steps_before = ui.viewer.stats.step
    pos0, vel0 = _state(ui.backend)
    ui.click("kernel_combo")
    assert "kernel:cpu-fp64" in ui.panel.item_rects, "the combo did not open"
    # every registry record is listed; without pycuda the CUDA ones are greyed: clicking one does nothing
    cuda = [r.name for r in ui.ctl.records if r.backend == "cuda"]
    for name in cuda:
        assert f"kernel:{name}" in ui.panel.item_rects and ui.ctl.why_not(name)
    if cuda and ui.ctl.why_not(cuda[0]):
        ui.click(f"kernel:{cuda[0]}")
        assert ui.backend.kernel == "cpu-simd"
        if "kernel:cpu-fp64" not in ui.panel.item_rects:
            ui.click("kernel_combo")
    ui.click("kernel:cpu-fp64")
    assert ui.backend.kernel == "cpu-fp64"
    pos1, vel1 = _state(ui.backend)
    assert pos1.tobytes() == pos0.tobytes() and vel1.tobytes() == vel0.tobytes()
    assert ui.viewer.stats.step is steps_before  # paused: nothing stepped during the clicks
    ui.key(keys.SPACE, " ")
    ui.frame()
    assert ui.viewer.stats.step.kernel == "cpu-fp64" and ui.viewer.stats.step.force_ms > 0
    assert ui.ctl.log.records[-1].kernel == "cpu-fp64"
    ui.frame(2)
    assert any(m.label == "cpu-fp64" for m in ui.ctl.markers)  # the history plot's switch marker
    # the keys step through the available kernels too
    ui.key(keys.Key("]"), "]")
    assert ui.backend.kernel == "cpu-tree"  # the next record after cpu-fp64
    ui.key(keys.Key("["), "[")
    assert ui.backend.kernel == "cpu-fp64"


def test_changing_n_in_the_panel_reallocates_and_the_run_continues(ui):
    names0 = ui.viewer.renderer.gl_names()
    ui.tab("Simulation")
    ui.click("initial.n")
    ui.type("1024")
    ui.enter()
    assert ui.backend.n == 1024, ui.ctl.message
    assert ui.viewer.renderer.n == 1024 and ui.viewer.stats.n == 1024
    assert ui.scene.initial.n == 1024
    names1 = ui.viewer.renderer.gl_names()
    assert names1 != names0  # new VBOs (re-offered to the backend: CUDA re-registers them)
    t0, frames0 = ui.backend.time, ui.viewer.stats.frame
    ui.frame(3)
    assert ui.viewer.stats.frame == frames0 + 3
    assert ui.viewer.stats.step.n == 1024 and ui.backend.time > t0
    img = ui.viewer.render_to_array()
    assert img[:, W // 2 :].any()  # bodies still drawn right of the panel
    assert "initial.n" not in ui.panel.red_fields


@pytest.mark.parametrize("bad", ["0", "-0.5"])
def test_bad_dt_is_rejected_red_and_the_previous_value_kept(ui, bad):
    dt0 = ui.backend.physics.dt
    ui.tab("Simulation")
    ui.click("physics.dt")
    ui.type(bad)
    ui.enter()
    assert ui.backend.physics.dt == dt0 and ui.scene.physics.dt == dt0
    ui.frame()
    assert "physics.dt" in ui.panel.red_fields  # drawn with the red frame colour
    err = ui.panel.field_errors["physics.dt"]
    assert "physics.dt" in err and "out of range" in err
    from app.model import config

    with pytest.raises(Exception) as cli:  # the CLI's own rule says the same thing
        config.coerce("physics.dt", bad, config.field_for("physics.dt"))
    assert str(cli.value) == err
    ui.frame(2)
    assert ui.backend.physics.dt == dt0  # the run goes on with the old value
    # a good value clears the red and takes effect
    ui.click("physics.dt")  # the field selects all its text when clicked
    ui.type("0.002")
    ui.enter()
    ui.frame()
    assert ui.backend.physics.dt == 0.002 and "physics.dt" not in ui.panel.red_fields


def test_panel_takes_the_mouse_over_itself_and_tab_hides_it(ui):
    from vispy.util import keys

    ev = ui.viewer.events
    x0, y0, x1, y1 = ui.panel.item_rects["window"]

    def drag(start) -> float:
        az = ui.viewer.camera.azimuth
        ui.move(start)
        press = ev.mouse_press(pos=start, button=1, buttons=[1], modifiers=())
        end = (start[0] + 60, start[1])
        ev.mouse_move(pos=end, button=1, buttons=[1], modifiers=(), press_event=press)
        ev.mouse_release(pos=end, button=1, buttons=[], modifiers=())
        ui.frame()
        return ui.viewer.camera.azimuth - az

    assert drag(((x0 + x1) / 2, y1 - 30)) == 0.0, "a drag over the panel turned the camera"
    assert drag((W - 100.0, H / 2)) != 0.0, "a drag beside the panel did not turn the camera"
    ui.move((W - 100.0, H / 2))
    assert not ui.panel.bridge.want_capture_mouse
    ui.key(keys.TAB, "")
    assert not ui.panel.visible and not ui.panel.bridge.want_capture_mouse
    builds = ui.panel.bridge.builds
    ui.frame(2)
    assert ui.panel.bridge.builds == builds  # hidden: no ImGui frame at all
    left = ui.viewer.render_to_array(overlays=True)[:, : int(x1) - 10]
    ui.key(keys.TAB, "")
    assert ui.panel.visible
    shown = ui.viewer.render_to_array(overlays=True)[:, : int(x1) - 10]
    assert shown.mean() > left.mean() + 5  # the panel's background and text are there again


def test_the_widgets_stay_put_whatever_the_measured_times(ui, monkeypatch):
    """Which parts of the frame time are non-zero flickers with timing (the drift read-back every few
    frames, a loaded machine); the live numbers showing them must not move the widgets below them, or a
    click aimed at a tab or a field lands on its neighbour."""
    from app.ui.style import BREAKDOWN

    ui.tab("Simulation")
    measured = ui.ctl.live
    layouts = []
    for ms in (0.0, 1.0, 0.0):  # every part of the frame absent, then present, then absent again
        monkeypatch.setattr(
            ui.ctl,
            "live",
            lambda max_age_s=0.1, ms=ms: {**measured(max_age_s), **{f: ms for f, _, _ in BREAKDOWN}},
        )
        ui.frame()
        layouts.append(dict(ui.panel.item_rects))
    assert "physics.dt" in layouts[0]
    assert layouts[0] == layouts[1] == layouts[2]


def test_reset_key_and_buttons(ui, tmp_path):
    from vispy.util import keys

    ui.frame(3)
    assert ui.backend.time > 0
    ui.tab("Simulation")
    ui.click("pause")  # the Pause button
    assert ui.viewer.paused
    ui.key(keys.Key("R"), "r")  # R: the scene's bodies again
    assert ui.backend.time == 0.0
    from app.scene import make_bodies

    assert (
        ui.backend.state().pos.astype(np.float32).tobytes()
        == make_bodies(ui.scene).pos.astype(np.float32).tobytes()
    )
    t = ui.backend.time
    ui.click("step")
    ui.frame(2)
    assert ui.viewer.paused and ui.backend.time == pytest.approx(t + ui.backend.physics.dt)
    # screenshot button: out/screenshot-<time>.png with the panel in it
    ui.panel.screenshot_dir = tmp_path
    ui.tab("System")
    ui.click("screenshot")
    ui.frame()
    shots = list(tmp_path.glob("screenshot-*.png"))
    assert len(shots) == 1
    from PIL import Image

    img = np.asarray(Image.open(shots[0]))
    assert img.shape == (H, W, 3) and img[:, :300].mean() > 10  # the panel is in it


def test_benchmark_button_runs_each_kernel_on_a_copy(ui):
    from vispy.util import keys

    ui.key(keys.SPACE, " ")
    pos0, vel0 = _state(ui.backend)
    kernel = ui.backend.kernel
    ui.tab("Benchmark")
    ui.click("bench")
    ui.frame(3)
    bench = ui.ctl.bench
    assert bench is not None and not bench.running
    assert (
        [r.kernel for r in bench.results]
        == ui.ctl.available()
        == ["cpu-simd", "cpu-fp64", "cpu-tree", "cpu-n3l"]
    )
    for r in bench.results:
        assert not r.error and r.interactions_per_s > 0 and r.n == 512
    pos1, vel1 = _state(ui.backend)
    assert pos1.tobytes() == pos0.tobytes() and vel1.tobytes() == vel0.tobytes()  # ran on copies
    assert ui.backend.kernel == kernel
    ui.frame()
    assert "bench_plot" in ui.panel.item_rects  # the bar chart was drawn


def test_live_numbers_history_and_panel_cost_are_measured(ui):
    ui.frame(6)
    live = ui.ctl.live(max_age_s=0)
    assert live["frame_ms"] > 0 and live["force_ms"] > 0 and live["interactions_per_s"] > 0
    assert live["gflops"] == pytest.approx(live["interactions_per_s"] * 20e-9)
    assert ui.panel.cost_ms > 0 and ui.panel.bridge.build_ms > 0
    t, d = ui.ctl.history.window(10.0, ("frame_ms", "force_ms"))
    assert t.size >= 5 and (d["force_ms"] > 0).all()
    ui.ctl.update_medians()
    m = ui.ctl.medians[("cpu-simd", 512)]
    assert m["frames"] >= 1 and m["force_ms"] > 0
    from app.ui.panel import measure_panel_cost

    cost = measure_panel_cost(ui.viewer, ui.panel, frames=8, block=4, warmup=0)
    assert cost["shown_ms"] > 0 and cost["hidden_ms"] > 0 and cost["panel_cpu_ms"] > 0


def test_frames_between_rebuilds_replay_the_panel(ui):
    """Without input the widgets are rebuilt at most refresh_hz times a second; the frames between
    replay the last draw lists, and the panel is still on every frame."""
    ui.panel.bridge.refresh_hz = 1e-3
    ui.frame(4)  # input-triggered rebuilds run out
    builds = ui.panel.bridge.builds
    lit = []
    for _ in range(3):
        ui.frame()
        lit.append(ui.viewer.render_to_array(overlays=True)[20:300, 20:400].mean())
    assert ui.panel.bridge.builds == builds, "rebuilt without input"
    assert min(lit) > 20, "a replayed frame lost the panel"
    ui.move((200.0, 200.0))  # any input rebuilds at once
    assert ui.panel.bridge.builds > builds


def test_run_command_wires_the_panel(gl_env, capsys):
    from app.cli import main

    assert (
        main(
            [
                "run",
                "plummer",
                "--n",
                "256",
                "--backend",
                "cpu",
                "--headless",
                "--frames",
                "12",
                "--panel-cost",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "panel cost over 12 frames" in out and "shown vs" in out and "hidden" in out
    assert (
        main(
            ["run", "plummer", "--n", "256", "--backend", "cpu", "--headless", "--frames", "3", "--no-panel"]
        )
        == 0
    )
    assert "cpu-simd N=256" in capsys.readouterr().out


def test_energy_monitor_matches_the_float64_reference():
    from app.model.ics import generate
    from app.model.physics import Physics, potential_energy
    from app.ui.energy import EnergyMonitor
    from app.ui.energy import potential_energy as fast_potential

    b = generate("plummer", 300, 3, {})
    for phys in (
        Physics(softening=0.05),
        Physics(softening=0.0),
        Physics(softening=0.02, model="gravity-repulsion", repulsion=1e-4),
    ):
        assert fast_potential(b.pos, b.mass, phys) == pytest.approx(
            potential_energy(b.pos, b.mass, phys), rel=1e-12
        )

    class Stub:
        physics = Physics(softening=0.05)
        n = b.n
        synchronised, reduces_diagnostics, uses_all_cores = True, False, False  # (as a Backend's)

        def __init__(self):
            self.bodies = b.copy()

        def state(self):
            return self.bodies.copy()

    stub = Stub()
    mon = EnergyMonitor(every=1)
    mon.tick(stub)
    mon.wait()
    stub.bodies.vel *= 1.01  # more kinetic energy: a drift the monitor must see
    mon.tick(stub)
    mon.wait()
    first, last = mon.samples[0], mon.samples[-1]
    assert first.energy == 0.0 and last.energy > 1e-4 and last.momentum >= 0.0


def test_escape_closes_an_open_combo_first_and_only_a_second_escape_quits(ui):
    from vispy.util import keys

    ui.click("kernel_combo")
    assert "kernel:cpu-fp64" in ui.panel.item_rects and ui.panel.modal_input, "the combo did not open"
    ui.key(keys.ESCAPE)
    assert not ui.viewer.quit_requested, "Escape with the combo open quit the viewer"
    ui.frame(2)
    assert not ui.panel.modal_input and "kernel:cpu-fp64" not in ui.panel.item_rects, "the combo stayed open"
    ui.key(keys.SPACE, " ")  # the viewer's keys are its own again
    assert ui.viewer.paused
    ui.key(keys.ESCAPE)
    assert ui.viewer.quit_requested


def test_escape_in_a_text_field_leaves_the_field_not_the_viewer(ui):
    from vispy.util import keys

    dt0 = ui.backend.physics.dt
    ui.tab("Simulation")
    ui.click("physics.dt")
    ui.type("5")
    assert ui.panel.modal_input, "the field did not take the keys"
    ui.key(keys.ESCAPE)
    assert not ui.viewer.quit_requested, "Escape in a text field quit the viewer"
    ui.frame(2)
    assert not ui.panel.modal_input
    assert ui.backend.physics.dt == dt0  # Escape dropped the edit
    ui.key(keys.ESCAPE)
    assert ui.viewer.quit_requested


def test_save_snapshot_button_and_key_write_files_that_load_back_bitwise(ui, tmp_path):
    from vispy.util import keys

    from app.model import formats

    ui.ctl.view_recorder.directory = tmp_path
    ui.key(keys.SPACE, " ")  # paused: the state does not move between the save and the comparison
    ui.tab("Simulation")
    ui.click("save_snapshot")
    first = ui.ctl.last_snapshot
    assert first is not None and first.parent == tmp_path and first.suffix == ".npz"
    state = ui.backend.state()
    back = formats.read(first)
    for field in ("pos", "vel", "mass"):
        assert getattr(back, field).tobytes() == getattr(state, field).tobytes(), field
    assert back.time == state.time
    ui.key(keys.Key("S"), "s")
    assert ui.ctl.last_snapshot != first and ui.ctl.last_snapshot.is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left behind


def ctrl_click(ui, target) -> None:
    """Ctrl held (a key event carrying the modifier, as glfw delivers it) around a click."""
    from vispy.util import keys

    ui.viewer.events.key_press(key=keys.CONTROL, text="", modifiers=(keys.CONTROL,))
    ui.frame(2)
    ui.click(target)
    ui.viewer.events.key_release(key=keys.CONTROL, text="", modifiers=())
    ui.frame(2)


@pytest.fixture
def tree_ui(gl_env):
    u = UI(n=4096, kernel="cpu-tree")
    yield u
    u.close()


def test_cpu_tree_shows_its_force_error_and_split_and_the_theta_slider_applies_next_step(tree_ui):
    """The real cpu-tree through real input: the live force error (median, p99, interactions per body)
    and the stage split beside the timings; the theta slider reaches the next step (fewer interactions,
    a larger error sampled at once); a typed theta outside (0, 1.5] is refused red, the old one kept."""
    from vispy.util import keys

    from app.engine.forces import STAGES

    ui = tree_ui
    ui.click("tunable:opening")  # the geometric test, which reads theta at every step (rel: the first only)
    ui.click("tunable:opening=cube")
    assert ui.backend.tunables()["opening"] == "cube", ui.ctl.message
    ui.frame(3)
    probe = ui.ctl.force_error
    e = probe.latest
    assert e is not None and e.kernel == "cpu-tree" and e.k == 1024 and e.n == 4096
    assert 0 < e.median <= e.p99 <= 1e-3, e  # theta 0.5: within the record's p99 budget
    assert 100 < probe.interactions_per_body < 4096
    assert "force_error" in ui.panel.item_rects and "stages" in ui.panel.item_rects
    live = ui.ctl.live_stages()  # (refits on these frames: keys and sort may be 0, the rest ran)
    assert tuple(live) == STAGES and all(v >= 0 for v in live.values())
    assert live["build"] > 0 and live["moments"] > 0 and live["walk"] > 0
    before = ui.viewer.stats.step.interactions_per_body

    ui.key(keys.SPACE, " ")  # paused while the user sets theta
    x0, y0, _, y1 = ui.panel.item_rects["tunable:theta"]
    ui.click((x0 + 0.8 * 150.0, (y0 + y1) / 2))
    theta = ui.backend.tunables()["theta"]
    assert 1.05 < theta < 1.35, (theta, ui.ctl.message)
    assert ui.ctl.message == f"cpu-tree.theta = {theta:g} from the next step"
    coarse = probe.latest  # resampled at once for the new theta (the tree evaluated at the paused state)
    assert coarse is not e and coarse.p99 > 2 * e.p99, (coarse, e)
    ui.key(keys.SPACE, " ")
    ui.frame(2)
    assert ui.viewer.stats.step.interactions_per_body < 0.7 * before  # the next step ran with it

    ctrl_click(ui, "tunable:theta")  # Ctrl+click: the slider becomes a text field
    ui.type("2")
    ui.enter()
    assert ui.backend.tunables()["theta"] == theta
    assert "tunable:theta" in ui.panel.red_fields
    assert "cpu-tree.theta: 2.0 is not in (0, 1.5]" in ui.ctl.message
    x0, y0, _, y1 = ui.panel.item_rects["tunable:theta"]
    ui.click((x0 + 0.3 * 150.0, (y0 + y1) / 2))  # a value in range clears the red
    assert 0.3 < ui.backend.tunables()["theta"] < 0.6 and "tunable:theta" not in ui.panel.red_fields


def test_an_all_pairs_kernel_shows_no_force_error_and_no_split(ui):
    ui.frame(3)
    assert ui.backend.kernel == "cpu-simd"
    assert ui.ctl.force_error.latest is None and not ui.ctl.force_error.note and not ui.ctl.live_stages()
    assert "force_error" not in ui.panel.item_rects and "stages" not in ui.panel.item_rects
    assert "exchange" not in ui.panel.item_rects and ui.ctl.live_devices() == ({}, 0.0)  # one device


@pytest.fixture
def devices_ui(gl_env):
    from app.commands.assembly import make_backend
    from app.scene import load_scene

    scene = load_scene("plummer", {"initial.n": 3000, "run.backend": "cpu", "run.gpus": "3"})
    u = UI(n=3000, backend=make_backend(scene))
    yield u
    u.close()


def test_several_devices_show_a_force_bar_each_and_the_exchange_time(devices_ui):
    """--gpus 3 over CPU devices: the panel draws one force-time bar per device, top to bottom, and the
    exchange time; the viewer draws from the devices' gathered positions; a kernel switch stays on them."""
    ui = devices_ui
    ui.frame(6)
    devices, exchange_ms = ui.ctl.live_devices()
    assert list(devices) == ["0 cpu0", "1 cpu1", "2 cpu2"] and all(ms > 0 for ms in devices.values())
    assert exchange_ms > 0
    tops = [ui.panel.item_rects[f"device:{i}"][1] for i in range(3)]
    assert tops == sorted(tops) and "exchange" in ui.panel.item_rects
    assert ui.viewer.stats.data_path == "host upload from 3 CPU devices"
    ui.ctl.switch_kernel("cpu-fp64")
    ui.frame(4)
    assert ui.backend.kernel == "cpu-fp64" and ui.backend.k == 3
    assert list(ui.ctl.live_devices()[0]) == ["0 cpu0", "1 cpu1", "2 cpu2"]


@pytest.fixture
def devices_tree_ui(gl_env):
    from app.commands.assembly import make_backend
    from app.scene import load_scene

    scene = load_scene(
        "plummer", {"initial.n": 4096, "run.backend": "cpu", "run.gpus": "2", "run.kernel": "cpu-tree"}
    )
    u = UI(n=4096, backend=make_backend(scene), kernel="cpu-tree")
    yield u
    u.close()


def test_several_devices_show_the_trees_live_force_error(devices_tree_ui):
    """--gpus 2 --backend cpu --kernel cpu-tree: the probe samples the running tree through the
    multi-device backend (each row from the device that owns it, the exact sum on device 0) and the panel
    shows its median and p99, within the record's budget at theta 0.5, beside the two devices' bars."""
    ui = devices_tree_ui
    ui.frame(3)
    assert ui.backend.k == 2 and ui.backend.kernel == "cpu-tree"
    probe = ui.ctl.force_error
    e = probe.latest
    assert probe.note == "" and e is not None, probe.note
    assert e.kernel == "cpu-tree" and e.k == 1024 and e.n == 4096
    assert 0 < e.median <= e.p99 <= 1e-3 and e.within_budget, e
    assert 100 < probe.interactions_per_body < 4096
    assert "force_error" in ui.panel.item_rects and "device:1" in ui.panel.item_rects


@pytest.fixture
def block_ui(gl_env):
    u = UI(n=2048, kernel="cpu-tree", height=1100)  # the tree's live rows push the tabs down: room for them
    u.frame(3)  # the force error's row appears after the first frames: the layout settles first
    yield u
    u.close()


def test_the_time_steps_combo_moves_the_run_to_block_steps_and_back_keeping_the_state(block_ui):
    """Through real input: a max step wide enough for several levels (dt typed), then "block" in the time
    steps combo moves the state into block steps on cpu-tree, x and v bitwise kept; the live row shows the
    active fraction and the bodies per level, kernels other than the tree are greyed with the reason; L
    typed applies from the next step; "shared" brings the shared-step backend back."""
    from vispy.util import keys

    ui = block_ui
    ui.key(keys.SPACE, " ")
    ui.tab("Simulation")
    ui.click("physics.dt")
    ui.type("0.03125")
    ui.enter()
    assert ui.backend.physics.dt == 0.03125, (ui.ctl.message, ui.panel.field_errors)
    assert "physics.block_levels" in ui.panel.item_rects  # drawn (greyed: it applies to block steps)
    pos0, vel0 = _state(ui.backend)
    ui.click("physics.timesteps")
    ui.click("physics.timesteps=block")
    assert ui.backend.timesteps == "block", ui.ctl.message
    assert ui.backend.kernel == "cpu-tree"
    assert ui.ctl.message == "time steps: block (cpu-tree) from the next step"
    pos1, vel1 = _state(ui.backend)
    assert pos1.tobytes() == pos0.tobytes() and vel1.tobytes() == vel0.tobytes()
    assert "block time steps walk the tree" in ui.ctl.why_not("cpu-simd")
    t0 = ui.backend.time
    ui.key(keys.SPACE, " ")
    ui.frame(4)
    assert ui.backend.time >= t0 + 4 * 0.03125  # one max step per step
    fraction, levels = ui.ctl.live_block()
    assert 0 < fraction < 1 and np.count_nonzero(levels) >= 2 and levels.sum() == 2048, (fraction, levels)
    assert "block" in ui.panel.item_rects  # the live row
    e = ui.ctl.force_error.latest  # the tree's a(x) against the all-pairs sum, as under shared steps
    assert e is not None and e.kernel == "cpu-tree" and 0 < e.p99 <= 1e-3, (e, ui.ctl.force_error.note)
    assert "tunable:theta" in ui.panel.item_rects and "tunable:rebuild_every" not in ui.panel.item_rects
    assert ui.viewer.render_to_array()[:, W // 2 :].any()  # the bodies are drawn (host upload)

    ui.click("physics.block_levels")
    ui.type("2")
    ui.enter()
    ui.frame(2)
    assert ui.backend.physics.block_levels == 2 and ui.backend.levels_histogram().shape == (3,)

    ui.click("run.frames_per_step")  # frames inside a max step: a frame advances steps/frame ÷ 4 of one
    ui.type("4")
    ui.enter()
    assert ui.viewer.scene.run.frames_per_step == 4, (ui.ctl.message, ui.panel.field_errors)
    spf = ui.viewer.scene.run.steps_per_frame
    ui.frame(1)  # (the frame that applied the field may already have drawn a part)
    t1 = ui.backend.time
    ui.frame(1)
    assert ui.backend.time == pytest.approx(t1 + spf * 0.03125 / 4)
    if spf % 4:
        assert not ui.backend.synchronised  # inside a max step

    ui.key(keys.SPACE, " ")
    pos2, vel2 = _state(ui.backend)  # (the max step in flight runs to its end)
    ui.click("physics.timesteps")
    ui.click("physics.timesteps=shared")
    assert ui.backend.timesteps == "shared" and ui.backend.kernel == "cpu-tree", ui.ctl.message
    ui.click("run.frames_per_step")  # greyed under shared steps: the click does not focus it
    ui.type("8")
    ui.enter()
    assert ui.viewer.scene.run.frames_per_step == 4
    pos3, vel3 = _state(ui.backend)  # cpu-tree's shared steps keep a float32 state: block's float64 rounded
    assert np.array_equal(pos3, pos2.astype(np.float32)) and np.array_equal(vel3, vel2.astype(np.float32))
    assert ui.ctl.live_block() is None
    ui.key(keys.SPACE, " ")
    ui.frame(2)
    assert "block" not in ui.panel.item_rects


def test_block_steps_are_refused_on_several_devices_and_the_run_goes_on(devices_ui):
    ui = devices_ui
    backend = ui.backend
    assert ui.ctl.set_value("physics.timesteps", "block") is not None or ui.ctl.message
    assert ui.backend is backend and ui.backend.timesteps == "shared"
    assert "block time steps run on one device" in ui.ctl.message
    assert ui.scene.physics.timesteps == "shared"
    t0 = ui.backend.time
    ui.frame(2)
    assert ui.backend.time > t0


def test_alpha_is_greyed_unless_the_relative_opening_test_reads_it(tree_ui):
    """cpu-tree's alpha is read by opening=rel only (the default): choosing cube in the opening combo greys
    its slider and a click on it changes nothing; choosing rel again enables it, and a click then sets it."""
    from vispy.util import keys

    ui = tree_ui
    ui.key(keys.SPACE, " ")
    assert ui.backend.tunables()["opening"] == "rel" and "tunable:alpha" not in ui.panel.unread
    ui.click("tunable:opening")
    ui.click("tunable:opening=cube")
    assert ui.backend.tunables()["opening"] == "cube", ui.ctl.message
    assert ui.panel.unread["tunable:alpha"] == "read only when opening is rel (now cube)"
    assert "tunable:theta" not in ui.panel.unread
    x0, y0, x1, y1 = ui.panel.item_rects["tunable:alpha"]
    ui.click((x0 + 0.8 * (x1 - x0), (y0 + y1) / 2))
    assert ui.backend.tunables()["alpha"] == "auto"  # greyed: the click did nothing
    ui.click("tunable:opening")
    ui.click("tunable:opening=rel")
    assert ui.backend.tunables()["opening"] == "rel", ui.ctl.message
    assert "tunable:alpha" not in ui.panel.unread
    x0, y0, x1, y1 = ui.panel.item_rects["tunable:alpha"]  # (the rows above it changed: read it again)
    assert "tunable:alpha:auto" not in ui.panel.item_rects  # auto already: no way back to offer
    ui.click((x0 + 0.5 * (x1 - x0), (y0 + y1) / 2))
    assert ui.backend.tunables()["alpha"] > 0.001, ui.ctl.message
    # a number set by the slider; the auto button beside it makes alpha follow N again
    ui.click("tunable:alpha:auto")
    assert ui.backend.tunables()["alpha"] == "auto", ui.ctl.message
    ui.frame()
    assert "tunable:alpha:auto" not in ui.panel.item_rects
    # rebuild_rule is read only when the tree refits (rebuild_every > 1: the default 16)
    assert "tunable:rebuild_rule" not in ui.panel.unread


def test_a_tab_added_in_one_entry_shows_and_its_control_reaches_the_scene(gl_env, monkeypatch):
    """docs/architecture.md's "a panel control" row, followed once from tests/: a module and one entry in
    TABS give a tab that a click opens, and its button's Controller call changes the scene."""
    import toy_section

    import app.ui.panel

    monkeypatch.setattr(app.ui.panel, "TABS", (*app.ui.panel.TABS, (toy_section.NAME, toy_section.draw)))
    # a window tall enough for the panel to need no scroll bar: with one, six tabs fill its width and ImGui
    # squeezes a seventh, so its drawn place is not where its rect says
    u = UI(height=1100)
    try:
        assert "toy:brighter" not in u.panel.item_rects  # another tab is open
        u.tab(toy_section.NAME)
        before = u.scene.render.brightness
        u.click("toy:brighter")
        assert before != toy_section.BRIGHTER and u.scene.render.brightness == toy_section.BRIGHTER
    finally:
        u.close()


def test_tab_brings_the_panel_back_without_giving_a_widget_the_keyboard(gl_env):
    """Issue 28: Tab (hide, then show the panel) also reached ImGui, whose Tab moved the keyboard into the
    θ slider's text field, so the next V typed a "v" there instead of starting a recording. Tab is the
    viewer's key: after hiding and showing the panel, no widget takes text and V reaches its action."""
    from vispy.util import keys

    ui = UI(kernel="cpu-tree")  # a kernel with tunables: the θ slider is drawn
    request = None
    try:
        assert any("theta" in name for name in ui.panel.item_rects), sorted(ui.panel.item_rects)
        request = _tab_then_v(ui, keys)
    finally:
        ui.close()
    assert request == ["V"]


def _tab_then_v(ui, keys) -> list[str]:
    pressed: list[str] = []
    ui.viewer.key_actions["V"] = lambda: pressed.append("V")
    ui.key(keys.TAB)
    assert not ui.panel.visible
    ui.key(keys.TAB)
    assert ui.panel.visible
    ui.frame(3)
    io = ui.panel.bridge._io()
    assert not io.want_text_input and not ui.panel.modal_input
    ui.key(keys.Key("V"), "v")
    return pressed
