"""Snapshot readers and writers: Tipsy, NEMO ASCII, NBabel, npz and csv.

Formats and the choices made for them:

* ``tipsy`` (read, write): the binary format of PKDGRAV/ChaNGa, the Bonsai tree code and NVIDIA's nbody
  sample. A 32-byte header (double time; int nbodies, ndim, nsph, ndark, nstar; 4 pad bytes) is followed
  by gas, dark and star records of float32. Standard Tipsy is big-endian (XDR); Bonsai writes
  little-endian, so the byte order is detected from which reading gives a self-consistent header. Bonsai
  stores each particle's ID in ``phi`` as an int32 bit pattern; see `_ids_from_phi` for how that is told
  apart from a real potential. Reading gives components (app.model.components): Bonsai's ID ranges (disk,
  bulge, halo) when the IDs span two of them, else one per non-empty section (gas, dark, star). Writing
  (little-endian, IDs in ``phi``) keeps components as sections: each body goes to the section its
  component's name says (gas; dark or halo; star, disk or bulge), the bodies' order kept. Without
  components, or when a name says no section (``galaxy1-disk``) or the components' rows are not in
  the order gas, dark, star, every body is a dark record and a warning says the components are lost;
  a warning also says when the file reads back otherwise (section names instead of ``disk``/``halo``,
  two parts in one section). `tipsy_sections` is that rule.
* ``nemo`` (read): NEMO ASCII rows ``m x y z vx vy vz``, optionally preceded by an ``N t`` header line.
* ``nbabel`` (read): the NBabel benchmark's rows ``id m x y z vx vy vz`` (NBabel itself writes -1 as id).
* ``npz`` (read, write): numpy archive with keys pos, vel, mass, time and optional ids; exact in float64.
  A block-step run adds its levels (step_levels, step_levels_max, step_levels_dt, step_levels_rule).
  Components (app.model.components) are kept as ``component`` (N,) and ``component_names`` (K,) texts.
* ``csv`` (read, write): header ``m,x,y,z,vx,vy,vz`` (+ ``id``, + ``component``), floats written with 17
  significant digits so a round trip is exact in float64. A nonzero time is kept in a leading
  ``# time = ...`` comment line, so a snapshot at t = 0 stays a plain table for spreadsheets. Components
  are the integer ``component`` column (each body's index) and a ``# component_names = ["disk", "halo"]``
  comment (a JSON list); a column without the comment names the components by their indices.

The format comes from an explicit ``format=``, else the extension, else (no or unknown extension, as with
NBabel's ``input1k``) the content. A gzip file (``m.tipsy.gz``, or any name: it is told by its magic
bytes) is decompressed in memory and read as the format inside it. Text formats skip blank lines and
``#`` comments but never a data row: every malformed row is an InputFileError naming the file and its
1-based line number (and column), as is a value beyond float32's range; binary errors name the record
and section. Writes go to a temporary file in the target's folder, renamed into place only
when complete, so a failed write never leaves a partial file under the final name.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import io
import json
import logging
import os
import re
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.core.errors import ConfigError, InputFileError
from app.core.outputs import atomic_write
from app.model import components
from app.model.bodies import Bodies, StepLevels
from app.model.config import FORMAT_CHOICES
from app.model.physics import COARSEN

log = logging.getLogger(__name__)

FORMATS = FORMAT_CHOICES  # the settings' one list (initial.format, --format)

_EXTENSIONS = {
    ".tipsy": "tipsy",
    ".std": "tipsy",
    ".tip": "tipsy",
    ".mpv": "nemo",
    ".nemo": "nemo",
    ".nbabel": "nbabel",
    ".npz": "npz",
    ".csv": "csv",
}

_SNIFF_BYTES = 65536

# --------------------------------------------------------------------------------------------- Tipsy

_TIPSY_HEADER_SIZE = 32
# Field lists per section, in file order; everything is float32 on disk.
_GAS_FIELDS = ("mass", "x", "y", "z", "vx", "vy", "vz", "rho", "temp", "hsmooth", "metals", "phi")
_DARK_FIELDS = ("mass", "x", "y", "z", "vx", "vy", "vz", "eps", "phi")
_STAR_FIELDS = ("mass", "x", "y", "z", "vx", "vy", "vz", "metals", "tform", "eps", "phi")
_SECTIONS = (("gas", "nsph", _GAS_FIELDS), ("dark", "ndark", _DARK_FIELDS), ("star", "nstar", _STAR_FIELDS))


def _header_dtype(byteorder: str) -> np.dtype:
    return np.dtype(
        [
            ("time", byteorder + "f8"),
            ("nbodies", byteorder + "i4"),
            ("ndim", byteorder + "i4"),
            ("nsph", byteorder + "i4"),
            ("ndark", byteorder + "i4"),
            ("nstar", byteorder + "i4"),
            ("pad", byteorder + "i4"),
        ]
    )


def _record_dtype(fields: tuple[str, ...], byteorder: str) -> np.dtype:
    return np.dtype([(name, byteorder + "f4") for name in fields])


@dataclass(frozen=True)
class TipsyHeader:
    time: float
    nbodies: int
    ndim: int
    nsph: int
    ndark: int
    nstar: int
    byteorder: str  # "<" little-endian (Bonsai), ">" big-endian (standard XDR Tipsy)

    def count(self, section: str) -> int:
        return {"gas": self.nsph, "dark": self.ndark, "star": self.nstar}[section]

    @property
    def consistent(self) -> bool:
        counts = (self.nsph, self.ndark, self.nstar)
        return self.ndim == 3 and min(counts) >= 0 and self.nbodies == sum(counts)

    @property
    def file_size(self) -> int:
        """The exact size in bytes of a file holding what this header announces."""
        return _TIPSY_HEADER_SIZE + sum(self.count(name) * 4 * len(fields) for name, _, fields in _SECTIONS)


def _decode_header(raw: bytes, byteorder: str) -> TipsyHeader:
    h = np.frombuffer(raw, dtype=_header_dtype(byteorder), count=1)[0]
    # The pad word is not checked: Bonsai leaves uninitialised memory there (0x00007f26 in the shared file).
    return TipsyHeader(
        float(h["time"]),
        int(h["nbodies"]),
        int(h["ndim"]),
        int(h["nsph"]),
        int(h["ndark"]),
        int(h["nstar"]),
        byteorder,
    )


def _plausible_tipsy_header(raw: bytes, size: int) -> TipsyHeader | None:
    """The header in whichever byte order makes it self-consistent, preferring one matching the size."""
    if len(raw) < _TIPSY_HEADER_SIZE:
        return None
    candidates = [h for h in (_decode_header(raw, bo) for bo in (">", "<")) if h.consistent]
    exact = [h for h in candidates if h.file_size == size]
    return (exact or candidates or [None])[0]


def read_tipsy_header(path) -> TipsyHeader:
    """Decode and check a Tipsy header; InputFileError when neither byte order makes sense."""
    path = Path(path)
    with _open_for_reading(path) as f:
        raw = f.read(_TIPSY_HEADER_SIZE)
    if len(raw) < _TIPSY_HEADER_SIZE:
        raise InputFileError(
            f"{path}: {len(raw)} bytes, shorter than the {_TIPSY_HEADER_SIZE}-byte Tipsy "
            "header (double time; int nbodies, ndim, nsph, ndark, nstar; 4 pad bytes)"
        )
    header = _plausible_tipsy_header(raw, _size(path))
    if header is None:
        seen = "; ".join(_describe_header(_decode_header(raw, bo)) for bo in (">", "<"))
        raise InputFileError(
            f"{path}: not a valid Tipsy header in either byte order ({seen}); expected "
            "ndim = 3 and nbodies = nsph + ndark + nstar >= 0"
        )
    return header


def _describe_header(h: TipsyHeader) -> str:
    order = "big-endian" if h.byteorder == ">" else "little-endian"
    return f"{order}: nbodies {h.nbodies}, ndim {h.ndim}, nsph {h.nsph}, ndark {h.ndark}, nstar {h.nstar}"


def _check_tipsy_size(path: Path, header: TipsyHeader, size: int) -> None:
    expected = header.file_size
    counts = f"N = {header.nbodies}: {header.nsph} gas, {header.ndark} dark, {header.nstar} star"
    if size > expected:
        raise InputFileError(
            f"{path}: {size - expected} bytes after the last record; the header ({counts}) "
            f"describes a {expected}-byte file"
        )
    if size == expected:
        return
    offset = size - _TIPSY_HEADER_SIZE
    for name, _, fields in _SECTIONS:
        section_bytes = header.count(name) * 4 * len(fields)
        if offset < section_bytes:
            record = offset // (4 * len(fields))
            raise InputFileError(
                f"{path}: truncated Tipsy file: it ends inside record {record} ({name}) "
                f"after {size} bytes, but the header ({counts}) needs {expected} bytes"
            )
        offset -= section_bytes


def _ids_from_phi(phi_bits: np.ndarray) -> np.ndarray | None:
    """Bonsai's particle IDs, if `phi` (as raw int32 bits) holds them rather than a potential.

    In the shared Bonsai file phi read as int32 is 200000000 + i for dark and 100000000 + i for star
    records (Bonsai's DARKMATTERID / BULGEID offsets); read as float it is ~1e-31, no physical potential.
    A gravitational potential is negative (sign bit set, so a negative int32) or absent (all zero), so
    IDs are taken to be present when every pattern is a non-negative int32, not all zero, and unique.
    """
    if phi_bits.size == 0 or not phi_bits.any() or (phi_bits < 0).any():
        return None
    if np.unique(phi_bits).size != phi_bits.size:
        return None
    return phi_bits.astype(np.int64)


def read_tipsy(path) -> Bodies:
    path = Path(path)
    header = read_tipsy_header(path)
    if header.nbodies == 0:
        raise InputFileError(
            f"{path}: Tipsy header says N = 0 (nsph = ndark = nstar = 0); an N-body "
            "snapshot needs at least one body"
        )
    _check_tipsy_size(path, header, _size(path))
    mass, pos, vel, phi, labels = [], [], [], [], []
    with _open_for_reading(path) as f:
        f.seek(_TIPSY_HEADER_SIZE)
        for name, _, fields in _SECTIONS:
            count = header.count(name)
            if count == 0:
                continue
            dtype = _record_dtype(fields, header.byteorder)
            rec = np.frombuffer(f.read(count * dtype.itemsize), dtype=dtype, count=count)
            mass.append(rec["mass"])
            pos.append(np.stack([rec["x"], rec["y"], rec["z"]], axis=1))
            vel.append(np.stack([rec["vx"], rec["vy"], rec["vz"]], axis=1))
            phi.append(rec["phi"].view(header.byteorder + "i4"))
            labels.append((name, count))
    ids = _ids_from_phi(np.concatenate(phi))
    return _bodies(
        path,
        np.concatenate(pos),
        np.concatenate(vel),
        np.concatenate(mass),
        header.time,
        ids,
        _tipsy_label(labels),
        components.from_tipsy(labels, ids),
    )


def _tipsy_label(sections: list[tuple[str, int]]) -> Callable[[int], str]:
    def label(i: int) -> str:
        for name, count in sections:
            if i < count:
                return f"record {i} ({name})"
            i -= count
        return f"record {i} (past the last section)"

    return label


# The Tipsy section a component's name (case ignored) puts its bodies in when a snapshot is written.
TIPSY_SECTION_OF = {
    "gas": "gas",
    "dark": "dark",
    "halo": "dark",
    "star": "star",
    "disk": "star",
    "bulge": "star",
}
_KEEP_THEM = "write .npz or .csv to keep the components"


def tipsy_sections(bodies: Bodies, path="snapshot") -> tuple[np.ndarray, str | None]:
    """Per body, the index (0 gas, 1 dark, 2 star) of the Tipsy section `write_tipsy` puts it in, and None
    or one line saying what of the bodies' components the file does not keep.

    Each component goes to the section its name says (TIPSY_SECTION_OF: gas; dark or halo; star, disk or
    bulge). Tipsy stores the sections in the order gas, dark, star and a snapshot keeps the bodies' order,
    so the components' rows must come in that order. When a name says no section or the rows are in
    another order, every body is dark (the writer's layout without components) and the components are
    lost; otherwise the line says what a reader gets back when it is not the components written (section
    names for other names, parts sharing a section, which Bonsai-style IDs in phi may still tell apart)."""
    comp = bodies.components
    dark = np.ones(bodies.n, np.int64)
    if comp is None:
        return dark, None
    where = [TIPSY_SECTION_OF.get(name.lower()) for name in comp.names]
    unnamed = [name for name, section in zip(comp.names, where, strict=True) if section is None]
    if unnamed:
        return dark, (
            f"{path}: Tipsy keeps components as its sections (gas; dark or halo; star, disk or "
            f"bulge): {', '.join(unnamed)} names none of them, so every body is written as dark "
            f"and the components ({comp.describe()}) are lost; {_KEEP_THEM}"
        )
    order = [name for name, _, _ in _SECTIONS]
    section = np.array([order.index(s) for s in where], np.int64)[comp.index]
    if (np.diff(section) < 0).any():
        return dark, (
            f"{path}: Tipsy stores its sections in the order gas, dark, star, but these bodies' "
            f"components ({comp.describe()}) come in another order; sections would reorder the "
            f"bodies, so every body is written as dark and the components are lost; {_KEEP_THEM}"
        )
    counts = np.bincount(section, minlength=3)
    back = components.from_tipsy(
        [(name, int(c)) for name, c in zip(order, counts, strict=True)], _tipsy_ids(bodies.ids, path)
    )
    if components.same(back, comp):
        return section, None
    got = back.describe() if back is not None else "one component"
    return section, (
        f"{path}: Tipsy keeps the sections, not these components' names: it reads back as "
        f"{got}, not {comp.describe()}; {_KEEP_THEM}"
    )


def _tipsy_ids(ids: np.ndarray | None, path) -> np.ndarray | None:
    """The IDs as Tipsy's phi holds them; ConfigError for IDs that int32 cannot hold."""
    if ids is None:
        return None
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() > np.iinfo(np.int32).max):
        raise ConfigError(
            f"{path}: particle IDs outside 0..2^31-1 do not fit Tipsy's phi field; "
            "write npz or csv to keep them"
        )
    return ids


def write_tipsy(path, bodies: Bodies, byteorder: str = "<") -> None:
    """Bodies in the sections their components name (`tipsy_sections`; all dark without components, and
    a warning when the file cannot keep the components), in their own order; eps and the other fields 0.
    IDs, when present, go in phi as int32 (Bonsai style)."""
    byteorder = {"little": "<", "big": ">"}.get(byteorder, byteorder)
    if byteorder not in ("<", ">"):
        raise ConfigError(f"Tipsy byteorder {byteorder!r}: use 'little' ('<') or 'big' ('>')")
    n = bodies.n
    ids = _tipsy_ids(bodies.ids, path)
    section, lost = tipsy_sections(bodies, path)
    if lost:
        log.warning("%s", lost)
    counts = np.bincount(section, minlength=3)
    header = np.zeros(1, dtype=_header_dtype(byteorder))
    header[0] = (bodies.time, n, 3, *counts.tolist(), 0)
    records = []
    for k, (_, _, fields) in enumerate(_SECTIONS):
        rows = slice(int(counts[:k].sum()), int(counts[: k + 1].sum()))  # (sections follow the body order)
        rec = np.zeros(int(counts[k]), dtype=_record_dtype(fields, byteorder))
        rec["mass"] = bodies.mass[rows]
        for j, axis in enumerate("xyz"):
            rec[axis] = bodies.pos[rows, j]
            rec["v" + axis] = bodies.vel[rows, j]
        if ids is not None:
            rec["phi"] = ids[rows].astype(byteorder + "i4").view(byteorder + "f4")
        records.append(rec)
    with atomic_write(path, "wb", what="snapshot") as f:
        f.write(header.tobytes())
        for rec in records:
            f.write(rec.tobytes())


# ---------------------------------------------------------------------------------------- text tables

Row = tuple[int, list[str]]  # (1-based line number, tokens)
_FORTRAN_D = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)[dD][+-]?\d+$")


