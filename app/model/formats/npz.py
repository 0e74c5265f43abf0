"""``npz`` (read, write): numpy archive with keys pos, vel, mass, time and optional ids; exact in float64
(extension .npz; without one, told by the zip signature).

A block-step run adds its levels (step_levels, step_levels_max, step_levels_dt, step_levels_rule), so
that a run resumed from the file is its bitwise continuation. Components (app.model.components) are kept
as ``component`` (N,) and ``component_names`` (K,) texts.
"""

from __future__ import annotations

import struct
import zipfile
import zlib
from pathlib import Path

import numpy as np

from app.core.errors import ConfigError, InputFileError
from app.core.outputs import atomic_write
from app.model import components
from app.model.bodies import Bodies, StepLevels
from app.model.config import COARSEN
from app.model.formats.opening import open_for_reading
from app.model.formats.snapshot_format import Head, SnapshotFormat, checked_bodies

_ZIP_SIGNATURE = b"PK\x03\x04"
DEFLATE_MAX_RATIO = 1032  # the most deflate expands its input (zlib's technical notes)


def read_npz(path) -> Bodies:
    path = Path(path)
    with open_for_reading(path) as f:
        if f.read(4) != _ZIP_SIGNATURE:
            raise InputFileError(
                f"{path}: not an npz archive (no zip signature); expected numpy.savez "
                "output with keys pos, vel, mass, time, ids"
            )
        f.seek(0)
        try:
            _check_claims(path, f)
            f.seek(0)
            with np.load(f, allow_pickle=False) as z:
                arrays = {key: z[key] for key in z.files}
        # what a damaged archive raises from zipfile, zlib and numpy's header parser (found by fuzzing,
        # tests/test_fuzz_readers.py: an unsupported "zip version" or compression method among them)
        except (
            zipfile.BadZipFile,
            ValueError,
            EOFError,
            OSError,
            NotImplementedError,
            KeyError,
            struct.error,
            zlib.error,
            MemoryError,
        ) as e:
            raise InputFileError(
                f"{path}: damaged npz archive ({e}); expected numpy.savez output with keys "
                "pos, vel, mass, time, ids"
            ) from None
    return _bodies_of(path, arrays)


def _check_claims(path: Path, f) -> None:
    """InputFileError for an array whose .npy header claims more bytes than the archive holds for it (a
    header claiming 10^12 bodies): refused before numpy allocates what the header claims."""
    with zipfile.ZipFile(f) as archive:
        for info in archive.infolist():
            if not info.filename.endswith(".npy"):
                continue
            with archive.open(info) as member:
                version = np.lib.format.read_magic(member)
                read_header = (
                    np.lib.format.read_array_header_1_0
                    if version == (1, 0)
                    else np.lib.format.read_array_header_2_0
                )
                shape, _fortran, dtype = read_header(member, max_header_size=10_000)
                claimed = int(np.prod(shape, dtype=object)) * dtype.itemsize
                # the directory's size, and no more than deflate can expand its compressed bytes to
                # (1,032 to 1 at most), for a directory that lies as well
                held = min(info.file_size, max(info.compress_size, 1) * DEFLATE_MAX_RATIO) - member.tell()
            if claimed > held:
                raise InputFileError(
                    f"{path}: array {info.filename[:-4]!r} claims shape {shape} ({claimed:,} bytes), but "
                    f"the archive holds {max(held, 0):,} bytes for it; refused before reading (a damaged "
                    "or forged header)"
                )


def _bodies_of(path: Path, arrays: dict) -> Bodies:
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
    bodies = checked_bodies(
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
    arrays: dict[str, np.ndarray | np.generic] = {
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
        # Uncompressed: positions barely compress and loading stays a memcpy. Every array above is numbers
        # or text, never objects, so the file is the same either way and read_npz refuses pickles anyway;
        # naming the flag lets the type checker match **arrays to the arrays alone.
        np.savez(f, allow_pickle=False, **arrays)


def sniff(head: Head) -> bool:
    """The zip signature that numpy.savez's archives start with."""
    return head.data.startswith(_ZIP_SIGNATURE)


FORMAT = SnapshotFormat("npz", (".npz",), sniff, read_npz, write_npz)
