"""Snapshot series: a numbered set of snapshots of one run, written by `simulate --snapshot-every K
--out-dir DIR` and read back for a replay (`run DIR`, `record DIR`).

    writer = SeriesWriter(Path("out/run1"), every=100, dt=1e-3)   # nothing touched yet
    writer.prepare(resume=None)       # before the work: DIR created, writable, not another run's series
    writer.due(step) / writer.write(step, bodies) / writer.finish()

    series = open_series("out/run1")  # a folder (its series.json, else every snapshot file in it) or a glob
    series.n, series.times, series.paths
    pos4, speeds = series.render_arrays(t)         # float32, positions interpolated linearly in time
    bodies = series.state_at(t)                    # float64 Bodies at time t (also interpolated)

On disk: DIR/snap_<step>.npz (app.model.formats' npz writer: float64, the original body order, the time, the
bodies' components: a replay draws them as the live run did) and
DIR/series.json, the manifest: the snapshots in order with their step and time, dt, N, and `complete`
(false until the run wrote its last step). Both are written atomically (app.core.outputs): a snapshot is
listed only once it is complete, and an interrupted run leaves a series of complete snapshots marked
incomplete. A resumed run (`simulate --resume`) continues the series in the same DIR on the same step grid, so
that a run stopped and resumed writes the snapshots an uninterrupted one would.

Reading checks every file before the replay starts: each must be readable and hold the same N as the
first; an error names the file and says what to do. Rows are matched by particle ID when the files carry
IDs (other codes reorder bodies); otherwise row i is body i in every file.
"""

from __future__ import annotations

import glob
import json
import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.core.errors import ConfigError, InputFileError
from app.core.outputs import atomic_write, check_output
from app.model.bodies import Bodies

log = logging.getLogger(__name__)

MANIFEST = "series.json"
KIND = "nbody-live snapshot series"
PREFIX = "snap_"
SNAPSHOT_SUFFIXES = (".npz", ".csv", ".tipsy", ".tip", ".std", ".nemo", ".mpv", ".nbabel")
KEEP_BYTES = 1 << 30  # series up to this size (float32 positions + velocities) stay in memory
CACHED = 4  # snapshots kept in memory otherwise (the two around the current time, and the last two)


def snapshot_name(step: int) -> str:
    return f"{PREFIX}{step:08d}.npz"


def is_series_arg(text: str | None) -> bool:
    """True when a SCENE argument names a series: a folder, or a glob pattern (`out/run1/snap_*.npz`)."""
    if not text:
        return False
    p = Path(text)
    return p.is_dir() or (not p.exists() and glob.has_magic(text))


# --------------------------------------------------------------------------------------------------
# writing


@dataclass
class Entry:
    file: str
    step: int
    time: float