def _read_text(path: Path) -> str:
    with _open_for_reading(path) as f:
        raw = f.read()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise InputFileError(
            f"{path}: line {line}: byte {raw[e.start]:#04x} is not text; expected a UTF-8 "
            "text table (is this a binary file? pass --format tipsy or npz)"
        ) from None


def _rows(text: str, sep: str | None = None) -> list[Row]:
    """Non-empty, non-comment lines split into tokens, keeping each line's number for error messages."""
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        body = line.split("#", 1)[0]
        if body.strip():
            tokens = body.split(sep)
            rows.append((lineno, [t.strip() for t in tokens] if sep else tokens))
    return rows


def _table(path: Path, rows: list[Row], ncols: int, layout: str) -> np.ndarray:
    """(len(rows), ncols) float64; InputFileError naming the first row of the wrong width or bad token."""
    for lineno, tokens in rows:
        if len(tokens) != ncols:
            raise InputFileError(
                f"{path}: line {lineno}: {_values(len(tokens))}, expected {ncols} ({layout})"
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


def _values(count: int) -> str:
    return f"{count} value" + ("" if count == 1 else "s")


def _line_label(rows: list[Row]) -> Callable[[int], str]:
    return lambda i: f"line {rows[i][0]}"


def _integer_column(path: Path, rows: list[Row], values: np.ndarray, what: str) -> np.ndarray:
    bad = ~(np.isfinite(values) & (values == np.round(values)))
    if bad.any():
        i = int(np.argmax(bad))
        raise InputFileError(f"{path}: line {rows[i][0]}: {what} {values[i]!r} is not an integer")
    return values.astype(np.int64)


def _no_rows(path: Path) -> InputFileError:
    return InputFileError(f"{path}: contains no bodies (N = 0): no data rows found")


def read_nemo(path) -> Bodies:
    path = Path(path)
    rows = _rows(_read_text(path))
    if not rows:
        raise _no_rows(path)
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
            f"{path}: line {first_line}: {_values(len(first))}, expected 7 ({layout}) or an 'N t' header line"
        )
    table = _table(path, rows, 7, layout)
    return _bodies(path, table[:, 1:4], table[:, 4:7], table[:, 0], time, None, _line_label(rows))


