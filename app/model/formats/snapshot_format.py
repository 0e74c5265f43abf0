"""What a snapshot format is to app.model.formats: its record in the table (`SnapshotFormat`: name,
extensions, sniff, read, write), what its sniff is shown (`Head`: the first bytes of a file whose
extension names no format) and the Bodies every reader returns (`checked_bodies`: validated, each bad
row named the way its file names it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.model.bodies import Bodies
from app.model.formats.text_rows import Row, data_rows

SNIFF_BYTES = 65536  # how much of a file detection reads


@dataclass(frozen=True)
class Head:
    """The start of a file (its first SNIFF_BYTES bytes, decompressed when gzip), as a sniff sees it."""

    data: bytes
    text: str | None  # None when binary: a NUL byte, or not UTF-8
    rows: list[Row]  # the text's data rows, the last left out when the window cut it; [] when binary

    @classmethod
    def of(cls, data: bytes) -> Head:
        if b"\0" in data or not _is_text(data):
            return cls(data, None, [])
        text = data.decode("utf-8", errors="replace")
        lines = text.splitlines()
        if len(data) == SNIFF_BYTES and not text.endswith("\n"):
            lines = lines[:-1]  # the last line may be cut off by the sniff window
        return cls(data, text, data_rows("\n".join(lines)))

    @property
    def comma_separated(self) -> bool:
        """Whether the first data row has a comma (csv's; the whitespace tables' sniffs say no to it)."""
        return bool(self.rows) and any("," in t for t in self.rows[0][1])


def _is_text(head: bytes) -> bool:
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start > len(head) - 4  # a multi-byte character cut off by the sniff window is still text
    return True


Reader = Callable[[Path], Bodies]
Writer = Callable[[Path, Bodies], None]
Sniff = Callable[[Head], bool]


@dataclass(frozen=True)
class SnapshotFormat:
    """One snapshot format: a module of app/model/formats/ (or a registered one) defines it as FORMAT."""

    name: str  # what --format and initial.format say (lower case)
    extensions: tuple[str, ...]  # lower case, with the dot; the first is the one messages suggest
    sniff: Sniff | None  # does a file's Head look like this format? None: by extension or name only
    read: Reader  # InputFileError naming the file and the row for anything malformed
    write: Writer | None = None  # atomic (app.core.outputs.atomic_write); None: a format only read


def checked_bodies(path: Path, pos, vel, mass, time, ids, label: Callable[[int], str], comp=None) -> Bodies:
    """The Bodies a reader returns (float64, contiguous), validated: `label(i)` names body i's row in the
    file for the InputFileError of a bad value."""
    return Bodies.from_arrays(pos, vel, mass, time, ids, source=str(path), components=comp, row_label=label)
