"""Issue 28, item 4: the fault matrix. Every output of every command that writes a file, under every fault
of a file system, and every command under SIGINT / SIGTERM at three points of its run and (MPI) a killed
rank: the exit status, one line naming the problem (no traceback), and what is kept.

Three tables: MATRIX (output x fault), SIGNALS (command x point, under SIGINT and SIGTERM) and KILLED (a
rank of two killed under mpiexec). Each cell is one real process: `python -m app`, or
`tests/signal_job.py`, which runs the command and sends itself the signal just before the named call
(`tune` there runs on tests/test_tune_gpus.py's stand-in GPU). The faults are real, not mocked:
- a read-only folder is a read-only bind mount, and a full disk a 4 KiB tmpfs, both made in a private
  user + mount namespace (`unshare -rm`), so nothing outside the test sees them; where namespaces are
  not permitted those two columns skip, saying so;
- /dev/full is the kernel's own (every write fails with ENOSPC);
- a name over the file system's limit, a folder that does not exist, two outputs on one path and the
  extension of another format are ordinary paths.

A cell that cannot apply (a command with one output has no "same path twice") is in NOT_APPLICABLE
with its reason; `test_the_matrix_covers_every_output_and_fault` fails on a cell in neither table.
"""

from __future__ import annotations

import concurrent.futures
import csv
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from test_fault_rows import BENCH, SIMULATE

ROOT = Path(__file__).resolve().parent.parent
HEAVY = "nbody-live: backend"  # the backend choice lines `auto` prints: not about the fault


# --- the outputs ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Output:
    """One output of one command: `argv(path, partner)` runs the command writing this output at `path`
    (and its other output, if it has one, at `partner`); `suffix` is the right extension ("" for a
    folder); `partner` the other output's extension, None for a command with one output."""

    argv: Callable[[str, str], list[str]]
    suffix: str
    partner: str | None = None
    wrong: str | None = None  # the extension of another format (None: a folder)


def with_values(argv: list[str], **values: str) -> list[str]:
    """`argv` with the value after each `--name` replaced (n="256": the value after --n)."""
    out = list(argv)
    for name, value in values.items():
        out[out.index(f"--{name}") + 1] = value
    return out


SIM = [*with_values(SIMULATE, n="256", steps="40"), "--log-every", "1"]  # an npz of 18 KB: fills 4 KiB
REC = ["record", "plummer", "--n", "64", "--size", "128x96", "--no-progress", "--backend", "cpu"]
RUN = ["run", "plummer", "--n", "64", "--backend", "cpu"]

OUTPUTS = {
    "simulate --out": Output(lambda p, q: [*SIM, "--out", p, "--log", q], ".npz", ".csv", ".xyz"),
    "simulate --log": Output(lambda p, q: [*SIM, "--out", q, "--log", p], ".csv", ".npz", ".txt"),
    "simulate --out-dir": Output(lambda p, q: [*SIM, "--snapshot-every", "10", "--out-dir", p], ""),
    "record --out": Output(lambda p, q: [*REC, "--frames", "30", "--out", p], ".mp4", None, ".png"),
    "record --still": Output(lambda p, q: [*REC, "--still", "0.1", "--out", p], ".png", None, ".mp4"),
    "record --frames-dir": Output(lambda p, q: [*REC, "--frames", "4", "--frames-dir", p], ""),
    "bench --json": Output(lambda p, q: [*BENCH, "--json", p, "--plot", q], ".json", ".png", ".png"),
    "bench --plot": Output(lambda p, q: [*BENCH, "--json", q, "--plot", p], ".png", ".json", ".jpg"),
    "tune --json": Output(lambda p, q: ["tune", "--n", "64", "--json", p], ".json", None, ".png"),
    "run --timings": Output(
        lambda p, q: [*RUN, "--frames", "400", "--timings", p, "--screenshot", q], ".csv", ".png", ".json"
    ),
    "new-kernel --out": Output(lambda p, q: ["new-kernel", "mine", "--out", p], ".cu", None, ".txt"),
    "run --record-to": Output(lambda p, q: [*RUN, "--frames", "5", "--record-to", p], ""),
    "run --screenshot": Output(
        lambda p, q: [*RUN, "--frames", "5", "--timings", q, "--screenshot", p], ".png", ".csv", ".jpg"
    ),
}
FAULTS = (
    "missing folder",
    "read-only",
    "disk full",
    "/dev/full",
    "too long a name",
    "same path twice",
    "wrong extension",
)
IN_NAMESPACE = ("read-only", "disk full")