class SeriesWriter:
    """The series of one `simulate` run. Steps are absolute: a resumed run continues the numbering of the
    series it resumes (from the resumed state's time on the series' grid t0 + step x dt)."""

    def __init__(self, directory, every: int, dt: float):
        self.directory = Path(directory)
        self.every = int(every)
        self.dt = float(dt)
        self.manifest = self.directory / MANIFEST
        self.entries: list[Entry] = []
        self.t0 = 0.0
        self.n: int | None = None
        self.base = 0  # the absolute step of the run's first state
        self.final_step: int | None = None
        self.complete = False

    # --- before the work ---------------------------------------------------------------------------
    def plan(self, resume: Bodies | None) -> int:
        """Read what DIR holds (nothing is written) and return the absolute step of the starting state:
        0 for a new series; for --resume into a series, the resumed state's step on its grid.
        ConfigError when DIR holds another run's series, or the resumed state is not on its grid."""
        if resume is None:
            if self.manifest.exists() or self._stray():
                what = MANIFEST if self.manifest.exists() else f"{PREFIX}*.npz files"
                raise ConfigError(
                    f"--out-dir {self.directory} already holds a snapshot series ({what}); "
                    "name a new folder, or add --resume FILE to continue that run"
                )
            return 0
        self.t0 = resume.time
        old = self._read_manifest()
        if old is None:
            if self._stray():
                raise ConfigError(
                    f"--out-dir {self.directory} holds {PREFIX}*.npz files but no {MANIFEST}: "
                    "it is not a series this command can continue; name a new folder"
                )
            return 0  # a new series that starts at the resumed state
        if old.get("dt") != self.dt:
            was = old.get("dt")
            raise ConfigError(
                f"--out-dir {self.directory}: the series was written with dt = {was}, this "
                f"run has dt = {self.dt}; resume with --dt {was} or name a new --out-dir"
            )
        if old.get("n") != resume.n:
            raise ConfigError(
                f"--out-dir {self.directory}: the series has N = {old.get('n')}, the resumed "
                f"state N = {resume.n}; resume from that run's checkpoint or name a new "
                "--out-dir"
            )
        self.t0, self.n = float(old["t0"]), old.get("n")
        exact = (resume.time - self.t0) / self.dt
        step = round(exact)
        if step < 0 or abs(exact - step) > 1e-6 * max(1.0, abs(exact)):
            raise ConfigError(
                f"--resume: its time {resume.time:.17g} is not on the grid of the series in "
                f"{self.directory} (t0 + k x dt, t0 = {self.t0:.17g}, dt = {self.dt:g}): it is "
                "not a checkpoint of that run; name a new --out-dir"
            )
        self.entries = [Entry(**e) for e in old["snapshots"] if int(e["step"]) <= step]
        dropped = len(old["snapshots"]) - len(self.entries)
        if dropped:
            log.info(
                "%s: %d snapshots after step %d will be written again by the resumed run",
                self.directory,
                dropped,
                step,
            )
        return step

    def prepare(self, resume: Bodies | None = None, steps: int = 0) -> None:
        """Before the work, on the writing rank: `plan`, then make DIR (and its parents) and prove it
        takes new files; RuntimeFault / ConfigError in one line otherwise."""
        from app.core.errors import RuntimeFault

        try:  # a path the system cannot look at (too long a name) is one line, as a file output's is
            self.base = self.plan(resume)
            self.final_step = self.base + int(steps)
            if self.directory.exists() and not self.directory.is_dir():
                raise ConfigError(f"--out-dir {self.directory} is a file; name a folder (created if missing)")
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RuntimeFault(f"cannot write snapshot series {self.directory}: {e.strerror or e}") from e
        check_output(self.manifest, "snapshot series")

    # --- during the work ---------------------------------------------------------------------------
    def due(self, step: int) -> bool:
        """Whether absolute `step` gets a snapshot (a multiple of `every`, not yet written)."""
        return step % self.every == 0 and not any(e.step == step for e in self.entries)

    def write(self, step: int, bodies: Bodies) -> Path:
        """Snapshot `step` (atomically), then the manifest listing it."""
        from app.model import formats

        name = snapshot_name(step)
        if step == 0:
            self.t0 = float(bodies.time)
        # the time on the series' grid, as the uninterrupted run computes it (a resumed run's own clock,
        # t_resume + k x dt, can differ from t0 + step x dt in the last bit)
        bodies = Bodies(
            bodies.pos, bodies.vel, bodies.mass, self.t0 + step * self.dt, bodies.ids, bodies.components
        )
        formats.write(self.directory / name, bodies, "npz")
        self.entries = [e for e in self.entries if e.step != step]
        self.entries.append(Entry(name, int(step), float(bodies.time)))
        self.entries.sort(key=lambda e: e.step)
        self.n = bodies.n
        self._write_manifest()
        return self.directory / name

    def finish(self, step: int, bodies: Bodies) -> None:
        """The run completed at absolute `step`: its final state is the last snapshot (also off the
        `every` grid), and the manifest says the series is complete."""
        self.complete = True
        if any(e.step == step for e in self.entries):
            self._write_manifest()
        else:
            self.write(step, bodies)

    # --- the manifest ------------------------------------------------------------------------------
    def _stray(self) -> bool:
        return self.directory.is_dir() and any(self.directory.glob(f"{PREFIX}*.npz"))

    def _read_manifest(self) -> dict | None:
        if not self.manifest.is_file():
            return None
        return read_manifest(self.manifest)

    def _write_manifest(self) -> None:
        data = {
            "kind": KIND,
            "version": 1,
            "complete": self.complete,
            "n": self.n,
            "dt": self.dt,
            "every": self.every,
            "t0": self.t0,
            "final_step": self.final_step,
        }
        snapshots = [{"file": e.file, "step": e.step, "time": e.time} for e in self.entries]
        head = json.dumps(data, indent=1)[:-2]  # one line per snapshot below
        rows = ",\n  ".join(json.dumps(e) for e in snapshots)
        with atomic_write(self.manifest, "w", what="snapshot series manifest") as f:
            f.write(f'{head},\n "snapshots": [\n  {rows}\n ]\n}}\n')


