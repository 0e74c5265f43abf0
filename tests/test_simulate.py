"""`simulate` keeps what it has done: outputs checked first, the log streamed, checkpoints, resume,
signals. CPU runs here; the device-energy path has a `gpu` twin."""

import csv
import signal
import subprocess
import sys

import numpy as np
import pytest
from conftest import one_line_error
from waiting import wait_for

from app.backends import backend_class
from app.cli import main
from app.commands import simulate
from app.model import formats

CPU = ["--backend", "cpu", "--no-progress"]


@pytest.fixture
def no_work(monkeypatch):
    """Fails the test if a backend is made: the outputs must be refused before any work."""

    def refuse(*_a, **_k):
        raise AssertionError("a backend was made before the outputs were checked")

    monkeypatch.setattr(simulate, "make_backend", refuse)


def test_unwritable_out_is_refused_before_any_work(capsys, no_work):
    rc = main(["simulate", "plummer", "--n", "2048", "--steps", "300", "--out", "/nonexistent/o.npz", *CPU])
    one_line_error(capsys, rc, 1, "/nonexistent/o.npz", "does not exist")


def test_unknown_out_extension_is_refused_before_any_work(capsys, no_work, tmp_path):
    rc = main(["simulate", "--steps", "3", "--out", str(tmp_path / "o.xyz"), *CPU])
    one_line_error(capsys, rc, 2, "o.xyz", ".npz")
    assert not list(tmp_path.iterdir())


def test_unwritable_log_is_refused_before_any_work(capsys, no_work, tmp_path):
    rc = main(
        [
            "simulate",
            "--steps",
            "3",
            "--out",
            str(tmp_path / "o.npz"),
            "--log",
            str(tmp_path / "no" / "l.csv"),
            *CPU,
        ]
    )
    one_line_error(capsys, rc, 1, "l.csv", "does not exist")
    assert not list(tmp_path.iterdir())


def test_energy_is_computed_only_for_the_log(monkeypatch, tmp_path):
    import app.model.physics

    def refuse(*_a, **_k):
        raise AssertionError("an O(N²) energy was computed without --log")

    monkeypatch.setattr(app.model.physics, "diagnostics", refuse)
    assert main(["simulate", "--n", "64", "--steps", "3", "--out", str(tmp_path / "o.npz"), *CPU]) == 0


def test_device_diagnostics_are_used_when_the_backend_has_them():
    class Device:
        reduces_diagnostics = True  # (Backend.reduces_diagnostics)

        def diagnostics(self):
            return "on the device"

    assert simulate._measure(Device(), None)() == "on the device"


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def _fp64(n_steps, out, *extra):
    size = [] if "--resume" in extra else ["--n", "128"]  # a resumed run's bodies are the file's
    return main(
        [
            "simulate",
            "plummer",
            *size,
            "--kernel",
            "cpu-fp64",
            "--steps",
            str(n_steps),
            "--out",
            str(out),
            *CPU,
            *extra,
        ]
    )


def test_resume_continues_bitwise_in_float64(tmp_path):
    whole, half, resumed = tmp_path / "whole.npz", tmp_path / "half.npz", tmp_path / "resumed.npz"
    assert _fp64(40, whole) == 0
    assert _fp64(20, half, "--checkpoint-every", "7") == 0
    assert _fp64(20, resumed, "--resume", str(half)) == 0
    a, b = formats.read(whole), formats.read(resumed)
    assert np.array_equal(a.pos, b.pos) and np.array_equal(a.vel, b.vel)
    assert b.time == pytest.approx(a.time)


def test_checkpoint_is_the_state_at_that_step(tmp_path):
    every, ckpt = tmp_path / "every.npz", tmp_path / "at14.npz"
    assert _fp64(14, ckpt) == 0
    seen = []
    original = formats.write

    def spy(path, bodies, format=None):
        seen.append(bodies.copy())
        original(path, bodies, format)

    import app.model.formats

    app.model.formats.write = spy
    try:
        assert _fp64(20, every, "--checkpoint-every", "7") == 0
    finally:
        app.model.formats.write = original
    assert len(seen) == 3  # steps 7, 14 and the final 20
    assert np.array_equal(seen[1].pos, formats.read(ckpt).pos)


