"""The `nbody-live` command: argparse sub-commands, one module each under app/commands/.

User mistakes (bad flags, scene keys, files) end in one line on stderr and exit status 2; failures
while running (unwritable output, device faults) in one line and exit status 1; never a traceback
unless --debug is given.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys

from app import __version__
from app.commands import bench, info, new_kernel, record, run, simulate, tune, validate
from app.core.errors import RuntimeFault, UserError

PROG = "nbody-live"
DESCRIPTION = """\
NBody Live: a real-time 3D N-body gravity viewer for writing, comparing and showing GPU kernels.
Bodies are integrated by CUDA kernels straight in the vertex buffer OpenGL draws (CPU fallback:
numba), switched and timed live.

start here:
  nbody-live run                       the viewer on a Plummer sphere with the best backend found
  nbody-live info                      what this machine can run (backends, GL, CUDA device)
  nbody-live <command> --help          each command's options and examples
"""


class _Parser(argparse.ArgumentParser):
    """One line on a usage error: the problem and where to look, then exit status 2.

    Any number, '-1e-3' included, is a value rather than an option, so that `--dt -1e-3` reaches the
    option's own check ("must be > 0") instead of "expected one argument" (argparse alone takes only
    '-1' and '-.5' for numbers)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$|^-inf$")

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log debug details")
    p.add_argument("-q", "--quiet", action="store_true", help="log warnings and errors only")
    p.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module in (run, record, simulate, validate, bench, tune, info, new_kernel):
        module.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    # Our own loggers at the chosen level; third-party ones (PyOpenGL, vispy, numba) at warnings only.
    logging.basicConfig(level=logging.WARNING, format=f"{PROG}: %(message)s", stream=sys.stderr)
    for name in ("app", PROG):
        logging.getLogger(name).setLevel(level)
    if not args.command:
        parser.print_help()
        return 2
    from app.commands.running import Stopped, StopsRaise

    try:
        # SIGTERM as Ctrl-C wherever a command has not taken the signals itself (its setup: a backend's
        # kernels compiling, a scene loading): one line and 143, not a silent death
        with StopsRaise():
            if getattr(args, "kernel_file", None) or getattr(args, "kernel_dir", None):
                from app.backends.cuda import user_kernels

                user_kernels.load(args.kernel_file, args.kernel_dir)  # before any backend lists its kernels
            return int(args.func(args) or 0)
    except (UserError, RuntimeFault) as e:
        if args.debug:
            raise
        print(f"{PROG} {args.command}: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt as stop:
        print(f"{PROG} {args.command}: interrupted ({stop or 'SIGINT'})", file=sys.stderr)
        return stop.exit_code if isinstance(stop, Stopped) else 130


if __name__ == "__main__":
    raise SystemExit(main())
