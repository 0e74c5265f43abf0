"""Every output of run, record, bench and tune is checked before any work and written atomically: a bad
path is one line naming it and the reason, exit status 1, no traceback, no file left behind, and the
work (the backend, the benchmark, the tuner) never starts. app/core/outputs.py is the one implementation."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.cli import main
from app.core import outputs
from app.core.errors import RuntimeFault


def bad_paths(tmp_path: Path, name: str) -> dict[str, Path]:
    """Paths no file can be written to, each with a different reason (tests run as root, who ignores
    chmod: /proc refuses new files instead)."""
    return {
        "missing folder": tmp_path / "missing" / name,
        "refusing folder": Path("/proc") / name,
        "a directory": tmp_path,
    }


class WorkStarted(Exception):
    pass


def never(*args, **kwargs):
    raise WorkStarted("the work started before the output was checked")


def assert_one_line_error(rc, capsys, path: Path, tmp_path: Path):
    err = capsys.readouterr().err
    assert rc == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "cannot write" in lines[0] and str(path) in lines[0], err
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing left behind, no temporary


def test_check_output_reasons_and_atomic_write_leaves_nothing_on_failure(tmp_path):
    for why, path in bad_paths(tmp_path, "x.bin").items():
        with pytest.raises(RuntimeFault, match="cannot write thing") as e:
            outputs.check_output(path, "thing")
        assert str(path) in str(e.value) and "\n" not in str(e.value), why
    target = tmp_path / "x.bin"
    target.write_bytes(b"old")
    with pytest.raises(ValueError), outputs.atomic_write(target, "wb") as f:
        f.write(b"half")
        raise ValueError("the writer failed half way")
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["x.bin"]


@pytest.mark.parametrize("flag", ["--timings", "--screenshot"])
def test_run_checks_its_outputs_before_the_backend_starts(tmp_path, capsys, monkeypatch, flag):
    monkeypatch.setattr("app.commands.run.make_backend", never)
    for path in bad_paths(tmp_path, "t.csv" if flag == "--timings" else "s.png").values():
        rc = main(["run", "--backend", "cpu", "--n", "64", "--frames", "2", "--headless", flag, str(path)])
        assert_one_line_error(rc, capsys, path, tmp_path)


@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_bench_checks_its_outputs_before_benchmarking(tmp_path, capsys, monkeypatch, flag):
    monkeypatch.setattr("app.tools.bench.run_bench", never)
    for path in bad_paths(tmp_path, "b.json" if flag == "--json" else "b.png").values():
        rc = main(["bench", "--backend", "cpu", "--n", "64", "--no-progress", flag, str(path)])
        assert_one_line_error(rc, capsys, path, tmp_path)


def test_tune_checks_its_json_before_tuning(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("app.backends.select_backend", never)  # tuning starts by opening the GPU
    for path in bad_paths(tmp_path, "tune.json").values():
        rc = main(["tune", "--n", "64", "--json", str(path)])
        assert_one_line_error(rc, capsys, path, tmp_path)


@pytest.mark.parametrize(
    "target",
    [
        ["--frames", "2", "--out", "{}/r.mp4"],
        ["--still", "1", "--out", "{}/s.png"],
        ["--frames", "2", "--frames-dir", "{}/frames"],
    ],
)
def test_record_checks_its_targets_before_the_backend_starts(tmp_path, capsys, monkeypatch, target):
    monkeypatch.setattr("app.commands.record.make_backend", never)
    for folder in (tmp_path / "missing" / "deeper", Path("/proc")):
        if "--frames-dir" in target and folder.name == "deeper":
            continue  # --frames-dir creates its folder
        args = [a.format(folder) for a in target]
        rc = main(["record", "--backend", "cpu", "--n", "64", "--no-progress", *args])
        assert_one_line_error(rc, capsys, Path(args[-1]), tmp_path)


@pytest.mark.gl
def test_run_screenshot_that_fails_at_exit_is_an_error_not_wrote(tmp_path, capsys, monkeypatch):
    """The screenshot is taken as the viewer closes, after the check: a failure then (a full disk) is
    exit status 1 and never "wrote"."""
    from app.render import encoder, gl_setup

    try:
        gl_setup.configure(headless=True)
    except RuntimeError as e:
        pytest.skip(str(e))

    def full(img, path, compress_level=3, what="frame"):
        raise RuntimeFault(f"cannot write {what} {path}: No space left on device")

    monkeypatch.setattr(encoder, "write_png", full)
    shot = tmp_path / "s.png"
    rc = main(
        [
            "-q",
            "run",
            "--backend",
            "cpu",
            "--n",
            "64",
            "--frames",
            "2",
            "--headless",
            "--size",
            "64x64",
            "--screenshot",
            str(shot),
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 1 and f"wrote {shot}" not in out and "No space left" in err and str(shot) in err
    assert not shot.exists()


def drawing_viewer():
    """What FrameLog reads of a viewer after a frame: its stats (a 2 ms frame, no step)."""
    from types import SimpleNamespace

    return SimpleNamespace(
        stats=SimpleNamespace(
            frame=0,
            kernel="k",
            n=8,
            step=None,
            paused=False,
            frame_ms=2.0,
            draw_ms=1.0,
            upload_ms=0.0,
            record_ms=0.0,
        )
    )


def test_run_timings_stream_every_frame_as_it_is_drawn(tmp_path):
    """`run --timings` keeps every frame (the in-memory log keeps the last `capacity`), each row flushed
    as it is drawn, so that an interrupted run keeps its rows."""
    import csv

    from app.render.frames import CSV_FIELDS, FrameLog

    log = FrameLog(capacity=3)
    path = tmp_path / "t.csv"
    log.stream_csv(path)
    viewer = drawing_viewer()
    for i in range(5):
        viewer.stats.frame = i
        log._on_frame(viewer)
        rows = list(csv.DictReader(path.open()))  # on disk already, before close()
        assert [int(r["frame"]) for r in rows] == list(range(i + 1))
    log.close()
    log.close()
    assert len(log.records) == 3 and list(rows[0]) == list(CSV_FIELDS)
    assert float(rows[-1]["outside_force_ms"]) == 2.0


def test_a_timings_write_that_fails_mid_run_stops_the_stream_not_the_viewer(tmp_path, monkeypatch):
    from app.render.frames import FrameLog

    real, written = outputs.StreamedFile.write, []

    def full(self, text):
        if len(written) == 3:
            raise RuntimeFault(f"cannot write timings {self.path}: No space left on device")
        written.append(text)
        real(self, text)

    monkeypatch.setattr(outputs.StreamedFile, "write", full)
    log = FrameLog().stream_csv(tmp_path / "t.csv")
    viewer = drawing_viewer()
    for _ in range(5):
        log._on_frame(viewer)  # (inside the viewer's draw: it must not raise)
    assert "No space left on device" in log.stream_error and len(written) == 3  # header + 2 rows
    assert len(log.records) == 5


def test_the_kernel_and_tuning_caches_write_through_app_outputs(tmp_path, monkeypatch):
    """The compile cache round-trips and leaves no temporaries; an unwritable one only costs a recompile.
    The tuning cache is written atomically to its GPU's file (no nvcc or GPU needed for either)."""
    from app.backends.cuda import compile as cc
    from app.backends.cuda import tuning_cache

    module = cc.CompiledModule(
        path=tmp_path / "k.cu",
        arch="sm_90",
        cubin=b"\x7fELF...",
        log="ptxas info",
        functions={"f": cc.FunctionResources("f", registers=32)},
        key="abc",
    )
    cc._write_cache(tmp_path, "k", module)
    back = cc._read_cache(tmp_path, "k", module.path, "sm_90", "abc")
    assert back.cubin == module.cubin and back.functions == module.functions and back.cached
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.cubin", "k.json"]
    cc._write_cache(Path("/proc/nbody-cache"), "k", module)  # unwritable: silently not cached

    monkeypatch.setenv("NBODY_CACHE_DIR", str(tmp_path / "cache"))
    data = {
        "schema": tuning_cache.SCHEMA,
        "gpu": "Toy GPU",
        "driver": "1.0",
        "source_hash": "0" * 64,
        "best": [],
    }
    path = tuning_cache.write_cache(data)
    assert path.is_file() and [p.name for p in path.parent.iterdir()] == [path.name]
