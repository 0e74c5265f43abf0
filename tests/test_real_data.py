"""Reading real data: gzip, missing paths, scene-relative files, --n vs --subsample, float32 overflow."""

import gzip

import numpy as np
import pytest
from conftest import one_line_error, shared_file

from app.cli import main
from app.core.errors import InputFileError
from app.model import formats, ics
from app.scene import load_scene, make_bodies, subsample


def _gzip(src, dst):
    dst.write_bytes(gzip.compress(src.read_bytes()))
    return dst


@pytest.mark.parametrize(
    "name, gz_name",
    [
        ("nemo_figure8.mpv", "f8.mpv.gz"),
        ("nbabel_input1k", "in.gz"),
        ("bonsai_model3_child_compact.tipsy", "b.tipsy.gz"),
    ],
)
def test_gzip_is_read_whatever_the_format(tmp_path, name, gz_name):
    src = shared_file(name)
    got, want = formats.read(_gzip(src, tmp_path / gz_name)), formats.read(src)
    assert np.array_equal(got.pos, want.pos) and np.array_equal(got.mass, want.mass)


def test_gzip_npz_and_csv(tmp_path):
    b = ics.generate("plummer", 50, 1)
    for name in ("s.npz", "s.csv"):
        formats.write(tmp_path / name, b)
        got = formats.read(_gzip(tmp_path / name, tmp_path / (name + ".gz")))
        assert np.array_equal(got.pos, b.pos)


def test_damaged_gzip_is_one_line_without_format_advice(tmp_path, capsys):
    bad = tmp_path / "s.csv.gz"
    bad.write_bytes(gzip.compress(b"m,x,y,z,vx,vy,vz\n" * 10)[:-12])
    rc = main(["simulate", str(bad), "--steps", "1", "--out", str(tmp_path / "o.npz"), "--backend", "cpu"])
    line = one_line_error(capsys, rc, 2, "s.csv.gz", "gzip")
    assert "format=" not in line


def test_missing_snapshot_is_said_to_be_missing(capsys, tmp_path):
    (tmp_path / "model.tipsy").write_bytes(b"")
    rc = main(["run", str(tmp_path / "model.tipsyy")])
    one_line_error(capsys, rc, 2, str(tmp_path / "model.tipsyy"), "no such", "model.tipsy?")


def test_unknown_preset_name_still_lists_presets(capsys):
    one_line_error(capsys, main(["run", "plumer"]), 2, "unknown scene preset", "plummer")


def test_scene_file_is_resolved_against_the_toml_folder(tmp_path, monkeypatch):
    src = shared_file("nemo_figure8.mpv")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "f8.mpv").write_bytes(src.read_bytes())
    (tmp_path / "scenes").mkdir()
    toml = tmp_path / "scenes" / "f8.toml"
    toml.write_text('[initial]\nfile = "../data/f8.mpv"\n')
    monkeypatch.chdir(tmp_path / "data")  # anywhere but the TOML's folder
    scene = load_scene(str(toml))
    assert make_bodies(scene).n == 3
    assert scene.initial.file == str(tmp_path / "data" / "f8.mpv")


def test_missing_scene_file_error_shows_the_full_path(tmp_path, capsys):
    toml = tmp_path / "s.toml"
    toml.write_text('[initial]\nfile = "nothere.mpv"\n')
    rc = main(["simulate", str(toml), "--steps", "1", "--out", str(tmp_path / "o.npz"), "--backend", "cpu"])
    one_line_error(capsys, rc, 2, str(tmp_path / "nothere.mpv"))


def test_n_with_a_snapshot_suggests_subsample(capsys, tmp_path):
    path = shared_file("nbabel_input1k")
    rc = main(["simulate", str(path), "--n", "100", "--steps", "1", "--out", str(tmp_path / "o.npz")])
    one_line_error(capsys, rc, 2, "--n", "--subsample")
    assert not list(tmp_path.iterdir())


def test_subsample_is_seeded_and_keeps_the_total_mass():
    b = ics.generate("plummer", 1000, 1)
    b.mass = np.random.default_rng(0).uniform(0.5, 1.5, b.n)
    a, again, other = subsample(b, 100, 7), subsample(b, 100, 7), subsample(b, 100, 8)
    assert a.n == 100 and a.mass.sum() == pytest.approx(b.mass.sum())
    assert np.array_equal(a.pos, again.pos) and not np.array_equal(a.pos, other.pos)


def test_subsample_cli(tmp_path):
    path = shared_file("nbabel_input1k")
    out = tmp_path / "o.npz"
    assert (
        main(
            [
                "simulate",
                str(path),
                "--subsample",
                "64",
                "--steps",
                "1",
                "--out",
                str(out),
                "--backend",
                "cpu",
                "--no-progress",
            ]
        )
        == 0
    )
    got = formats.read(out)
    assert got.n == 64 and got.mass.sum() == pytest.approx(formats.read(path).mass.sum())


def test_float32_overflow_names_line_and_column(tmp_path):
    path = tmp_path / "big.mpv"
    path.write_text("1 0 0 0 0 0 0\n1 0 5e38 0 0 0 0\n")
    with pytest.raises(InputFileError, match=r"line 2: column 3 is 5e38.*float32"):
        formats.read(path)
