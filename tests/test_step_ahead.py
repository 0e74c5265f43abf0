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
