"""``tipsy`` (read, write): the binary format of PKDGRAV/ChaNGa, the Bonsai tree code and NVIDIA's nbody
sample (extensions .tipsy, .std, .tip; without one, told by a self-consistent header).

A 32-byte header (double time; int nbodies, ndim, nsph, ndark, nstar; 4 pad bytes) is followed by gas,
dark and star records of float32. Standard Tipsy is big-endian (XDR); Bonsai writes little-endian, so the
byte order is detected from which reading gives a self-consistent header. Bonsai stores each particle's
ID in ``phi`` as an int32 bit pattern; see `_ids_from_phi` for how that is told apart from a real
potential. Reading gives components (app.model.components): Bonsai's ID ranges (disk, bulge, halo) when
the IDs span two of them, else one per non-empty section (gas, dark, star). Writing (little-endian, IDs
in ``phi``) keeps components as sections: each body goes to the section its component's name says (gas;
dark or halo; star, disk or bulge), the bodies' order kept. Without components, or when a name says no
section (``galaxy1-disk``) or the components' rows are not in the order gas, dark, star, every body is a
dark record and a warning says the components are lost; a warning also says when the file reads back
otherwise (section names instead of ``disk``/``halo``, two parts in one section). `tipsy_sections` is
that rule. Binary errors name the record and section.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.core.errors import ConfigError, InputFileError
from app.core.outputs import atomic_write
from app.model import components
from app.model.bodies import Bodies
from app.model.formats.opening import content_size, open_for_reading
from app.model.formats.snapshot_format import Head, SnapshotFormat, checked_bodies

log = logging.getLogger(__name__)


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
    if exact:
        return exact[0]
    return candidates[0] if candidates else None


def read_tipsy_header(path) -> TipsyHeader:
    """Decode and check a Tipsy header; InputFileError when neither byte order makes sense."""
    path = Path(path)
    with open_for_reading(path) as f:
        raw = f.read(_TIPSY_HEADER_SIZE)
    if len(raw) < _TIPSY_HEADER_SIZE:
        raise InputFileError(
            f"{path}: {len(raw)} bytes, shorter than the {_TIPSY_HEADER_SIZE}-byte Tipsy "
            "header (double time; int nbodies, ndim, nsph, ndark, nstar; 4 pad bytes)"
        )
    header = _plausible_tipsy_header(raw, content_size(path))
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
    _check_tipsy_size(path, header, content_size(path))
    mass, pos, vel, phi, labels = [], [], [], [], []
    with open_for_reading(path) as f:
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
    return checked_bodies(
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
    named = [s for s in where if s is not None]  # all of them: none is unnamed (returned above)
    section = np.array([order.index(s) for s in named], np.int64)[comp.index]
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


def sniff(head: Head) -> bool:
    """A header that is self-consistent in either byte order (it holds NUL bytes: never text)."""
    return _plausible_tipsy_header(head.data, len(head.data)) is not None


FORMAT = SnapshotFormat("tipsy", (".tipsy", ".std", ".tip"), sniff, read_tipsy, write_tipsy)