def test_log_rows_are_streamed(tmp_path):
    log = tmp_path / "l.csv"
    assert (
        main(
            [
                "simulate",
                "--n",
                "64",
                "--steps",
                "10",
                "--log-every",
                "3",
                "--out",
                str(tmp_path / "o.npz"),
                "--log",
                str(log),
                *CPU,
            ]
        )
        == 0
    )
    rows = _rows(log)
    assert [int(r["step"]) for r in rows] == [0, 3, 6, 9, 10]
    assert all(float(r["force_ms_per_step"]) >= 0 for r in rows)


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_writes_the_state_so_far_and_the_log(tmp_path, sig, code):
    """A real signal, at whatever point of the run it lands: the log stops at the state in --out or one
    step short of it (the signal came before that step's energy was done), and the message says which."""
    out, log = tmp_path / "o.npz", tmp_path / "l.csv"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app",
            "-q",
            "simulate",
            "plummer",
            "--n",
            "512",
            "--steps",
            "1000000",
            "--log-every",
            "1",
            "--out",
            str(out),
            "--log",
            str(log),
            "--backend",
            "cpu",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: log.exists() and log.read_text().count("\n") >= 4, "the header and 3 log rows")
    finally:
        proc.send_signal(sig)
        _stdout, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert signal.Signals(sig).name in lines[0] and str(out) in lines[0] and str(log) in lines[0]
    final = formats.read(out)
    rows = _rows(log)
    assert final.n == 512 and len(rows) >= 3 and all(len(r) == len(simulate.LOG_COLUMNS) for r in rows)
    steps, at = [int(r["step"]) for r in rows], round(final.time / 1e-3)
    assert steps == list(range(len(rows))) and f"at step {at} of 1000000" in lines[0], lines[0]
    assert f"last row: step {steps[-1]}" in lines[0], lines[0]
    cut = f"the float64 energy of step {at} was interrupted"
    assert (steps[-1] == at and cut not in lines[0]) or (steps[-1] == at - 1 and cut in lines[0]), lines[0]


def _signal_at_energy(monkeypatch, sig, call, after=False):
    """Raises `sig` in this process at the `call`-th float64 energy of the log (0: step 0's): before the
    energy starts (it stops before its first block) or, with `after`, once it is done."""
    from app.engine import energy

    real, calls = energy.potential_energy, []

    def potential(*a, **k):
        calls.append(None)
        if len(calls) - 1 == call and not after:
            signal.raise_signal(sig)  # handled in this thread within a few bytecodes: before stop() is asked
        result = real(*a, **k)
        if len(calls) - 1 == call and after:
            signal.raise_signal(sig)
        return result

    monkeypatch.setattr(energy, "potential_energy", potential)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize(
    "at, after, rows, state, end",
    [
        (0, False, [], 0, "no rows; the float64 energy of step 0 was interrupted, it has no row"),
        (
            3,
            False,
            [0, 1, 2],
            3,
            "last row: step 2; the float64 energy of step 3 was interrupted, it has no row",
        ),
        (
            5,
            False,
            [0, 1, 2, 3, 4],
            5,
            "last row: step 4; the float64 energy of step 5 was interrupted, it has no row",
        ),
        (3, True, [0, 1, 2, 3], 3, "last row: step 3"),
    ],
    ids=["first-row", "a-row", "last-row", "after-a-row"],
)
def test_a_signal_during_a_log_energy_leaves_out_that_row_and_says_so(
    monkeypatch, tmp_path, capsys, sig, at, after, rows, state, end
):
    """The signal at a known point: during the energy of step `at`'s row (its row is left out, the state
    is at that step, the message names both), or just after it (the row is kept). Step 5 is the last."""
    out, log = tmp_path / "o.npz", tmp_path / "l.csv"
    _signal_at_energy(monkeypatch, sig, at, after)
    rc = main(
        [
            "simulate",
            "plummer",
            "--n",
            "64",
            "--steps",
            "5",
            "--log-every",
            "1",
            "--out",
            str(out),
            "--log",
            str(log),
            *CPU,
        ]
    )
    captured = capsys.readouterr()
    assert rc == 128 + sig and captured.out == "", captured
    name = signal.Signals(sig).name
    assert captured.err == (
        f"nbody-live simulate: interrupted by {name} at step {state} of 5: state so far "
        f"-> {out}, log -> {log} ({end})\n"
    )
    assert [int(r["step"]) for r in _rows(log)] == rows
    assert round(formats.read(out).time / 1e-3) == state


