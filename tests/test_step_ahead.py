"""The record loop's overlap (app/render/step_ahead.py): the next frame's steps on a worker thread beside the
readback, on the CPU backend and headless EGL. The GPU's case (interop buffers held by splat frames) is
in tests/test_splat_record_gpu.py, whose recordings must stay byte-identical."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import test_record
from test_record import SMALL

from app.backends.cpu import CPUBackend
from app.cli import main
from app.core.errors import RuntimeFault
from app.render import canvas
from app.render.step_ahead import StepAhead

gl_env = test_record.gl_env  # the headless-GL fixture (skips where there is none)


def _record(tmp_path, capsys, name: str, *extra: str) -> tuple[int, bytes, str]:
    out = tmp_path / name
    rc = main(["record", *SMALL, "--frames", "24", "--camera", "orbit", "--out", str(out), *extra])
    printed = capsys.readouterr()
    return rc, out.read_bytes() if out.exists() else b"", printed.out + printed.err


@pytest.mark.gl
def test_stepping_ahead_records_the_same_bytes_as_stepping_in_turn(gl_env, tmp_path, capsys, monkeypatch):
    threads: list[str] = []
    run_steps = canvas.Viewer.run_steps

    def spy(self):
        threads.append(threading.current_thread().name)
        return run_steps(self)

    monkeypatch.setattr(canvas.Viewer, "run_steps", spy)
    rc, ahead, said = _record(tmp_path, capsys, "ahead.mp4")
    assert rc == 0 and "step" in said and "(on a worker thread, beside the readback)" in said
    assert len(threads) == 23 and all(t.startswith("steps") for t in threads)  # every frame after the first

    threads.clear()
    monkeypatch.setattr(StepAhead, "can_start", lambda self: False)  # one after the other, as before
    rc, in_turn, said = _record(tmp_path, capsys, "in-turn.mp4")
    assert rc == 0 and "worker thread, beside" not in said
    assert len(threads) == 23 and threading.main_thread().name in set(threads)
    assert ahead == in_turn and len(ahead) > 1000


@pytest.mark.gl
def test_a_step_failing_on_the_worker_stops_the_recording_in_one_line(gl_env, tmp_path, capsys, monkeypatch):
    step = CPUBackend.step
    calls = []

    def failing(self, n=1):
        calls.append(threading.current_thread().name)
        if len(calls) == 5:
            raise RuntimeFault("the device fell off the bus (a test)")
        return step(self, n)

    monkeypatch.setattr(CPUBackend, "step", failing)
    rc, data, said = _record(tmp_path, capsys, "failed.mp4")
    assert rc == 1 and data == b""  # no half-written file passed off as complete
    assert "the device fell off the bus (a test)" in said and "Traceback" not in said
    assert calls[4].startswith("steps")  # it failed on the worker, and the GL thread said so
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # and left no partial file behind


class _Viewer(SimpleNamespace):
    pass


@pytest.mark.parametrize(
    ("interop", "gl", "expect"),
    [
        (False, None, True),  # the host path: the steps write host arrays, uploaded after them
        (True, None, False),
        (True, SimpleNamespace(held=False), False),  # GL maps them each frame: not beside GL's reads
        (True, SimpleNamespace(held=True), True),  # held by splat frames: GL never reads them
    ],
)
def test_steps_run_ahead_only_where_they_touch_nothing_the_frame_in_flight_reads(interop, gl, expect):
    viewer = _Viewer(interop=interop, backend=SimpleNamespace(gl_buffers=gl))
    assert StepAhead(viewer).can_start() is expect


class _SplatCase:
    """A SplatStyle whose GPU frame, wait and layer are stand-ins that log the order of events."""

    def __init__(self, monkeypatch, fail_at: str | None = None):
        from app.render import splat_style

        self.order: list[str] = []
        style = splat_style.SplatStyle(canvas=None)

        def gpu_frame(viewer, backend, n, view, light, size):
            self.order.append("queued")
            if fail_at == "queue":
                raise RuntimeError("the splat kernel did not build (a test)")
            return SimpleNamespace(gpu_ms=0.2, exposure=None), None

        def took(*_):
            self.order.append("waited")
            if fail_at == "wait":
                raise RuntimeError("an illegal address on the GPU (a test)")

        monkeypatch.setattr(splat_style.SplatView, "of", staticmethod(lambda *a: None))
        monkeypatch.setattr(style, "_gpu_frame", gpu_frame)
        monkeypatch.setattr(style, "_took", took)
        monkeypatch.setattr(style, "_light_for", lambda renderer, n: None)
        layer = SimpleNamespace(draw=lambda size: self.order.append("quad"))
        monkeypatch.setattr(style, "_layer", lambda: layer)
        style.on_queued = lambda: self.order.append("steps begun")
        self.style = style
        self.viewer = SimpleNamespace(
            renderer=SimpleNamespace(settings=SimpleNamespace(style="splat")),
            backend=SimpleNamespace(n=1000, gl_buffers=object(), data_path="CUDA-GL interop"),
            camera=None,
        )

    def draw(self):
        return self.style.draw(self.viewer, (64, 32), shifted=False)


def test_a_splat_frame_begins_the_next_steps_once_it_is_queued_before_the_host_waits(monkeypatch):
    case = _SplatCase(monkeypatch)
    assert case.draw() is True
    assert case.order == ["queued", "steps begun", "waited", "quad"]


def test_a_splat_frame_failing_before_it_is_queued_turns_into_sprites_with_no_steps_begun(monkeypatch):
    case = _SplatCase(monkeypatch, fail_at="queue")
    assert case.draw() is False and "did not build" in case.style.why  # the viewer draws sprites
    assert case.order == ["queued"]


def test_a_splat_frame_failing_after_the_steps_began_is_raised_not_drawn_as_sprites(monkeypatch):
    case = _SplatCase(monkeypatch, fail_at="wait")
    with pytest.raises(RuntimeError, match="illegal address"):  # GL must not read the buffers being written
        case.draw()
    assert case.order == ["queued", "steps begun", "waited"] and case.style.failed is None
    case.style.on_queued = None  # the live viewer: no steps begun, so the same failure falls back to sprites
    case.order.clear()
    assert case.draw() is False and case.style.failed


def test_steps_begun_beside_a_splat_frame_are_counted_and_named_in_the_summary():
    from app.render.record_sinks import RecordResult

    class Steps(SimpleNamespace):
        def begin_advance(self):
            return False  # (paused: nothing to run on the worker)

        def end_advance(self, outcome, t0):
            pass

    ahead = StepAhead(Steps(interop=True, backend=SimpleNamespace(gl_buffers=SimpleNamespace(held=True))))
    assert ahead.start(beside_draw=True) is True and ahead.start() is False  # begun once per frame
    assert ahead.beside_draw == 1 and ahead.finish() is True and ahead.started == 0  # (paused: none ran)
    result = RecordResult(None, None, 2, (64, 32), 1.0, timings={"step": 10.0}, steps_ahead=1)
    assert "beside the readback" in result.summary_line()
    result.steps_beside_draw = 1
    assert "(on a worker thread, beside the splat frame and the readback)" in result.summary_line()


@pytest.mark.gpu
def test_on_a_gpu_splat_frames_begin_the_next_steps_and_record_the_frames_stepped_in_turn(
    tmp_path, capsys, monkeypatch
):
    """The tree at 262,144 bodies drawn as splat frames from the interop buffers: every frame after the
    first begins the next steps before the host waits for it, and the PNGs are those of frames stepped
    one after the other (the steps' copies into the buffers wait for the frame's reads)."""
    monkeypatch.setenv("NBODY_HEADLESS", "1")
    begun = []
    start = StepAhead.start

    def spy(self, beside_draw=False):
        began = start(self, beside_draw)
        begun.append(beside_draw and began)
        return began

    monkeypatch.setattr(StepAhead, "start", spy)
    args = ["record", "collision", "--n", "262144", "--kernel", "tree", "--size", "640x360", "--fps", "60",
            "--frames", "16", "--set", "render.style=splat", "--no-progress"]  # fmt: skip
    frames = {}
    for name in ("ahead", "in-turn"):
        if name == "in-turn":
            monkeypatch.setattr(StepAhead, "can_start", lambda self: False)
        folder = tmp_path / name
        rc = main([*args, "--frames-dir", str(folder)])
        said = capsys.readouterr()
        assert rc == 0, said.out + said.err
        frames[name] = [p.read_bytes() for p in sorted(folder.glob("frame_*.png"))]
        if name == "ahead":
            assert "beside the splat frame and the readback" in said.out + said.err
            assert sum(begun) == 15, begun  # every frame but the last began the next one's steps
    assert len(frames["ahead"]) == 16 and frames["ahead"] == frames["in-turn"]
