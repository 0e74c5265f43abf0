"""Issue 27, item 1: the user's own kernel files. `new-kernel` writes a starter that parses into a record
like the built-ins (tests/test_registry.py walks it with them); a header with a problem is one line naming
the file and the key, exit status 2; --kernel-file and --kernel-dir add the kernels to every command's
registry, and `info --kernels` marks them as the user's. Compiling the starter needs nvcc (skipped
without); running, validating and benching it beside `shared` needs a GPU (the gpu test at the end).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import needs_nvcc

from app.backends.cuda import registry, user_kernels
from app.cli import main
from app.core.errors import ConfigError


@pytest.fixture(autouse=True)
def builtins_only(monkeypatch):
    """Whatever a test loads into the registry is gone after it."""
    monkeypatch.setattr(registry, "RECORDS", registry.RECORDS)


def starter(tmp_path, name="mine", base="shared"):
    path = tmp_path / f"{name}.cu"
    rc = main(["new-kernel", name, "--from", base, "--out", str(path)])
    assert rc == 0 and path.is_file()
    return path


def with_header(tmp_path, header: str, name="k.cu", body="NBODY_FORCE_ENTRIES(my_force, my_force)\n"):
    path = tmp_path / name
    path.write_text(f'/* nbody-live kernel\n{header}\n*/\n#include "common.cuh"\n{body}')
    return path


GOOD = 'name = "mine"\ndoc = "one line"\nentry = "my_force"\npolicy = "grid"'


def test_new_kernel_writes_a_starter_that_is_a_record_like_the_builtins(tmp_path, capsys):
    path = starter(tmp_path, "my-kernel", "shared-unroll")
    assert f"wrote {path}" in capsys.readouterr().out
    rec = user_kernels.user_record(path)
    base = {r.name: r for r in registry.RECORDS}["shared-unroll"]
    assert (rec.name, rec.entry, rec.backend, rec.precision) == (
        "my-kernel",
        "my_kernel_force",
        "cuda",
        "fp32",
    )
    assert rec.source == str(path.resolve()) and user_kernels.is_user(rec) and not user_kernels.is_user(base)
    assert rec.policy.shared_bytes_per_thread == base.policy.shared_bytes_per_thread == 16
    assert rec.default_tunables() == {"block_size": 256} and rec.error_budget.max_rel == 1e-4
    assert rec.policy.symbols(rec) == [
        f"my_kernel_force_{f}" for f in ("gravity_plain", "gravity_soft", "repulsion_plain", "repulsion_soft")
    ]
    text = path.read_text()
    assert "shared_unroll_force" not in text and text.count("my_kernel_force") >= 2  # the entry renamed


def test_new_kernel_refuses_to_overwrite_a_clash_or_another_policy(tmp_path, capsys):
    path = starter(tmp_path)
    capsys.readouterr()
    for argv, said in (
        (["new-kernel", "mine", "--out", str(path)], "does not overwrite"),
        (["new-kernel", "shared", "--out", str(tmp_path / "s.cu")], "a built-in has that name"),
        (["new-kernel", "x", "--from", "register-blocked", "--out", str(tmp_path / "x.cu")], "policy 'grid'"),
        (["new-kernel", "x", "--from", "nope", "--out", str(tmp_path / "y.cu")], "not a CUDA kernel"),
        (["new-kernel", "Bad_Name", "--out", str(tmp_path / "z.cu")], "lower-case letters"),
        (["new-kernel", "x", "--out", str(tmp_path / "x.txt")], "must end in .cu"),
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0], err


@pytest.mark.parametrize(
    "header, said",
    [
        (None, "no kernel header"),
        ("name = ", "the kernel header is not TOML"),
        (GOOD + '\ncolour = "red"', "unknown header key 'colour'"),
        (GOOD + "\ntile = 1", "header key 'tile' = 1 must be a bool"),
        ('name = "mine"\ndoc = "x"\npolicy = "grid"', "the kernel header lacks entry"),
        (GOOD.replace('"mine"', '"My Kernel"'), "name 'My Kernel': lower-case letters"),
        (GOOD.replace('"my_force"', '"my-force"'), "entry 'my-force' is not a C identifier"),
        (
            GOOD.replace('"grid"', '"multi-thread"'),
            "policy 'multi-thread' is not offered to kernel files yet",
        ),
        (GOOD.replace('"grid"', '"magic"'), "policy 'magic': choose from grid"),
        (GOOD + '\nprecision = "fp64"', "precision 'fp64': kernel files are fp32"),
        (GOOD + "\nblock_sizes = [64, 100]", "block_sizes [64, 100]: powers of two"),
        (GOOD + "\nblock_sizes = [64, 128]\nblock_size = 256", "block_size 256 is not one of"),
        (GOOD + "\nbudget_max = 2.0", "budget_max 2.0 must be in (0, 1)"),
        (GOOD.replace('"mine"', '"shared"'), "name 'shared' is taken (by shared.cu)"),
        (GOOD.replace('"mine"', '"cpu-simd"'), "name 'cpu-simd' is taken"),
    ],
)
def test_a_bad_header_is_one_line_naming_the_file_and_the_key(tmp_path, capsys, header, said):
    if header is None:
        path = tmp_path / "k.cu"
        path.write_text('#include "common.cuh"\nNBODY_FORCE_ENTRIES(my_force, my_force)\n')
    else:
        path = with_header(tmp_path, header)
    rc = main(["info", "--kernels", "--no-gl", "--kernel-file", str(path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and str(path) in err[0] and said in err[0], err


def test_a_file_without_its_entries_or_two_files_of_one_name_are_refused(tmp_path, capsys):
    bare = with_header(tmp_path, GOOD, body="// nothing defined\n")
    with pytest.raises(ConfigError, match="no NBODY_FORCE_ENTRIES"):
        user_kernels.user_record(bare)
    a = with_header(tmp_path, GOOD, "a.cu")
    b = with_header(tmp_path, GOOD, "b.cu")
    rc = main(["info", "--kernels", "--no-gl", "--kernel-file", str(a), "--kernel-file", str(b)])
    err = capsys.readouterr().err
    assert rc == 2 and f"{b}: name 'mine' is taken (by {a})" in err


def test_kernel_files_join_every_command_and_info_marks_them(tmp_path, capsys):
    folder = tmp_path / "mine"
    folder.mkdir()
    starter(folder, "first")
    starter(folder, "second", "naive")
    (folder / "helper.cu").write_text("// a file without a header: not a kernel\n")
    capsys.readouterr()
    assert main(["info", "--kernels", "--no-gl", "--kernel-dir", str(folder)]) == 0
    out = capsys.readouterr().out
    for name in ("first", "second"):
        assert f"  {name} " in out and f"yours: {(folder / name).with_suffix('.cu').resolve()}" in out
    assert "helper" not in out
    names = [r.name for r in registry.RECORDS]
    assert names[-2:] == ["first", "second"] and len(names) == len(set(names))
    assert main(["info", "--kernels", "--no-gl", "--kernel-dir", str(folder)]) == 0  # again, in one process
    assert [r.name for r in registry.RECORDS] == names  # the same files: read again, not a clash
    assert [p.name for p in user_kernels.kernel_files([folder / "first.cu"], [folder])] == [
        "first.cu",
        "second.cu",
    ]


@pytest.mark.parametrize("command", ["run", "record", "simulate", "validate", "bench", "tune", "info"])
def test_every_command_that_runs_kernels_takes_kernel_files(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    assert "--kernel-file PATH.cu" in out and "--kernel-dir DIR" in out


STARTER_BASES = ("naive", "shared", "shared-unroll", "shared-ptx-fma", "gpu5-branchy", "warp-shuffle")


def test_the_starter_bases_are_every_grid_builtin():
    """docs/writing-kernels.md names these as --from's choices: every fp32 built-in of the plain grid for
    any N."""
    bases = [r.name for r in registry.RECORDS if user_kernels.is_starter_base(r)]
    assert sorted(bases) == sorted(STARTER_BASES)


@needs_nvcc
@pytest.mark.parametrize("base", STARTER_BASES)
def test_the_starter_compiles_with_every_entry_its_record_launches(tmp_path, monkeypatch, base):
    from app.backends.cuda.compile import compile_file

    monkeypatch.setenv("NBODY_CACHE_DIR", str(tmp_path / "cache"))
    path = starter(tmp_path, "compiled", base)
    rec = user_kernels.user_record(path)
    module = compile_file(path, "sm_90", rec.policy.nvcc_options)
    assert set(rec.policy.symbols(rec)) <= set(module.functions), sorted(module.functions)
    assert not module.problems(), module.problems()  # no register spills or stack frames


@pytest.mark.gpu
def test_a_kernel_file_runs_validates_and_benches_beside_the_builtins(tmp_path, capsys):
    """On the GPU: the starter is loaded, its accelerations agree with float64 within its budget through
    validate, and bench gives it a row beside `shared`'s."""
    import json

    from app.backends import backend_class

    if backend_class("cuda").why_not():
        pytest.skip(backend_class("cuda").why_not())
    path = starter(tmp_path, "on-gpu")
    rc = main(["validate", "--kernel-file", str(path), "--kernel", "on-gpu", "--n", "4096"])
    out = capsys.readouterr().out
    assert rc == 0, out
    out_json = tmp_path / "b.json"
    argv = [
        "bench",
        "--kernel-file",
        str(path),
        "--kernels",
        "on-gpu,shared",
        "--n",
        "65536",
        "--no-progress",
    ]
    assert main([*argv, "--json", str(out_json)]) == 0
    rows = {r["kernel"]: r for r in json.loads(out_json.read_text())["results"]}
    assert rows["on-gpu"]["status"] == "ok" and rows["shared"]["status"] == "ok"
    ratio = rows["on-gpu"]["median_ms"] / rows["shared"]["median_ms"]
    assert np.isfinite(ratio) and 0.5 < ratio < 2.0  # the same tiled body, built with the default options


