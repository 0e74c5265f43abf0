"""Output files, written the one way: checked before any work, written atomically, never half-reported.

    target = check_output(args.out, "snapshot")      # before the work: RuntimeFault with one line if not
    ...                                              # (minutes of work)
    with atomic_write(target, "wb") as f:            # a hidden temporary beside it, renamed when complete
        f.write(data)

`check_output` proves the folder takes a new file by creating (and removing) one there, which also
catches read-only mounts and /proc-like folders that `os.access` reports as writable. `atomic_write`
fsyncs, gives the file the mode an ordinary open() would (mkstemp's is 0600), and on any failure
removes the temporary and raises RuntimeFault naming the path: a failed write is never reported as
written. `StreamedFile` is for logs that must survive an interruption: each row is flushed as it comes.
`partial_file` is for writers that fill a temporary themselves (the video encoder, PIL) and rename it
into place when they finish; `discard` removes it when they do not.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

from app.core.errors import RuntimeFault


def check_output(path, what: str = "output") -> Path:
    """`path` as a Path if a file can be written there, else RuntimeFault naming the path and the reason."""
    target = Path(path)
    directory = target.parent
    if target.is_dir():
        raise RuntimeFault(f"cannot write {what} {target}: it is a directory")
    if not directory.exists():
        raise RuntimeFault(f"cannot write {what} {target}: folder {directory} does not exist")
    if not directory.is_dir():
        raise RuntimeFault(f"cannot write {what} {target}: {directory} is not a folder")
    discard(partial_file(target, what))
    return target


def check_outputs(*outputs: tuple[object, str]) -> None:
    """`check_output(path, what)` for each (path, what) whose path was given (not None): a command's
    optional outputs, all checked before its work."""
    for path, what in outputs:
        if path is not None:
            check_output(path, what)


def partial_file(target: Path, what: str = "output") -> Path:
    """Create an empty hidden file beside `target` (mode 0o666 through the umask, as open() would), the
    temporary a writer fills and renames over `target`; RuntimeFault naming `target` if it cannot."""
    for _ in range(100):
        name = target.parent / f".{target.name}.{secrets.token_hex(4)}.part"
        try:
            fd = os.open(name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
        except FileExistsError:
            continue
        except OSError as e:
            raise RuntimeFault(
                f"cannot write {what} {target}: folder {target.parent} does not take new "
                f"files ({e.strerror or e})"
            ) from e
        os.close(fd)
        return name
    raise RuntimeFault(f"cannot write {what} {target}: no free temporary name in {target.parent}")


@contextlib.contextmanager
def atomic_write(path, mode: str = "wb", what: str = "output", **open_args) -> Iterator:
    """A file object whose contents appear under `path` only if the block completes."""
    target = Path(path)
    tmp = partial_file(target, what)
    try:
        with open(tmp, mode, **open_args) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if target.exists():  # keep the old file's mode, as overwriting it in place would
            os.chmod(tmp, target.stat().st_mode & 0o7777)
        os.replace(tmp, target)
    except BaseException as e:
        discard(tmp)
        if isinstance(e, OSError):
            raise RuntimeFault(f"cannot write {what} {target}: {e.strerror or e}") from e
        raise


def discard(path: Path | None) -> None:
    """Remove a temporary that will not be renamed into place (None, or already gone: nothing to do)."""
    if path is not None:
        with contextlib.suppress(OSError):
            Path(path).unlink()


class StreamedFile:
    """A text file written row by row and flushed after each, so that an interrupted run keeps every
    row written so far. Opened only after `check_output`; `close()` is safe to call twice."""

    def __init__(self, path, what: str = "log"):
        self.path = check_output(path, what)
        self.what = what
        try:
            self._f = open(self.path, "w", newline="")  # noqa: SIM115 - closed by close()
        except OSError as e:
            raise RuntimeFault(f"cannot write {what} {self.path}: {e.strerror or e}") from e

    def write(self, text: str) -> None:
        try:
            self._f.write(text)
            self._f.flush()
        except OSError as e:
            raise RuntimeFault(f"cannot write {self.what} {self.path}: {e.strerror or e}") from e

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()