# --- what is kept -----------------------------------------------------------------------------------------
@dataclass
class Outcome:
    rc: int
    err: str
    where: Path  # the folder the faulted output was to go in (the mount, in a namespace)
    path: Path  # the faulted output's path
    other: Path  # the partner output's path


def nothing(o: Outcome) -> None:
    """No file at all where the output was to go: neither a complete-looking one nor a hidden temporary."""
    if o.where.is_dir():
        assert sorted(p.name for p in o.where.rglob("*")) == [], "files left behind"


def dev_full_intact(o: Outcome) -> None:
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode), "/dev/full was replaced"
    assert not list(Path("/dev").glob(".full*")), "a temporary left in /dev"


def folder_made(o: Outcome) -> None:
    assert o.path.is_dir() and any(o.path.iterdir())


def state_kept(o: Outcome) -> None:
    """The snapshot, the other output, holds the run's 256 bodies."""
    assert np.load(o.other)["pos"].shape == (256, 3)


def state_and_log_rows_kept(o: Outcome) -> None:
    state_kept(o)
    if o.path.exists():  # a log on the full disk: the rows that fitted, each whole
        with open(o.path, newline="") as fh:
            rows = list(csv.reader(fh))
        assert rows[0][0] == "step" and all(len(r) == len(rows[0]) for r in rows)


def complete_snapshots_only(o: Outcome) -> None:
    """Every snapshot of the series there is whole (it loads); no temporaries."""
    for p in o.path.rglob("*"):
        assert not p.name.startswith("."), f"temporary {p.name} left"
        if p.suffix == ".npz":
            assert np.load(p)["pos"].shape == (256, 3)


def whole_frames_only(o: Outcome) -> None:
    from PIL import Image

    names = sorted(p.name for p in o.path.iterdir())
    assert names == [f"frame_{i:06d}.png" for i in range(len(names))], names
    for name in names:
        with Image.open(o.path / name) as im:
            im.verify()


def rows_so_far(o: Outcome) -> None:
    """The bench JSON as its last whole write left it: the rows so far, marked incomplete."""
    if o.path.exists():
        data = json.loads(o.path.read_text())
        assert data["complete"] is False and all(r["status"] == "ok" for r in data["results"])


def json_complete(o: Outcome) -> None:
    nothing(o)
    assert json.loads(o.other.read_text())["complete"] is True


def timing_rows_kept(o: Outcome) -> None:
    with open(o.path, newline="") as fh:
        rows = list(csv.reader(fh))
    assert len(rows) >= 2 and all(len(r) == len(rows[0]) for r in rows)


def timings_complete(o: Outcome) -> None:
    nothing(o)
    assert len(o.other.read_text().splitlines()) == 7  # the header, frame 0 (the first draw) and 5 more


@dataclass(frozen=True)
class Expect:
    status: int
    said: str  # in the last line of stderr
    kept: Callable[[Outcome], None] = nothing


RECORD_TO = "run --record-to"
FILE_OUTPUTS = [name for name, out in OUTPUTS.items() if out.suffix]
FOLDER_OUTPUTS = [name for name, out in OUTPUTS.items() if not out.suffix]
TWO_OUTPUTS = [name for name, out in OUTPUTS.items() if out.partner]
NO_SPACE = "No space left on device"

