"""Snapshot readers and writers: one module per format (tipsy, nemo, nbabel, npz, csv: each module's
docstring says the choices made for it), listed in one table, `TABLE`, from which detection, `read`,
`write` and their errors all come.

A format is a `SnapshotFormat` (app/model/formats/snapshot_format.py): its name, its extensions, a sniff
that tells its content from the first bytes (`Head`), a reader and, when it can be written, a writer. The
package's own are listed in TABLE; one from outside is added by one call, `register(FORMAT)`, which also
adds its name to the settings' (app.model.config.FORMAT_CHOICES: initial.format, --format).

The common rules:

* The format comes from an explicit ``format=``, else the extension, else (no or unknown extension, as
  with NBabel's ``input1k``) the content: the first 64 KiB go to each format's sniff in the table's
  order, the first to say yes names it. The package's own sniffs do not overlap on real files (a zip
  signature: npz; binary: Tipsy, by a self-consistent header; text: a comma in the first data row says
  csv, 8 values per row NBabel, 7 NEMO), so their order does not matter; a registered format is asked
  before them, so that a format whose rows would pass for NEMO's is still found by its own sniff.
* A gzip file (``m.tipsy.gz``, or any name: it is told by its magic bytes) is decompressed in memory
  and read as the format inside it (app/model/formats/opening.py).
* Text formats skip blank lines and ``#`` comments but never a data row: every malformed row is an
  InputFileError naming the file and its 1-based line number (and column), as is a value beyond
  float32's range (app/model/formats/text_rows.py); binary errors name the record and section.
* Writes go to a temporary file in the target's folder, renamed into place only when complete
  (app.core.outputs.atomic_write), so a failed write never leaves a partial file under the final name.
"""

from __future__ import annotations

import logging
from pathlib import Path

from app.core.errors import ConfigError, InputFileError
from app.model.bodies import Bodies
from app.model.config import FORMAT_CHOICES
from app.model.formats import csv, nbabel, nemo, npz, tipsy
from app.model.formats.csv import read_csv, write_csv
from app.model.formats.nbabel import read_nbabel
from app.model.formats.nemo import read_nemo
from app.model.formats.npz import STEP_LEVEL_KEYS, read_npz, write_npz
from app.model.formats.opening import inner_suffix, open_for_reading
from app.model.formats.snapshot_format import SNIFF_BYTES, Head, SnapshotFormat, Writer
from app.model.formats.text_rows import n_values
from app.model.formats.tipsy import (
    TIPSY_SECTION_OF,
    TipsyHeader,
    read_tipsy,
    read_tipsy_header,
    tipsy_sections,
    write_tipsy,
)

__all__ = [
    "FORMATS",
    "STEP_LEVEL_KEYS",
    "TABLE",
    "TIPSY_SECTION_OF",
    "Head",
    "SnapshotFormat",
    "TipsyHeader",
    "detect_format",
    "output_format",
    "read",
    "read_csv",
    "read_nbabel",
    "read_nemo",
    "read_npz",
    "read_tipsy",
    "read_tipsy_header",
    "register",
    "tipsy_sections",
    "unregister",
    "write",
    "write_csv",
    "write_npz",
    "write_tipsy",
]

log = logging.getLogger(__name__)

# The one table of snapshot formats, in the settings' order (app.model.config.FORMAT_CHOICES, which a test
# holds equal to the names here). Changed only by `register` and `unregister`, which keep the two equal.
TABLE: list[SnapshotFormat] = [tipsy.FORMAT, nemo.FORMAT, nbabel.FORMAT, npz.FORMAT, csv.FORMAT]

FORMATS = FORMAT_CHOICES  # the settings' one list of names (initial.format, --format): TABLE's


def register(fmt: SnapshotFormat) -> None:
    """Add a snapshot format: `read` and `write` take it by name or extension, `detect_format` by
    extension and, asked before the package's own, by its sniff; the settings accept its name.
    ValueError for a name or an extension already taken, or one the lookups could not find (a name or
    extension not in lower case, an extension without its dot)."""
    taken = [f.name for f in TABLE if f.name == fmt.name]
    taken += [e for f in TABLE for e in f.extensions if e in fmt.extensions]
    if taken:
        raise ValueError(f"snapshot format {fmt.name!r}: {', '.join(taken)} already taken")
    bad = [s for s in (fmt.name, *fmt.extensions) if s != s.lower() or not s]
    bad += [e for e in fmt.extensions if not e.startswith(".")]
    if bad:
        raise ValueError(f"snapshot format {fmt.name!r}: {bad}: names and extensions in lower case, '.ext'")
    TABLE.insert(0, fmt)
    FORMAT_CHOICES.insert(0, fmt.name)


