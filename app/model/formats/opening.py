"""Opening a snapshot for reading: a missing file, a folder or an unreadable file is an InputFileError
saying so, and a gzip file (told by its magic bytes, whatever its name) is decompressed in memory, once
for the reader's several opens."""

from __future__ import annotations

import contextlib
import functools
import gzip
import io
import os
import zlib
from collections.abc import Iterator
from pathlib import Path

from app.core.errors import InputFileError

_GZIP_MAGIC = b"\x1f\x8b"


def inner_suffix(path: Path) -> str:
    """The extension that names the format: `.tipsy` for both `m.tipsy` and `m.tipsy.gz`."""
    suffix = path.suffix.lower()
    return Path(path.stem).suffix.lower() if suffix == ".gz" else suffix


def _is_gzip(path: Path) -> bool:
    with _open_raw(path) as f:
        return f.read(2) == _GZIP_MAGIC


def content_size(path: Path) -> int:
    """The size of the content: decompressed for a gzip file."""
    if not _is_gzip(path):
        return path.stat().st_size
    with open_for_reading(path) as f:
        return f.seek(0, io.SEEK_END)


@functools.lru_cache(maxsize=1)
def _gunzip(path: Path, _mtime_ns: int, _size: int) -> bytes:
    """A gzip file's content, kept for the next call: a reader opens its file two or three times (the
    sniff, the header, the records) and should not decompress it each time."""
    limit = gunzip_limit()
    content = bytearray()
    with _open_raw(path) as f:
        try:
            with gzip.GzipFile(fileobj=f) as stream:  # in chunks: a small file may expand a thousandfold
                while chunk := stream.read(GUNZIP_CHUNK):
                    content += chunk
                    if len(content) > limit:
                        raise InputFileError(
                            f"{path}: decompresses to more than {limit / 2**30:,.1f} GiB, half this "
                            "machine's free memory; decompress it to disk (gunzip) and read that"
                        )
        except (OSError, EOFError, zlib.error) as e:
            raise InputFileError(f"{path}: damaged gzip file ({e}); it cannot be decompressed") from None
    return bytes(content)


GUNZIP_CHUNK = 1 << 24


def gunzip_limit() -> int:
    """How much a gzip snapshot may decompress to in memory: half the free memory (1 GiB where the
    system cannot say)."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (ValueError, OSError):
        return 1 << 30


@contextlib.contextmanager
def _open_raw(path: Path) -> Iterator[io.BufferedReader]:
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below; the try only converts the open's errors
    except FileNotFoundError:
        raise InputFileError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise InputFileError(f"{path}: is a directory, expected a snapshot file") from None
    except OSError as e:
        raise InputFileError(f"{path}: cannot read: {e.strerror}") from None
    with f:
        yield f


@contextlib.contextmanager
def open_for_reading(path: Path) -> Iterator[io.BufferedIOBase]:
    """The file's content, decompressed in memory when it is gzip (whatever its name): every reader
    seeks, and npz needs a seekable stream."""
    with _open_raw(path) as f:
        if f.read(2) != _GZIP_MAGIC:
            f.seek(0)
            yield f
            return
        stat = os.fstat(f.fileno())
    with io.BytesIO(_gunzip(path, stat.st_mtime_ns, stat.st_size)) as content:
        yield content
