"""The viewer's hot reload wired end to end on the CPU (the CI twin of the GPU's; the GPU's own test is
tests/test_reload_gpu.py): a viewer with its panel on the CPU backend, whose `kernel_reload` hands the
Controller stages made of a fake compiler (the file's first word names the kernel it builds), a
validation against float64 on the snapshot the stepping thread took, and a swap to `cpu-n3l`. Saves of
the watched file go through the frames; the Kernel section shows each outcome with its message and
stage times, the old kernel keeps stepping through a compile error and a failed validation, and a good
save is swapped in between two steps, the state untouched by the swap."""

from __future__ import annotations

import hashlib
import os
import time

import numpy as np
import pytest
from test_panel import UI, gl_env  # noqa: F401 - the fixture, used by name

from app.engine.kernel_reload import BuildError, validate_on_sample
from app.model.physics import accelerations

pytestmark = pytest.mark.gl


def _candidate(scale: float, nan: bool = False):
    def run(pos, mass, rows, physics):
        acc = accelerations(pos, mass, physics, targets=rows) * scale
        if nan:
            acc[3] = np.nan
        return acc

    return run


KERNELS = {"ok": _candidate(1 + 1e-7), "wrong": _candidate(1.01), "nan": _candidate(1.0, nan=True)}


def _digest(backend) -> str:
    s = backend.state()
    return hashlib.sha256(s.pos.tobytes() + s.vel.tobytes()).hexdigest()


class FakeHooks:
    """Backend.kernel_reload's stages over the CPU backend."""

    def __init__(self, backend, path):
        self.backend, self.path = backend, path
        self.swaps: list[tuple[str, str]] = []  # the state's digest before and after each swap
        self.closed = False

    def paths(self):
        return [self.path]

    def build(self, path):
        words = path.read_text().split()
        if words[0] == "error":
            raise BuildError(f"{path}({words[1]}): error: expected a ';'")
        return words[0]

    def snapshot(self):
        return self.backend.state(), self.backend.physics

    def validate(self, built, snap):
        state, physics = snap
        candidate = KERNELS[built]
        return validate_on_sample(
            lambda pos, mass, rows: candidate(pos, mass, rows, physics), state.pos, state.mass, physics, 1e-4
        )

    def swap(self, built):
        before = _digest(self.backend)
        self.backend.set_kernel("cpu-n3l")
        self.swaps.append((before, _digest(self.backend)))

    def close(self):
        self.closed = True


def _save(path, text):
    path.write_text(text)
    later = time.time_ns() + 1_000_000
    os.utime(path, ns=(later, later))


@pytest.fixture
def reload_ui(gl_env, tmp_path, monkeypatch):  # noqa: F811 - the fixture imported above
    from app.backends.cpu import CPUBackend

    path = tmp_path / "mine.cu"
    path.write_text("ok")
    made: list[FakeHooks] = []

    def kernel_reload(self, sanitizer=False):
        made.append(FakeHooks(self, path))
        return made[-1]

    monkeypatch.setattr(CPUBackend, "kernel_reload", kernel_reload)
    u = UI(kernel="cpu-simd")
    u.path, u.hooks = path, made
    yield u
    u.close()


def _frames_until_reload(ui, timeout=20.0):
    before = len(ui.ctl.reloads)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ui.frame()
        if len(ui.ctl.reloads) > before:
            ui.frame(2)  # the panel draws what came of it
            return ui.ctl.reloads[-1]
    raise AssertionError("no reload finished")


