"""End-to-end sub-commands on the CPU backend: simulate, validate, info."""

import csv

import numpy as np
import pytest
from conftest import shared_file

from app.cli import main
from app.model import formats


def test_simulate_writes_snapshot_and_conservation_log(tmp_path, capsys):
    out, log = tmp_path / "final.npz", tmp_path / "energy.csv"
    rc = main(
        [
            "simulate",
            "plummer",
            "--n",
            "256",
            "--steps",
            "40",
            "--log-every",
            "10",
            "--backend",
            "cpu",
            "--out",
            str(out),
            "--log",
            str(log),
            "--no-progress",
        ]
    )
    assert rc == 0
    final = formats.read(out)
    assert final.n == 256 and final.time == pytest.approx(40 * 1e-3)
    with open(log) as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == [0, 10, 20, 30, 40]
    assert float(rows[0]["energy"]) == pytest.approx(-0.25, rel=0.1)
    assert abs(float(rows[-1]["rel_energy_drift"])) < 1e-3
    assert "energy drift" in capsys.readouterr().out


def test_simulate_from_snapshot_round_trip(tmp_path):
    path = shared_file("nemo_figure8.mpv")
    out = tmp_path / "f8.csv"
    rc = main(
        [
            "simulate",
            str(path),
            "--softening",
            "0",
            "--steps",
            "5",
            "--backend",
            "cpu",
            "--kernel",
            "cpu-fp64",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert rc == 0
    start, end = formats.read(path), formats.read(out)
    assert end.n == 3 and not np.allclose(start.pos, end.pos)


def test_validate_exits_zero_within_tolerance_and_one_above(capsys):
    rc = main(["validate", "plummer", "--n", "512", "--backend", "cpu", "--kernel", "cpu-simd"])
    out = capsys.readouterr().out
    assert rc == 0 and "max rel err" in out
    rc = main(
        ["validate", "plummer", "--n", "512", "--backend", "cpu", "--kernel", "cpu-simd", "--tol", "1e-12"]
    )
    assert rc == 1 and "FAIL" in capsys.readouterr().out


def test_validate_nbabel16k_cpu():
    path = shared_file("nbabel_input16k")
    rc = main(["validate", str(path), "--softening", "0.01", "--backend", "cpu", "--kernel", "cpu-simd"])
    assert rc == 0


def test_info_lists_backends_and_kernels(capsys):
    assert main(["info", "--no-gl"]) == 0
    out = capsys.readouterr().out
    assert "backend cpu: available" in out
    assert "backend cuda:" in out  # available or the reason it is not
    assert main(["info", "--kernels"]) == 0
    assert "cpu-simd" in capsys.readouterr().out
    for flag in ("--keys", "--scenes", "--generators"):
        assert main(["info", flag]) == 0
    assert "physics.dt" in capsys.readouterr().out


def test_info_kernels_says_how_several_devices_split_each_record(capsys):
    assert main(["info", "--kernels"]) == 0
    lines = capsys.readouterr().out.splitlines()
    splits = {}
    for i, ln in enumerate(lines):
        if "on several devices (--gpus, MPI ranks):" in ln:
            name = next(lines[j].split()[0] for j in range(i - 1, -1, -1) if not lines[j].startswith("   "))
            splits[name] = ln.split("MPI ranks): ")[1].split(":")[0]
    assert {k: splits[k] for k in ("cpu-simd", "cpu-fp64", "cpu-tree", "cpu-n3l")} == {
        "cpu-simd": "targets",
        "cpu-fp64": "targets",
        "cpu-tree": "domains",
        "cpu-n3l": "pairs",
    }
    assert {splits.get("atomics-n3l"), splits.get("tree"), splits.get("best")} == {
        "pairs",
        "domains",
        "as the record it picks for N",
    }


def test_info_kernels_states_the_memory_per_body_of_a_record_that_reports_it(capsys):
    assert main(["info", "--kernels"]) == 0
    lines = capsys.readouterr().out.splitlines()
    tree = next(i for i, ln in enumerate(lines) if ln.strip().startswith("cpu-tree "))
    simd = next(i for i, ln in enumerate(lines) if ln.strip().startswith("cpu-simd "))
    memory = [ln for ln in lines if "bytes per body" in ln]
    assert lines[tree + 2].split()[:5] == ["memory", "135", "bytes", "per", "body"]
    assert "at N = 1,048,576 (host, beside the state" in lines[tree + 2]
    assert not lines[simd + 2].strip().startswith("memory") and len(memory) == 1  # all-pairs: none


def test_validate_a_tree_prints_its_tunables_and_percentiles_and_judges_the_p99(capsys):
    args = ["validate", "plummer", "--n", "4096", "--backend", "cpu", "--kernel", "cpu-tree"]
    assert main([*args, "--tunable", "theta=0.3", "--tunable", "opening=cube"]) == 0
    row = capsys.readouterr().out.splitlines()[-1]
    assert "alpha=0.001 group=64 leaf=16 opening=cube rebuild_every=16 rebuild_rule=adaptive theta=0.3" in row
    assert " median " in row and "p99 " in row and row.count("ok")
    median = float(row.split(" median ")[1].split()[0])
    p99 = float(row.split(" p99 ")[1].split()[0])
    assert 0 < median < p99 <= 1e-3
    assert main([*args, "--tunable", "theta=1.4"]) == 1  # far outside its p99 budget
    out = capsys.readouterr().out
    assert "99th-percentile relative error" in out
    # under the default opening test (rel) one evaluation is the cube test at theta, and the row says so
    assert (
        "opening=rel" in out and "these errors are the cube test's at theta=1.4 (a run's first step)" in out
    )
    assert main(["validate", "plummer", "--n", "64", "--kernel", "all", "--tunable", "theta=0.5"]) == 2
    assert "--tunable applies to one kernel" in capsys.readouterr().err


def test_info_names_the_device_a_backend_reports(capsys, monkeypatch):
    from app import backends
    from app.backends.base import Backend

    class Device(Backend):  # only what `info` asks of a backend; the rest is never called
        name = "dev"
        closed = 0
        kernels = classmethod(lambda cls: [])
        why_not = classmethod(lambda cls: None)
        load = kernel = set_kernel = tunables = set_tunables = clear_tunables = None
        set_physics = physics = n = step = accelerations = state = None

        def device_info(self):
            return {"name": "Toy GPU", "arch": "sm_90", "sms": 132, "driver_version": "580.1", "extra": 1}

        def close(self):
            Device.closed += 1

    class Broken(Device):
        name = "broken"

        def device_info(self):
            raise RuntimeError("no context")

    class Hostless(Device):  # Backend.device_info's default: no facts to state
        name = "host"
        device_info = Backend.device_info

        @classmethod
        def system_lines(cls):
            return ["links: none"]

    classes = {"dev": Device, "broken": Broken, "host": Hostless}
    monkeypatch.setattr(backends, "backend_classes", lambda: classes)
    assert main(["info", "--no-gl"]) == 0
    out = capsys.readouterr().out
    assert "backend dev: available\n  device: Toy GPU (sm_90, 132 SMs, driver 580.1)\n" in out
    assert "  device: unknown (RuntimeError: no context)" in out and Device.closed == 3
    assert (
        "backend host: available\n  device: (the backend states no device facts)\n  links: none\nkernels:"
    ) in out


@pytest.mark.gl
@pytest.mark.slow
@pytest.mark.parametrize("display", ["unset", "stale"])
def test_run_without_a_display_records_a_demo_instead(tmp_path, display):
    """`make run` on a machine with no display, or with a $DISPLAY no server answers (SSH, containers):
    out/demo.mp4 and out/demo.png, paths printed, status 0, one line saying why."""
    import av
    from test_display import dead_display, nbody

    out = nbody(
        "run",
        "plummer",
        "--n",
        "512",
        "--size",
        "320x180",
        cwd=tmp_path,
        display=dead_display() if display == "stale" else None,
    )
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    [why] = [line for line in out.stderr.splitlines() if "recording a short demo" in line]
    assert ("cannot open display" if display == "stale" else "unset") in why
    video, still = tmp_path / "out" / "demo.mp4", tmp_path / "out" / "demo.png"
    assert "out/demo.mp4" in out.stdout and "out/demo.png" in out.stdout
    with av.open(str(video)) as c:
        frames = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    assert len(frames) > 30 and frames[-1].shape == (180, 320, 3) and frames[-1].max() > 50
    from PIL import Image

    assert Image.open(still).size == (320, 180)