def test_a_scene_names_its_kernel_files_relative_to_itself(tmp_path, capsys):
    """`[run] kernel_files = [...]`: the scene's own kernels, found beside the scene file wherever it is
    run from, loaded before its `run.kernel` is looked up; a bad one is one line naming the file."""
    from app.scene import load_scene

    folder = tmp_path / "scene"
    folder.mkdir()
    starter(folder, "scene-kernel")
    scene_file = folder / "mine.toml"
    scene_file.write_text(
        '[initial]\ngenerator = "plummer"\nn = 512\n[run]\nkernel_files = ["scene-kernel.cu"]\n'
        'kernel = "scene-kernel"\n'
    )
    scene = load_scene(str(scene_file))
    assert scene.run.kernel_files == (str(folder / "scene-kernel.cu"),)
    assert "scene-kernel" in [r.name for r in registry.RECORDS]
    scene_file.write_text('[initial]\ngenerator = "plummer"\n[run]\nkernel_files = ["nope.cu"]\n')
    rc = main(["simulate", str(scene_file), "--steps", "1", "--out", str(tmp_path / "o.npz")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and f"{folder / 'nope.cu'}: no such file" in err[0], err
    rc = main(
        [
            "simulate",
            "plummer",
            "--set",
            "run.kernel_files=3",
            "--steps",
            "1",
            "--out",
            str(tmp_path / "o.npz"),
        ]
    )
    assert rc == 2  # a path that is no kernel file: its own one line


@needs_nvcc
def test_the_hot_reload_build_compiles_a_save_or_says_its_first_error(tmp_path, monkeypatch):
    """The build Reloader runs on its worker for a saved kernel file (issue 27, item 2), by nvcc here
    (NVRTC where cuda-core imports, on the GPU machine): a good file is its record and the one form the
    physics launches; a compile error is one line with the file, the line and the count of the rest; a
    header broken by the edit is its header line, and a new name is refused."""
    from app.backends.cuda.reload_build import build
    from app.engine.kernel_reload import BuildError
    from app.model.physics import Physics

    monkeypatch.setenv("NBODY_CACHE_DIR", str(tmp_path / "cache"))
    path = starter(tmp_path, "reloaded")
    built = build(path, "sm_90", Physics(softening=0.01), "reloaded", compiler="nvcc")
    assert built.record.name == "reloaded" and built.symbols == ("reloaded_force_gravity_soft",)
    assert (
        b"reloaded_force_gravity_soft" in built.build.cubin
        and b"reloaded_force_gravity_plain" not in built.build.cubin
    )
    plain = build(path, "sm_90", Physics(softening=0.0), compiler="nvcc")
    assert plain.symbols == ("reloaded_force_gravity_plain",) and plain.build.form == 1
    text = path.read_text()
    path.write_text(text.replace("extern __shared__ float4 tile[];", "extern __shared__ float4 tile[]"))
    with pytest.raises(BuildError) as broken:
        build(path, "sm_90", Physics(), compiler="nvcc")
    line = str(broken.value)
    assert "\n" not in line and f"{path}(" in line and 'error: expected a ";"' in line
    path.write_text(text.replace('policy = "grid"', 'policy = "gird"'))
    with pytest.raises(BuildError, match="policy 'gird': choose from grid"):
        build(path, "sm_90", Physics(), compiler="nvcc")
    path.write_text(text.replace('name = "reloaded"', 'name = "renamed"'))
    with pytest.raises(BuildError, match="a kernel keeps its name while the viewer runs"):
        build(path, "sm_90", Physics(), "reloaded", compiler="nvcc")


def test_the_first_compile_error_counts_the_rest():
    log = 'a.cu(3): error: expected a ";"\n  x\n\na.cu(9): error: undefined "y"\n2 errors detected\n'
    assert user_kernels.first_compile_error(log) == 'a.cu(3): error: expected a ";" (and 1 more)'
    assert user_kernels.first_compile_error("nvcc fatal: no input") is None


def test_tune_tunes_a_kernel_file_and_best_may_pick_it(tmp_path, capsys, monkeypatch):
    """Through tests/test_tune_gpus.py's stand-in GPU (the tune loop, not a GPU's timings): `tune
    --kernel-file` times the user's kernel among the built-ins; when it is the fastest correct one, the
    cache files it and `best` runs it where the same file is loaded (the cache's source hash covers the
    kernel files, so another set of files makes it stale rather than wrong)."""
    from test_tune_gpus import FAKE_GPU, RECORDS, TIMES, FakeGpu, FakeGpuHere

    import app.backends
    from app.backends.cuda import tuning_cache
    from app.backends.cuda.multi import GpuDevices

    monkeypatch.setenv("NBODY_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(FakeGpu, "loads", [])
    monkeypatch.setattr(app.backends, "select_backend", lambda name: FakeGpuHere)
    monkeypatch.setattr(GpuDevices, "count", staticmethod(lambda: 1))
    monkeypatch.setitem(TIMES[1], "mine-fast", (0.5, 0.0))  # the stand-in times it twice as fast
    path = starter(tmp_path, "mine-fast")
    monkeypatch.setitem(RECORDS, "mine-fast", user_kernels.user_record(path))  # the stand-in's own table
    variants = "mine-fast,register-blocked,atomics-n3l,shared"
    rc = main(["tune", "--kernel-file", str(path), "--n", "256", "--variants", variants, "--budget-s", "30"])
    out = capsys.readouterr().out
    assert rc == 0 and "N =       256: mine-fast" in out, out
    records = {r.name: r for r in registry.RECORDS}
    rec, _tun, source, warning = records["best"].policy.resolve(records, FAKE_GPU, 256)
    assert (rec.name, warning) == ("mine-fast", None) and source.startswith("tuned cache")
    data, _why = tuning_cache.read_file(
        FAKE_GPU.name, FAKE_GPU.driver_version, tuning_cache.source_hash(registry.RECORDS)
    )
    assert data is not None and data["tunings"]["1"]["best"][0]["variant"] == "mine-fast"
    builtins = {r.name: r for r in registry.RECORDS if not user_kernels.is_user(r)}  # a run without the file
    rec, _tun, source, _warning = builtins["best"].policy.resolve(builtins, FAKE_GPU, 256)
    assert rec.name != "mine-fast" and not source.startswith("tuned cache")  # that tuning is not for it
    path.write_text(path.read_text() + "\n// an edit\n")  # the file edited: its tuning is stale
    rec, _tun, source, _warning = records["best"].policy.resolve(records, FAKE_GPU, 256)
    assert not source.startswith("tuned cache")
