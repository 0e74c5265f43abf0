"""``nbabel`` (read): the NBabel benchmark's rows ``id m x y z vx vy vz`` (NBabel itself writes -1 as id;
ids all alike carry no identity). Extension .nbabel; without one (NBabel's ``input1k``), told by rows of
8 values."""

from __future__ import annotations

from pathlib import Path

from app.model.bodies import Bodies
from app.model.formats.snapshot_format import Head, SnapshotFormat, checked_bodies
from app.model.formats.text_rows import (
    data_rows,
    integer_column,
    line_label,
    no_rows_error,
    number_table,
    read_text,
)


def read_nbabel(path) -> Bodies:
    path = Path(path)
    rows = data_rows(read_text(path))
    if not rows:
        raise no_rows_error(path)
    table = number_table(path, rows, 8, "id m x y z vx vy vz")
    ids = integer_column(path, rows, table[:, 0], "id")
    # NBabel writes the same placeholder (-1) for every body: identical ids carry no identity.
    identity = None if (ids == ids[0]).all() else ids
    return checked_bodies(path, table[:, 2:5], table[:, 5:8], table[:, 1], 0.0, identity, line_label(rows))


def sniff(head: Head) -> bool:
    """Whitespace rows of 8 values."""
    return bool(head.rows) and not head.comma_separated and len(head.rows[0][1]) == 8


FORMAT = SnapshotFormat("nbabel", (".nbabel",), sniff, read_nbabel)
