"""The text formats' common ground: a file read as UTF-8 text, its data rows (blank lines and `#` comments
skipped, never a data row) with their 1-based line numbers, and tables of numbers whose every error (a
row of the wrong width, a token that is no number, a value beyond float32's range, an id that is no
integer) is an InputFileError naming the file, the line and the column."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from app.core.errors import InputFileError
from app.model.formats.opening import open_for_reading

Row = tuple[int, list[str]]  # (1-based line number, tokens)
_FORTRAN_D = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[dD][+-]?\d+$")


def read_text(path: Path) -> str:
    with open_for_reading(path) as f:
        raw = f.read()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise InputFileError(
            f"{path}: line {line}: byte {raw[e.start]:#04x} is not text; expected a UTF-8 "
            "text table (is this a binary file? pass --format tipsy or npz)"
        ) from None


def data_rows(text: str, sep: str | None = None) -> list[Row]:
    """Non-empty, non-comment lines split into tokens, keeping each line's number for error messages."""
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        body = line.split("#", 1)[0]
        if body.strip():
            tokens = body.split(sep)
            rows.append((lineno, [t.strip() for t in tokens] if sep else tokens))
    return rows


def number_table(path: Path, rows: list[Row], ncols: int, layout: str) -> np.ndarray:
    """(len(rows), ncols) float64; InputFileError naming the first row of the wrong width or bad token."""
    for lineno, tokens in rows:
        if len(tokens) != ncols:
            raise InputFileError(
                f"{path}: line {lineno}: {n_values(len(tokens))}, expected {ncols} ({layout})"
            )
    flat = [t for _, tokens in rows for t in tokens]
    try:
        table = np.array(flat, dtype=np.float64).reshape(len(rows), ncols)
    except ValueError:
        pass
    else:
        _check_float32_range(path, rows, table, layout)
        return table
    # Slow path, only on failure: find which token numpy rejected so the message can name its line.
    for lineno, tokens in rows:
        for col, token in enumerate(tokens):
            try:
                float(token)
            except ValueError:
                hint = "; Fortran 'D' exponents must be written as 'E'" if _FORTRAN_D.match(token) else ""
                raise InputFileError(
                    f"{path}: line {lineno}: column {col + 1} is {token!r}, not a number "
                    f"(expected {ncols} numbers: {layout}){hint}"
                ) from None
    raise InputFileError(f"{path}: a value could not be read as a number (expected {layout})")


def _check_float32_range(path: Path, rows: list[Row], table: np.ndarray, layout: str) -> None:
    """Finite values beyond float32 would become inf in every fp32 kernel: name the first one."""
    with np.errstate(invalid="ignore"):
        big = np.isfinite(table) & (np.abs(table) > np.finfo(np.float32).max)
    if big.any():
        i, col = (int(v) for v in np.argwhere(big)[0])
        lineno, tokens = rows[i]
        raise InputFileError(
            f"{path}: line {lineno}: column {col + 1} is {tokens[col]}, beyond float32's "
            f"range (|x| <= 3.4e38) in which the kernels compute ({layout})"
        )


def n_values(count: int) -> str:
    return f"{count} value" + ("" if count == 1 else "s")


def line_label(rows: list[Row]) -> Callable[[int], str]:
    return lambda i: f"line {rows[i][0]}"


def integer_column(path: Path, rows: list[Row], values: np.ndarray, what: str) -> np.ndarray:
    bad = ~(np.isfinite(values) & (values == np.round(values)))
    if bad.any():
        i = int(np.argmax(bad))
        raise InputFileError(f"{path}: line {rows[i][0]}: {what} {values[i]!r} is not an integer")
    return values.astype(np.int64)


def no_rows_error(path: Path) -> InputFileError:
    return InputFileError(f"{path}: contains no bodies (N = 0): no data rows found")