def _nemo_header(path: Path, lineno: int, tokens: list[str]) -> tuple[int, float]:
    values = _table(path, [(lineno, tokens)], len(tokens), "header 'N t'")[0]
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


def read_nbabel(path) -> Bodies:
    path = Path(path)
    rows = _rows(_read_text(path))
    if not rows:
        raise _no_rows(path)
    table = _table(path, rows, 8, "id m x y z vx vy vz")
    ids = _integer_column(path, rows, table[:, 0], "id")
    # NBabel writes the same placeholder (-1) for every body: identical ids carry no identity.
    if (ids == ids[0]).all():
        ids = None
    return _bodies(path, table[:, 2:5], table[:, 5:8], table[:, 1], 0.0, ids, _line_label(rows))


_CSV_COLUMNS = ("m", "x", "y", "z", "vx", "vy", "vz")
_CSV_OPTIONAL = ("id", "component")  # integer columns
_CSV_TIME = re.compile(r"#\s*time\s*[=:]\s*(\S+)\s*$")
_CSV_NAMES = re.compile(r"#\s*component_names\s*[=:]\s*(.*?)\s*$")  # a JSON list of texts


def read_csv(path) -> Bodies:
    path = Path(path)
    text = _read_text(path)
    time, names = None, None  # the first of each comment counts
    for lineno, line in enumerate(text.splitlines(), 1):
        if time is None and (m := _CSV_TIME.match(line.strip())):
            time = _csv_time(path, lineno, m.group(1))
        elif names is None and (m := _CSV_NAMES.match(line.strip())):
            names = _csv_component_names(path, lineno, m.group(1))
    rows = _rows(text, sep=",")
    if not rows:
        raise _no_rows(path)
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
        raise _no_rows(path)
    table = _table(path, rows, len(columns), ",".join(columns))
    col = {name: table[:, k] for k, name in enumerate(columns)}
    ids = _integer_column(path, rows, col["id"], "id") if "id" in col else None
    comp = _csv_components(path, rows, col.get("component"), names)
    pos = np.stack([col["x"], col["y"], col["z"]], axis=1)
    vel = np.stack([col["vx"], col["vy"], col["vz"]], axis=1)
    return _bodies(path, pos, vel, col["m"], time or 0.0, ids, _line_label(rows), comp)


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
    index = _integer_column(path, rows, column, "component")
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
    for values, *extra in zip(cols, *(v for _, v in ints), strict=True):
        out.write(row % (*values, *extra))
    with atomic_write(path, "wb", what="snapshot") as f:
        f.write(out.getvalue().encode("utf-8"))


