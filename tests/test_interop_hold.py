"""GLBuffers.hold / release (app/backends/cuda/interop.py) against a stand-in for pycuda.gl: while held,
`mapped()` hands out the held pointers with no map or unmap (the splat style's frames), `release()` unmaps
once, and unregistering releases first."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from app.backends.cuda.interop import GLBuffers


class _Mapping:
    def __init__(self, log: list, name: str, ptr: int, size: int):
        self.log, self.name, self.ptr, self.size = log, name, ptr, size

    def device_ptr_and_size(self):
        return self.ptr, self.size

    def unmap(self):
        self.log.append(("unmap", self.name))


def _stand_in(log: list):
    class RegisteredBuffer:
        def __init__(self, vbo, flags):
            self.vbo = vbo

        def map(self):
            log.append(("map", self.vbo))
            return _Mapping(log, self.vbo, 1000 * self.vbo, 16 * 64)

        def unregister(self):
            log.append(("unregister", self.vbo))

    return SimpleNamespace(graphics_map_flags=SimpleNamespace(NONE=0), RegisteredBuffer=RegisteredBuffer)


def test_held_buffers_are_mapped_once_and_released_once():
    log: list = []
    gl = GLBuffers(_stand_in(log), 1, 2)
    with gl.mapped() as m:  # not held: a map and an unmap of both, as before
        assert (m.pos, m.speed) == (1000, 2000)
    assert log == [("map", 1), ("map", 2), ("unmap", 2), ("unmap", 1)]
    log.clear()
    gl.hold()
    gl.hold()  # (a second hold is nothing)
    for _ in range(3):  # three frames: the step's copies and the splat both use the pointers
        with gl.mapped_for(64) as m:
            assert (m.pos, m.speed) == (1000, 2000)
    assert log == [("map", 1), ("map", 2)] and gl.held and gl.is_mapped
    gl.release()
    assert log[2:] == [("unmap", 2), ("unmap", 1)] and not gl.held and not gl.is_mapped
    gl.release()  # (nothing held: nothing)
    assert len(log) == 4


def test_a_too_small_held_buffer_is_still_a_fault_and_unregister_releases_first():
    log: list = []
    gl = GLBuffers(_stand_in(log), 1, 2)
    gl.hold()
    with pytest.raises(Exception, match="resize them"), gl.mapped_for(65):
        pass
    assert gl.held  # the fault leaves the hold as it was
    gl.unregister()
    assert log[-4:] == [("unmap", 2), ("unmap", 1), ("unregister", 2), ("unregister", 1)]


def test_hold_inside_mapped_is_refused():
    gl = GLBuffers(_stand_in([]), 1, 2)
    with gl.mapped(), pytest.raises(RuntimeError, match="hold"):
        gl.hold()


class _Event:
    """A stand-in CUDA event: what was recorded on which stream, and the host waits for it."""

    def __init__(self, log: list):
        self.log = log

    def record(self, stream=None):
        self.log.append(("record", stream))

    def synchronize(self):
        self.log.append(("wait",))


def test_the_next_write_waits_for_the_last_held_read_on_the_host():
    log: list = []
    gl = GLBuffers(_stand_in(log), 1, 2, new_event=lambda: _Event(log))
    gl.hold()
    log.clear()
    with gl.mapped_for(64):  # a write with no read before it: nothing to wait for
        pass
    assert log == []
    with gl.mapped_for(64, reader="splat-stream"):  # the splat frame reads: its end is marked on its stream
        assert log == []
    assert log == [("record", "splat-stream")]
    with gl.mapped_for(64):  # the steps' copies (a worker thread in a recording) wait for that read first
        assert log[-1] == ("wait",)
    with gl.mapped_for(64):  # the same read is waited for once
        pass
    assert log == [("record", "splat-stream"), ("wait",)]


def test_a_failed_read_is_still_marked_and_release_waits_for_it():
    log: list = []
    gl = GLBuffers(_stand_in(log), 1, 2, new_event=lambda: _Event(log))
    gl.hold()
    with pytest.raises(RuntimeError), gl.mapped(reader="s"):  # a launch that raised after others were queued
        raise RuntimeError("launch failed")
    assert log[-1] == ("record", "s")
    gl.release()  # GL gets the buffers back only after the reads queued on the reader's stream
    assert log[-3:] == [("wait",), ("unmap", 2), ("unmap", 1)]


def test_a_reader_of_buffers_not_held_is_ordered_by_the_unmap_alone():
    log: list = []
    gl = GLBuffers(_stand_in(log), 1, 2, new_event=lambda: _Event(log))
    with gl.mapped(reader="s"):
        pass
    with gl.mapped():
        pass
    assert [e[0] for e in log] == ["map", "map", "unmap", "unmap"] * 2  # no event, no wait


def test_a_write_waits_for_a_read_that_is_due_and_goes_on_when_it_is_called_off(monkeypatch):
    import threading
    import time

    from app.backends.cuda import interop
    from app.core.errors import RuntimeFault

    log: list = []
    gl = GLBuffers(_stand_in(log), 1, 2, new_event=lambda: _Event(log))
    gl.hold()
    for settle in ("read", "cancel"):
        gl.expect_read()  # the GL thread, before it begins the steps on a worker
        writer = threading.Thread(target=lambda: gl.mapped().__enter__())
        writer.start()
        time.sleep(0.05)
        assert writer.is_alive()  # the steps' copies wait: the frame has not read the buffers yet
        if settle == "read":
            with gl.mapped(reader="s"):
                pass
        else:
            gl.cancel_read()  # the frame will not be drawn
        writer.join(5)
        assert not writer.is_alive()
    monkeypatch.setattr(interop, "READ_DUE_WITHIN_S", 0.01)
    gl.expect_read()
    with pytest.raises(RuntimeFault, match="did not read them within"), gl.mapped():
        pass  # a draw that never comes is a fault, not a hang


def test_release_calls_off_a_due_read():
    gl = GLBuffers(_stand_in([]), 1, 2, new_event=lambda: _Event([]))
    gl.hold()
    gl.expect_read()
    gl.release()  # the GL thread itself (a sprites frame, new buffers): it must not wait for its own read
    assert not gl.held