MATRIX: dict[tuple[str, str], Expect] = {
    **{(name, "missing folder"): Expect(1, "does not exist") for name in FILE_OUTPUTS},
    **{(name, "missing folder"): Expect(0, "", folder_made) for name in FOLDER_OUTPUTS if name != RECORD_TO},
    (RECORD_TO, "missing folder"): Expect(0, "", nothing),  # made at the first recording, not before
    **{(name, "read-only"): Expect(1, "Read-only file system") for name in OUTPUTS},
    ("simulate --out", "disk full"): Expect(1, NO_SPACE),
    ("simulate --log", "disk full"): Expect(1, NO_SPACE, state_and_log_rows_kept),
    ("simulate --out-dir", "disk full"): Expect(1, NO_SPACE, complete_snapshots_only),
    ("record --out", "disk full"): Expect(1, "disk is full"),
    ("record --still", "disk full"): Expect(1, NO_SPACE),
    ("record --frames-dir", "disk full"): Expect(1, NO_SPACE, whole_frames_only),
    ("bench --json", "disk full"): Expect(1, NO_SPACE, rows_so_far),
    ("bench --plot", "disk full"): Expect(1, NO_SPACE, json_complete),
    ("run --timings", "disk full"): Expect(1, NO_SPACE, timing_rows_kept),
    ("run --screenshot", "disk full"): Expect(1, NO_SPACE, timings_complete),
    ("simulate --out", "/dev/full"): Expect(2, "cannot tell the output format", dev_full_intact),
    ("simulate --log", "/dev/full"): Expect(1, NO_SPACE, state_kept),
    ("simulate --out-dir", "/dev/full"): Expect(2, "is a file; name a folder", dev_full_intact),
    ("record --out", "/dev/full"): Expect(
        1, "a character device, and this output needs a file", dev_full_intact
    ),
    ("record --still", "/dev/full"): Expect(1, NO_SPACE, dev_full_intact),
    ("record --frames-dir", "/dev/full"): Expect(1, "it is not a directory", dev_full_intact),
    ("bench --json", "/dev/full"): Expect(1, NO_SPACE, dev_full_intact),
    ("bench --plot", "/dev/full"): Expect(1, NO_SPACE, dev_full_intact),
    ("run --timings", "/dev/full"): Expect(1, NO_SPACE, dev_full_intact),
    ("run --screenshot", "/dev/full"): Expect(1, NO_SPACE, dev_full_intact),
    (RECORD_TO, "/dev/full"): Expect(1, "/dev/full is not a folder", dev_full_intact),
    ("new-kernel --out", "/dev/full"): Expect(2, "does not overwrite", dev_full_intact),
    **{(name, "too long a name"): Expect(1, "this file system takes at most") for name in FILE_OUTPUTS},
    **{(name, "too long a name"): Expect(1, "File name too long") for name in FOLDER_OUTPUTS},
    **{(name, "same path twice"): Expect(1, "are the same file") for name in TWO_OUTPUTS},
    ("simulate --out", "wrong extension"): Expect(
        2, "cannot tell the output format from the extension '.xyz'"
    ),
    **{
        (name, "wrong extension"): Expect(2, f"must end in {OUTPUTS[name].suffix}")
        for name in FILE_OUTPUTS
        if name != "simulate --out"
    },
}
NOT_APPLICABLE = {
    ("new-kernel --out", "disk full"): "a starter is about 2 KiB and fits the 4 KiB tmpfs; its ENOSPC is the "
    "/dev/full cell's refusal to overwrite, and atomic_write's on a full disk is the other outputs'",
    (RECORD_TO, "disk full"): "nothing is written there until V is pressed in the viewer: a live recording "
    "that fills its disk is tests/test_live_record.py's",
    **{
        (name, "same path twice"): "the command writes one output"
        for name in OUTPUTS
        if name not in TWO_OUTPUTS
    },
    **{(name, "wrong extension"): "a folder has no format" for name in FOLDER_OUTPUTS},
    **{
        ("tune --json", fault): "tune writes after its timing, which needs a GPU (CI has none): the same "
        "fault through a stand-in GPU is test_tune_writes_a_full_device_as_one_line below"
        for fault in ("disk full", "/dev/full")
    },
}


# --- running the cells ------------------------------------------------------------------------------------
def _namespaces_work() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = "mount -t tmpfs -o size=4k tmpfs /mnt"
    return subprocess.run(["unshare", "-rm", "sh", "-c", probe], capture_output=True).returncode == 0


NAMESPACES = _namespaces_work()