# ------------------------------------------------------------------------------------------------- npz


def read_npz(path) -> Bodies:
    path = Path(path)
    with _open_for_reading(path) as f:
        if f.read(4) != b"PK\x03\x04":
            raise InputFileError(
                f"{path}: not an npz archive (no zip signature); expected numpy.savez "
                "output with keys pos, vel, mass, time, ids"
            )
        f.seek(0)
        try:
            with np.load(f, allow_pickle=False) as z:
                arrays = {key: z[key] for key in z.files}
        except (zipfile.BadZipFile, ValueError, EOFError, OSError) as e:
            raise InputFileError(
                f"{path}: damaged npz archive ({e}); expected numpy.savez output with keys "
                "pos, vel, mass, time, ids"
            ) from None
    missing = [k for k in ("pos", "vel", "mass") if k not in arrays]
    if missing:
        found = ", ".join(sorted(arrays)) or "none"
        raise InputFileError(
            f"{path}: missing array(s) {', '.join(missing)}; an npz snapshot needs pos "
            f"(N, 3), vel (N, 3) and mass (N,) (found: {found})"
        )
    for key, arr in arrays.items():
        numeric = np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)
        if key in ("pos", "vel", "mass", "time", "ids", "component") and not numeric:
            raise InputFileError(f"{path}: array {key!r} has dtype {arr.dtype}; expected numbers")
    n = arrays["mass"].size
    for key, shape in (("pos", (n, 3)), ("vel", (n, 3)), ("mass", (n,))):
        if arrays[key].shape != shape:
            raise InputFileError(
                f"{path}: array {key!r} has shape {arrays[key].shape}; expected {shape} for {n} masses"
            )
    time = arrays.get("time", np.float64(0.0))
    if time.size != 1 or not np.isfinite(time).all():
        raise InputFileError(f"{path}: 'time' must be one finite number, got {time!r}")
    ids = arrays.get("ids")
    if ids is not None and (ids.shape != (n,) or not np.issubdtype(ids.dtype, np.integer)):
        raise InputFileError(
            f"{path}: 'ids' has shape {ids.shape} and dtype {ids.dtype}; expected ({n},) integers"
        )
    bodies = _bodies(
        path,
        arrays["pos"],
        arrays["vel"],
        arrays["mass"],
        float(time.reshape(())),
        ids,
        lambda i: f"body {i} (row {i} of pos/vel/mass)",
        _npz_components(path, arrays, n),
    )
    bodies.step_levels = _npz_step_levels(path, arrays, n)
    return bodies


