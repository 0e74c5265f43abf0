"""Issue 28, item 5: every snapshot reader (Tipsy, NEMO, NBabel, csv, npz), the scene TOML and a series'
series.json, fed damaged copies of a valid file (truncated, bit-flipped, bytes overwritten by huge counts,
byte-swapped) either reads it or raises the project's UserError naming the file in one line. Anything
else (a traceback's IndexError, ValueError, struct.error, MemoryError, a warning) fails, and so does a case
slower than CASE_S. Found with hypothesis (derandomized: the same cases every run); the inputs of the bugs
it found are kept below as regression cases."""

from __future__ import annotations

import struct
import time
from pathlib import Path

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from app.core.errors import UserError  # noqa: E402
from app.model import formats  # noqa: E402
from app.model.bodies import Bodies  # noqa: E402

CASES = 2000  # per reader (the floor)
CASE_S = 2.0  # one damaged file, read or refused
EXTENSIONS = {"tipsy": ".tipsy", "nemo": ".nemo", "nbabel": ".nbabel", "csv": ".csv", "npz": ".npz"}


def _valid(tmp: Path, fmt: str) -> bytes:
    rng = np.random.default_rng(3)
    n = 24
    bodies = Bodies.from_arrays(rng.normal(size=(n, 3)), rng.normal(size=(n, 3)), np.full(n, 1.0 / n))
    rows = np.column_stack([bodies.mass, bodies.pos, bodies.vel])
    if fmt == "nbabel":  # no writer: `-1 m x y z vx vy vz` per line (the NBabel inputs' layout)
        return "".join(f"{i} " + " ".join(f"{v:.17g}" for v in r) + "\n" for i, r in enumerate(rows)).encode()
    if fmt == "nemo":  # no writer: `N t`, then `m x y z vx vy vz` per line (NEMO's ASCII snapshot)
        return (f"{n} 0.0\n" + "".join(" ".join(f"{v:.17g}" for v in r) + "\n" for r in rows)).encode()
    path = tmp / f"valid{EXTENSIONS[fmt]}"
    formats.write(path, bodies, format=fmt)
    return path.read_bytes()


@st.composite
def damaged(draw, data: bytes) -> bytes:
    """One of: a truncation, bit flips, a 4- or 8-byte run set to a huge count, or a byte-swapped run."""
    kind = draw(st.sampled_from(["truncate", "flip", "huge", "swap"]))
    b = bytearray(data)
    if kind == "truncate":
        return bytes(b[: draw(st.integers(0, max(len(b) - 1, 0)))])
    if kind == "flip":
        for _ in range(draw(st.integers(1, 8))):
            i = draw(st.integers(0, len(b) - 1))
            b[i] ^= 1 << draw(st.integers(0, 7))
        return bytes(b)
    at = draw(st.integers(0, max(len(b) - 8, 0)))
    if kind == "huge":
        value = draw(st.sampled_from([2**31 - 1, 2**32 - 1, 10**12, -1, 2**63 - 1]))
        packed = (
            struct.pack("<q", value)
            if draw(st.booleans())
            else struct.pack("<i", max(min(value, 2**31 - 1), -(2**31)))
        )
        b[at : at + len(packed)] = packed
        return bytes(b)
    run = b[at : at + 8]
    b[at : at + 8] = run[::-1]
    return bytes(b)