def test_a_signal_after_the_last_energy_changes_nothing(monkeypatch, tmp_path, capsys):
    out, log = tmp_path / "o.npz", tmp_path / "l.csv"
    _signal_at_energy(monkeypatch, signal.SIGINT, 5, after=True)
    assert (
        main(
            [
                "simulate",
                "plummer",
                "--n",
                "64",
                "--steps",
                "5",
                "--log-every",
                "1",
                "--out",
                str(out),
                "--log",
                str(log),
                *CPU,
            ]
        )
        == 0
    )
    assert "energy drift" in capsys.readouterr().out
    assert [int(r["step"]) for r in _rows(log)] == [0, 1, 2, 3, 4, 5]


CUDA = backend_class("cuda")


@pytest.mark.gpu
def test_cuda_log_uses_device_energy(monkeypatch, tmp_path):
    import app.model.physics

    def refuse(*_a, **_k):
        raise AssertionError("the host computed the energy although the device can")

    monkeypatch.setattr(app.model.physics, "diagnostics", refuse)
    log = tmp_path / "l.csv"
    assert (
        main(
            [
                "simulate",
                "--n",
                "4096",
                "--steps",
                "20",
                "--log-every",
                "10",
                "--backend",
                "cuda",
                "--out",
                str(tmp_path / "o.npz"),
                "--log",
                str(log),
                "--no-progress",
            ]
        )
        == 0
    )
    rows = _rows(log)
    assert len(rows) == 3 and abs(float(rows[-1]["rel_energy_drift"])) < 1e-3


def test_n_with_resume_is_refused(tmp_path, capsys, no_work):
    rc = main(
        [
            "simulate",
            "--n",
            "10",
            "--resume",
            str(tmp_path / "c.npz"),
            "--steps",
            "1",
            "--out",
            str(tmp_path / "o.npz"),
            *CPU,
        ]
    )
    one_line_error(capsys, rc, 2, "--n", "--resume")


ONLY_THE_FIRST = """
import os, signal, time
from app.commands.running import Interruption
# a process started with SIGINT ignored (a background job of a non-interactive shell) keeps it ignored:
# Python then installs no handler of its own, and Interruption rightly restores "ignored"
signal.signal(signal.SIGINT, signal.default_int_handler)
try:
    with Interruption() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
        assert stop.signum == signal.SIGINT and stop.exit_code == 130
        os.kill(os.getpid(), signal.SIGINT)  # the default handler again: KeyboardInterrupt
        time.sleep(5)
except KeyboardInterrupt:
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    print("interrupted")
"""


def test_only_the_first_signal_is_caught():
    """In a process of its own, which starts from Python's own SIGINT handler: the second SIGINT went
    unraised in suites started as background jobs (`cmd &` in a script), whose processes inherit SIGINT
    ignored; Interruption then restores "ignored", as it should."""
    from pathlib import Path

    done = subprocess.run(
        [sys.executable, "-c", ONLY_THE_FIRST],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert done.returncode == 0 and done.stdout.strip() == "interrupted", (done.stdout, done.stderr)


def test_resume_never_overwrites_a_log(tmp_path, capsys, no_work):
    old = tmp_path / "l.csv"
    old.write_text("step\n0\n")
    rc = main(
        [
            "simulate",
            "--resume",
            str(tmp_path / "c.npz"),
            "--steps",
            "1",
            "--out",
            str(tmp_path / "o.npz"),
            "--log",
            str(old),
            *CPU,
        ]
    )
    one_line_error(capsys, rc, 2, "l.csv", "exists")
    assert old.read_text() == "step\n0\n"