# npz: block time steps' levels, L, the max step and the coarsening rule (app.model.bodies.StepLevels)
STEP_LEVEL_KEYS = ("step_levels", "step_levels_max", "step_levels_dt", "step_levels_rule")


def _npz_step_levels(path: Path, arrays: dict, n: int) -> StepLevels | None:
    """The block-step levels a block-step run wrote, checked: (N,) integers in [0, step_levels_max], one
    max step > 0, one rule of COARSEN; None when the snapshot has none."""
    present = [k for k in STEP_LEVEL_KEYS if k in arrays]
    if not present:
        return None
    if len(present) != len(STEP_LEVEL_KEYS):
        raise InputFileError(
            f"{path}: {', '.join(STEP_LEVEL_KEYS)} go together; found only {', '.join(present)}"
        )
    levels, top, dt, rule = (arrays[k] for k in STEP_LEVEL_KEYS)
    if (
        levels.shape != (n,)
        or not np.issubdtype(levels.dtype, np.integer)
        or top.size != 1
        or not np.issubdtype(top.dtype, np.integer)
        or dt.size != 1
        or rule.size != 1
        or rule.dtype.kind != "U"
    ):
        raise InputFileError(
            f"{path}: 'step_levels' must be ({n},) integers, with one integer "
            "'step_levels_max', one number 'step_levels_dt' and one text "
            f"'step_levels_rule'; got {levels.dtype} {levels.shape}, {top.dtype} "
            f"{top.shape}, {dt.dtype} "
            f"{dt.shape}, {rule.dtype} {rule.shape}"
        )
    top, dt, rule = int(top.reshape(())), float(dt.reshape(())), str(rule.reshape(()))
    low, high = (int(levels.min()), int(levels.max())) if n else (0, 0)
    if not 0 <= top <= 30 or not (np.isfinite(dt) and dt > 0) or low < 0 or high > top or rule not in COARSEN:
        raise InputFileError(
            f"{path}: block-step levels out of range: step_levels_max {top} (0..30), "
            f"step_levels_dt {dt} (> 0), levels in [{low}, {high}], step_levels_rule "
            f"{rule!r} (one of {', '.join(COARSEN)})"
        )
    return StepLevels(levels.astype(np.int32), top, dt, rule)


