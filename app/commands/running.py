"""What a running command shares: stopping cleanly on a signal, progress bars, and the report of what the
viewer wrote."""

from __future__ import annotations

import argparse
import logging

log = logging.getLogger("nbody-live")


class Interruption:
    """SIGINT / SIGTERM caught as a flag while a long loop runs, so that the loop stops between steps
    (never inside one, which would leave a half-kicked state) and can still write what it has done.
    Only the first is caught. `signum` is None until a signal arrives; `exit_code` is the shell's
    128 + signal number."""

    SIGNALS = ("SIGINT", "SIGTERM")

    def __init__(self):
        self.signum: int | None = None
        self._previous: dict = {}

    def __enter__(self) -> Interruption:
        import signal

        for name in self.SIGNALS:
            sig = getattr(signal, name)
            self._previous[sig] = signal.signal(sig, self._catch)
        return self

    def _catch(self, signum, _frame) -> None:
        self.signum = signum
        self._restore()  # a second Ctrl-C is not caught: it stops the process the ordinary way

    def _restore(self) -> None:
        import signal

        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def __exit__(self, *exc) -> None:
        self._restore()

    @property
    def name(self) -> str:
        import signal

        return signal.Signals(self.signum).name if self.signum else ""

    @property
    def exit_code(self) -> int:
        return 128 + self.signum if self.signum else 0


class Stopped(KeyboardInterrupt):
    """SIGINT or SIGTERM as an exception (StopsRaise, which app/cli.py keeps around every command): a
    command whose unit of work is minutes long and kept as it finishes (bench's rows, tune's N) ends the
    unit at once and says what it kept. A KeyboardInterrupt, so that whatever cleans up on Ctrl-C
    cleans up."""

    def __init__(self, signum: int):
        import signal

        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class StopsRaise:
    """While active (main thread only), SIGINT and SIGTERM raise Stopped; the handlers before it are put
    back on exit."""

    def __init__(self):
        self._previous: dict = {}

    def __enter__(self) -> StopsRaise:
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._raise)
        return self

    @staticmethod
    def _raise(signum, _frame) -> None:
        raise Stopped(signum)

    def __exit__(self, *exc) -> None:
        import signal

        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


def progress_bar(args: argparse.Namespace, show: bool = True, **options):
    """A tqdm bar on stderr only when stderr is a terminal and neither -q nor --no-progress was given
    (`show` False: not from this process at all, e.g. an MPI rank other than 0)."""
    import sys

    from tqdm import tqdm

    hidden = (
        not show
        or getattr(args, "quiet", False)
        or getattr(args, "no_progress", False)
        or not sys.stderr.isatty()
    )
    return tqdm(disable=hidden, file=sys.stderr, **options)


def report_viewer_outputs(
    args: argparse.Namespace, viewer, frame_log, recorder, recordings: bool = True
) -> None:
    """After `run`'s loop: the live recordings (when `recordings`), then its files; a file that could not
    be written is a RuntimeFault (exit 1), never "wrote"."""
    from app.core.errors import RuntimeFault

    if recordings:  # closing the viewer finalised a recording still running
        from app.render.live_recording import recording_line

        for res in recorder.recordings:
            print(recording_line(res))
    if recorder.error:
        log.error("%s", recorder.error)
    for error in (frame_log.stream_error, viewer.screenshot_error):
        if error:
            raise RuntimeFault(error)
    frame_log.close()
    for path in (args.timings, args.screenshot):
        if path:
            print(f"wrote {path}")
