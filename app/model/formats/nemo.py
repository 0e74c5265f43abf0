"""``nemo`` (read): NEMO ASCII rows ``m x y z vx vy vz``, optionally preceded by an ``N t`` header line
(extensions .mpv, .nemo; without one, told by rows of 7 values, or an ``N t`` line before such a row)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from app.core.errors import InputFileError
from app.model.bodies import Bodies
from app.model.formats.snapshot_format import Head, SnapshotFormat, checked_bodies
from app.model.formats.text_rows import (
    data_rows,
    line_label,
    n_values,
    no_rows_error,
    number_table,
    read_text,
)


def read_nemo(path) -> Bodies:
    path = Path(path)
    rows = data_rows(read_text(path))
    if not rows:
        raise no_rows_error(path)
    layout = "m x y z vx vy vz"
    time = 0.0
    first_line, first = rows[0]
    if len(first) in (1, 2):
        n_declared, time = _nemo_header(path, first_line, first)
        rows = rows[1:]
        if n_declared != len(rows):
            span = f" (lines {rows[0][0]}-{rows[-1][0]})" if rows else ""
            raise InputFileError(
                f"{path}: line {first_line}: header says N = {n_declared}, but the file has "
                f"{len(rows)} body rows{span}"
            )
    elif len(first) != 7:
        raise InputFileError(
            f"{path}: line {first_line}: {n_values(len(first))}, expected 7 ({layout}) "
            "or an 'N t' header line"
        )
    table = number_table(path, rows, 7, layout)
    return checked_bodies(path, table[:, 1:4], table[:, 4:7], table[:, 0], time, None, line_label(rows))


def _nemo_header(path: Path, lineno: int, tokens: list[str]) -> tuple[int, float]:
    values = number_table(path, [(lineno, tokens)], len(tokens), "header 'N t'")[0]
    n = values[0]
    if not (np.isfinite(n) and n == round(n)):
        raise InputFileError(f"{path}: line {lineno}: header N = {tokens[0]!r} is not an integer")
    if n <= 0:
        raise InputFileError(
            f"{path}: line {lineno}: header says N = {int(n)}; an N-body snapshot needs at least one body"
        )
    time = float(values[1]) if len(values) > 1 else 0.0
    if not np.isfinite(time):
        raise InputFileError(f"{path}: line {lineno}: header time {tokens[1]!r} is not finite")
    return int(n), time


def sniff(head: Head) -> bool:
    """Whitespace rows of 7 values, or an 'N t' line (1 or 2 values) before such a row."""
    if not head.rows or head.comma_separated:
        return False
    first = head.rows[0][1]
    return len(first) == 7 or (len(first) in (1, 2) and len(head.rows) > 1 and len(head.rows[1][1]) == 7)


FORMAT = SnapshotFormat("nemo", (".mpv", ".nemo"), sniff, read_nemo)