def _paths(base: Path, name: str, fault: str) -> tuple[Path, Path, Path]:
    """(the folder the faulted output goes in, its path, the partner's path) of one cell."""
    out = OUTPUTS[name]
    cell = base / f"{name.replace(' ', '_').replace('-', '')}-{fault.replace(' ', '_').replace('/', '')}"
    where, other = cell / "here", cell / "other"
    where.mkdir(parents=True)
    other.mkdir()
    partner = other / f"y{out.partner or ''}"
    leaf = f"x{out.suffix}"
    if fault == "missing folder":
        return where, where / "nope" / leaf, partner
    if fault == "/dev/full":
        return where, Path("/dev/full"), partner
    if fault == "too long a name":
        return where, where / ("a" * 300 + out.suffix), partner
    if fault == "same path twice":
        return where, where / leaf, where / leaf
    if fault == "wrong extension":
        return where, where / f"x{out.wrong}", partner
    return where, where / leaf, partner


def _command(name: str, path: Path, partner: Path) -> list[str]:
    return [sys.executable, "-m", "app", *OUTPUTS[name].argv(str(path), str(partner))]


# the checkout first, then whatever the environment adds (the GPU machine's kit installs its wheels there)
ENV = dict(
    os.environ, NBODY_HEADLESS="1", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[tuple[str, str], Outcome]:
    """Every applicable cell run once: the namespace cells in one private namespace, the others as
    processes four at a time."""
    base = tmp_path_factory.mktemp("matrix")
    cells = {cell: _paths(base, *cell) for cell in MATRIX}
    found: dict[tuple[str, str], Outcome] = {}

    def run(cell) -> None:
        where, path, partner = cells[cell]
        r = subprocess.run(
            _command(cell[0], path, partner), capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=120
        )
        found[cell] = Outcome(r.returncode, r.stderr, where, path, partner)

    plain = [cell for cell in MATRIX if cell[1] not in IN_NAMESPACE]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(run, plain))
    if NAMESPACES:
        script = ["set -u"]
        for cell in (c for c in MATRIX if c[1] in IN_NAMESPACE):
            where, path, partner = cells[cell]
            if cell[1] == "read-only":
                script.append(f"mount --bind {where} {where} && mount -o remount,bind,ro {where} {where}")
            else:
                script.append(f"mount -t tmpfs -o size=4k tmpfs {where}")
            tag = f"{base}/{where.parent.name}"
            script.append(f"{shlex.join(_command(cell[0], path, partner))} 2>{tag}.err; echo $? >{tag}.rc")
            script.append(f"cp -a {where} {tag}.kept")  # what the mount held, for after the namespace
        subprocess.run(
            ["unshare", "-rm", "sh", "-c", "\n".join(script)],
            env=ENV,
            cwd=ROOT,
            timeout=600,
            capture_output=True,
        )
        for cell in (c for c in MATRIX if c[1] in IN_NAMESPACE):
            where, path, partner = cells[cell]
            tag = base / where.parent.name
            kept = Path(f"{tag}.kept")
            found[cell] = Outcome(
                int(Path(f"{tag}.rc").read_text()),
                Path(f"{tag}.err").read_text(),
                kept,
                kept / path.relative_to(where),
                partner,
            )
    return found


def last_line(err: str) -> str:
    """stderr's last line, after checking that every line is the program's own (no traceback)."""
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith(HEAVY) and "no display" not in ln]
    assert "Traceback" not in err, err
    assert all(ln.startswith("nbody-live") for ln in lines), [
        ln for ln in lines if not ln.startswith("nbody")
    ]
    return lines[-1] if lines else ""


@pytest.mark.parametrize("cell", list(MATRIX), ids=lambda cell: f"{cell[0]} x {cell[1]}")
def test_an_output_under_a_fault(outcomes, cell):
    if cell[1] in IN_NAMESPACE and not NAMESPACES:
        pytest.skip("needs `unshare -rm` with mounts (a private user + mount namespace)")
    want, got = MATRIX[cell], outcomes[cell]
    line = last_line(got.err)
    assert got.rc == want.status, got.err
    assert want.said in line, got.err
    want.kept(got)


