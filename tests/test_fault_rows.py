"""Rows of issue 28's table of bad inputs, each re-run through the command line: one line naming the
problem, the right exit status, no traceback, and nothing lost or falsely reported. The rows here, what
they did before and what they do now:

- `simulate --out` with a 300-character name: an OSError traceback; now one line, exit 1, before any work;
- `simulate --log /dev/full`: the message, then a traceback from close(); now the run goes on without the
  log and writes --out, exit 1;
- `simulate --log` whose disk fills mid-run: chained tracebacks and no state written; now --out is
  written and the rows so far kept, exit 1;
- `simulate --out x.csv --log x.csv`: exit 0, the snapshot overwrote the log; now refused before any work;
- `bench --plot out.jpg`: PNG bytes in a .jpg; now refused before benchmarking, exit 2;
- `record --out x.png` without --still: MP4 bytes in a .png; now refused before the backend starts, exit 2;
- an empty scene .toml: the default Plummer sphere, silently; now refused, exit 2;
- a folder or a fifo as the scene: "no such scene file; did you mean adir?"; now "a folder" or "not a
  regular file", exit 2.
"""

from __future__ import annotations

import csv
import errno
import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from app.cli import main
from app.core import outputs


class WorkStarted(Exception):
    pass


def never(*args, **kwargs):
    raise WorkStarted("the work started before the input was checked")


def one_line(capsys, rc: int, status: int, *fragments: str) -> str:
    err = capsys.readouterr().err
    assert rc == status, err
    assert "Traceback" not in err
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("nbody-live: backend")]
    assert len(lines) == 1, err
    for fragment in fragments:
        assert fragment in lines[0], err
    return lines[0]


SIMULATE = ["simulate", "plummer", "--n", "64", "--steps", "4", "--backend", "cpu", "--kernel", "cpu-simd"]


