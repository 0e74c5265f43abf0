"""Scene loading: presets, precedence (defaults < file < flags), validation naming keys and ranges."""

import pytest

from app.core.errors import ConfigError
from app.scene import load_scene, make_bodies, preset_names

EXPECTED_PRESETS = {"plummer", "disk", "collision", "cube", "shell", "expand"}


def test_every_preset_loads_and_is_deterministic():
    assert set(preset_names()) >= EXPECTED_PRESETS
    for name in preset_names():
        scene = load_scene(name, {"initial.n": 256})
        a, b = make_bodies(scene), make_bodies(scene)
        assert a.n == 256
        assert (a.pos == b.pos).all() and (a.vel == b.vel).all()
        assert scene.description, f"preset {name} needs a description"


def test_precedence_file_then_overrides(tmp_path):
    f = tmp_path / "s.toml"
    f.write_text('[physics]\ndt = 0.005\nsoftening = 0.1\n[initial]\ngenerator = "cube"\nn = 100\n')
    s = load_scene(str(f), {"physics.dt": "0.002"})
    assert s.physics.dt == 0.002 and s.physics.softening == 0.1 and s.initial.n == 100
    assert s.initial.generator == "cube"


@pytest.mark.parametrize(
    "key,value,words",
    [
        ("physics.dt", 0, ["physics.dt", "> 0"]),
        ("physics.softening", -1, ["physics.softening", ">= 0"]),
        ("camera.elevation", 91, ["camera.elevation", "<= 90"]),
        ("camera.target", "1,2", ["camera.target", "three numbers"]),
        ("render.colormap", "jet", ["render.colormap", "inferno"]),
        ("run.steps_per_frame", 2.5, ["run.steps_per_frame", "whole number"]),
        ("physics.G", "nan", ["physics.G", "finite"]),
    ],
)
def test_invalid_values_name_key_and_range(key, value, words):
    with pytest.raises(ConfigError) as e:
        load_scene("plummer", {key: value})
    for w in words:
        assert w in str(e.value)


def test_generator_parameter_is_checked_by_the_generator():
    with pytest.raises(ConfigError) as e:
        load_scene("plummer", {"initial.no_such_param": 1})
    assert "initial.no_such_param" in str(e.value)


def test_file_and_generator_params_conflict(tmp_path):
    f = tmp_path / "s.npz"
    f.write_bytes(b"")
    with pytest.raises(ConfigError):
        load_scene("plummer", {"initial.file": str(f), "initial.generator": None, "initial.scale": 2.0})


def test_the_settings_table_and_the_scene_dataclasses_agree():
    """app/model/config.py's SCHEMA describes every scene setting once; app/scene.py's dataclasses hold them.
    Every key has a field and every field a key (except the two that are not keys of the table: generator
    parameters, checked by their generator, and [[components]] tables), and each default passes its own key's
    validation unchanged (its type and range are the table's)."""
    from dataclasses import fields, is_dataclass

    from app.model import config
    from app.scene import Scene

    not_keys = {("initial", "params"), ("scene", "components")}
    scene = Scene()
    sections = {f.name for f in fields(scene) if is_dataclass(getattr(scene, f.name))}
    assert set(config.SCHEMA) == {"scene"} | sections
    for section, keys in config.SCHEMA.items():
        holder = scene if section == "scene" else getattr(scene, section)
        names = {f.name for f in fields(holder)} - (sections if section == "scene" else set())
        assert names - set(keys) == {n for s, n in not_keys if s == section}, section
        assert set(keys) <= names, (section, set(keys) - names)
        for name, field in keys.items():
            default = getattr(holder, name)
            if (default is None and field.optional) or (field.kind in ("keys", "components") and not default):
                continue  # (unset: nothing to validate)
            assert config.coerce(f"{section}.{name}", default, field) == default, f"{section}.{name}"


def test_a_scene_file_carries_the_kernels_tunables(tmp_path, capsys):
    """[run.tunables] in a scene file reaches the backend; --tunable and --set run.tunables.NAME add to it
    (the command line over the file); the kernel's record validates the values once the run is assembled,
    naming record.key, before any work."""
    from app.cli import build_parser, main
    from app.commands.assembly import make_backend, scene_from_args

    path = tmp_path / "tree.toml"
    path.write_text(
        '[initial]\ngenerator = "plummer"\nn = 512\n[run]\nbackend = "cpu"\nkernel = "cpu-tree"\n'
        '[run.tunables]\ntheta = 0.9\nopening = "bmax"\n'
    )
    args = build_parser().parse_args(
        [
            "simulate",
            str(path),
            "--steps",
            "1",
            "--out",
            str(tmp_path / "o.npz"),
            "--tunable",
            "leaf=32",
            "--set",
            "run.tunables.theta=0.7",
        ]
    )
    scene = scene_from_args(args)
    assert scene.run.tunables == {"theta": 0.7, "opening": "bmax", "leaf": 32}
    backend = make_backend(scene)
    try:
        assert {k: backend.tunables()[k] for k in ("theta", "opening", "leaf")} == scene.run.tunables
    finally:
        backend.close()
    path.write_text(path.read_text().replace("theta = 0.9", "theta = 9.0"))
    assert main(["simulate", str(path), "--steps", "1", "--out", str(tmp_path / "bad.npz")]) == 2
    assert "cpu-tree.theta" in capsys.readouterr().err and not (tmp_path / "bad.npz").exists()
    path.write_text(path.read_text().replace("theta = 9.0", "theta = [0.5, 0.6]"))
    assert main(["simulate", str(path), "--steps", "1", "--out", str(tmp_path / "bad.npz")]) == 2
    assert "run.tunables.theta = [0.5, 0.6]: expected a number or text" in capsys.readouterr().err
