"""Readers on the published data sets, exact round trips, and errors that name the file and the row."""

import time

import numpy as np
import pytest
from conftest import shared_file

from app.core.errors import ConfigError, InputFileError, RuntimeFault
from app.model import formats
from app.model.bodies import Bodies

BONSAI = "bonsai_model3_child_compact.tipsy"


# ------------------------------------------------------------------------------------ shared data files


def test_nbabel_1k():
    path = shared_file("nbabel_input1k")
    assert formats.detect_format(path) == "nbabel"
    b = formats.read(path)
    assert b.n == 1024
    assert b.mass.sum() == pytest.approx(1.0, abs=1e-12)
    assert np.abs(b.mass @ b.pos).max() < 1e-15
    assert b.ids is None  # NBabel's -1 placeholders carry no identity


def test_nbabel_16k_loads_fast():
    path = shared_file("nbabel_input16k")
    start = time.perf_counter()
    b = formats.read(path)
    elapsed = time.perf_counter() - start
    assert b.n == 16384
    assert b.mass.sum() == pytest.approx(1.0, abs=1e-12)
    assert elapsed < 1.0, f"16k NBabel file took {elapsed:.2f} s"


def test_bonsai_tipsy_header_and_records():
    path = shared_file(BONSAI)
    h = formats.read_tipsy_header(path)
    assert (h.nbodies, h.ndim, h.nsph, h.ndark, h.nstar) == (22000, 3, 0, 20000, 2000)
    assert h.byteorder == "<" and h.time == 0.0
    b = formats.read(path)
    assert b.n == 22000
    assert b.mass.sum() == pytest.approx(97.278, rel=1e-4)
    assert b.mass[:20000].sum() == pytest.approx(88.658, rel=1e-4)  # dark records come first
    # Bonsai's IDs live in phi as int32: DARKMATTERID 200000000 + i, BULGEID 100000000 + i.
    np.testing.assert_array_equal(b.ids[:20000], 200_000_000 + np.arange(20000))
    np.testing.assert_array_equal(b.ids[20000:], 100_000_000 + np.arange(2000))


def test_nemo_figure8_with_header():
    path = shared_file("nemo_figure8.mpv")
    assert formats.detect_format(path) == "nemo"
    b = formats.read(path)
    assert b.n == 3 and b.time == 0.0
    np.testing.assert_array_equal(b.mass, [1.0, 1.0, 1.0])
    np.testing.assert_array_equal(b.pos[0], [-0.97000436, 0.24308753, 0.0])
    np.testing.assert_array_equal(b.vel[2], [0.93240737, 0.86473146, 0.0])


def test_text_formats_sniffed_without_extension(tmp_path):
    nemo = tmp_path / "plain"
    nemo.write_text("1 0 0 0 0 0 0\n1 1 0 0 0 0 0\n")
    assert formats.detect_format(nemo) == "nemo"
    nbabel = tmp_path / "labelled"
    nbabel.write_text("7 1 0 0 0 0 0 0\n9 1 1 0 0 0 0 0\n")
    assert formats.detect_format(nbabel) == "nbabel"
    np.testing.assert_array_equal(formats.read(nbabel).ids, [7, 9])


# ------------------------------------------------------------------------------------------ round trips


def _random_bodies(n=257, ids=True, time=1.25, float32=False) -> Bodies:
    rng = np.random.default_rng(7)
    pos, vel = rng.normal(size=(n, 3)) * 1e3, rng.normal(size=(n, 3)) * 1e-3
    mass = rng.uniform(0.0, 1.0, n) / 3.0
    if float32:
        pos, vel, mass = (a.astype(np.float32).astype(np.float64) for a in (pos, vel, mass))
    return Bodies.from_arrays(pos, vel, mass, time=time, ids=rng.permutation(n) + 5 if ids else None)


def _assert_identical(a: Bodies, b: Bodies):
    for field in ("pos", "vel", "mass"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)
        assert getattr(b, field).dtype == np.float64
    assert a.time == b.time
    if a.ids is None:
        assert b.ids is None
    else:
        np.testing.assert_array_equal(a.ids, b.ids)


@pytest.mark.parametrize("ext", ["npz", "csv"])
@pytest.mark.parametrize("ids", [True, False])
def test_float64_round_trip_exact(tmp_path, ext, ids):
    bodies = _random_bodies(ids=ids)
    path = tmp_path / f"snap.{ext}"
    formats.write(path, bodies)
    _assert_identical(bodies, formats.read(path))


@pytest.mark.parametrize("byteorder", ["<", ">"])
def test_tipsy_round_trip_bit_exact(tmp_path, byteorder):
    bodies = _random_bodies(float32=True)
    path = tmp_path / "snap.tipsy"
    formats.write_tipsy(path, bodies, byteorder=byteorder)
    assert formats.read_tipsy_header(path).byteorder == byteorder
    _assert_identical(bodies, formats.read(path))
    again = tmp_path / "again"  # no extension: found by sniffing the header
    formats.write_tipsy(again, formats.read(path), byteorder=byteorder)
    assert again.read_bytes() == path.read_bytes()
    assert formats.detect_format(again) == "tipsy"


def test_bonsai_rewrite_is_bit_exact(tmp_path):
    original = formats.read(shared_file(BONSAI))
    path = tmp_path / "copy.tipsy"
    formats.write(path, original)
    _assert_identical(original, formats.read(path))


