"""The command line: help that teaches, and bad input ending in one line with exit status 2."""

import subprocess
import sys

import pytest

from app.cli import main

BAD_INPUTS = [
    (["--set", "physics.dtt=1"], ["physics.dtt", "softening"]),  # unknown key: names the valid ones
    (["--set", "colour.map=x"], ["colour", "physics"]),  # unknown section
    (["--dt", "abc"], ["physics.dt", "number"]),  # wrong type
    (["--dt", "0"], ["physics.dt", "> 0"]),  # dt <= 0
    (["--dt=-1e-3"], ["physics.dt", "> 0"]),
    (["--n", "0"], ["initial.n", ">= 1"]),
    (["--damping", "1.5"], ["physics.damping", "<= 1"]),
    (["--integrator", "rk4"], ["physics.integrator", "leapfrog", "euler-damped"]),
    (["--backend", "gpu"], ["run.backend", "auto", "cpu", "cuda"]),
    (["--kernel", "warp-speed"], ["warp-speed", "cpu-simd"]),
    (["--set", "render.size_by_mass=maybe"], ["render.size_by_mass", "true or false"]),
    # a kernel's tunables (KernelRecord.validate_tunables), checked before any work
    (["--kernel", "cpu-tree", "--tunable", "theta=2"], ["cpu-tree.theta: 2 is not in (0, 1.5]"]),
    (["--kernel", "cpu-tree", "--tunable", "theta=0"], ["cpu-tree.theta: 0 is not in (0, 1.5]"]),
    (["--kernel", "cpu-tree", "--tunable", "theta=-0.1"], ["cpu-tree.theta", "(0, 1.5]"]),
    (["--kernel", "cpu-tree", "--tunable", "leaf=12"], ["cpu-tree.leaf: 12 is not one of 8, 16, 32, 64"]),
    (["--kernel", "cpu-tree", "--tunable", "theta"], ["--tunable 'theta'", "NAME=VALUE"]),
    (["--kernel", "cpu-simd", "--tunable", "theta=0.5"], ["cpu-simd: no tunable 'theta'"]),
]


def _one_line_error(capsys, rc, words):
    out = capsys.readouterr()
    assert rc == 2
    lines = [ln for ln in out.err.splitlines() if ln.strip() and not ln.startswith("nbody-live: ")]
    assert len(lines) == 1, out.err
    assert "Traceback" not in out.err
    for w in words:
        assert w in lines[0], (w, lines[0])


@pytest.mark.parametrize("command", ["run", "simulate", "validate", "record"])
@pytest.mark.parametrize("flags,words", BAD_INPUTS)
def test_bad_scene_input_is_one_line_exit_2(capsys, command, flags, words, tmp_path):
    extra = ["--steps", "1", "--out", str(tmp_path / "o.npz")] if command == "simulate" else []
    rc = main([command, "plummer", *flags, *extra])
    _one_line_error(capsys, rc, words)


def test_unknown_preset_lists_presets(capsys):
    rc = main(["run", "no-such-scene"])
    _one_line_error(capsys, rc, ["no-such-scene", "plummer", "collision"])


def test_argparse_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["run", "--frames", "0"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--frames" in err


def test_bad_scene_file(tmp_path, capsys):
    f = tmp_path / "s.toml"
    f.write_text("[physics]\ndt = -1\n")
    rc = main(["validate", str(f)])
    _one_line_error(capsys, rc, [str(f), "physics.dt"])
    f.write_text("[physics\n")
    rc = main(["validate", str(f)])
    _one_line_error(capsys, rc, [str(f), "TOML"])


def test_console_script_help_teaches_each_command():
    for cmd in ["run", "record", "simulate", "validate", "bench", "info"]:
        out = subprocess.run([sys.executable, "-m", "app", cmd, "--help"], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert "example" in out.stdout, cmd
    out = subprocess.run([sys.executable, "-m", "app", "run", "--help"], capture_output=True, text=True)
    for key in ("space", "Escape", "wheel"):
        assert key in out.stdout


def test_console_script_bad_backend_real_process():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "app",
            "simulate",
            "plummer",
            "--backend",
            "gpu",
            "--steps",
            "1",
            "--out",
            "x.npz",
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
