"""Issue 28, item 5: memory stays bounded on hostile input. A header claiming 10^12 bodies (or an archive
that expands a thousandfold) is refused with one line naming the file before anything of that size is
allocated. "Before allocation" is measured: the Python-traced allocations (numpy reports its arrays to
tracemalloc) peak far below what the header claims. Claims of 2.4 GB, which an overcommitting kernel
would hand out without complaint, are the ones that show it. The old npz reader let numpy allocate the
claimed array and then failed on the missing data, a traced peak of 2.4 GB.
"""

from __future__ import annotations

import gzip
import io
import struct
import tracemalloc
import zipfile

import numpy as np
import pytest
from numpy.lib import format as npy_format

from app.core.errors import InputFileError, UserError
from app.model import formats
from app.model.formats import opening

PEAK_BOUND = 32 * 2**20  # bytes traced while reading: the inputs here are KiB, the claims GB to TB


def npy_member(shape: tuple, payload: bytes = b"\0" * 64) -> bytes:
    """A .npy whose header claims `shape` float64, followed by only `payload`."""
    buf = io.BytesIO()
    npy_format.write_array_header_1_0(buf, {"descr": "<f8", "fortran_order": False, "shape": shape})
    return buf.getvalue() + payload


def claiming_npz(path, n: int) -> None:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("pos.npy", npy_member((n, 3)))
        z.writestr("vel.npy", npy_member((n, 3)))
        z.writestr("mass.npy", npy_member((n,)))


def claiming_tipsy(path, n: int) -> None:
    """A Tipsy header (time, nbodies, ndim, nsph, ndark, nstar, pad): `n` dark bodies, one record of data."""
    path.write_bytes(struct.pack("<diiiiii", 0.0, n, 3, 0, n, 0, 0) + b"\0" * 36)


def traced_refusal(path, fragment: str) -> int:
    """Read `path`: it must be refused with one line naming it and `fragment`; returns the traced peak."""
    opening._gunzip.cache_clear()
    tracemalloc.start()
    try:
        with pytest.raises(UserError) as refused:
            formats.read(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    message = str(refused.value)
    assert str(path) in message and fragment in message and "\n" not in message, message
    return peak


@pytest.mark.parametrize("n", [10**8, 10**12])
def test_an_npz_claiming_more_bodies_than_it_holds_is_refused_before_allocation(tmp_path, n):
    path = tmp_path / "claims.npz"
    claiming_npz(path, n)
    peak = traced_refusal(path, f"claims shape ({n}, 3) ({24 * n:,} bytes)")
    assert peak < PEAK_BOUND, f"{peak / 2**20:.0f} MiB traced while refusing"


@pytest.mark.parametrize("n", [10**8, 2**31 - 1])
def test_a_tipsy_header_claiming_more_bodies_than_the_file_holds_is_refused_before_allocation(tmp_path, n):
    path = tmp_path / "claims.tipsy"
    claiming_tipsy(path, n)
    peak = traced_refusal(path, f"N = {n}")
    assert peak < PEAK_BOUND, f"{peak / 2**20:.0f} MiB traced while refusing"


def test_a_nemo_header_claiming_10_to_the_12_bodies_is_refused_from_its_rows(tmp_path):
    path = tmp_path / "claims.nemo"
    path.write_text("1000000000000 0\n1 0 0 0 0 0 0\n")
    peak = traced_refusal(path, "header says N = 1000000000000")
    assert peak < PEAK_BOUND


def test_a_gzip_that_expands_past_the_limit_is_refused_while_decompressing(tmp_path, monkeypatch):
    """A gzip bomb: 64 MiB of zeros in a file of ~64 KiB; with the limit at 8 MiB it stops at the first
    chunk over it, never holding the 64 MiB."""
    path = tmp_path / "bomb.csv.gz"
    path.write_bytes(gzip.compress(b"\0" * (64 * 2**20)))
    assert path.stat().st_size < 2**20
    monkeypatch.setattr(opening, "GUNZIP_CHUNK", 2**20)
    monkeypatch.setattr(opening, "gunzip_limit", lambda: 8 * 2**20)
    peak = traced_refusal(path, "decompresses to more than 0.0 GiB")
    assert peak < PEAK_BOUND


def test_an_honest_npz_and_gzip_read_as_before(tmp_path):
    rng = np.random.default_rng(1)
    pos, vel, mass = rng.normal(size=(1000, 3)), rng.normal(size=(1000, 3)), np.full(1000, 1e-3)
    path = tmp_path / "ok.npz"
    np.savez_compressed(path, pos=pos, vel=vel, mass=mass, time=0.5)  # deflated members: the ratio rule
    bodies = formats.read(path)
    assert np.array_equal(bodies.pos, pos) and bodies.time == 0.5
    zipped = tmp_path / "ok.npz.gz"
    zipped.write_bytes(gzip.compress(path.read_bytes()))
    assert np.array_equal(formats.read(zipped).vel, vel)
    assert opening.gunzip_limit() > 2**20


def test_a_scene_or_command_line_asking_for_10_to_the_12_bodies_is_refused(tmp_path, capsys):
    from app.cli import main

    rc = main(["simulate", "plummer", "--n", str(10**12), "--steps", "1", "--out", str(tmp_path / "o.npz")])
    err = capsys.readouterr().err
    assert rc == 2 and "out of range" in err and "Traceback" not in err, err
    with pytest.raises(InputFileError):
        formats.read(tmp_path / "missing.npz")
