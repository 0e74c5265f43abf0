"""Components through every writer: npz and csv keep any components exactly (names and each body's index,
in the original body order); Tipsy keeps them as its sections where their names say one (gas; dark or
halo; star, disk or bulge) and the rows follow the section order, and otherwise writes every body as
dark and says (a warning) what is lost. The writers' users keep them too: `simulate --out`, its series."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from conftest import shared_file
from test_components import write_tipsy_sections

from app.cli import main
from app.core.errors import InputFileError
from app.model import components, formats, ics
from app.model.bodies import Bodies
from app.model.components import BONSAI_BULGE_ID, BONSAI_DARK_ID, Components
from app.scene import load_scene, make_bodies


def _bodies(n: int, comp: Components | None, ids=None, seed: int = 11) -> Bodies:
    """float32-exact values (Tipsy stores float32), so every format can round-trip them bitwise."""
    rng = np.random.default_rng(seed)
    pos, vel = rng.normal(size=(n, 3)), rng.normal(size=(n, 3)) * 0.1
    mass = rng.uniform(0.5, 1.0, n) / n
    pos, vel, mass = (a.astype(np.float32).astype(np.float64) for a in (pos, vel, mass))
    return Bodies.from_arrays(pos, vel, mass, time=0.75, ids=ids, components=comp)


def _same_bodies(a: Bodies, b: Bodies) -> None:
    """The same bodies in the same order (each body's component too when `a` has components)."""
    for field in ("pos", "vel", "mass"):
        assert getattr(a, field).tobytes() == getattr(b, field).tobytes(), field
    assert a.time == b.time
    assert (a.ids is None) == (b.ids is None) and (a.ids is None or np.array_equal(a.ids, b.ids))


def _same_components(a: Components | None, b: Components | None) -> None:
    assert components.same(a, b), (a and a.describe(), b and b.describe())


# ------------------------------------------------------------------------------------------ npz, csv


@pytest.mark.parametrize("ext", ["npz", "csv"])
@pytest.mark.parametrize("ids", [False, True])
def test_npz_and_csv_keep_any_components_in_body_order(tmp_path, ext, ids):
    rng = np.random.default_rng(5)
    n = 300
    # interleaved rows (not blocks), names a CSV or JSON parser could trip on, and an empty component
    names = ("disk, thin", 'bulge "classic"', "halo # dark", "unused", "other")
    index = rng.choice([0, 1, 2, 4], size=n)
    comp = Components(names, index)
    b = _bodies(n, comp, ids=rng.permutation(n) + 7 if ids else None)
    path = tmp_path / f"s.{ext}"
    formats.write(path, b)
    back = formats.read(path)
    _same_bodies(b, back)
    _same_components(comp, back.components)
    assert back.components.names == names  # the empty one too: its index still means the same part


def test_csv_component_column_and_names_comment(tmp_path):
    b = ics.generate("disk", 40, 3)  # bulge, disk, halo
    path = tmp_path / "d.csv"
    formats.write(path, b)
    lines = path.read_text().splitlines()
    assert lines[0] == '# component_names = ["bulge", "disk", "halo"]'
    assert lines[1] == "m,x,y,z,vx,vy,vz,component"
    assert [int(line.rsplit(",", 1)[1]) for line in lines[2:]] == b.components.index.tolist()
    # a hand-made table: the column without names gives the indices as names
    path.write_text("m,x,y,z,vx,vy,vz,component\n1,0,0,0,0,0,0,1\n1,1,0,0,0,0,0,0\n1,2,0,0,0,0,0,1\n")
    back = formats.read(path)
    assert back.components.names == ("0", "1") and back.components.index.tolist() == [1, 0, 1]
    plain = Bodies.from_arrays(b.pos, b.vel, b.mass)
    formats.write(path, plain)
    assert "component" not in path.read_text() and formats.read(path).components is None


@pytest.mark.parametrize(
    "text, words",
    [
        (
            '# component_names = ["a", "b"]\nm,x,y,z,vx,vy,vz,component\n1,0,0,0,0,0,0,0\n1,0,0,0,0,0,0,2\n',
            ("line 4", "component 2", "2 component_names"),
        ),
        (
            "# component_names = disk, halo\nm,x,y,z,vx,vy,vz,component\n1,0,0,0,0,0,0,0\n",
            ("line 1", "JSON list"),
        ),
        ('# component_names = ["a"]\nm,x,y,z,vx,vy,vz\n1,0,0,0,0,0,0\n', ("no component column",)),
        ("m,x,y,z,vx,vy,vz,component\n1,0,0,0,0,0,0,0.5\n", ("line 2", "component", "not an integer")),
        ("m,x,y,z,vx,vy,vz,component\n1,0,0,0,0,0,0,16\n", ("line 2", "component 16", "0 to 15")),
        ('# component_names = ["a", "a"]\nm,x,y,z,vx,vy,vz,component\n1,0,0,0,0,0,0,0\n', ("must differ",)),
    ],
)
def test_bad_csv_components_name_the_line(tmp_path, text, words):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(InputFileError) as e:
        formats.read(path)
    assert str(path) in str(e.value) and all(w in str(e.value) for w in words), str(e.value)


# ----------------------------------------------------------------------------------------------- Tipsy


def _header(path):
    h = formats.read_tipsy_header(path)
    return h.nsph, h.ndark, h.nstar


def test_tipsy_sections_round_trip_as_sections(tmp_path, caplog):
    src = tmp_path / "three.tipsy"
    write_tipsy_sections(src, {"gas": 30, "dark": 50, "star": 20})
    b = formats.read(src)
    path = tmp_path / "again.tipsy"
    with caplog.at_level(logging.WARNING, logger=formats.log.name):
        formats.write(path, b)
    assert not caplog.records
    assert _header(path) == (30, 50, 20)
    back = formats.read(path)
    _same_bodies(b, back)
    _same_components(b.components, back.components)


def test_tipsy_keeps_bonsai_parts_through_their_ids(tmp_path, caplog):
    n_halo, n_disk, n_bulge = 40, 25, 15
    ids = np.concatenate(
        [BONSAI_DARK_ID + np.arange(n_halo), np.arange(n_disk), BONSAI_BULGE_ID + np.arange(n_bulge)]
    )
    comp = components.from_tipsy([], ids)
    assert comp.names == ("halo", "disk", "bulge")
    b = _bodies(ids.size, comp, ids=ids)
    path = tmp_path / "bonsai.tipsy"
    with caplog.at_level(logging.WARNING, logger=formats.log.name):
        formats.write(path, b)
    assert not caplog.records
    assert _header(path) == (0, n_halo, n_disk + n_bulge)  # the halo dark, disk and bulge stars
    back = formats.read(path)
    _same_bodies(b, back)
    _same_components(comp, back.components)


def test_bonsai_file_rewritten_keeps_its_sections_and_parts(tmp_path):
    original = formats.read(shared_file("bonsai_model3_child_compact.tipsy"))
    path = tmp_path / "copy.tipsy"
    formats.write(path, original)
    assert _header(path) == _header(shared_file("bonsai_model3_child_compact.tipsy"))
    back = formats.read(path)
    _same_bodies(original, back)
    _same_components(original.components, back.components)


def test_tipsy_names_of_parts_become_section_names_with_a_warning(tmp_path, caplog):
    comp = Components(("halo", "disk"), np.repeat([0, 1], [30, 20]))  # e.g. [[components]] of a text file
    b = _bodies(50, comp)
    path = tmp_path / "parts.tipsy"
    with caplog.at_level(logging.WARNING, logger=formats.log.name):
        formats.write(path, b)
    assert "reads back as dark 30, star 20, not halo 30, disk 20" in caplog.text
    assert ".npz or .csv" in caplog.text
    back = formats.read(path)
    _same_bodies(b, back)
    assert back.components.names == ("dark", "star")
    assert np.array_equal(back.components.index, comp.index)  # the parts kept, their names not


@pytest.mark.parametrize(
    "comp, why",
    [
        (
            ics.generate("collision", 60, 2).components,
            "galaxy1-bulge, galaxy1-disk, galaxy1-halo, galaxy2-bulge, galaxy2-disk, galaxy2-halo "
            "names none of them",
        ),
        (Components(("star", "dark"), np.repeat([0, 1], [20, 40])), "in another order"),
        (Components(("gas", "dark"), np.array([0, 1] * 30)), "in another order"),
    ],
)
def test_tipsy_that_cannot_keep_the_components_writes_dark_and_says_so(tmp_path, caplog, comp, why):
    b = _bodies(comp.n, comp)
    path = tmp_path / "lost.tipsy"
    with caplog.at_level(logging.WARNING, logger=formats.log.name):
        formats.write(path, b)
    assert why in caplog.text and "every body is written as dark" in caplog.text, caplog.text
    assert _header(path) == (0, comp.n, 0)
    back = formats.read(path)
    _same_bodies(b, back)  # the original body order all the same
    assert back.components is None


# ------------------------------------------------------------------------------- the writers' users


@pytest.mark.parametrize("ext", ["npz", "csv", "tipsy"])
def test_simulate_writes_the_components_in_every_format(tmp_path, ext):
    """Disk: bulge, disk, halo (star, star, dark in Tipsy); the final snapshot and the series keep them."""
    out = tmp_path / f"final.{ext}"
    assert (
        main(
            [
                "simulate",
                "disk",
                "--n",
                "120",
                "--steps",
                "4",
                "--backend",
                "cpu",
                "--no-progress",
                "--snapshot-every",
                "2",
                "--out-dir",
                str(tmp_path / "series"),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    start = make_bodies(load_scene("disk", {"initial.n": 120}))
    got = formats.read(out).components
    if ext == "tipsy":  # the halo (dark) after the stars: no section order keeps the rows, so all dark
        assert got is None and _header(out) == (0, 120, 0)
    else:
        _same_components(start.components, got)
    for snap in sorted((tmp_path / "series").glob("snap_*.npz")):
        _same_components(start.components, formats.read(snap).components)
