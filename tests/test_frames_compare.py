"""Per-frame timings CSVs read back (`FrameLog.read_csv`) and compared (bench/frames_compare.py: issue 15's
"at most 0.1 ms a frame more with --gpus 1" check)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

from app.core.errors import RuntimeFault
from app.render.frames import FrameLog

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "frames_compare.py"


def streamed(path: Path, frame_ms: list[float], map_ms: float = 0.1) -> Path:
    """A CSV as `run --timings` writes it (FrameLog.stream_csv), one frame per value."""
    log = FrameLog().stream_csv(path)
    step = SimpleNamespace(
        steps=2, force_ms=1.0, integrate_ms=0.01, map_ms=map_ms, unmap_ms=0.02, interactions=10
    )
    for i, ms in enumerate(frame_ms):
        stats = SimpleNamespace(
            frame=i,
            kernel="shared",
            n=65536,
            step=step,
            paused=False,
            frame_ms=ms,
            draw_ms=0.5,
            upload_ms=0.0,
            record_ms=0.0,
        )
        log._on_frame(SimpleNamespace(stats=stats))
    log.close()
    return path


def compare():
    spec = importlib.util.spec_from_file_location("frames_compare", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_a_streamed_csv_reads_back_into_the_same_records(tmp_path):
    path = streamed(tmp_path / "a.csv", [3.0, 2.0, 4.0, 1.5])
    log = FrameLog.read_csv(path)
    assert [r.frame_ms for r in log.records] == [3.0, 2.0, 4.0, 1.5]
    r = log.records[-1]
    assert (r.kernel, r.n, r.steps, r.map_ms, r.interactions) == ("shared", 65536, 2, 0.1, 10)
    assert log.medians(skip=1)["frame_ms"] == 2.0


def test_not_a_timings_csv_names_the_file(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(RuntimeFault, match="bad.csv: not a per-frame timings CSV"):
        FrameLog.read_csv(bad)
    with pytest.raises(RuntimeFault, match="missing.csv"):
        FrameLog.read_csv(tmp_path / "missing.csv")


def test_compare_passes_within_the_bound_and_fails_over_it(tmp_path, capsys):
    main = compare()
    base = streamed(tmp_path / "base.csv", [10.0] * 20)
    near = streamed(tmp_path / "near.csv", [10.05] * 20)
    far = streamed(tmp_path / "far.csv", [10.0] * 5 + [10.3] * 15)  # the warm-up frames are left out
    assert main([str(base), str(near)]) == 0
    out = capsys.readouterr().out
    assert "near.csv: +0.050 ms a frame over the base" in out and "ok" in out
    assert main([str(base), str(near), str(far)]) == 1
    assert (
        "far.csv: +0.300 ms a frame over the base (outside the force +0.300 ms): OVER the 0.1 ms bound"
        in capsys.readouterr().out
    )
    assert main([str(base), str(far), "--max-extra-ms", "0.5"]) == 0


def test_compare_a_missing_file_is_exit_2(tmp_path, capsys):
    base = streamed(tmp_path / "base.csv", [10.0] * 3)
    assert compare()([str(base), str(tmp_path / "nope.csv")]) == 2
    err = capsys.readouterr().err
    assert "nope.csv" in err and len(err.strip().splitlines()) == 1
