"""`python tests/signal_job.py TARGET NTH SIGNAL [--stand-in-gpu] [--rank R] -- ARGS...`: `nbody-live
ARGS...` in a process that sends itself SIGNAL (INT, TERM or KILL) at the NTH call of TARGET
("module.function" or "module.Class.method"), just before the call runs: a real signal at a chosen point
of a real run, for tests/test_fault_matrix.py. With --stand-in-gpu, `cuda` is tests/test_tune_gpus.py's
stand-in GPU (for `tune`, which needs one, in CI). With --rank R (under mpiexec) only rank R does it."""

from __future__ import annotations

import importlib
import os
import signal
import sys


def resolve(target: str):
    """(the object holding the attribute, its name) of a dotted path to a function or a method."""
    parts = target.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            owner = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:-1]:
            owner = getattr(owner, part)
        return owner, parts[-1]
    raise ValueError(f"{target}: no module in it")


def signal_at(target: str, nth: int, signum: int) -> None:
    owner, name = resolve(target)
    real = getattr(owner, name)
    calls = [0]

    def wrapped(*args, **kwargs):
        calls[0] += 1
        if calls[0] == nth:
            os.kill(os.getpid(), signum)  # the handler runs before the next line: it may raise
        return real(*args, **kwargs)

    setattr(owner, name, wrapped)


def stand_in_gpu() -> None:
    from test_tune_gpus import FakeGpu, FakeGpuHere

    import app.backends
    from app.backends.cuda.multi import GpuDevices

    FakeGpu.loads = []
    app.backends.select_backend = lambda name: FakeGpuHere
    GpuDevices.count = staticmethod(lambda: 1)


if __name__ == "__main__":
    split = sys.argv.index("--")
    target, nth, sig, *flags = sys.argv[1:split]
    if "--stand-in-gpu" in flags:
        stand_in_gpu()
    rank = int(flags[flags.index("--rank") + 1]) if "--rank" in flags else None
    if rank is None or int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", -1))) == rank:
        signal_at(target, int(nth), getattr(signal, f"SIG{sig}"))
    from app.cli import main

    sys.exit(main(sys.argv[split + 1 :]))
