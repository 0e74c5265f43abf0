"""Output files, written the one way: checked before any work, written atomically, never half-reported.

    target = check_output(args.out, "snapshot")      # before the work: RuntimeFault with one line if not
    ...                                              # (minutes of work)
    with atomic_write(target, "wb") as f:            # a hidden temporary beside it, renamed when complete
        f.write(data)

`check_output` proves the folder takes a new file by creating (and removing) one there, which also
catches read-only mounts and /proc-like folders that `os.access` reports as writable. `atomic_write`
fsyncs, gives the file the mode an ordinary open() would (mkstemp's is 0600), and on any failure
removes the temporary and raises RuntimeFault naming the path: a failed write is never reported as
written. `StreamedFile` is for logs that must survive an interruption: each row is written as it comes,
and a row a full disk cut short is cut off.
`partial_file` is for writers that fill a temporary themselves (the video encoder, PIL) and rename it
into place when they finish; `discard` removes it when they do not.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

from app.core.errors import ConfigError, RuntimeFault


def check_output(path, what: str = "output") -> Path:
    """`path` as a Path if a file can be written there, else RuntimeFault naming the path and the reason."""
    target = Path(path)
    directory = target.parent
    limit = name_max(directory)
    if len(os.fsencode(target.name)) > limit:
        raise RuntimeFault(
            f"cannot write {what} {_short(target)}: its name is {len(os.fsencode(target.name))} bytes, and "
            f"this file system takes at most {limit}; choose a shorter name"
        )
    try:
        if target.is_dir():
            raise RuntimeFault(f"cannot write {what} {target}: it is a directory")
        if special_file(target):
            return _checked_special(target, what)
        if not directory.exists():
            raise RuntimeFault(f"cannot write {what} {target}: folder {directory} does not exist")
        if not directory.is_dir():
            raise RuntimeFault(f"cannot write {what} {target}: {directory} is not a folder")
    except OSError as e:  # a path the system cannot even look at (too long a path, a loop of links)
        raise RuntimeFault(f"cannot write {what} {_short(target)}: {e.strerror or e}") from e
    discard(partial_file(target, what))
    return target


def special_file(target: Path) -> str | None:
    """What an existing target that is not a regular file or a folder is ("a character device", "a
    fifo", "a block device", "a socket"), else None. A device or a fifo is written in place: renaming a
    temporary over it would replace /dev/null itself (as root) with the output."""
    try:
        mode = target.stat().st_mode
    except OSError:
        return None
    for test, name in (
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISFIFO, "a fifo"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return None


def _checked_special(target: Path, what: str) -> Path:
    """A character device or a fifo the output is written straight into (/dev/null, /dev/stdout, a
    pipe); RuntimeFault for a block device or a socket, or one this process may not write."""
    kind = special_file(target)
    if kind in ("a block device", "a socket"):
        raise RuntimeFault(f"cannot write {what} {target}: it is {kind}, not a file; give a file name")
    if not os.access(target, os.W_OK):
        raise RuntimeFault(f"cannot write {what} {target}: {kind} this process may not write")
    return target


def check_folder(path, what: str) -> Path:
    """A folder outputs will be written in, later and only maybe (a live recording): there and taking
    new files, or possible to make (each missing name fits the file system, the nearest existing parent
    takes new entries). Nothing is created; RuntimeFault naming the folder and the reason otherwise."""
    target = Path(path)
    try:
        there = target
        while not there.exists():
            if len(os.fsencode(there.name)) > name_max(there.parent):
                raise RuntimeFault(
                    f"cannot write {what} in {_short(target)}: the name {_short(there)} is too long"
                )
            there = there.parent
        if not there.is_dir():
            raise RuntimeFault(f"cannot write {what} in {target}: {there} is not a folder")
    except OSError as e:
        raise RuntimeFault(f"cannot write {what} in {_short(target)}: {e.strerror or e}") from e
    try:
        discard(partial_file(there / "probe", what))
    except RuntimeFault as e:
        why = getattr(e.__cause__, "strerror", None) or "it takes no new files"
        raise RuntimeFault(
            f"cannot write {what} in {target}: folder {there} takes no new files ({why})"
        ) from e
    return target


def check_outputs(*outputs: tuple[str | os.PathLike | None, str]) -> None:
    """`check_output(path, what)` for each (path, what) whose path was given (not None): a command's
    optional outputs, all checked before its work; two outputs naming one file are refused (the second
    would overwrite the first)."""
    given = [(Path(path), what) for path, what in outputs if path is not None]
    refuse_same_file(given)
    for path, what in given:
        check_output(path, what)


def check_suffix(path, suffixes: tuple[str, ...], what: str, option: str) -> None:
    """ConfigError when `path` (given to `option`) does not end in one of `suffixes` (lower case, with the
    dot): a writer of one format must not put its bytes under another format's name. A device or a fifo
    (/dev/null, a pipe) has no format in its name: it passes."""
    if path is not None and Path(path).suffix.lower() not in suffixes and not special_file(Path(path)):
        raise ConfigError(
            f"{option} {path}: the {what} is written as {suffixes[0][1:].upper()}, so its name must end in "
            f"{' or '.join(suffixes)}; rename it (e.g. {Path(path).with_suffix(suffixes[0])})"
        )


def refuse_same_file(outputs) -> None:
    """RuntimeFault when two of the (path, what) outputs are one file (after resolving links and '..')."""
    seen: dict[Path, str] = {}
    for path, what in outputs:
        key = Path(os.path.realpath(path))
        if key in seen:
            raise RuntimeFault(
                f"the {seen[key]} and the {what} are the same file, {path}: the second would overwrite "
                "the first; give each its own name"
            )
        seen[key] = what


def name_max(directory: Path) -> int:
    """The longest file name (in bytes) the file system of `directory` takes (255 where it cannot say)."""
    with contextlib.suppress(OSError, ValueError):
        return int(os.pathconf(directory if directory.is_dir() else ".", "PC_NAME_MAX"))
    return 255


def _short(path: Path, keep: int = 60) -> str:
    """A path for a message: a very long name cut in the middle."""
    text = str(path)
    return text if len(text) <= 2 * keep else f"{text[:keep]}...{text[-keep:]}"


def partial_file(target: Path, what: str = "output") -> Path:
    """Create an empty hidden file beside `target` (mode 0o666 through the umask, as open() would), the
    temporary a writer fills and renames over `target`; RuntimeFault naming `target` if it cannot, or if
    `target` is a device or a fifo (renaming over /dev/null would replace it; `atomic_write` writes those
    in place, and a writer that needs a file of its own, the video encoder, cannot)."""
    kind = special_file(target)
    if kind:
        raise RuntimeFault(
            f"cannot write {what} {target}: it is {kind}, and this output needs a file; give a file name"
        )
    stem = target.name[: max(1, name_max(target.parent) - 16)]  # ".{stem}.{8 hex}.part" fits the limit
    for _ in range(100):
        name = target.parent / f".{stem}.{secrets.token_hex(4)}.part"
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
    """A file object whose contents appear under `path` only if the block completes (a character device
    or a fifo is written in place: there is no file to replace)."""
    target = Path(path)
    if special_file(target):
        try:
            with open(_checked_special(target, what), mode, **open_args) as f:
                yield f
        except OSError as e:  # /dev/full: ENOSPC, at the write or at the close's flush
            raise RuntimeFault(f"cannot write {what} {target}: {e.strerror or e}") from e
        return
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
    """A text file written row by row, each write straight to the file, so that an interrupted run keeps
    every row written so far. A write that fails (a full disk) is cut back off the file: it ends at its
    last whole row, never inside one. Opened only after `check_output`; `close()` is safe to call twice."""

    def __init__(self, path, what: str = "log"):
        self.path = check_output(path, what)
        self.what = what
        self._whole = 0  # the file's length after its last whole write
        try:
            self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
        except OSError as e:
            raise RuntimeFault(f"cannot write {what} {self.path}: {e.strerror or e}") from e

    def write(self, text: str) -> None:
        if self._fd is None:
            raise RuntimeFault(f"cannot write {self.what} {self.path}: it is closed")
        data = memoryview(text.encode())
        size = len(data)
        try:
            while data:
                data = data[os.write(self._fd, data) :]
        except OSError as e:
            with contextlib.suppress(OSError):  # a device (/dev/full) cannot be cut: nothing to cut
                if stat.S_ISREG(os.fstat(self._fd).st_mode):
                    os.ftruncate(self._fd, self._whole)
                    os.lseek(self._fd, self._whole, os.SEEK_SET)
            raise RuntimeFault(f"cannot write {self.what} {self.path}: {e.strerror or e}") from e
        self._whole += size

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
