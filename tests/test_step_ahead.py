"""The record loop's overlap (app/render/step_ahead.py): the next frame's steps on a worker thread beside the
readback, on the CPU backend and headless EGL. The GPU's case (interop buffers held by splat frames) is
in tests/test_splat_record_gpu.py, whose recordings must stay byte-identical."""

from __future__ import annotations

import threading
import time
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


def _failing_splat_style(monkeypatch):
    """A SplatStyle whose GPU frame fails, and a viewer for it whose buffers a GPU fills."""
    from app.render import splat_style

    style = splat_style.SplatStyle(canvas=None)

    def gpu_frame(*_):
        raise RuntimeError("an illegal address on the GPU (a test)")

    monkeypatch.setattr(splat_style.SplatView, "of", staticmethod(lambda *a: None))
    monkeypatch.setattr(style, "_gpu_frame", gpu_frame)
    monkeypatch.setattr(style, "_light_for", lambda renderer, n: None)
    viewer = SimpleNamespace(
        renderer=SimpleNamespace(settings=SimpleNamespace(style="splat")),
        backend=SimpleNamespace(n=1000, gl_buffers=object(), data_path="CUDA-GL interop"),
        camera=None,
    )
    return style, viewer


def test_a_failed_splat_frame_is_raised_while_steps_run_beside_it_else_drawn_as_sprites(monkeypatch):
    style, viewer = _failing_splat_style(monkeypatch)
    style.strict = (
        True  # (record_scene, the next steps begun before this frame: GL must not draw their buffers)
    )
    with pytest.raises(RuntimeError, match="illegal address"):
        style.draw(viewer, (64, 32), shifted=False)
    assert style.failed is None
    style.strict = False  # the live viewer: the same failure falls back to sprites for the rest of the run
    assert style.draw(viewer, (64, 32), shifted=False) is False and "illegal address" in style.failed


class _HeldViewer(SimpleNamespace):
    """A viewer whose steps end with a write into held GLBuffers (stand-ins for pycuda.gl and events), as
    the GPU backends' copies into the interop buffers do."""

    def __init__(self, log: list):
        from test_interop_hold import _Event, _stand_in

        from app.backends.cuda.interop import GLBuffers

        gl = GLBuffers(_stand_in(log), 1, 2, new_event=lambda: _Event(log))
        gl.hold()
        log.clear()
        super().__init__(
            interop=True, backend=SimpleNamespace(gl_buffers=gl), splat=SimpleNamespace(strict=False), log=log
        )

    def begin_advance(self):
        self.log.append("begin")
        return True

    def run_steps(self):
        self.log.append("steps")
        with self.backend.gl_buffers.mapped():  # the steps' last copies: a writer
            self.log.append("written")
        return "timings"

    def end_advance(self, outcome, t0):
        self.log.append(("end", outcome))

    def draw(self):  # the splat frame: a reader of the held buffers
        self.log.append(("strict", self.splat.strict))
        with self.backend.gl_buffers.mapped(reader="splat-stream"):
            self.log.append("read")


def test_steps_begun_before_a_splat_frame_write_the_buffers_only_after_its_read():
    log: list = []
    viewer = _HeldViewer(log)
    with StepAhead(viewer) as ahead:
        assert ahead.start_before_draw() is True and ahead.start() is False  # begun once a frame
        deadline = time.monotonic() + 5
        while "steps" not in log and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(0.05)
        assert "written" not in log  # the worker waits for the frame's read, however long its draw takes
        viewer.draw()
        assert ahead.finish() is True
    assert log.index("read") < log.index(("record", "splat-stream")) < log.index(("wait",))
    assert log.index(("wait",)) < log.index("written") and log[-1] == ("end", "timings")
    assert ("strict", True) in log and viewer.splat.strict is False  # strict for the frame drawn beside
    assert ahead.before_draw == 1 and ahead.started == 1


def test_a_recording_ending_before_the_frame_is_drawn_calls_off_the_read_the_steps_wait_for():
    log: list = []
    viewer = _HeldViewer(log)
    with StepAhead(viewer) as ahead:
        assert ahead.start_before_draw()
        # the frame's draw raised (or a second Ctrl-C): no read comes, and closing must not hang
    assert "written" in log and viewer.splat.strict is False


def test_steps_are_begun_before_the_draw_only_where_a_splat_frame_holds_the_buffers():
    for interop, gl in ((False, None), (True, SimpleNamespace(held=False))):
        viewer = _Viewer(interop=interop, backend=SimpleNamespace(gl_buffers=gl))
        assert StepAhead(viewer).start_before_draw() is False  # (start after the draw: the rules above)
    assert StepAhead(_HeldViewer([]), enabled=False).start_before_draw() is False  # a window


def test_steps_begun_before_a_splat_frame_are_named_in_the_summary():
    from app.render.record_sinks import RecordResult

    result = RecordResult(None, None, 2, (64, 32), 1.0, timings={"step": 10.0, "draw": 5.0}, steps_ahead=1)
    assert "(on a worker thread, beside the readback), draw 5.00 ms;" in result.summary_line() + ";"
    result.steps_beside_draw = 1
    said = result.summary_line()
    assert "step 10.00 ms (on a worker thread, beside the splat frame's draw and readback)" in said
    assert "draw 5.00 ms (its wait behind the steps included)" in said


@pytest.mark.gpu
def test_on_a_gpu_splat_frames_begin_the_next_steps_and_record_the_frames_stepped_in_turn(
    tmp_path, capsys, monkeypatch
):
    """The tree at 262,144 bodies drawn as splat frames from the interop buffers: every frame after the
    first is drawn while the next frame's steps run, and the PNGs are those of frames stepped one after
    the other (the steps' copies into the buffers wait for the frame's reads)."""
    monkeypatch.setenv("NBODY_HEADLESS", "1")
    begun = []
    start_before_draw = StepAhead.start_before_draw

    def spy(self):
        begun.append(start_before_draw(self))
        return begun[-1]

    monkeypatch.setattr(StepAhead, "start_before_draw", spy)
    args = ["record", "collision", "--n", "262144", "--kernel", "tree", "--size", "640x360", "--fps", "60",
            "--frames", "16", "--set", "render.style=splat", "--no-progress"]  # fmt: skip
    frames = {}
    for name in ("ahead", "in-turn"):
        if name == "in-turn":
            monkeypatch.setattr(StepAhead, "can_start", lambda self: False)
            monkeypatch.setattr(StepAhead, "start_before_draw", lambda self: False)
        folder = tmp_path / name
        rc = main([*args, "--frames-dir", str(folder)])
        said = capsys.readouterr()
        assert rc == 0, said.out + said.err
        frames[name] = [p.read_bytes() for p in sorted(folder.glob("frame_*.png"))]
        if name == "ahead":
            assert "beside the splat frame's draw and readback" in said.out + said.err
            assert begun == [False] + [True] * 14, begun  # from the second frame to the last but one
    assert len(frames["ahead"]) == 16 and frames["ahead"] == frames["in-turn"]
