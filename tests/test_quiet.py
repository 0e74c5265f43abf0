"""Quiet by default: no advice that cannot help, no compile notice for a cache load, the project's own
messages instead of numpy's warnings, integer limits as integers, negative numbers as option values."""

import collections
import logging
import os
import subprocess
import sys
import warnings

import pytest
from conftest import one_line_error

from app.backends import cpu_forces as cpu
from app.backends.cuda import context
from app.cli import main
from app.model import formats, ics


def _driverless(monkeypatch):
    monkeypatch.setattr(context, "_nvidia_driver_present", lambda: False)
    monkeypatch.setitem(sys.modules, "pycuda", None)  # import pycuda.driver: ModuleNotFoundError
    monkeypatch.setitem(sys.modules, "pycuda.driver", None)
    monkeypatch.delenv("NBODY_DISABLE_CUDA", raising=False)


def test_no_pip_advice_without_a_driver_unless_verbose(monkeypatch):
    _driverless(monkeypatch)
    reason = context._driver_or_reason.__wrapped__()[1]
    assert "no NVIDIA driver" in reason and "pip install" not in reason
    monkeypatch.setattr(context.log, "isEnabledFor", lambda level: level <= logging.DEBUG)
    assert "pip install pycuda" in context._driver_or_reason.__wrapped__()[1]


def test_pip_advice_where_a_driver_is_present(monkeypatch):
    _driverless(monkeypatch)
    monkeypatch.setattr(context, "_nvidia_driver_present", lambda: True)
    assert "pip install pycuda" in context._driver_or_reason.__wrapped__()[1]


class _Dispatcher:
    def __init__(self, misses):
        self.stats = collections.namedtuple("Stats", "cache_misses")(collections.Counter(misses))


@pytest.mark.parametrize("misses, said", [({}, False), ({("float32",): 1}, True)])
def test_compile_notice_only_when_numba_compiles(monkeypatch, caplog, misses, said):
    monkeypatch.setattr(cpu, "_ANNOUNCED", type(cpu._ANNOUNCED)())
    caplog.set_level(logging.INFO, logger=cpu.log.name)
    import time

    with cpu.announce_compiling([_Dispatcher({}), _Dispatcher(misses)], poll_s=0.01):
        time.sleep(0.1)  # the "compile"
    assert ("compiling CPU kernels" in caplog.text) == said


@pytest.mark.slow
def test_compile_notice_with_a_fresh_cache_and_not_after(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    cmd = [
        sys.executable,
        "-m",
        "app",
        "simulate",
        "--n",
        "16",
        "--steps",
        "1",
        "--backend",
        "cpu",
        "--out",
        str(tmp_path / "o.npz"),
        "--no-progress",
    ]
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    second = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert "compiling CPU kernels" in first.stderr
    assert "compiling CPU kernels" not in second.stderr


def test_a_velocity_beyond_float32_is_one_line(tmp_path, capsys):
    b = ics.generate("plummer", 10, 1)
    b.vel[3, 1] = 1e300
    formats.write(tmp_path / "fast.npz", b)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rc = main(
            [
                "simulate",
                str(tmp_path / "fast.npz"),
                "--steps",
                "2",
                "--backend",
                "cpu",
                "--out",
                str(tmp_path / "o.npz"),
                "--no-progress",
            ]
        )
    one_line_error(capsys, rc, 2, "body 3", "velocity", "1e+300", "float32", "cpu-fp64")
    assert not (tmp_path / "o.npz").exists()


def test_coincident_bodies_at_softening_0_warn_in_one_line(tmp_path, caplog):
    path = tmp_path / "two.mpv"
    path.write_text("1 0 0 0 0 0 0\n1 0 0 0 0 0 0\n1 1 0 0 0 0 0\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a numpy RuntimeWarning fails the test
        rc = main(
            [
                "simulate",
                str(path),
                "--softening",
                "0",
                "--steps",
                "2",
                "--backend",
                "cpu",
                "--out",
                str(tmp_path / "o.npz"),
                "--log",
                str(tmp_path / "l.csv"),
                "--no-progress",
            ]
        )
    assert rc == 0
    said = [r.getMessage() for r in caplog.records if "not finite" in r.getMessage()]
    assert len(said) == 1 and "--softening" in said[0]


def test_integer_limits_are_integers(capsys):
    rc = main(["simulate", "--n", "99999999", "--steps", "1", "--out", "x.npz"])
    line = one_line_error(capsys, rc, 2, "initial.n", "16777216")
    assert "e+07" not in line


@pytest.mark.parametrize("value", ["-1e-3", "-1E+3", "-0.5", "-2"])
def test_negative_numbers_are_option_values(capsys, value):
    rc = main(["simulate", "--dt", value, "--steps", "1", "--out", "x.npz"])
    one_line_error(capsys, rc, 2, "physics.dt", "> 0")


@pytest.mark.parametrize(
    "quiet, no_progress, tty, shown",
    [
        (False, False, True, True),
        (True, False, True, False),
        (False, True, True, False),
        (False, False, False, False),
    ],
)
def test_progress_bar_only_on_a_terminal_and_not_with_q(monkeypatch, quiet, no_progress, tty, shown):
    import argparse
    import io

    from app.commands.running import progress_bar

    stderr = io.StringIO()
    stderr.isatty = lambda: tty
    monkeypatch.setattr(sys, "stderr", stderr)
    with progress_bar(argparse.Namespace(quiet=quiet, no_progress=no_progress), total=3) as bar:
        assert (not bar.disable) == shown  # (closing a bar disables it)
        bar.update(3)
    assert ("3/3" in stderr.getvalue()) == shown