def test_the_matrix_covers_every_output_and_fault():
    for name in OUTPUTS:
        for fault in FAULTS:
            cell = (name, fault)
            assert (cell in MATRIX) != (cell in NOT_APPLICABLE), f"{cell}: in neither table, or in both"
            assert NOT_APPLICABLE.get(cell, "x"), cell


# --- signals at three points of each command's run --------------------------------------------------------
# Each cell is `tests/signal_job.py`: the command in a process that sends itself the signal just before the
# named call. "setup": the backend (or the bench's first row) is being made, nothing measured yet; "work":
# in the middle of the steps, rows, frames or N; "output": while the result is being written.
SIGNAL_JOB = ROOT / "tests" / "signal_job.py"
STAND_IN = ["register-blocked", "atomics-n3l", "multi-thread-per-body", "block-template", "shared"]
COMMANDS = {
    "simulate": lambda d: [
        *with_values(SIM, **{"log-every": "5"}),
        "--out",
        f"{d}/o.npz",
        "--log",
        f"{d}/l.csv",
    ],
    "bench": lambda d: [*BENCH, "--json", f"{d}/b.json", "--plot", f"{d}/b.png"],
    "record": lambda d: [*REC, "--frames", "30", "--out", f"{d}/v.mp4"],
    "run": lambda d: [*RUN, "--frames", "30", "--timings", f"{d}/t.csv", "--screenshot", f"{d}/s.png"],
    "tune": lambda d: ["tune", "--n", "256,512", "--variants", ",".join(STAND_IN), "--json", f"{d}/t.json"],
    "new-kernel": lambda d: ["new-kernel", "mine", "--out", f"{d}/mine.cu"],
}
POINTS = {
    ("simulate", "setup"): ("app.commands.simulate.make_backend", 1),
    ("simulate", "work"): ("app.backends.cpu.CPUBackend.step", 3),
    ("simulate", "output"): ("app.model.formats.write", 1),
    ("bench", "setup"): ("app.tools.bench._Sweep.open", 1),
    ("bench", "work"): ("app.tools.bench._Sweep.row", 3),
    ("bench", "output"): ("app.tools.bench_plot.plot", 1),
    ("record", "setup"): ("app.commands.record.make_backend", 1),
    ("record", "work"): ("app.backends.cpu.CPUBackend.step", 10),
    ("record", "output"): ("app.render.record_sinks.Recorder.stop", 1),
    ("run", "setup"): ("app.commands.run.make_backend", 1),
    ("run", "work"): ("app.backends.cpu.CPUBackend.step", 10),
    ("run", "output"): ("app.render.canvas.Viewer.save_png", 1),
    ("tune", "setup"): ("app.backends.cuda.tune._compile_first", 1),
    ("tune", "work"): ("app.backends.cuda.tune._Sweep.at", 2),
    ("tune", "output"): ("app.backends.cuda.tuning_cache.write_cache", 1),
    ("new-kernel", "setup"): ("app.backends.cuda.user_kernels.new_kernel_text", 1),
    ("new-kernel", "output"): ("app.core.outputs.partial_file", 1),  # atomic_write's temporary
}


def none_written(d: Path) -> None:
    assert [p.name for p in d.iterdir() if p.name != "cache"] == []