def _npz_components(path: Path, arrays: dict, n: int):
    """The optional `component` (N,) integers and `component_names` (K,) texts of an npz snapshot."""
    index, names = arrays.get("component"), arrays.get("component_names")
    if index is None and names is None:
        return None
    if index is None or names is None:
        raise InputFileError(
            f"{path}: 'component' and 'component_names' go together; found only "
            f"{'component' if names is None else 'component_names'}"
        )
    if (
        index.shape != (n,)
        or not np.issubdtype(index.dtype, np.integer)
        or names.ndim != 1
        or names.dtype.kind != "U"
    ):
        raise InputFileError(
            f"{path}: 'component' must be ({n},) integers and 'component_names' (K,) texts; "
            f"got {index.dtype} {index.shape} and {names.dtype} {names.shape}"
        )
    if n and (index.min() < 0 or index.max() >= names.size):
        raise InputFileError(
            f"{path}: 'component' holds {int(index.max())}, but there are {names.size} component_names"
        )
    try:
        return components.Components(tuple(names.tolist()), index)
    except ConfigError as e:
        raise InputFileError(f"{path}: {e}") from None


def write_npz(path, bodies: Bodies) -> None:
    arrays = {
        "pos": np.asarray(bodies.pos, np.float64),
        "vel": np.asarray(bodies.vel, np.float64),
        "mass": np.asarray(bodies.mass, np.float64),
        "time": np.float64(bodies.time),
    }
    if bodies.ids is not None:
        arrays["ids"] = np.asarray(bodies.ids, np.int64)
    if bodies.components is not None:
        arrays["component"] = bodies.components.index
        arrays["component_names"] = np.array(bodies.components.names, dtype=str)
    if bodies.step_levels is not None:
        sl = bodies.step_levels
        arrays.update(
            zip(
                STEP_LEVEL_KEYS,
                (
                    np.asarray(sl.levels, np.int32),
                    np.int32(sl.max_level),
                    np.float64(sl.dt_max),
                    np.array(sl.coarsen),
                ),
                strict=True,
            )
        )
    with atomic_write(path, "wb", what="snapshot") as f:
        np.savez(f, **arrays)  # uncompressed: positions barely compress and loading stays a memcpy