REBUILD = "delete the manifest to replay the snapshot files in its folder in name order"


def read_manifest(path: Path) -> dict:
    """A series.json, checked enough to be used; InputFileError naming it otherwise."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise InputFileError(
            f"{path}: unreadable series manifest ({e}); delete it to replay the snapshot "
            "files in its folder in name order"
        ) from None
    if not (isinstance(data, dict) and data.get("kind") == KIND and isinstance(data.get("snapshots"), list)):
        raise InputFileError(
            f"{path}: not an nbody-live series manifest; delete or rename it to replay the "
            "snapshot files in its folder in name order"
        )
    # every entry as the readers and a resumed writer use it (a damaged one raised KeyError or TypeError
    # past this check: tests/test_fuzz_readers.py); type() is, not isinstance: True is not a step
    for k, row in enumerate(data["snapshots"]):
        if not (
            isinstance(row, dict) and set(row) == {"file", "step", "time"} and type(row["file"]) is str
        ) or not (
            row["file"] == Path(row["file"]).name != ""
            and type(row["step"]) is int
            and type(row["time"]) in (int, float)
        ):
            raise InputFileError(f"{path}: snapshot entry {k} is damaged ({str(row)[:80]}); {REBUILD}")
    if type(data.get("t0", 0.0)) not in (int, float):
        raise InputFileError(f"{path}: t0 = {data['t0']!r} is not a number; {REBUILD}")
    return data


# --------------------------------------------------------------------------------------------------
# reading


def _natural_key(path: Path):
    return [int(s) if s.isdigit() else s for s in re.split(r"(\d+)", path.name)]


def _is_snapshot_file(path: Path) -> bool:
    name = path.name.lower().removesuffix(".gz")
    return (
        path.is_file() and not path.name.startswith(".") and any(name.endswith(s) for s in SNAPSHOT_SUFFIXES)
    )


def series_paths(arg: str) -> tuple[list[Path], dict | None]:
    """The files of a series argument, in order, and its manifest (None without one).

    A folder: the files its series.json lists, else every snapshot file in it (hidden files, such as the
    temporaries of a write in progress, left out) in natural name order. A glob: the matching files."""
    p = Path(arg)
    if p.is_dir():
        manifest = p / MANIFEST
        if manifest.is_file():
            data = read_manifest(manifest)
            return [p / e["file"] for e in data["snapshots"]], data
        paths = sorted((c for c in p.iterdir() if _is_snapshot_file(c)), key=_natural_key)
        if not paths:
            raise InputFileError(
                f"{p}: no snapshot files in this folder (looked for "
                f"{', '.join(SNAPSHOT_SUFFIXES)}, optionally .gz); write a series with "
                "`nbody-live simulate ... --snapshot-every K --out-dir DIR`"
            )
        return paths, None
    paths = sorted((Path(m) for m in glob.glob(arg) if Path(m).is_file()), key=_natural_key)
    if not paths:
        raise InputFileError(
            f"{arg}: the pattern matches no files; quote it so that the shell does not "
            "expand it, and check the folder"
        )
    return paths, None


class Series:
    """The snapshots of one series, checked, with positions and speeds interpolated in time."""

    def __init__(
        self,
        name: str,
        paths: list[Path],
        frames: list[tuple[np.ndarray, np.ndarray]] | None,
        times: np.ndarray,
        first: Bodies,
        order: list[np.ndarray | None],
        fmt: str | None,
        manifest: dict | None,
    ):
        self.name = name
        self.paths = paths
        self.times = times
        self.mass = first.mass.copy()
        self.ids = None if first.ids is None else first.ids.copy()
        self.components = first.components  # the first snapshot's, in its body order (the replay's order)
        self.n = first.n
        self.manifest = manifest
        self.complete = bool(manifest.get("complete", True)) if manifest else True
        self._format = fmt
        self._order = order  # per file: the row permutation to the first file's order (None: as is)
        self._keep_all = frames is not None
        self._frames: dict[int, tuple[np.ndarray, np.ndarray]] = dict(enumerate(frames or []))
        self._used: list[int] = []

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def start(self) -> float:
        return float(self.times[0])

    @property
    def end(self) -> float:
        return float(self.times[-1])

    def index_at(self, t: float) -> tuple[int, float]:
        """(i, f): time t lies between snapshot i and i + 1, a fraction f of the way (f = 0 at the ends)."""
        times = self.times
        if len(times) == 1 or t <= times[0]:
            return 0, 0.0
        if t >= times[-1]:
            return len(times) - 1, 0.0
        i = int(np.searchsorted(times, t, side="right")) - 1
        f = (t - times[i]) / (times[i + 1] - times[i])
        return i, float(min(max(f, 0.0), 1.0))

    def nearest(self, t: float) -> int:
        i, f = self.index_at(t)
        return i + 1 if f > 0.5 else i

    def frame(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(positions (N, 3), velocities (N, 3)) of snapshot i as float32."""
        got = self._frames.get(i)
        if got is None:
            got = _load(self.paths[i], self._format, self._order[i])
            self._frames[i] = got
            if not self._keep_all:
                self._used = [j for j in self._used if j != i] + [i]
                while len(self._used) > CACHED:
                    self._frames.pop(self._used.pop(0), None)
        return got

    def _interpolated(self, t: float, dtype) -> tuple[np.ndarray, np.ndarray]:
        i, f = self.index_at(t)
        pos, vel = self.frame(i)
        if f == 0.0:
            return pos.astype(dtype), vel.astype(dtype)
        pos_b, vel_b = self.frame(i + 1)
        a, v, w = np.asarray(pos, dtype), np.asarray(vel, dtype), dtype(f)
        return a + w * (np.asarray(pos_b, dtype) - a), v + w * (np.asarray(vel_b, dtype) - v)

    def render_arrays(self, t: float) -> tuple[np.ndarray, np.ndarray]:
        """(positions (N, 4) float32 [x, y, z, m], speeds (N,) float32) at time t."""
        pos, vel = self._interpolated(t, np.float32)
        pos4 = np.empty((self.n, 4), np.float32)
        pos4[:, :3] = pos
        pos4[:, 3] = self.mass
        return pos4, np.linalg.norm(vel, axis=1).astype(np.float32)

    def state_at(self, t: float) -> Bodies:
        """The float64 state shown at time t (exactly a snapshot's values, as float32, at its time)."""
        pos, vel = self._interpolated(t, np.float64)
        return Bodies(
            np.ascontiguousarray(pos),
            np.ascontiguousarray(vel),
            self.mass.copy(),
            float(t),
            None if self.ids is None else self.ids.copy(),
            self.components,
        )

    def describe(self) -> str:
        state = "" if self.complete else " (from an interrupted run: complete snapshots only)"
        return (
            f"{self.name}: {len(self)} snapshots of N = {self.n:,}, t = {self.start:g} .. {self.end:g}{state}"
        )


