"""The GPU's non-finite check (app/backends/cuda/nonfinite.py) over a twin GPU, in CI: the one check the
single-GPU backend runs on every row and each GPU of `--gpus` on its share.

The twin queues the driver calls the check makes (the flag's reset, the kernel, the copy into pinned
memory, the event) on one stream, which runs only when the test says the GPU got there; its kernel is the
host's form of `first_nonfinite` (app.backends.cpu) on the rows the launch's pointers address, keeping the
minimum index as the kernel's atomicMin does. Checked: the rows of a share (found as state indices, rows
outside it ignored), the answer without a host wait only once the GPU got there and read once, a check
launched while an earlier copy is in flight, the waiting read, and a new state dropping the old checks.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from app.backends.cpu_forces import first_nonfinite
from app.backends.cuda.nonfinite import INT_MAX, NonFiniteCheck
from app.backends.cuda.state_ops import BLOCK, INTEGRATE_SOURCE
from app.engine.forces import Span

N = 100


def address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def at(ptr: int, count: int, ctype, shape) -> np.ndarray:
    """The twin's device memory: a numpy view of `count` values at `ptr`."""
    return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctype)), shape=(count,)).reshape(shape)


class TwinEvent:
    def __init__(self, gpu: TwinGpu):
        self.gpu, self.done = gpu, False

    def record(self) -> None:
        self.gpu.queue.append(lambda: setattr(self, "done", True))

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.gpu.host_waits += 1
        self.gpu.run()


class TwinGpu:
    """What NonFiniteCheck asks of a CudaDevice (scratch, pinned, function, drv), on a queued stream."""

    def __init__(self):
        self.queue: list = []
        self.host_waits = 0
        self._buffers: dict = {}
        self.drv = self

    def run(self) -> None:
        """The GPU gets through everything queued so far."""
        while self.queue:
            self.queue.pop(0)()

    # CudaDevice
    def scratch(self, key: str, nbytes: int) -> int:
        return address(self._buffers.setdefault(("device", key), np.zeros(max(nbytes, 16) // 4, np.int32)))

    def pinned(self, key: str, count: int, dtype) -> np.ndarray:
        return self._buffers.setdefault(("pinned", key), np.zeros(count, dtype))

    def function(self, source: str, symbol: str, types: str):
        assert (source, symbol, types) == (INTEGRATE_SOURCE, "first_nonfinite", "PPiP")
        return self

    def prepared_call(self, grid, block, pos: int, vel: int, n: int, flag: int) -> None:
        assert grid[0] * block[0] >= n and block[0] == BLOCK

        def first_nonfinite_kernel():
            rows = [at(ptr, 4 * n, ctypes.c_float, (n, 4)) for ptr in (pos, vel)]
            bad = first_nonfinite(*rows)
            cell = at(flag, 1, ctypes.c_int32, (1,))
            if bad >= 0:
                cell[0] = min(int(cell[0]), bad)  # atomicMin

        self.queue.append(first_nonfinite_kernel)

    # the driver
    def memset_d32(self, ptr: int, value: int, count: int) -> None:
        self.queue.append(lambda: at(ptr, count, ctypes.c_int32, (count,)).fill(value))

    def memcpy_dtoh_async(self, host: np.ndarray, ptr: int) -> None:
        def copy():
            host[:] = at(ptr, host.size, ctypes.c_int32, host.shape)

        self.queue.append(copy)

    def Event(self) -> TwinEvent:  # noqa: N802 - pycuda's name
        return TwinEvent(self)


@pytest.fixture
def state():
    """A clean float32 state (pos with masses, vel) and a twin GPU with a prepared check."""
    rng = np.random.default_rng(4)
    pos = np.ascontiguousarray(np.c_[rng.normal(size=(N, 3)), np.full(N, 1 / N)], dtype=np.float32)
    vel = np.ascontiguousarray(np.c_[rng.normal(size=(N, 3)), np.zeros(N)], dtype=np.float32)
    gpu = TwinGpu()
    check = NonFiniteCheck(gpu)
    check.prepare()
    return pos, vel, gpu, check


def launch(check, pos, vel, rows: Span) -> None:
    check.launch(address(pos), address(vel), rows)


def test_a_share_finds_its_first_bad_row_as_a_state_index(state):
    pos, vel, _gpu, check = state
    launch(check, pos, vel, Span.all(N))
    assert check.result(wait=True) == -1
    pos[20, 0] = np.nan  # before the share
    vel[41, 2] = np.inf
    pos[60, 3] = np.nan  # a mass
    pos[90, 1] = np.inf  # after the share
    launch(check, pos, vel, Span(40, 30))
    assert check.result(wait=True) == 41
    vel[41, 2] = 0.0
    launch(check, pos, vel, Span(40, 30))
    assert check.result(wait=True) == 60
    launch(check, pos, vel, Span(40, 0))  # an empty share: nothing to find, the flag still reset
    assert check.result(wait=True) == -1
    vel[:, 3] = np.nan  # the unused fourth velocity component is not a body's
    launch(check, pos, vel, Span(61, 20))
    assert check.result(wait=True) == -1


def test_without_a_wait_the_answer_comes_once_the_gpu_got_there_and_once(state):
    pos, vel, gpu, check = state
    vel[55, 0] = np.nan
    launch(check, pos, vel, Span(50, 50))
    assert check.result(wait=False) == -1  # queues the flag's copy behind an event
    assert check.result(wait=False) == -1  # the GPU has not got there
    gpu.run()
    assert check.result(wait=False) == 55
    assert check.result(wait=False) == -1  # read once; nothing launched since: nothing copied again
    assert not gpu.queue and gpu.host_waits == 0


def test_a_check_launched_while_a_copy_is_in_flight_is_read_after_it(state):
    pos, vel, gpu, check = state
    vel[77, 1] = np.nan
    launch(check, pos, vel, Span(0, 50))  # clean rows
    assert check.result(wait=False) == -1
    launch(check, pos, vel, Span(50, 50))  # the share changed (re-balanced): rows 50.. hold the NaN
    assert check.result(wait=False) == -1  # the first copy still on its way: nothing new is copied
    gpu.run()
    assert check.result(wait=False) == -1  # the first check's answer (clean); the second's copy queued
    gpu.run()
    assert check.result(wait=False) == 77
    assert gpu.host_waits == 0


def test_the_waiting_read_has_the_newest_check(state):
    pos, vel, gpu, check = state
    launch(check, pos, vel, Span.all(N))
    assert check.result(wait=False) == -1  # a copy in flight
    pos[3, 2] = np.inf
    launch(check, pos, vel, Span.all(N))
    assert check.result(wait=True) == 3
    assert gpu.host_waits >= 1 and not gpu.queue
    assert gpu.pinned("nonfinite-flag", 1, np.int32)[0] != INT_MAX


def test_a_new_state_drops_the_old_checks(state):
    pos, vel, gpu, check = state
    vel[10, 0] = np.nan
    launch(check, pos, vel, Span.all(N))
    assert check.result(wait=False) == -1
    check.prepare()  # load(): the copy in flight and the launch belong to the old state
    gpu.run()
    assert check.result(wait=False) == -1 and check.result(wait=True) == -1
