"""The one table of snapshot formats (app/model/formats/__init__.py TABLE): every record reads (and writes,
when it can) and is found by each of its extensions and by its content; the package's own sniffs never
agree on a file; the settings' names are the table's. And the table is open: the toy format of
tests/toy_format.py, added by one `formats.register` call, is read, written, detected and taken by the
settings and by `simulate`, and is gone again after its test."""

import numpy as np
import pytest
import toy_format

from app.cli import main
from app.core.errors import ConfigError, InputFileError
from app.model import config, formats, ics
from app.model.bodies import Bodies

CPU = ["--backend", "cpu", "--no-progress"]
OWN = list(formats.TABLE)  # the package's own, as collected

# A read-only format has no writer to make its test file: it gives a sample here.
SAMPLES = {
    "nemo": "2 0.5\n1 0 0 0 0 0.25 0\n1 1 0 0 0 -0.25 0\n",
    "nbabel": "7 1 0 0 0 0 0.25 0\n9 1 1 0 0 0 -0.25 0\n",
}


def _bodies(n=33) -> Bodies:
    """Values exact in float32 (Tipsy keeps float32), IDs that fit Tipsy's int32 phi, t = 0 (the toy
    keeps no time)."""
    rng = np.random.default_rng(5)
    pos, vel = (rng.normal(size=(n, 3)).astype(np.float32).astype(np.float64) for _ in range(2))
    mass = rng.uniform(0.5, 1.0, n).astype(np.float32).astype(np.float64)
    return Bodies.from_arrays(pos, vel, mass, time=0.0, ids=rng.permutation(n) + 3)


def _same(a: Bodies, b: Bodies) -> None:
    for field in ("pos", "vel", "mass"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)


def _files(fmt: formats.SnapshotFormat, tmp_path) -> list:
    """One file per extension, plus one without (its content must say the format), each checked to read
    back what was written (or, read-only, to read)."""
    paths = [tmp_path / f"snap{ext}" for ext in fmt.extensions] + [tmp_path / "snap"]
    for path in paths:
        if fmt.write is not None:
            formats.write(path, _bodies(), format=fmt.name)
            _same(_bodies(), formats.read(path, format=fmt.name))
        else:
            path.write_text(SAMPLES[fmt.name])
            assert formats.read(path, format=fmt.name).n == 2
    return paths


@pytest.mark.parametrize("fmt", OWN, ids=lambda f: f.name)
def test_every_format_round_trips_and_is_found_by_extension_and_content(fmt, tmp_path):
    *named, plain = _files(fmt, tmp_path)
    for path in named:
        assert formats.detect_format(path) == fmt.name, path.name
        assert formats.read(path).n == formats.read(plain, format=fmt.name).n
    if fmt.sniff is not None:
        assert formats.detect_format(plain) == fmt.name


@pytest.mark.parametrize("fmt", OWN, ids=lambda f: f.name)
def test_the_packages_own_sniffs_never_agree(fmt, tmp_path):
    """So the order in which detection asks them does not matter."""
    plain = _files(fmt, tmp_path)[-1]
    head = formats.Head.of(plain.read_bytes()[:65536])
    assert [f.name for f in OWN if f.sniff is not None and f.sniff(head)] == [fmt.name]


def test_the_settings_names_are_the_tables():
    assert [f.name for f in formats.TABLE] == config.FORMAT_CHOICES
    assert formats.FORMATS is config.FORMAT_CHOICES
    assert config.SCHEMA["initial"]["format"].allowed() is config.FORMAT_CHOICES
    writable = [f.name for f in formats.TABLE if f.write is not None]
    assert writable == ["tipsy", "npz", "csv"]
    with pytest.raises(ConfigError, match=r"\.tipsy, \.npz or \.csv"):
        formats.output_format("snap.mpv")


# ------------------------------------------------------------------------------------------ the toy


@pytest.fixture
def toy():
    """The toy format registered for one test, and unregistered after it."""
    before = list(formats.TABLE), list(config.FORMAT_CHOICES)
    formats.register(toy_format.FORMAT)
    yield toy_format.FORMAT
    formats.unregister(toy_format.FORMAT.name)
    assert before == (formats.TABLE, config.FORMAT_CHOICES)


def test_a_registered_format_is_read_written_and_detected(toy, tmp_path):
    bodies = _bodies()
    path = tmp_path / "snap.toy"
    formats.write(path, bodies)
    assert path.read_text().startswith("x y z vx vy vz m\n")
    assert formats.detect_format(path) == "toy" and formats.output_format(path) == "toy"
    _same(bodies, formats.read(path))
    plain = tmp_path / "snap"  # no extension: its sniff, asked before NEMO's, finds it
    plain.write_bytes(path.read_bytes())
    assert formats.detect_format(plain) == "toy"
    _same(bodies, formats.read(plain))
    assert [f.name for f in formats.TABLE] == config.FORMAT_CHOICES == ["toy", *(f.name for f in OWN)]
    assert config.coerce("initial.format", "toy", config.SCHEMA["initial"]["format"]) == "toy"
    bad = tmp_path / "bad.toy"
    bad.write_text("x y z vx vy vz m\n0 0 0 0 0 0 1\n0 0 0 0 0\n")
    with pytest.raises(InputFileError, match="line 3: 5 values, expected 7"):
        formats.read(bad)


def test_simulate_loads_and_writes_a_registered_format(toy, tmp_path):
    start = ics.generate("plummer", 64, 3)
    src, out = tmp_path / "start.toy", tmp_path / "end.toy"
    formats.write(src, start)
    assert main(["simulate", str(src), "--steps", "3", "--out", str(out), *CPU]) == 0
    end = formats.read(out)
    assert end.n == 64 and not np.array_equal(end.pos, start.pos)
    plain = tmp_path / "start"  # named by --format, which the command line now accepts
    plain.write_bytes(src.read_bytes())
    out2 = tmp_path / "end2.toy"
    assert main(["simulate", str(plain), "--format", "toy", "--steps", "3", "--out", str(out2), *CPU]) == 0
    np.testing.assert_array_equal(formats.read(out2).pos, end.pos)


def test_register_refuses_a_taken_name_or_extension():
    with pytest.raises(ValueError, match="'npz'"):
        formats.register(formats.SnapshotFormat("npz", (".npz2",), None, toy_format.read))
    with pytest.raises(ValueError, match=r"\.csv"):
        formats.register(formats.SnapshotFormat("table", (".csv",), None, toy_format.read))
    with pytest.raises(ValueError, match="lower case"):
        formats.register(formats.SnapshotFormat("toy", ("TOY",), None, toy_format.read))
    assert formats.TABLE == OWN


def test_unregistered_the_format_is_unknown_again(tmp_path, capsys):
    formats.register(toy_format.FORMAT)
    formats.unregister("toy")
    assert formats.TABLE == OWN and [f.name for f in OWN] == config.FORMAT_CHOICES
    with pytest.raises(ConfigError, match="extension"):
        formats.output_format(tmp_path / "snap.toy")
    src = tmp_path / "start.npz"
    formats.write(src, _bodies())
    argv = ["simulate", str(src), "--format", "toy", "--steps", "1", "--out", str(tmp_path / "o.npz"), *CPU]
    with pytest.raises(SystemExit) as exit_info:  # argparse's --format choices
        main(argv)
    assert exit_info.value.code == 2 and "invalid choice: 'toy'" in capsys.readouterr().err
