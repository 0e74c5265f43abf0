"""Signals while recording (app.render.recorder, the live viewer): the first SIGINT/SIGTERM stops after
the current frame and finalises the file, a second abandons it; and the exit status a stopped run returns.
"""

from __future__ import annotations

import logging
import signal
import threading

log = logging.getLogger(__name__)


class InterruptGuard:
    """SIGINT/SIGTERM while recording: the first sets `signum` (stop after this frame and finalise) and
    calls `on_signal(signum)` (the live viewer: quit at the next tick, which finalises its recording), a
    second raises KeyboardInterrupt (abandon). Installed only on the main thread; restored on exit."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, on_signal=None, doing: str = "stopping after this frame and finalising the file"):
        self.signum: int | None = None
        self.on_signal = on_signal
        self.doing = doing
        self._previous: dict = {}

    def _handler(self, signum, frame) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt(f"{signal.Signals(signum).name} again: recording abandoned")
        self.signum = signum
        log.warning("%s: %s (again to abandon it)", signal.Signals(signum).name, self.doing)
        if self.on_signal is not None:
            self.on_signal(signum)

    def __enter__(self) -> InterruptGuard:
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self._previous[s] = signal.signal(s, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous.clear()

    @property
    def stop(self) -> bool:
        return self.signum is not None


def exit_status(interrupted) -> int:
    """The shell's convention for a run a signal stopped (130 for SIGINT, 143 for SIGTERM), else 0; the
    recorder and the live viewer both finalise their file first."""
    if interrupted in (signal.SIGINT, signal.SIGTERM):
        return 128 + int(interrupted)
    return 0