def test_too_long_a_name_is_one_line_before_any_work(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("app.commands.simulate.make_backend", never)
    out = tmp_path / ("a" * 300 + ".npz")
    rc = main([*SIMULATE, "--out", str(out)])
    one_line(capsys, rc, 1, "cannot write snapshot", "its name is 304 bytes", "at most 255")
    assert list(tmp_path.iterdir()) == []


def test_a_name_near_the_limit_still_gets_its_temporary(tmp_path):
    """The hidden temporary beside a 255-byte name is cut to fit, so the longest legal name is writable."""
    target = tmp_path / ("b" * 251 + ".npz")
    with outputs.atomic_write(target, "wb") as f:
        f.write(b"x")
    assert target.read_bytes() == b"x" and [p.name for p in tmp_path.iterdir()] == [target.name]


@pytest.mark.parametrize("same", ["x.csv", "sub/../x.csv"])
def test_the_same_file_for_out_and_log_is_refused_before_any_work(tmp_path, capsys, monkeypatch, same):
    monkeypatch.setattr("app.commands.simulate.make_backend", never)
    (tmp_path / "sub").mkdir()
    rc = main([*SIMULATE, "--out", str(tmp_path / "x.csv"), "--log", str(tmp_path / same)])
    one_line(capsys, rc, 1, "are the same file", "snapshot (--out)", "log (--log)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sub"]


def test_a_log_on_dev_full_keeps_the_run_and_its_state(tmp_path, capsys):
    out = tmp_path / "state.npz"
    rc = main([*SIMULATE, "--out", str(out), "--log", "/dev/full", "--log-every", "1"])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err, err
    assert "cannot write log /dev/full" in err and "goes on without the log" in err
    assert "the log /dev/full is incomplete" in err
    assert np.load(out)["pos"].shape == (64, 3)  # the state was written


def test_a_log_whose_disk_fills_mid_run_keeps_its_rows_and_the_state(tmp_path, capsys, monkeypatch):
    """A full disk after the header and two rows (an injected writer: deterministic, no tmpfs needed)."""
    real = outputs.StreamedFile.write
    calls = {"n": 0}

    def filling(self, text):
        calls["n"] += 1
        if calls["n"] > 3:
            raise outputs.RuntimeFault(f"cannot write {self.what} {self.path}: {os.strerror(errno.ENOSPC)}")
        return real(self, text)

    monkeypatch.setattr(outputs.StreamedFile, "write", filling)
    out, log = tmp_path / "state.npz", tmp_path / "log.csv"
    rc = main([*SIMULATE, "--out", str(out), "--log", str(log), "--log-every", "1"])
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err, err
    assert "No space left on device" in err and "last row: step 1" in err
    with open(log, newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[0][0] == "step" and [r[0] for r in rows[1:]] == ["0", "1"]
    assert np.load(out)["pos"].shape == (64, 3)


def test_bench_refuses_a_plot_name_of_another_format(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("app.tools.bench.run_bench", never)
    rc = main(["bench", "--backend", "cpu", "--n", "64", "--no-progress", "--plot", str(tmp_path / "b.jpg")])
    one_line(capsys, rc, 2, "--plot", "b.jpg", "must end in .png")
    assert list(tmp_path.iterdir()) == []


def test_record_refuses_a_video_under_another_name(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("app.commands.record.make_backend", never)
    rc = main(["record", "plummer", "--n", "64", "--frames", "2", "--out", str(tmp_path / "x.png")])
    one_line(capsys, rc, 2, "--out", "x.png", "must end in .mp4")
    assert list(tmp_path.iterdir()) == []


def test_a_video_without_pyav_is_one_line(tmp_path, capsys, monkeypatch):
    """Found by running the fault matrix on the GPU machine, whose kit had no PyAV: `record` ended in a
    ModuleNotFoundError traceback. It is one line saying how to install it, before the backend starts."""
    import sys

    monkeypatch.setitem(sys.modules, "av", None)  # import av raises ImportError
    monkeypatch.setattr("app.commands.record.make_backend", never)
    rc = main(["record", "plummer", "--n", "64", "--frames", "2", "--out", str(tmp_path / "x.mp4")])
    one_line(capsys, rc, 2, "needs PyAV (the `av` package)", "pip install av", "--frames-dir")
    assert list(tmp_path.iterdir()) == []


def test_the_viewer_without_imgui_bundle_is_one_line(capsys, monkeypatch):
    """Also found on the GPU machine, whose recording kit has no imgui-bundle: `run` ended in a
    ModuleNotFoundError traceback from the panel. One line now, before the backend is made."""
    import sys

    monkeypatch.setitem(sys.modules, "imgui_bundle", None)
    monkeypatch.setattr("app.commands.run.make_backend", never)
    monkeypatch.setenv("NBODY_HEADLESS", "1")
    rc = main(["run", "plummer", "--n", "64", "--backend", "cpu", "--frames", "2"])
    one_line(capsys, rc, 2, "the viewer needs imgui-bundle", "`nbody-live record` draws without it")


def test_an_empty_scene_file_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("app.commands.simulate.make_backend", never)
    scene = tmp_path / "empty.toml"
    scene.write_text("\n# nothing here\n")
    rc = main(["simulate", str(scene), "--steps", "1", "--out", str(tmp_path / "o.npz")])
    one_line(capsys, rc, 2, "empty.toml", "the scene file is empty")


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_folder_or_a_fifo_as_the_scene_says_what_it_is(tmp_path, capsys, monkeypatch, kind):
    monkeypatch.setattr("app.commands.simulate.make_backend", never)
    path = tmp_path / "adir"
    if kind == "folder":
        path.mkdir()
    else:
        os.mkfifo(path)
    rc = main(["simulate", str(path), "--steps", "1", "--out", str(tmp_path / "o.npz")])
    line = one_line(capsys, rc, 2, str(path), "a folder" if kind == "folder" else "not a regular file")
    assert "did you mean" not in line
    assert Path(path).exists()


def test_a_still_far_in_the_future_says_how_long_it_will_take():
    """`record --still 1e9` advanced for minutes without a word: after 2 s of advancing it now says what
    the rest will take at the rate so far, once, when that is over a minute (app.core.eta, which record
    and simulate use too)."""
    from app.core.eta import Eta, eta_line

    def line(done, total, elapsed):
        return eta_line(done, total, elapsed, "frame", "the still is frame 30,000,000,000: ", "Ctrl-C stops")

    assert line(100, 3 * 10**10, 1.0) is None  # too early to estimate
    said = line(100, 3 * 10**10, 2.0)  # 50 frames/s, 3e10 frames: ~19 years
    assert said is not None and "frame 30,000,000,000" in said and "19.0 years" in said and "Ctrl-C" in said
    assert line(100, 2000, 2.0) is None  # 38 s to go: not worth a line
    assert "1.7 h" in line(100, 300_000, 2.0)  # 299,900 frames at 50 a second
    assert line(100, 100, 5.0) is None  # done
    now, said_lines = [0.0], []
    eta = Eta(10**9, "step", stops="Ctrl-C stops", say=said_lines.append, clock=lambda: now[0])
    for done, now[0] in ((10, 1.0), (20, 2.0), (30, 3.0), (40, 4.0)):
        eta.update(done)
    assert said_lines == [
        "999,999,980 steps to go at 10.0 steps/s take about 3.2 years more; Ctrl-C stops"
    ]  # once, at 2 s


def test_a_length_past_an_hour_of_video_is_said_before_the_setup(caplog):
    """--still 1e9 and --seconds 1e6 say what they ask for before the backend and GL start (the time it
    takes follows once the first frames are timed); an ordinary length says nothing."""
    import logging

    from app.commands.record import _say_the_horizon

    with caplog.at_level(logging.INFO, logger="nbody-live"):
        _say_the_horizon(3 * 10**10, 30.0, still=True)
        _say_the_horizon(30 * 10**6, 30.0, still=False)
        _say_the_horizon(300, 30.0, still=False)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2
    assert said[0].startswith(
        "the still is the last of 30,000,000,000 frames (31.7 years of video at 30 fps)"
    )
    assert said[1].startswith("the video is 30,000,000 frames (11.6 days of video")
    assert all("Ctrl-C stops" in line for line in said)


@pytest.mark.parametrize("kernel", ["cpu-tree", "cpu-simd"])
def test_a_blow_up_is_one_line_without_a_numpy_warning(tmp_path, capsys, kernel):
    """Issue 28's last row: a tree blow-up printed numpy RuntimeWarnings (float32 squares of a speed and of
    a cell's offset overflowing) before the clean error. A body at 10^37 units a time unit: with warnings
    as errors, the run still ends in the one line naming the body."""
    import warnings

    rng = np.random.default_rng(1)
    vel = rng.normal(size=(256, 3))
    vel[0] = [1e37, 0.0, 0.0]
    snap = tmp_path / "fast.npz"
    np.savez(snap, pos=rng.normal(size=(256, 3)), vel=vel, mass=np.full(256, 1 / 256), time=0.0)
    argv = ["simulate", str(snap), "--steps", "50", "--dt", "10", "--backend", "cpu", "--kernel", kernel]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        rc = main([*argv, "--out", str(tmp_path / "o.npz"), "--log", str(tmp_path / "o.csv")])
    one_line(capsys, rc, 1, "non-finite position or velocity at body 0", "the simulation blew up")


def test_speeds_do_not_overflow_in_float32():
    from app.model.bodies import FLOAT32_MAX, speeds

    vel = np.array([[3e19, 4e19, 0.0], [1e39, 0.0, 0.0], [3.0, 4.0, 0.0]])
    with np.errstate(all="raise"):
        got = speeds(vel)
    assert got.dtype == np.float32 and list(got) == [np.float32(5e19), np.float32(FLOAT32_MAX), 5.0]


BENCH = [
    "bench",
    "--backend",
    "cpu",
    "--kernels",
    "cpu-simd,cpu-fp64",
    "--n",
    "64,128",
    "--warmup",
    "1",
    "--repeats",
    "1",
    "--error-sample",
    "0",
    "--no-progress",
]


def test_an_interrupted_bench_keeps_its_rows_and_resume_finishes_them(tmp_path, capsys, monkeypatch):
    """Issue 28's "bench interrupted by Ctrl-C" row: exit 130 and every finished row lost. Now the JSON is
    rewritten after every row, marked incomplete, and --resume runs only the rows it lacks."""
    from app.tools import bench

    real = bench._Sweep.row
    calls = {"n": 0}

    def interrupted_at_the_third(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    out = tmp_path / "b.json"
    monkeypatch.setattr(bench._Sweep, "row", interrupted_at_the_third)
    assert main([*BENCH, "--json", str(out)]) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and f"--resume {out}" in err and "Traceback" not in err
    kept = json.loads(out.read_text())
    assert kept["complete"] is False and len(kept["results"]) == 2
    monkeypatch.setattr(bench._Sweep, "row", real)
    ran = []
    monkeypatch.setattr(bench._Sweep, "row", lambda self, *a, **k: ran.append(a[:3]) or real(self, *a, **k))
    assert main([*BENCH, "--resume", str(out)]) == 0
    done = json.loads(out.read_text())
    assert done["complete"] is True and done["resumed_rows"] == 2
    assert done["results"][:2] == kept["results"]  # the kept rows, as they were
    assert [(r["kernel"], r["n"]) for r in done["results"]] == [
        ("cpu-simd", 64),
        ("cpu-fp64", 64),
        ("cpu-simd", 128),
        ("cpu-fp64", 128),
    ]
    assert ran == [("plummer", 128, "cpu-simd"), ("plummer", 128, "cpu-fp64")]  # only the missing rows


def interrupt_at(monkeypatch, row: int, signum: int | None = None) -> None:
    """bench's `row`-th row (from 1) is interrupted: by a real signal to this process (`signum`; the
    handler bench installs turns it into an exception), else by KeyboardInterrupt raised there."""
    from app.tools import bench

    real = bench._Sweep.row
    calls = {"n": 0}

    def row_of(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == row:
            if signum is None:
                raise KeyboardInterrupt
            os.kill(os.getpid(), signum)
            time.sleep(5)  # the handler raises before this ends
            raise AssertionError("the signal did not stop the row")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(bench._Sweep, "row", row_of)


def test_sigterm_stops_a_bench_as_ctrl_c_does(tmp_path, capsys, monkeypatch):
    out = tmp_path / "b.json"
    interrupt_at(monkeypatch, 2, signal.SIGTERM)
    rc = main([*BENCH, "--json", str(out)])
    line = one_line(capsys, rc, 143, "interrupted (SIGTERM)", f"--resume {out}")
    assert "Ctrl-C" not in line
    kept = json.loads(out.read_text())
    assert kept["complete"] is False and [r["kernel"] for r in kept["results"]] == ["cpu-simd"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back


def test_an_interrupted_scaling_bench_keeps_its_rows_and_resume_finishes_them(tmp_path, capsys, monkeypatch):
    """`bench --gpus 1,2` wrote its JSON only at the end and refused --resume. Now its rows are kept as
    they finish (each with its "gpus") and --resume runs the missing ones, on the device count each
    belongs to; the scaling rows are computed over all of them."""
    from app.tools import bench

    out = tmp_path / "s.json"
    scaling = [*BENCH, "--kernels", "cpu-simd", "--gpus", "1,2"]
    interrupt_at(monkeypatch, 4)  # the plan: N = 64, 128 on one device, then on two
    assert main([*scaling, "--json", str(out)]) == 130
    kept = json.loads(out.read_text())
    assert kept["complete"] is False and kept["gpu_counts"] == [1, 2]
    assert [(r["gpus"], r["n"]) for r in kept["results"]] == [(1, 64), (1, 128), (2, 64)]
    capsys.readouterr()
    real = bench._Sweep.row
    ran = []
    monkeypatch.setattr(bench._Sweep, "row", lambda self, *a, **k: ran.append(a[1]) or real(self, *a, **k))
    rc = main([*scaling, "--resume", str(out)])
    assert rc == 0, capsys.readouterr().err
    done = json.loads(out.read_text())
    assert done["complete"] is True and done["resumed_rows"] == 3 and ran == [128]
    assert [(r["gpus"], r["n"]) for r in done["results"]] == [(1, 64), (1, 128), (2, 64), (2, 128)]
    assert done["results"][:3] == kept["results"]
    assert {(r["gpus"], r["n"]) for r in done["scaling"]} == {(1, 64), (1, 128), (2, 64), (2, 128)}
    rc = main([*BENCH, "--kernels", "cpu-simd", "--json", str(tmp_path / "t.json"), "--resume", str(out)])
    one_line(capsys, rc, 2, "that bench is complete")


def test_resume_refuses_another_device_count(tmp_path, capsys, monkeypatch):
    out = tmp_path / "s.json"
    interrupt_at(monkeypatch, 2)
    assert main([*BENCH, "--kernels", "cpu-simd", "--gpus", "1,2", "--json", str(out)]) == 130
    capsys.readouterr()
    rc = main([*BENCH, "--kernels", "cpu-simd", "--resume", str(out)])
    one_line(capsys, rc, 2, "it was run on --gpus 1,2, this command on one device (no --gpus)")


@pytest.mark.parametrize(
    "change, message",
    [
        (["--seed", "7"], "it was run with seed = 42"),
        (["--kernels", "cpu-simd", "--n", "256"], "has a row this command would not run"),
    ],
)
def test_resume_refuses_another_plan(tmp_path, capsys, change, message):
    out = tmp_path / "b.json"
    result = {
        "complete": False,
        "seed": 42,
        "warmup": 1,
        "repeats": 1,
        "max_seconds": None,
        "results": [{"kernel": "cpu-simd", "scene": "plummer", "n": 64, "tunables": {}}],
    }
    out.write_text(json.dumps(result))
    args = list(BENCH)
    for flag, value in zip(change[::2], change[1::2], strict=True):
        if flag in args:
            args[args.index(flag) + 1] = value
        else:
            args += [flag, value]
    rc = main([*args, "--resume", str(out)])
    one_line(capsys, rc, 2, message)
    out.write_text(json.dumps({**result, "complete": True}))
    rc = main([*BENCH, "--resume", str(out)])
    one_line(capsys, rc, 2, "that bench is complete")


def test_gpus_all_on_the_cpu_means_one_device_a_core(monkeypatch):
    """Issue 28's row: `--gpus all --backend cpu` on 2 cores gave 8 "devices" (a fixed cap). "all" is now
    the core count (at most 8); an explicit K up to 8 still runs, for the CI's driver tests."""
    from app.backends.cpu import CPUBackend
    from app.backends.cpu_multi import MAX_CPU_DEVICES, CpuDevices
    from app.backends.multi import multi_backend_class

    for cores, want in ((2, 2), (1, 1), (64, MAX_CPU_DEVICES)):
        monkeypatch.setattr(os, "cpu_count", lambda c=cores: c)
        assert CpuDevices.all_count() == want
        assert multi_backend_class(CPUBackend, "all").k == want
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert multi_backend_class(CPUBackend, 4).k == 4
