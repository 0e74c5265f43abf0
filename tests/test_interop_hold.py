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
