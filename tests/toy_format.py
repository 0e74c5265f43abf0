"""A toy snapshot format, the worked example of adding one (docs/architecture.md "Where a change goes"):
a whitespace table under the header line `x y z vx vy vz m`, extension .toy, read and written.

One module defining FORMAT, and one call, `formats.register(FORMAT)`: then `formats.read` and `write`, the
detection by extension and by content, the settings (initial.format, --format) and every command that
loads or writes a snapshot take it (tests/test_format_table.py). The package's helpers do the common
work: text_rows (rows with their line numbers, tables whose errors name them), checked_bodies (the
validated Bodies), atomic_write (no partial file under the final name)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from app.core.errors import InputFileError
from app.core.outputs import atomic_write
from app.model.bodies import Bodies
from app.model.formats import Head, SnapshotFormat
from app.model.formats.snapshot_format import checked_bodies
from app.model.formats.text_rows import data_rows, line_label, no_rows_error, number_table, read_text

COLUMNS = ["x", "y", "z", "vx", "vy", "vz", "m"]
HEADER = " ".join(COLUMNS)


def sniff(head: Head) -> bool:
    """The header line first: the rows alone (7 numbers) would pass for NEMO's, whose sniff comes after."""
    return bool(head.rows) and head.rows[0][1] == COLUMNS


def read(path: Path) -> Bodies:
    rows = data_rows(read_text(path))
    if not rows or rows[0][1] != COLUMNS:
        where = f"line {rows[0][0]}" if rows else "no data rows"
        raise InputFileError(f"{path}: {where}: expected the header line {HEADER!r} first")
    rows = rows[1:]
    if not rows:
        raise no_rows_error(path)
    table = number_table(path, rows, len(COLUMNS), HEADER)
    return checked_bodies(path, table[:, 0:3], table[:, 3:6], table[:, 6], 0.0, None, line_label(rows))


def write(path: Path, bodies: Bodies) -> None:
    """17 significant digits, so a round trip is exact in float64; the time, IDs and components are lost."""
    table = np.column_stack([bodies.pos, bodies.vel, bodies.mass]).tolist()
    lines = [HEADER, *(" ".join(f"{v:.17g}" for v in row) for row in table)]
    with atomic_write(path, "w", what="snapshot") as f:
        f.write("\n".join(lines) + "\n")


FORMAT = SnapshotFormat("toy", (".toy",), sniff, read, write)