def test_saves_are_compiled_validated_and_swapped_through_the_frames(reload_ui):
    ui = reload_ui
    assert ui.ctl.reload_watching == [ui.path]
    assert "reload:watching" in ui.panel.item_rects  # the Kernel section says what it watches
    assert ui.backend.kernel == "cpu-simd"

    _save(ui.path, "error 7")
    t0 = ui.backend.time
    r = _frames_until_reload(ui)
    assert r.outcome == "compile error" and "mine.cu(7): error: expected a ';'" in ui.ctl.message
    assert "keeps running its last good build" in ui.ctl.message
    assert "reload:0" in ui.panel.item_rects  # the newest reload is listed
    assert ui.backend.kernel == "cpu-simd" and ui.backend.time > t0  # the old kernel kept stepping

    _save(ui.path, "wrong")
    r = _frames_until_reload(ui)
    assert r.outcome == "validation failed" and r.message.startswith("body ")
    assert "> the budget 0.0001" in ui.ctl.message and ui.backend.kernel == "cpu-simd"

    _save(ui.path, "nan")
    r = _frames_until_reload(ui)
    assert r.outcome == "validation failed" and "non-finite" in r.message and ui.backend.kernel == "cpu-simd"

    _save(ui.path, "ok")
    r = _frames_until_reload(ui)
    assert r.outcome == "swapped" and ui.backend.kernel == "cpu-n3l"
    assert "reloaded, live" in ui.ctl.message and r.live_s is not None and r.live_s < 20
    ((before, after),) = ui.hooks[-1].swaps
    assert before == after  # the swap changed the kernel, not the state
    assert [x.outcome for x in ui.ctl.reloads] == [
        "compile error",
        "validation failed",
        "validation failed",
        "swapped",
    ]


def test_a_switch_to_another_backend_ends_the_watch_and_closing_closes_it(reload_ui, monkeypatch):
    ui = reload_ui
    first = ui.hooks[-1]
    ui.ctl.close_reloads()
    assert first.closed and ui.ctl.reload_watching == []


def test_a_saved_shader_is_compiled_in_place_or_refused_with_the_drivers_message(
    gl_env,  # noqa: F811 - the fixture imported above
    tmp_path,
    monkeypatch,
):
    """The shaders are watched on every backend: a save that does not compile is listed with the
    driver's message and the particles draw on; a good save goes in at the next frame."""
    from app.core.paths import SHADERS
    from app.render import shaders
    from app.ui import reload_actions

    for name in reload_actions.SHADER_FILES:
        (tmp_path / name).write_text((SHADERS / name).read_text())
    monkeypatch.setattr(reload_actions, "SHADERS", tmp_path)
    monkeypatch.setattr(shaders, "SHADERS", tmp_path)
    ui = UI(kernel="cpu-simd")
    try:
        frag = tmp_path / "particles.frag"
        good = frag.read_text()
        _save(frag, good.replace("gl_FragColor", "gl_FragColour"))
        ui.frame(2)
        r = ui.ctl.reloads[-1]
        assert r.outcome == "compile error" and "particles.frag" in r.message
        assert "keep their last good shaders" in ui.ctl.message
        t0 = ui.backend.time
        ui.frame(2)
        assert ui.backend.time > t0  # the viewer goes on
        _save(frag, good.replace("vec4(1.0 - exp(-v_color * g), 1.0)", "vec4(g, 0.0, 0.0, 1.0)"))
        ui.frame(2)
        assert (
            ui.ctl.reloads[-1].outcome == "swapped" and "shaders: particles.frag reloaded" in ui.ctl.message
        )
    finally:
        ui.close()


def test_a_run_started_on_a_watched_kernel_is_tried_first_and_refused_runs_the_plain_builtin(
    gl_env,  # noqa: F811 - the fixture imported above
    tmp_path,
    monkeypatch,
):
    """A run whose kernel comes from a watched file: that file's build is tried before the first step;
    refused (here a wrong force), the run starts on the backend's plain all-pairs built-in (role
    "exact"), never on the refused kernel, saying why; a good save then goes in."""
    from app.backends.cpu import CPUBackend
    from app.ui import reload_actions

    path = tmp_path / "mine.cu"
    path.write_text("wrong")

    def kernel_reload(self, sanitizer=False):
        return FakeHooks(self, path)

    monkeypatch.setattr(CPUBackend, "kernel_reload", kernel_reload)
    # the watched file is the running kernel's (a CUDA kernel file's record names its path)
    monkeypatch.setattr(reload_actions.KernelReloads, "_name_of", lambda self, p: "cpu-n3l")
    ui = UI(kernel="cpu-n3l")
    try:
        assert ui.backend.kernel == "cpu-simd", ui.ctl.message
        assert "kernel cpu-n3l is refused: body " in ui.ctl.message and "> the budget" in ui.ctl.message
        t0 = ui.backend.time
        ui.frame(2)
        assert ui.backend.time > t0
        _save(path, "ok")
        r = _frames_until_reload(ui)
        assert r.outcome == "swapped" and ui.backend.kernel == "cpu-n3l"
    finally:
        ui.close()