# ---------------------------------------------------------------------------------- dispatch, sniffing

_READERS = {"tipsy": read_tipsy, "nemo": read_nemo, "nbabel": read_nbabel, "npz": read_npz, "csv": read_csv}
_WRITERS = {"tipsy": write_tipsy, "npz": write_npz, "csv": write_csv}


def _check_format_name(fmt: str, allowed: tuple[str, ...]) -> str:
    name = fmt.lower()
    if name not in allowed:
        raise ConfigError(f"format {fmt!r}: choose one of {', '.join(allowed)}")
    return name


def detect_format(path) -> str:
    """The format by extension; for no or an unknown extension, by content (InputFileError if unclear)."""
    path = Path(path)
    by_ext = _EXTENSIONS.get(_inner_suffix(path))
    if by_ext:
        return by_ext
    with _open_for_reading(path) as f:
        head = f.read(_SNIFF_BYTES)
    if not head:
        raise InputFileError(f"{path}: empty file: contains no bodies (N = 0)")
    if head.startswith(b"PK\x03\x04"):
        return "npz"
    if b"\0" in head or not _is_text(head):
        if _plausible_tipsy_header(head, _size(path)):
            return "tipsy"
        raise InputFileError(
            f"{path}: binary file without a plausible Tipsy header; readable formats are "
            f"{', '.join(FORMATS)} (pass --format to force one)"
        )
    return _sniff_text(path, head)


def _is_text(head: bytes) -> bool:
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start > len(head) - 4  # a multi-byte character cut off by the sniff window is still text
    return True