def unregister(name: str) -> None:
    """Remove the format `name` (undoing `register`); ValueError when there is none."""
    TABLE.remove(_named(name))
    FORMAT_CHOICES.remove(name)


def _named(name: str) -> SnapshotFormat:
    for fmt in TABLE:
        if fmt.name == name:
            return fmt
    raise ValueError(f"no snapshot format {name!r}")


def _with_extension(suffix: str) -> SnapshotFormat | None:
    return next((fmt for fmt in TABLE if suffix in fmt.extensions), None)


def _check_format_name(fmt: str, allowed: tuple[str, ...]) -> str:
    name = fmt.lower()
    if name not in allowed:
        raise ConfigError(f"format {fmt!r}: choose one of {', '.join(allowed)}")
    return name


def detect_format(path) -> str:
    """The format by extension; for no or an unknown extension, by content (InputFileError if unclear)."""
    path = Path(path)
    by_extension = _with_extension(inner_suffix(path))
    if by_extension is not None:
        return by_extension.name
    with open_for_reading(path) as f:
        data = f.read(SNIFF_BYTES)
    if not data:
        raise InputFileError(f"{path}: empty file: contains no bodies (N = 0)")
    head = Head.of(data)
    for fmt in TABLE:
        if fmt.sniff is not None and fmt.sniff(head):
            return fmt.name
    raise _unrecognised(path, head)


def _unrecognised(path: Path, head: Head) -> InputFileError:
    """What to say of content that no format's sniff claims."""
    if head.text is None:
        return InputFileError(
            f"{path}: binary file without a plausible Tipsy header; readable formats are "
            f"{', '.join(FORMATS)} (pass --format to force one)"
        )
    if not head.rows:
        return InputFileError(
            f"{path}: no data rows in the first {len(head.data)} bytes: contains no bodies (N = 0)"
        )
    lineno, tokens = head.rows[0]
    return InputFileError(
        f"{path}: line {lineno}: {n_values(len(tokens))}; cannot tell the format (expected 7 "
        "for NEMO 'm x y z vx vy vz' or 8 for NBabel 'id m x y z vx vy vz'); pass --format"
    )


def read(path, format: str | None = None) -> Bodies:
    """Read a snapshot; `format` (one of FORMATS) overrides detection by extension and content."""
    path = Path(path)
    name = _check_format_name(format, tuple(FORMATS)) if format else detect_format(path)
    return _named(name).read(path)


def output_format(path, format: str | None = None) -> str:
    """The writer `write` would use for `path`: ConfigError before any work if there is none."""
    path = Path(path)
    writable = [fmt for fmt in TABLE if fmt.write is not None]
    if format:
        return _check_format_name(format, tuple(fmt.name for fmt in writable))
    by_extension = _with_extension(path.suffix.lower())
    if by_extension is None or by_extension.write is None:
        suggested = [fmt.extensions[0] for fmt in writable]
        raise ConfigError(
            f"{path}: cannot tell the output format from the extension "
            f"{path.suffix or '(none)'!r}; use {_one_of(suggested)}"
        )
    return by_extension.name


def _one_of(words: list[str]) -> str:
    """'a, b or c'."""
    return " or ".join(filter(None, [", ".join(words[:-1]), *words[-1:]]))


def write(path, bodies: Bodies, format: str | None = None) -> None:
    """Write any format of the table that has a writer (npz, csv, tipsy: by `format` or the extension),
    atomically. Block steps' levels are kept by npz only: elsewhere, under the rule that needs them
    ("settled"), a warning says a run loaded from the file is not a bitwise continuation."""
    fmt = output_format(path, format)
    sl = bodies.step_levels
    if sl is not None and sl.coarsen == "settled" and fmt != "npz":
        log.warning(
            "%s: %s keeps no block-step levels, which coarsening rule settled needs for a bitwise "
            "resume; write .npz to keep them",
            path,
            fmt,
        )
    _writer(fmt)(Path(path), bodies)


def _writer(name: str) -> Writer:
    writer = _named(name).write
    assert writer is not None, name  # output_format names only formats that write
    return writer
