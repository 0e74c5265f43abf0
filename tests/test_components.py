"""Components without GL: where they come from (Tipsy sections, Bonsai IDs, generators, a scene's
[[components]] tables), the render.components keys (TOML, --set, patterns, errors), what keeps them
(npz, subsample), and the arithmetic of the free view area and the lens shift."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import shared_file

from app.core.errors import ConfigError
from app.model import components, formats, ics
from app.model.bodies import Bodies
from app.render import view_area
from app.render.camera import OrbitCamera
from app.scene import load_scene, make_bodies, subsample

_FIELDS = {
    "gas": ("mass", "x", "y", "z", "vx", "vy", "vz", "rho", "temp", "hsmooth", "metals", "phi"),
    "dark": ("mass", "x", "y", "z", "vx", "vy", "vz", "eps", "phi"),
    "star": ("mass", "x", "y", "z", "vx", "vy", "vz", "metals", "tform", "eps", "phi"),
}


def write_tipsy_sections(path, counts: dict[str, int], seed: int = 3) -> None:
    """A standard (big-endian) Tipsy file with the given gas / dark / star counts, written here by hand
    (not by app.model.formats, whose writer puts every body in the dark section); phi = 0: no IDs."""
    rng = np.random.default_rng(seed)
    n = sum(counts.values())
    header = np.zeros(
        1,
        dtype=[
            ("time", ">f8"),
            ("nbodies", ">i4"),
            ("ndim", ">i4"),
            ("nsph", ">i4"),
            ("ndark", ">i4"),
            ("nstar", ">i4"),
            ("pad", ">i4"),
        ],
    )
    header[0] = (0.5, n, 3, counts["gas"], counts["dark"], counts["star"], 0)
    parts = [header.tobytes()]
    for name in ("gas", "dark", "star"):
        rec = np.zeros(counts[name], dtype=[(f, ">f4") for f in _FIELDS[name]])
        rec["mass"] = 1.0 / n
        for f in ("x", "y", "z", "vx", "vy", "vz"):
            rec[f] = rng.normal(size=counts[name])
        parts.append(rec.tobytes())
    path.write_bytes(b"".join(parts))


def test_tipsy_with_three_sections_gives_three_components(tmp_path):
    path = tmp_path / "three.tipsy"
    write_tipsy_sections(path, {"gas": 3, "dark": 5, "star": 2})
    b = formats.read(path)
    assert b.ids is None
    assert b.components.names == ("gas", "dark", "star")
    assert b.components.index.tolist() == [0] * 3 + [1] * 5 + [2] * 2
    write_tipsy_sections(path, {"gas": 0, "dark": 5, "star": 2})  # an empty section is no component
    assert formats.read(path).components.names == ("dark", "star")
    write_tipsy_sections(path, {"gas": 0, "dark": 5, "star": 0})  # one section: nothing to tell apart
    assert formats.read(path).components is None


def test_bonsai_id_ranges_name_the_halo_and_the_bulge():
    b = formats.read(shared_file("bonsai_model3_child_compact.tipsy"))
    assert b.components.names == ("halo", "bulge")
    assert b.components.counts().tolist() == [20000, 2000]
    assert (b.components.index[b.ids >= components.BONSAI_DARK_ID] == 0).all()


def test_bonsai_ids_beat_sections():
    ids = np.array([5, 6, 100_000_001, 200_000_000, 200_000_001])
    c = components.from_tipsy([("dark", 3), ("star", 2)], ids)
    assert c.names == ("disk", "bulge", "halo") and c.index.tolist() == [0, 0, 1, 2, 2]
    # IDs that all fall in one range say nothing: the sections decide
    assert components.from_tipsy([("dark", 3), ("star", 2)], np.arange(5)).names == ("dark", "star")


def test_generators_give_their_parts():
    disk = ics.generate("disk", 1000, 1, {"bulge_bodies": 0.3, "halo_bodies": 0.4})
    assert disk.components.names == ("bulge", "disk", "halo")
    assert disk.components.counts().tolist() == [300, 300, 400]
    # the bulge is the compact part, the halo the extended one
    r = np.linalg.norm(disk.pos, axis=1)
    bulge, part, halo = (np.median(r[disk.components.rows(k)]) for k in ("bulge", "disk", "halo"))
    assert bulge < 0.5 * part and halo > 2.0 * part
    col = ics.generate("collision", 2000, 1)
    names = ("bulge", "disk", "halo")
    assert col.components.names == tuple(f"galaxy{k}-{p}" for k in (1, 2) for p in names)
    n1, _ = ics.collision_split(2000, 1.0)
    assert col.components.counts()[:3].sum() == n1
    g1 = col.components.index < 3  # on opposite sides of the centre of mass (the Kepler orbit's x-y plane)
    centre1, centre2 = (np.average(col.pos[g], axis=0, weights=col.mass[g]) for g in (g1, ~g1))
    assert centre1 @ centre2 < 0 and np.linalg.norm(centre1 - centre2) == pytest.approx(6.0)  # separation
    assert ics.generate("disk", 100, 1, {"bulge_mass": 0.0}).components.names == ("disk", "halo")
    assert ics.generate("disk", 100, 1, {"bulge_mass": 0.0, "halo_mass": 0.0}).components is None
    assert ics.generate("plummer", 100, 1).components is None


def test_scene_components_table_names_row_ranges_of_a_text_file(tmp_path):
    rng = np.random.default_rng(1)
    rows = np.column_stack([np.full(10, 0.1), rng.normal(size=(10, 6))])
    np.savetxt(tmp_path / "m.nemo", rows)
    toml = tmp_path / "s.toml"
    toml.write_text(
        '[initial]\nfile = "m.nemo"\n\n[[components]]\nname = "core"\nrows = [0, 4]\n\n'
        '[[components]]\nname = "ring"\nrows = [6, 10]\n\n'
        "[render.components.ring]\nvisible = false\ncolor = [1.0, 0.0, 0.0]\n"
    )
    scene = load_scene(str(toml))
    b = make_bodies(scene)
    assert b.components.names == ("core", "ring", "other")
    assert b.components.index.tolist() == [0, 0, 0, 0, 2, 2, 1, 1, 1, 1]
    drawn = {d.name: d for d in components.drawn(b.components, scene.render.components)}
    assert not drawn["ring"].visible and drawn["ring"].color == (1.0, 0.0, 0.0) and drawn["core"].visible


@pytest.mark.parametrize(
    "tables, words",
    [
        ('[[components]]\nname = "a"\nrows = [0, 40]\n', ("components[0]", "only 10 bodies")),
        (
            '[[components]]\nname = "a"\nrows = [0, 5]\n[[components]]\nname = "b"\nrows = [4, 8]\n',
            ("components[1]", "overlap", "'a'"),
        ),
        ('[[components]]\nname = "a"\nrows = [5, 2]\n', ("components[0].rows", "first < end")),
        ('[[components]]\nname = "a"\nrow = [0, 2]\n', ("unknown key 'row'",)),
    ],
)
def test_bad_components_tables_say_which(tmp_path, tables, words):
    np.savetxt(tmp_path / "m.nemo", np.column_stack([np.full(10, 0.1), np.ones((10, 6))]))
    toml = tmp_path / "s.toml"
    toml.write_text('[initial]\nfile = "m.nemo"\n' + tables)
    with pytest.raises(ConfigError) as e:
        make_bodies(load_scene(str(toml)))
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_render_component_keys_from_toml_and_set_patterns_and_order(tmp_path):
    toml = tmp_path / "s.toml"
    toml.write_text(
        '[initial]\ngenerator = "collision"\nn = 200\n\n[render.components."*"]\n'
        "brightness = 0.5\n\n[render.components.galaxy1-disk]\nvisible = false\n"
    )
    scene = load_scene(
        str(toml), {"render.components.galaxy2-*.color": "0,1,0", "render.components.4.brightness": "2"}
    )
    comp = make_bodies(scene).components
    d = {x.name: x for x in components.drawn(comp, scene.render.components)}
    assert d["galaxy1-bulge"].brightness == 0.5 and d["galaxy1-bulge"].visible
    assert not d["galaxy1-disk"].visible and d["galaxy1-disk"].gain == 0.0
    assert d["galaxy2-bulge"].color == (0.0, 1.0, 0.0) and d["galaxy2-bulge"].brightness == 0.5
    assert d["galaxy2-disk"].brightness == 2.0  # by index (4: after galaxy1's three), set after the pattern
    assert d["galaxy1-halo"].brightness == 0.5 and d["galaxy2-halo"].color == (0.0, 1.0, 0.0)
    # a key set again moves to the end: it wins over a pattern set after it the first time
    styles = components.set_style(scene.render.components, "components.*.brightness", 0.25)
    styles = components.set_style(styles, "components.galaxy1-bulge.brightness", 3.0)
    assert {x.name: x.brightness for x in components.drawn(comp, styles)}["galaxy1-bulge"] == 3.0


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("render.components.halo.brightness", "-1", ("render.components.halo.brightness", "out of range")),
        ("render.components.halo.visible", "maybe", ("render.components.halo.visible", "true or false")),
        ("render.components.halo.color", "1,2", ("render.components.halo.color", "three numbers")),
        ("render.components.halo", "1", ("render.components.halo", "visible")),
    ],
)
def test_bad_render_component_keys_name_the_key(key, value, words):
    with pytest.raises(ConfigError) as e:
        load_scene("plummer", {key: value})
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_set_reaches_component_keys_through_the_cli_parser():
    import argparse

    from app.commands.assembly import scene_from_args
    from app.commands.options import add_scene_options

    p = argparse.ArgumentParser()
    add_scene_options(p)
    args = p.parse_args(
        ["disk", "--set", "render.components.bulge.visible=false", "--set", "render.color_by=component-speed"]
    )
    scene = scene_from_args(args)
    assert scene.render.color_by == "component-speed"
    assert scene.render.components["bulge"].visible is False


def test_npz_and_subsample_keep_components(tmp_path):
    b = ics.generate("collision", 300, 2)
    formats.write(tmp_path / "s.npz", b)
    back = formats.read(tmp_path / "s.npz")
    assert back.components.names == b.components.names
    assert np.array_equal(back.components.index, b.components.index)
    sub = subsample(b, 100, 5)
    rows = np.sort(np.random.default_rng(5).choice(300, size=100, replace=False))
    assert np.array_equal(sub.components.index, b.components.index[rows])
    plain = Bodies.from_arrays(b.pos, b.vel, b.mass)
    formats.write(tmp_path / "p.npz", plain)
    assert formats.read(tmp_path / "p.npz").components is None


def test_components_limits():
    with pytest.raises(ConfigError, match="at most|between 1 and"):
        components.Components(
            tuple(f"c{i}" for i in range(components.MAX_COMPONENTS + 1)), np.zeros(3, np.uint8)
        )
    with pytest.raises(ConfigError, match="differ"):
        components.Components(("a", "a"), np.zeros(3, np.uint8))


def test_free_span_and_lens_shift():
    assert view_area.free_span(1000, []) == (0.0, 1000.0)
    assert view_area.free_span(1000, [None]) == (0.0, 1000.0)
    assert view_area.free_span(1000, [(8, 8, 448, 700)]) == (448.0, 1000.0)
    assert view_area.free_span(1000, [(600, 0, 1000, 700)]) == (0.0, 600.0)  # a panel moved right
    assert view_area.free_span(1000, [(0, 0, 950, 700)]) == (0.0, 1000.0)  # nearly all covered: ignored
    assert view_area.lens_shift((448.0, 1000.0), 1000) == pytest.approx(0.448)
    assert view_area.lens_shift((0.0, 1000.0), 1000) == 0.0


@pytest.mark.parametrize("shift", [0.0, 0.448, -0.3])
def test_lens_shift_moves_the_target_and_keeps_the_scale(shift):
    cam = OrbitCamera(azimuth=40, elevation=25, distance=7.0, target=np.array([0.5, -1.0, 0.25]))
    size = (1000, 600)
    x, y = cam.project(cam.target, size, shift)
    assert x == pytest.approx((1 + shift) / 2 * size[0]) and y == pytest.approx(size[1] / 2)
    right, _ = cam.basis()
    d0 = cam.project(cam.target + right, size) - cam.project(cam.target, size)
    d1 = cam.project(cam.target + right, size, shift) - cam.project(cam.target, size, shift)
    assert d1 == pytest.approx(d0)  # a slide, not a zoom
