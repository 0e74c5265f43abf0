"""``csv`` (read, write): header ``m,x,y,z,vx,vy,vz`` (+ ``id``, + ``component``), floats written with 17
significant digits so a round trip is exact in float64 (extension .csv; without one, told by a comma in
the first row).

A nonzero time is kept in a leading ``# time = ...`` comment line, so a snapshot at t = 0 stays a plain
table for spreadsheets. Components are the integer ``component`` column (each body's index) and a
``# component_names = ["disk", "halo"]`` comment (a JSON list); a column without the comment names the
components by their indices. (The module reads and writes with numpy and str.split, not the standard
library's csv module, so its name shadows nothing it uses.)
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np

from app.core.errors import ConfigError, InputFileError
from app.core.outputs import atomic_write
from app.model import components
from app.model.bodies import Bodies
from app.model.formats.snapshot_format import Head, SnapshotFormat, checked_bodies
from app.model.formats.text_rows import (
    Row,
    data_rows,
    integer_column,
    line_label,
    no_rows_error,
    number_table,
    read_text,
)

_CSV_COLUMNS = ("m", "x", "y", "z", "vx", "vy", "vz")
_CSV_OPTIONAL = ("id", "component")  # integer columns
_CSV_TIME = re.compile(r"#\s*time\s*[=:]\s*(\S+)\s*$")
_CSV_NAMES = re.compile(r"#\s*component_names\s*[=:]\s*(.*?)\s*$")  # a JSON list of texts


def read_csv(path) -> Bodies:
    path = Path(path)
    text = read_text(path)
    time, names = None, None  # the first of each comment counts
    for lineno, line in enumerate(text.splitlines(), 1):
        if time is None and (m := _CSV_TIME.match(line.strip())):
            time = _csv_time(path, lineno, m.group(1))
        elif names is None and (m := _CSV_NAMES.match(line.strip())):
            names = _csv_component_names(path, lineno, m.group(1))
    rows = data_rows(text, sep=",")
    if not rows:
        raise no_rows_error(path)
    (header_line, columns), rows = rows[0], rows[1:]
    columns = [n.lower() for n in columns]
    unknown = [n for n in columns if n not in (*_CSV_COLUMNS, *_CSV_OPTIONAL)]
    missing = [c for c in _CSV_COLUMNS if c not in columns]
    if unknown or missing or len(set(columns)) != len(columns):
        raise InputFileError(
            f"{path}: line {header_line}: header {','.join(columns)!r} must name the "
            f"columns {','.join(_CSV_COLUMNS)} once each, plus optional "
            f"{' and '.join(_CSV_OPTIONAL)}"
            + (f"; missing {missing}" if missing else "")
            + (f"; unknown {unknown}" if unknown else "")
        )
    if not rows:
        raise no_rows_error(path)
    table = number_table(path, rows, len(columns), ",".join(columns))
    col = {name: table[:, k] for k, name in enumerate(columns)}
    ids = integer_column(path, rows, col["id"], "id") if "id" in col else None
    comp = _csv_components(path, rows, col.get("component"), names)
    pos = np.stack([col["x"], col["y"], col["z"]], axis=1)
    vel = np.stack([col["vx"], col["vy"], col["vz"]], axis=1)
    return checked_bodies(path, pos, vel, col["m"], time or 0.0, ids, line_label(rows), comp)


def _csv_time(path: Path, lineno: int, token: str) -> float:
    try:
        time = float(token)
    except ValueError:
        time = float("nan")
    if not np.isfinite(time):
        raise InputFileError(f"{path}: line {lineno}: time {token!r} is not a finite number")
    return time


def _csv_component_names(path: Path, lineno: int, text: str) -> tuple[str, ...]:
    try:
        names = json.loads(text)
    except ValueError:
        names = None
    if not (isinstance(names, list) and names and all(isinstance(n, str) for n in names)):
        raise InputFileError(
            f"{path}: line {lineno}: component_names must be a JSON list of texts, e.g. "
            f'# component_names = ["disk", "halo"]; got {text!r}'
        )
    return tuple(names)


def _csv_components(path: Path, rows: list[Row], column: np.ndarray | None, names):
    """The `component` column (each body's index into the `# component_names = [...]` comment; without
    the comment, the names are the indices as text)."""
    if column is None:
        if names is not None:
            raise InputFileError(
                f"{path}: a '# component_names' comment but no component column; add the "
                "column (each body's index into the names) or remove the comment"
            )
        return None
    index = integer_column(path, rows, column, "component")
    count = len(names) if names is not None else components.MAX_COMPONENTS
    bad = (index < 0) | (index >= count)
    if bad.any():
        i = int(np.argmax(bad))
        what = f"the {count} component_names" if names is not None else "the component limit"
        raise InputFileError(
            f"{path}: line {rows[i][0]}: component {index[i]} is outside {what} (0 to {count - 1})"
        )
    if names is None:
        names = tuple(str(k) for k in range(int(index.max()) + 1))
    try:
        return components.Components(names, index)
    except ConfigError as e:
        raise InputFileError(f"{path}: {e}") from None


def write_csv(path, bodies: Bodies) -> None:
    """The float columns, then `id` and `component` when the bodies have them; the time and the component
    names in leading comment lines (`# time = ...`, `# component_names = [JSON texts]`)."""
    comp = bodies.components
    ints = [("id", bodies.ids), ("component", None if comp is None else comp.index)]
    ints = [(name, np.asarray(values, np.int64).tolist()) for name, values in ints if values is not None]
    row = ",".join(["%.17g"] * 7 + ["%d"] * len(ints)) + "\n"
    out = io.StringIO()
    if bodies.time != 0.0:
        out.write(f"# time = {bodies.time:.17g}\n")
    if comp is not None:
        out.write(f"# component_names = {json.dumps(list(comp.names))}\n")
    out.write(",".join([*_CSV_COLUMNS, *(name for name, _ in ints)]) + "\n")
    cols = np.column_stack([bodies.mass, bodies.pos, bodies.vel]).tolist()
    extra: list[int]  # the row's id and component, those it has
    for values, *extra in zip(cols, *(v for _, v in ints), strict=True):
        out.write(row % (*values, *extra))
    with atomic_write(path, "wb", what="snapshot") as f:
        f.write(out.getvalue().encode("utf-8"))


def sniff(head: Head) -> bool:
    """A comma in the first data row."""
    return head.comma_separated


FORMAT = SnapshotFormat("csv", (".csv",), sniff, read_csv, write_csv)
