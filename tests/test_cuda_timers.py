"""EventTimer's two reading modes, with fake events standing in for CUDA's (no GPU needed)."""

from app.engine.clocks import MAX_PENDING, EventTimer


class FakeGPU:
    """Events complete when the test says the GPU got past them; time is a counter of records."""

    def __init__(self):
        self.clock = 0.0
        self.done_until = 0  # events with serial < done_until have completed
        self.serial = 0

    def Event(self):  # noqa: N802 - the pycuda.driver name
        gpu = self

        class Ev:
            def record(self):
                gpu.clock += 1.0
                self.t, self.serial = gpu.clock, gpu.serial
                gpu.serial += 1

            def query(self):
                return self.serial < gpu.done_until

            def synchronize(self):
                gpu.done_until = max(gpu.done_until, self.serial + 1)

            def time_since(self, other):
                return self.t - other.t

        return Ev()


def _batch(timer, categories=("force", "integrate")):
    timer.reset()
    for c in categories:
        with timer.time(c):
            pass


def test_collect_blocks_and_returns_this_batch():
    gpu = FakeGPU()
    t = EventTimer(gpu)
    _batch(t)
    assert t.collect() == {"force": 1.0, "integrate": 1.0}
    assert gpu.done_until == gpu.serial  # it waited for the last event


def test_collect_lagged_never_waits_and_returns_newest_finished_batch():
    gpu = FakeGPU()
    t = EventTimer(gpu)
    _batch(t, ("force",))
    assert t.collect_lagged() is None and gpu.done_until == 0  # nothing finished, nothing waited
    _batch(t, ("force", "force"))
    assert t.collect_lagged() is None
    gpu.done_until = gpu.serial  # the GPU caught up with both batches
    _batch(t, ("force",))
    assert t.collect_lagged() == {"force": 2.0}  # the newest finished one, not the running one


def test_collect_lagged_applies_back_pressure():
    gpu = FakeGPU()
    t = EventTimer(gpu)
    for _ in range(MAX_PENDING + 1):
        _batch(t)
        t.collect_lagged()
    assert gpu.done_until > 0  # it waited for the oldest batch instead of queueing without bound


def test_events_are_reused():
    gpu = FakeGPU()
    t = EventTimer(gpu)
    for _ in range(20):
        _batch(t)
        t.collect()
    assert len(t._free) == 4