def state_at_step_15(d: Path) -> None:
    """The state where the run stopped (3 calls of 5 steps), and the log rows up to step 10, whole."""
    with open(d / "l.csv", newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[0][:2] == ["step", "time"] and [r[0] for r in rows[1:]] == ["0", "5", "10"]
    assert float(np.load(d / "o.npz")["time"]) == pytest.approx(1.5 * float(rows[-1][1]), rel=1e-12)


def run_complete(d: Path) -> None:
    assert np.load(d / "o.npz")["pos"].shape == (256, 3)
    assert (d / "l.csv").read_text().count("\n") == 1 + 9  # the header, steps 0, 5, ..., 40


def two_rows_kept(d: Path) -> None:
    data = json.loads((d / "b.json").read_text())
    assert data["complete"] is False and len(data["results"]) == 2


def json_complete_no_plot(d: Path) -> None:
    assert json.loads((d / "b.json").read_text())["complete"] is True and not (d / "b.png").exists()


def playable(d: Path, frames: int | None = None) -> None:
    import av

    with av.open(str(d / "v.mp4")) as video:
        count = sum(1 for _ in video.decode(video=0))
    assert count == frames if frames else count > 0
    assert [p.name for p in d.iterdir()] == ["v.mp4"]  # no temporary left


def frames_so_far(d: Path) -> None:
    playable(d)


def all_frames(d: Path) -> None:
    playable(d, 30)


def viewer_outputs(d: Path) -> None:
    """The timings of every frame drawn (whole rows) and the screenshot of the last."""
    from PIL import Image

    with open(d / "t.csv", newline="") as fh:
        rows = list(csv.reader(fh))
    assert len(rows) >= 3 and all(len(r) == len(rows[0]) for r in rows)
    with Image.open(d / "s.png") as im:
        assert im.size[0] > 0


def first_n_kept(d: Path) -> None:
    data = json.loads((d / "t.json").read_text())
    assert data["complete"] is False and [e["n"] for e in data["best"]] == [256]
    cached = json.loads(next((d / "cache").rglob("tune-*.json")).read_text())
    assert [e["n"] for e in cached["tunings"]["1"]["best"]] == [256]


def whole_tuning_filed(d: Path) -> None:
    cached = json.loads(next((d / "cache").rglob("tune-*.json")).read_text())
    assert [e["n"] for e in cached["tunings"]["1"]["best"]] == [256, 512]


# (status, what the last line says, what is kept). A signal after the last step or frame (the output is
# being written) changes nothing for simulate and record: the output completes and the status is 0, as
# their --help says; bench and tune stop, keeping what was written.
SIGNALS: dict[tuple[str, str], tuple[int | None, str, Callable[[Path], None]]] = {
    ("simulate", "setup"): (None, "simulate: interrupted ({sig})", none_written),
    ("simulate", "work"): (None, "interrupted by {sig} at step 15 of 40: state so far ->", state_at_step_15),
    ("simulate", "output"): (0, "", run_complete),
    ("bench", "setup"): (None, "no row had finished", none_written),
    ("bench", "work"): (None, "the rows measured so far are in", two_rows_kept),
    ("bench", "output"): (None, "b.json is complete; ", json_complete_no_plot),
    ("record", "setup"): (
        None,
        "interrupted ({sig}) before the first frame; nothing was written",
        none_written,
    ),
    ("record", "work"): (None, "interrupted ({sig}): kept 11 of 30 frames", frames_so_far),
    ("record", "output"): (0, "wrote ", all_frames),
    ("run", "setup"): (None, "run: interrupted ({sig})", none_written),
    ("run", "work"): (None, "wrote ", viewer_outputs),
    ("run", "output"): (None, "wrote ", viewer_outputs),
    ("tune", "setup"): (None, "no N had finished", none_written),
    ("tune", "work"): (None, "the N finished so far are in", first_n_kept),
    ("tune", "output"): (None, "the N finished so far are in", whole_tuning_filed),
    ("new-kernel", "setup"): (None, "new-kernel: interrupted ({sig})", none_written),
    ("new-kernel", "output"): (None, "new-kernel: interrupted ({sig})", none_written),
}


@pytest.mark.parametrize("sig", ["INT", "TERM"])
@pytest.mark.parametrize("cell", list(SIGNALS), ids=lambda cell: f"{cell[0]} at {cell[1]}")
def test_a_signal_at_a_point_of_a_run(tmp_path, cell, sig):
    command, _point = cell
    target, nth = POINTS[cell]
    flags = ["--stand-in-gpu"] if command == "tune" else []
    env = dict(ENV, NBODY_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run(
        [sys.executable, str(SIGNAL_JOB), target, str(nth), sig, *flags, "--", *COMMANDS[command](tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    status, said, kept = SIGNALS[cell]
    name = f"SIG{sig}"
    expected = 128 + {"INT": 2, "TERM": 15}[sig] if status is None else status
    assert r.returncode == expected, r.stderr
    last_line(r.stderr)  # the program's own lines, no traceback
    assert said.format(sig=name) in r.stdout + r.stderr, r.stdout + r.stderr
    kept(tmp_path)


NO_SIGNAL_POINT = {("new-kernel", "work"): "it has no work between reading the built-in and its one write"}


def test_every_command_that_writes_a_file_has_its_signal_cells():
    commands = {name.split()[0] for name in OUTPUTS}
    assert set(COMMANDS) == commands
    every = {(c, p) for c in commands for p in ("setup", "work", "output")}
    assert set(SIGNALS) == set(POINTS) == every - set(NO_SIGNAL_POINT)


# --- a rank killed under MPI ------------------------------------------------------------------------------
MPIEXEC = shutil.which("mpiexec", path=str(Path(sys.executable).parent))


def checkpoint_of_step_20(d: Path) -> None:
    """The last checkpoint (step 20: the kill came before step 21) is whole, and the log has its rows."""
    with open(d / "l.csv", newline="") as fh:
        rows = list(csv.reader(fh))
    assert [r[0] for r in rows[1:]] == ["0", "5", "10", "15", "20"]
    assert float(np.load(d / "o.npz")["time"]) == pytest.approx(float(rows[-1][1]), rel=1e-12)


KILLED = {
    "simulate": (
        [*with_values(SIM, **{"log-every": "5"}), "--checkpoint-every", "10"],
        lambda d: ["--out", f"{d}/o.npz", "--log", f"{d}/l.csv"],
        5,
        checkpoint_of_step_20,
    ),
    "bench": (BENCH, lambda d: ["--json", f"{d}/b.json"], 5, two_rows_kept),
}


@pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not found: pip install 'nbody-live[mpi]'")
@pytest.mark.parametrize("command", list(KILLED))
def test_a_rank_killed_mid_run_ends_the_job_and_keeps_what_was_written(tmp_path, command):
    """Rank 1 of 2 is killed (SIGKILL: it cannot say anything) just before its 5th step: the launcher ends
    the job within seconds, naming the signal, and what rank 0 had written stays whole: simulate's
    checkpoint and log, bench's rows."""
    import time

    argv, outputs, nth, kept = KILLED[command]
    started = time.monotonic()
    r = subprocess.run(
        [
            MPIEXEC,
            "-n",
            "2",
            sys.executable,
            str(SIGNAL_JOB),
            "app.backends.distributed.RankRun.step",
            str(nth),
            "KILL",
            "--rank",
            "1",
            "--",
            *argv,
            *outputs(tmp_path),
        ],
        capture_output=True,
        text=True,
        env=dict(ENV, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1"),
        cwd=ROOT,
        timeout=120,
    )
    assert r.returncode != 0 and time.monotonic() - started < 60, r.stderr
    said = r.stdout + r.stderr
    assert "Traceback" not in said and "signal 9" in said, said
    kept(tmp_path)
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left


def test_tune_writes_a_full_device_as_one_line(tmp_path, capsys, monkeypatch):
    """tune's --json on /dev/full (ENOSPC at its first write, after the first N), through the stand-in
    GPU: one line naming the file and the cause, exit 1, and the N measured filed in the cache (the
    tuning is not lost because its JSON could not be written)."""
    from test_tune_gpus import FakeGpu, FakeGpuHere

    import app.backends
    from app.backends.cuda.multi import GpuDevices
    from app.cli import main

    monkeypatch.setenv("NBODY_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(FakeGpu, "loads", [])
    monkeypatch.setattr(app.backends, "select_backend", lambda name: FakeGpuHere)
    monkeypatch.setattr(GpuDevices, "count", staticmethod(lambda: 1))
    rc = main(["tune", "--n", "256,512", "--variants", ",".join(STAND_IN), "--json", "/dev/full"])
    captured = capsys.readouterr()
    assert rc == 1 and last_line(captured.err) == (
        "nbody-live tune: error: cannot write tune results /dev/full: No space left on device"
    )
    assert "stopped: the tuning of N = 256 is filed in" in captured.out
    cached = json.loads(next((tmp_path / "cache").rglob("tune-*.json")).read_text())
    assert [e["n"] for e in cached["tunings"]["1"]["best"]] == [256]