def fuzz(data: bytes, path: Path, read, names_file: bool = False) -> list:
    """CASES damaged copies of `data` written to `path`, each given to `read()`: it returns, or raises the
    project's UserError in one line (naming the file with `names_file`), within CASE_S. Returns what the
    reads that succeeded gave."""
    got = []

    @settings(
        max_examples=CASES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(damaged(data))
    def check(blob: bytes) -> None:
        path.write_bytes(blob)
        t0 = time.perf_counter()
        try:
            got.append(read())
        except UserError as e:
            message = str(e)
            assert "\n" not in message.strip(), message
            assert not names_file or path.name in message, message
        assert time.perf_counter() - t0 < CASE_S

    check()
    return got


def write_series(folder: Path) -> Path:
    """A 3-snapshot series of 32 bodies (`simulate --snapshot-every`); returns its series.json."""
    from app.cli import main
    from app.model.series import MANIFEST

    argv = [
        "simulate",
        "plummer",
        "--n",
        "32",
        "--steps",
        "4",
        "--snapshot-every",
        "2",
        "--out-dir",
        str(folder),
    ]
    assert main([*argv, "--backend", "cpu", "--kernel", "cpu-simd"]) == 0
    return folder / MANIFEST


@pytest.mark.filterwarnings("error")  # a warning would be a second line on the terminal
@pytest.mark.parametrize("fmt", sorted(EXTENSIONS))
def test_a_damaged_snapshot_is_read_or_refused_in_one_line(fmt, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"fuzz-{fmt}")
    data = _valid(tmp, fmt)
    path = tmp / f"damaged{EXTENSIONS[fmt]}"
    read = fuzz(data, path, lambda: formats.read(path, format=fmt), names_file=True)
    assert all(isinstance(bodies, Bodies) for bodies in read)


def test_regression_an_npz_member_of_an_unknown_zip_version(tmp_path):
    """Found by the fuzzing above: a flipped "version needed to extract" in the zip's central directory
    made zipfile raise NotImplementedError ("zip file version 25.5"), a traceback past the npz reader."""
    data = bytearray(_valid(tmp_path, "npz"))
    central = data.index(b"PK\x01\x02")
    data[central + 6 : central + 8] = b"\xff\x00"  # version needed: 25.5
    path = tmp_path / "odd.npz"
    path.write_bytes(bytes(data))
    with pytest.raises(UserError, match="odd.npz: damaged npz archive"):
        formats.read(path)


@pytest.mark.filterwarnings("error")
def test_a_damaged_scene_file_is_loaded_or_refused_in_one_line(tmp_path_factory):
    """The collision preset's TOML, damaged the same ways: load_scene (and make_bodies' checks of its
    values) either gives a Scene or raises the project's UserError naming the file."""
    from app.core.paths import SCENES
    from app.scene import load_scene

    tmp = tmp_path_factory.mktemp("fuzz-scene")
    data = (SCENES / "collision.toml").read_bytes()
    path = tmp / "damaged.toml"
    fuzz(data, path, lambda: load_scene(str(path)))


def test_regression_a_scene_file_that_is_not_utf8(tmp_path):
    """Found by the fuzzing above: a scene file starting with 0xff raised UnicodeDecodeError (a traceback)."""
    from app.scene import load_scene

    path = tmp_path / "binary.toml"
    path.write_bytes(b"\xff\xff\xff\x7f[scene]\n")
    with pytest.raises(UserError, match=r"binary.toml: not a text file \(byte 0xff at offset 0"):
        load_scene(str(path))


@pytest.mark.filterwarnings("error")
def test_a_damaged_series_manifest_is_opened_or_refused_in_one_line(tmp_path_factory):
    """A series written by `simulate --snapshot-every`, its series.json damaged the same ways: open_series
    either opens the series or raises the project's UserError in one line."""
    from app.model.series import open_series

    folder = tmp_path_factory.mktemp("fuzz-series") / "run"
    manifest = write_series(folder)
    fuzz(manifest.read_bytes(), manifest, lambda: open_series(str(folder), progress=None))


def test_regression_a_series_manifest_entry_without_its_file(tmp_path):
    """Found by the fuzzing above: an entry whose "file" key was damaged raised KeyError (a traceback)."""
    from app.model.series import open_series

    folder = tmp_path / "run"
    manifest = write_series(folder)
    manifest.write_text(
        manifest.read_text().replace('"file": "snap_00000002.npz"', '"": "snap_00000002.npz"')
    )
    with pytest.raises(UserError, match="series.json: snapshot entry 1 is damaged"):
        open_series(str(folder), progress=None)


@pytest.mark.filterwarnings("error")
def test_a_damaged_kernel_file_header_is_read_or_refused_in_one_line(tmp_path_factory):
    """Issue 28 item 5's "kernel headers once they exist" (issue 27's kernel files): a starter that
    `new-kernel` writes, damaged the same ways, is a record or the project's UserError naming the file."""
    from app.backends.cuda import registry, user_kernels

    tmp = tmp_path_factory.mktemp("fuzz-kernel")
    data = user_kernels.new_kernel_text("fuzzed", {r.name: r for r in registry.RECORDS}["shared"]).encode()
    path = tmp / "damaged.cu"
    read = fuzz(data, path, lambda: user_kernels.user_record(path), names_file=True)
    assert read and all(rec.backend == "cuda" for rec in read)