@pytest.mark.parametrize("existing", [False, True])
def test_failed_write_leaves_no_partial_file(tmp_path, monkeypatch, existing):
    def broken_savez(f, **arrays):
        f.write(b"PK\x03\x04 half an archive")
        raise OSError("disk full")

    path = tmp_path / "snap.npz"
    if existing:
        path.write_bytes(b"previous snapshot")
    monkeypatch.setattr(np, "savez", broken_savez)
    with pytest.raises(RuntimeFault, match="snap.npz"):
        formats.write(path, _random_bodies())
    assert [p.name for p in tmp_path.iterdir()] == (["snap.npz"] if existing else [])
    if existing:
        assert path.read_bytes() == b"previous snapshot"


def test_write_needs_a_known_format(tmp_path):
    with pytest.raises(ConfigError, match="extension"):
        formats.write(tmp_path / "snap.xyz", _random_bodies())
    with pytest.raises(ConfigError, match="nemo"):
        formats.read(tmp_path / "x", format="nemo2")


# ------------------------------------------------------------------------------------- malformed inputs


def _expect(path, *fragments, fmt=None):
    with pytest.raises(InputFileError) as info:
        formats.read(path, format=fmt)
    message = str(info.value)
    for fragment in (path.name, *fragments):
        assert fragment in message, message
    return message


NEMO_OK = ["1 0 0 0 0 0 0", "1 1 0 0 0 0 0", "1 0 1 0 0 0 0"]


def _nemo(tmp_path, lines, name="bad.mpv"):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def test_row_with_six_numbers(tmp_path):
    path = _nemo(tmp_path, ["3 0.0", *NEMO_OK[:2], "1 0 1 0 0 0"])
    _expect(path, "line 4", "6 values", "expected 7")


def test_non_numeric_token(tmp_path):
    path = _nemo(tmp_path, ["# a comment", *NEMO_OK[:2], "1 0 x1 0 0 0 0"])
    _expect(path, "line 4", "'x1'", "not a number")


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_values(tmp_path, value):
    path = _nemo(tmp_path, [*NEMO_OK, f"1 0 0 0 0 {value} 0"])
    _expect(path, "line 4", "not finite")


def test_negative_mass(tmp_path):
    path = _nemo(tmp_path, [*NEMO_OK[:1], "", "-1 0 0 0 0 0 0"])
    _expect(path, "line 3", "negative mass")


def test_header_count_mismatch(tmp_path):
    path = _nemo(tmp_path, ["5 0.0", *NEMO_OK])
    _expect(path, "line 1", "N = 5", "3 body rows")


@pytest.mark.parametrize("lines", [[], ["# only a comment"], ["0 0.0"]], ids=["empty", "comment", "N=0"])
def test_no_bodies(tmp_path, lines):
    path = _nemo(tmp_path, lines)
    _expect(path, "N = 0")


def test_empty_file_without_extension(tmp_path):
    path = tmp_path / "nbabel_empty"
    path.write_bytes(b"")
    _expect(path, "N = 0")


def test_nbabel_short_row_and_bad_id(tmp_path):
    path = tmp_path / "nbabel_input"
    path.write_text("-1 1 0 0 0 0 0 0\n-1 1 0 0 0 0 0 0\n-1 1 0 0 0 0 0\n")
    _expect(path, "line 3", "7 values", "expected 8", fmt="nbabel")
    path.write_text("1 1 0 0 0 0 0 0\n2.5 1 1 0 0 0 0 0\n")
    _expect(path, "line 2", "id", "not an integer")


def test_csv_errors(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("m,x,y,z,vx,vy,vz\n1,0,0,0,0,0,0\n1,0,0,0,0,0\n")
    _expect(path, "line 3", "6 values", "expected 7")
    path.write_text("m,x,y,z,vx,vy\n1,0,0,0,0,0\n")
    _expect(path, "line 1", "missing ['vz']")
    path.write_text("# time = 2\nm,x,y,z,vx,vy,vz\n1,0,0,0,0,0,0\n2,0,0,0,0,nan,0\n")
    _expect(path, "line 4", "not finite")


def _tipsy_file(tmp_path, name="bad.tipsy", n=10):
    path = tmp_path / name
    formats.write(path, _random_bodies(n=n, float32=True))
    return path


def test_truncated_tipsy(tmp_path):
    path = _tipsy_file(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[: 32 + 3 * 36 + 20])  # three whole dark records and part of the fourth
    _expect(path, "truncated", "record 3 (dark)", "needs 392 bytes")
    path.write_bytes(data[:20])
    _expect(path, "shorter than the 32-byte Tipsy header")


def test_tipsy_bad_values_name_the_record(tmp_path):
    path = _tipsy_file(tmp_path)
    data = bytearray(path.read_bytes())
    data[32 + 4 * 36 : 32 + 4 * 36 + 4] = np.float32(-2.0).tobytes()  # mass of dark record 4
    path.write_bytes(bytes(data))
    _expect(path, "record 4 (dark)", "negative mass")
    data[32 + 4 * 36 : 32 + 4 * 36 + 4] = np.float32(np.nan).tobytes()
    path.write_bytes(bytes(data))
    _expect(path, "record 4 (dark)", "not finite")


def test_tipsy_header_count_mismatch_and_zero(tmp_path):
    path = _tipsy_file(tmp_path)
    data = bytearray(path.read_bytes())
    path.write_bytes(bytes(data) + b"\0" * 36)
    _expect(path, "36 bytes after the last record", "N = 10")
    header = np.frombuffer(bytes(data[:32]), dtype="<f8,<i4,<i4,<i4,<i4,<i4,<i4").copy()
    header[0][1], header[0][4] = 0, 0  # nbodies = ndark = 0
    path.write_bytes(header.tobytes())
    _expect(path, "N = 0")


def test_unrecognisable_binary(tmp_path):
    path = tmp_path / "noise"
    path.write_bytes(bytes(range(256)) * 4)
    _expect(path, "Tipsy header")