def _load(path: Path, fmt: str | None, order: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    from app.model import formats

    b = formats.read(path, format=fmt)
    pos, vel = b.pos.astype(np.float32), b.vel.astype(np.float32)
    return (pos, vel) if order is None else (pos[order], vel[order])


def _row_order(path: Path, first: Bodies, b: Bodies) -> np.ndarray | None:
    """Rows of `b` in the first file's body order, matched by ID when both carry IDs."""
    if first.ids is None or b.ids is None or np.array_equal(first.ids, b.ids):
        return None
    where = {int(k): i for i, k in enumerate(b.ids)}
    try:
        return np.fromiter((where[int(k)] for k in first.ids), np.int64, count=first.n)
    except KeyError as e:
        raise InputFileError(
            f"{path}: has no body with ID {e.args[0]}, which the first snapshot "
            f"({first.n:,} bodies) has; a series must hold the same bodies throughout"
        ) from None


def open_series(arg: str, format: str | None = None, progress=None) -> Series:
    """Read and check every snapshot of a series (a folder or a glob): InputFileError naming the first
    file that cannot be read or whose N differs, with what to do. `progress(k)` is called per file."""
    from app.core.errors import UserError
    from app.model import formats

    paths, manifest = series_paths(arg)
    first: Bodies | None = None
    frames: list[tuple[np.ndarray, np.ndarray]] | None = []
    times: list[float] = []
    order: list[np.ndarray | None] = []
    for path in paths:
        if not path.is_file():
            raise InputFileError(
                f"{path}: listed in {path.parent / MANIFEST} but missing; restore it, or "
                f"delete {MANIFEST} to replay the files that are there"
            )
        try:
            b = formats.read(path, format=format)
        except UserError as e:
            raise InputFileError(
                f"{e} (snapshot {len(times) + 1} of {len(paths)} in the series; remove or "
                "fix that file to replay the others)"
            ) from None
        except OSError as e:
            raise InputFileError(
                f"{path}: cannot read it ({e.strerror or e}); fix its permissions or remove "
                "it from the series"
            ) from None
        if first is None:
            first = b
            if b.n * len(paths) * 24 > KEEP_BYTES:
                frames = None
        elif b.n != first.n:
            raise InputFileError(
                f"{path}: N = {b.n:,}, but the series starts with N = {first.n:,} "
                f"({paths[0].name}); a replay needs the same bodies in every snapshot: "
                "remove that file or replay the two parts separately"
            )
        rows = _row_order(path, first, b)
        order.append(rows)
        times.append(b.time)
        if frames is not None:
            pos, vel = b.pos.astype(np.float32), b.vel.astype(np.float32)
            frames.append((pos, vel) if rows is None else (pos[rows], vel[rows]))
        if progress is not None:
            progress(1)
    times_arr = _timeline([Path(p) for p in paths], np.asarray(times, np.float64))
    if not np.all(np.diff(times_arr) > 0):  # distinct times out of name order: play them in time order
        by_time = np.argsort(times_arr, kind="stable")
        paths = [paths[i] for i in by_time]
        order = [order[i] for i in by_time]
        frames = None if frames is None else [frames[i] for i in by_time]
        times_arr = times_arr[by_time]
        log.info("%s: the snapshots' times are not in name order; playing them in time order", arg)
    assert first is not None  # series_paths lists at least one snapshot
    name = Path(arg).name if Path(arg).is_dir() else Path(arg).parent.name or arg
    return Series(name or str(arg), paths, frames, times_arr, first, order, format, manifest)


def _timeline(paths: list[Path], times: np.ndarray) -> np.ndarray:
    """The snapshots' times; one unit per snapshot when they carry none (all equal). InputFileError when
    two snapshots have the same time but others differ (a replay could not tell which comes first)."""
    if len(times) > 1 and np.all(times == times[0]):
        log.info(
            "the snapshots all have t = %g: replaying one time unit per snapshot, in name order", times[0]
        )
        return np.arange(len(times), dtype=np.float64)
    seen: dict[float, Path] = {}
    for p, t in zip(paths, times.tolist(), strict=True):
        if not math.isfinite(t):
            raise InputFileError(f"{p}: its time is {t}; a series needs finite times")
        if t in seen:
            raise InputFileError(
                f"{p} and {seen[t]} both have t = {t:.17g}: a replay plays snapshots in "
                "time order; remove one of them (two runs in one folder?)"
            )
        seen[t] = p
    return times