def _sniff_text(path: Path, head: bytes) -> str:
    text = head.decode("utf-8", errors="replace")
    lines = text.splitlines()
    if len(head) == _SNIFF_BYTES and not text.endswith("\n"):
        lines = lines[:-1]  # the last line may be cut off by the sniff window
    rows = _rows("\n".join(lines))
    if not rows:
        raise InputFileError(
            f"{path}: no data rows in the first {len(head)} bytes: contains no bodies (N = 0)"
        )
    lineno, tokens = rows[0]
    if any("," in t for t in tokens):
        return "csv"
    if len(tokens) == 8:
        return "nbabel"
    if len(tokens) == 7 or (len(tokens) in (1, 2) and len(rows) > 1 and len(rows[1][1]) == 7):
        return "nemo"
    raise InputFileError(
        f"{path}: line {lineno}: {_values(len(tokens))}; cannot tell the format (expected 7 "
        "for NEMO 'm x y z vx vy vz' or 8 for NBabel 'id m x y z vx vy vz'); pass --format"
    )


def read(path, format: str | None = None) -> Bodies:
    """Read a snapshot; `format` (one of FORMATS) overrides detection by extension and content."""
    path = Path(path)
    fmt = _check_format_name(format, FORMATS) if format else detect_format(path)
    return _READERS[fmt](path)


def output_format(path, format: str | None = None) -> str:
    """The writer `write` would use for `path`: ConfigError before any work if there is none."""
    path = Path(path)
    writable = tuple(_WRITERS)
    if format:
        return _check_format_name(format, writable)
    fmt = _EXTENSIONS.get(path.suffix.lower())
    if fmt not in _WRITERS:
        raise ConfigError(
            f"{path}: cannot tell the output format from the extension "
            f"{path.suffix or '(none)'!r}; use .npz, .csv or .tipsy"
        )
    return fmt


def write(path, bodies: Bodies, format: str | None = None) -> None:
    """Write npz, csv or tipsy (by `format` or the extension), atomically. Block steps' levels are kept
    by npz only: elsewhere, under the rule that needs them ("settled"), a warning says a run loaded from
    the file is not a bitwise continuation."""
    fmt = output_format(path, format)
    sl = bodies.step_levels
    if sl is not None and sl.coarsen == "settled" and fmt != "npz":
        log.warning(
            "%s: %s keeps no block-step levels, which coarsening rule settled needs for a bitwise "
            "resume; write .npz to keep them",
            path,
            fmt,
        )
    _WRITERS[fmt](Path(path), bodies)


# ------------------------------------------------------------------------------------------- plumbing


def _bodies(path: Path, pos, vel, mass, time, ids, label: Callable[[int], str], comp=None) -> Bodies:
    bodies = Bodies(
        pos=np.ascontiguousarray(pos, dtype=np.float64).reshape(-1, 3),
        vel=np.ascontiguousarray(vel, dtype=np.float64).reshape(-1, 3),
        mass=np.ascontiguousarray(mass, dtype=np.float64).reshape(-1),
        time=float(time),
        ids=None if ids is None else np.asarray(ids, dtype=np.int64).reshape(-1),
        components=comp,
    )
    bodies.validate(source=str(path), row_label=label)
    return bodies


_GZIP_MAGIC = b"\x1f\x8b"


def _inner_suffix(path: Path) -> str:
    """The extension that names the format: `.tipsy` for both `m.tipsy` and `m.tipsy.gz`."""
    suffix = path.suffix.lower()
    return Path(path.stem).suffix.lower() if suffix == ".gz" else suffix


def _is_gzip(path: Path) -> bool:
    with _open_raw(path) as f:
        return f.read(2) == _GZIP_MAGIC


def _size(path: Path) -> int:
    """The size of the content: decompressed for a gzip file."""
    if not _is_gzip(path):
        return path.stat().st_size
    with _open_for_reading(path) as f:
        return f.seek(0, io.SEEK_END)


@functools.lru_cache(maxsize=1)
def _gunzip(path: Path, _mtime_ns: int, _size: int) -> bytes:
    """A gzip file's content, kept for the next call: a reader opens its file two or three times (the
    sniff, the header, the records) and should not decompress it each time."""
    with _open_raw(path) as f:
        try:
            return gzip.decompress(f.read())
        except (OSError, EOFError, zlib.error) as e:
            raise InputFileError(f"{path}: damaged gzip file ({e}); it cannot be decompressed") from None


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
def _open_for_reading(path: Path) -> Iterator[io.BufferedIOBase]:
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
