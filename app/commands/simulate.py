"""`nbody-live simulate`: headless stepping to a snapshot, with an energy/momentum log."""

from __future__ import annotations

import argparse
import logging
import math
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.commands.assembly import make_backend, make_rank_run, scene_from_args
from app.commands.options import add_gpu_options, add_kernel_file_options, add_scene_options, positive_int
from app.commands.running import Interruption, progress_bar

if TYPE_CHECKING:
    from app.core.outputs import StreamedFile
    from app.model.series import SeriesWriter

log = logging.getLogger("nbody-live")

HELP = "step a scene or snapshot without a window; write the final snapshot and a conservation log"
DESCRIPTION = """\
Advance SCENE by --steps steps on the chosen backend, then write the final state to --out (format
from its extension: .npz, .csv, .tipsy/.tip/.std). Every output (--out, --log, --out-dir) is checked
before any work.

With --log, every --log-every steps a row of float64 diagnostics is appended to the CSV (and flushed,
so an interrupted run keeps every row): time, kinetic/potential/total energy, relative energy drift,
linear and angular momentum and the momentum drift relative to sum(m|v|) at the start. The O(N²)
energy is computed only for the log, on the GPU when the backend has one. A log that cannot be written
(a full disk) is said in one line and closed; the run goes on, writes --out, and ends with exit status 1
naming the log's last row. --out and --log may not name the same file.

--checkpoint-every K writes the state so far to --out every K steps (atomically: --out is always a
complete snapshot). Ctrl-C or SIGTERM stops between two steps, writes the state so far to --out and
exits 130 / 143. A log row's float64 energy is stopped too (on the host it takes minutes at 10⁶ bodies):
a signal that comes before that energy is done leaves out the row of that step, and the message names
the log's last row and the step that has none; the log never has a row past the state in --out. A
signal after the last step, while the final snapshot is written, lets it complete: exit status 0.
--resume FILE starts from such a snapshot instead of SCENE's bodies (SCENE still gives the physics and
the kernel) and takes --steps more steps; in float64 (.npz) the result is bitwise the one an
uninterrupted run gives. The log of a resumed run goes to a new file (an existing one is not
overwritten) and starts again at step 0, with drifts relative to the resumed state.

--timesteps block steps hierarchical time steps on the tree (one device): --dt is the max step, a step is
one max step, and each body takes dt/2^l substeps, l from GADGET-2's criterion (--block-levels L, --block-eta
ETA). Between two steps every body is synchronised and its level follows from x, so --resume from an .npz
continues bitwise there too.

--snapshot-every K --out-dir DIR writes a numbered series for a replay: DIR/snap_<step>.npz every K
steps, from step 0 to the last step (which is always written), with the same atomic npz writer as --out
(float64, the original body order, the time, the components), and DIR/series.json listing the complete
snapshots (`complete` is false until the last step is written). DIR is created if missing; a folder that
already holds a series is refused unless --resume continues it: the resumed run then adds the snapshots
an uninterrupted run would have written (same step numbers and times). Without --out, --out is
DIR/last.npz.
Replay the series with `nbody-live run DIR`, or render it to a video with `nbody-live record DIR`.

examples:
  nbody-live simulate plummer --n 4096 --steps 1000 --out out/p4k.npz --log out/p4k.csv
  nbody-live simulate collision --n 16384 --steps 4000 --snapshot-every 40 --out-dir out/collision
  nbody-live run out/collision                     # replay it: time slider, play/pause
  nbody-live record out/collision --seconds 10 --out out/collision.mp4
  nbody-live simulate ../shared/data/nbabel_input1k --softening 0.01 --dt 1e-3 --steps 1000 \\
      --out out/nbabel.npz --log out/energy.csv --backend cpu --kernel cpu-fp64
  nbody-live simulate plummer --n 65536 --steps 100000 --out out/big.npz --checkpoint-every 1000
  nbody-live simulate plummer --n 65536 --steps 40000 --out out/big.npz --resume out/big.npz
  nbody-live simulate collision --n 1048576 --timesteps block --dt 0.0625 --block-levels 6 \
      --block-eta 0.01 --steps 32 --out out/collision-block.npz --checkpoint-every 4
"""

LOG_COLUMNS = [
    "step",
    "time",
    "kinetic",
    "potential",
    "energy",
    "rel_energy_drift",
    "px",
    "py",
    "pz",
    "Lx",
    "Ly",
    "Lz",
    "rel_momentum_drift",
    "force_ms_per_step",
]

# Steps per backend.step() call at most, so that a signal is answered within this many steps.
MAX_CHUNK = 32
# Above this N the host's float64 energy takes long enough to deserve a progress bar.
LONG_ENERGY_N = 16384


def add_parser(sub) -> None:
    p = sub.add_parser(
        "simulate", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_scene_options(p)
    add_gpu_options(p)
    p.add_argument("--steps", type=positive_int, required=True, metavar="K", help="steps to take")
    p.add_argument(
        "--out",
        type=Path,
        metavar="FILE",
        help="final snapshot (.npz, .csv, .tipsy); required unless --out-dir is given",
    )
    p.add_argument("--log", type=Path, metavar="FILE.csv", help="energy/momentum log (CSV)")
    p.add_argument(
        "--log-every",
        type=positive_int,
        metavar="M",
        help="steps between log rows (default: steps/20; each row costs an O(N²) float64 pass)",
    )
    p.add_argument(
        "--checkpoint-every",
        type=positive_int,
        metavar="K",
        help="write the state so far to --out every K steps",
    )
    p.add_argument(
        "--resume",
        type=Path,
        metavar="FILE",
        help="start from this snapshot (e.g. a checkpoint) instead of SCENE's bodies",
    )
    p.add_argument(
        "--snapshot-every",
        type=positive_int,
        metavar="K",
        help="with --out-dir: a snapshot of the series every K steps (and of the last step)",
    )
    p.add_argument(
        "--out-dir",
        type=Path,
        metavar="DIR",
        help="with --snapshot-every: the folder of the series (snap_<step>.npz + series.json; "
        "created if missing); `run DIR` replays it, `record DIR` renders it",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_kernel_file_options(p)
    p.set_defaults(func=main)


def _row(step, diag, d0, force_ms_per_step):
    import numpy as np

    finite = math.isfinite(d0.energy) and d0.energy != 0.0
    drift = abs(diag.energy - d0.energy) / abs(d0.energy) if finite else float("nan")
    dp = float(np.linalg.norm(np.subtract(diag.momentum, d0.momentum)))
    return [
        step,
        diag.time,
        diag.kinetic,
        diag.potential,
        diag.energy,
        drift,
        *diag.momentum,
        *diag.angular_momentum,
        dp / d0.momentum_scale if d0.momentum_scale else 0.0,
        force_ms_per_step,
    ]


def _log_end(last, cut) -> str:
    """Where an interrupted run's log ends, and which step's row the signal left out (`cut`)."""
    end = f"last row: step {last[0]}" if last is not None else "no rows"
    return end if cut is None else f"{end}; the float64 energy of step {cut} was interrupted, it has no row"


def _csv_line(values) -> str:
    return ",".join(f"{v:.17g}" if isinstance(v, float) else str(v) for v in values) + "\n"


def _measure(backend, args, stop=None):
    """A function returning the float64 Diagnostics of the backend's current state: reduced on the
    device when the backend can (CUDA), else on the host with a progress bar when N is large."""
    if backend.reduces_diagnostics:
        return backend.diagnostics
    from functools import partial

    from app.engine.energy import EnergyInterrupted, potential_energy
    from app.model import physics

    def on_host():
        """None when a signal stopped it (it may come during the step before: the energy is then not
        started): the run ends at this step without its log row, writing what it has."""
        # parallel: the backend's own kernels are idle while the energy is summed
        asked = (lambda: stop.signum is not None) if stop is not None else None
        potential = partial(potential_energy, parallel=True, stop=asked)
        try:
            if backend.n <= LONG_ENERGY_N:
                return physics.diagnostics(backend.state(), backend.physics, potential=potential)
            with progress_bar(args, total=backend.n, unit="body", desc="float64 energy", leave=False) as bar:
                return physics.diagnostics(
                    backend.state(), backend.physics, progress=bar.update, potential=potential
                )
        except EnergyInterrupted:
            return None

    return on_host


def main(args) -> int:
    from app.backends import distributed

    return distributed.as_job(_simulate, args)  # under mpiexec: an error on any rank ends every rank


@dataclass
class _Job:
    """What the phases of one run share: the options, the MPI communicator (None: one process), whether
    this process checks and writes the outputs (rank 0), and the outputs: --out (`default_out`: it is
    DIR/last.npz of the series), the series and its first state's step in the series' numbering."""

    args: argparse.Namespace
    comm: Any
    writer: bool
    out: Path
    default_out: bool
    series: SeriesWriter | None = None
    base: int = 0


@dataclass
class _Log:
    """The conservation log as the run writes it: its file (rank 0's), the first state's diagnostics (the
    drifts' reference), the last row written and the step whose row a signal left out."""

    file: StreamedFile | None = None
    d0: Any = None
    last: list | None = None
    cut: int | None = None
    lost: str | None = None  # why the log stopped (a full disk): the run went on without it

    def write(self, row: list) -> None:
        if self.write_line(_csv_line(row)):
            self.last = row

    def write_line(self, text: str) -> bool:
        """Append to the log; a log that cannot be written (a full disk) is closed and the run goes on
        without it, loudly: the state the run computes is worth more than its log."""
        from app.core.errors import RuntimeFault

        assert self.file is not None  # rank 0's
        try:
            self.file.write(text)
            return True
        except RuntimeFault as e:
            self.lost = str(e)
            self.file.close()
            self.file = None
            print(
                f"nbody-live simulate: {e}; the run goes on without the log (its rows so far are kept) and "
                "still writes --out",
                file=sys.stderr,
            )
            return False


def _simulate(args, comm) -> int:
    """The run; under MPI (`comm`) every rank steps its share and rank 0 alone checks and writes the
    outputs. Collective calls (a step, reading the state) happen on every rank at the same points."""
    from app.backends import distributed
    from app.backends.multi import devices_line
    from app.core.outputs import StreamedFile
    from app.model import formats

    job = _check_outputs(args, comm)
    scene = scene_from_args(args)
    start = formats.read(args.resume) if args.resume else None
    _prepare_series(job, scene, start)
    backend = make_backend(scene, start) if comm is None else make_rank_run(comm, scene, start)
    rows = _Log()
    try:
        with Interruption() as stop:
            rows.file = StreamedFile(args.log) if args.log and job.writer else None
            if rows.file:  # the header first: a run stopped during its first energy still leaves a CSV
                rows.write_line(_csv_line(LOG_COLUMNS))
            measure = _measure(backend, args, stop)
            _first_row(args, rows, measure)
            done = _step_all(job, backend, stop, rows, measure)
            final = backend.state()
            if job.writer:
                formats.write(job.out, final)
                if job.series and done == args.steps:
                    job.series.finish(job.base + done, final)
            kernel = backend.kernel
            if backend.timesteps == "block":
                kernel += f", {backend.block_summary()}"
            devices = devices_line(backend)
            signum = distributed.any_rank(comm, stop.signum)
    finally:
        backend.close()
        if rows.file:
            rows.file.close()
    if not job.writer:
        return 0
    ranks = f" on {comm.size} ranks" if comm is not None else devices
    return _report(
        job, done, rows, signum, f"{args.steps} steps of N={final.n} with {kernel}{ranks} -> {job.out}"
    )


def _check_outputs(args, comm) -> _Job:
    """The options that go together, and every output checked before any work (by rank 0: the others
    only read the options): --out, whose default DIR/last.npz is checked once the series' folder exists
    (`_prepare_series`), and --log, which a resumed run may not overwrite."""
    from app.core.errors import ConfigError
    from app.core.outputs import check_output, check_suffix, refuse_same_file
    from app.model import formats

    writer = comm is None or comm.rank == 0
    if (args.snapshot_every is None) != (args.out_dir is None):
        raise ConfigError(
            "--snapshot-every K and --out-dir DIR go together: the series is a snapshot every K steps in DIR"
        )
    if args.out is None and args.out_dir is None:
        raise ConfigError(
            "--out FILE is required (the final snapshot), unless a series is written with "
            "--snapshot-every K --out-dir DIR (then --out defaults to DIR/last.npz)"
        )
    default_out = args.out is None
    if default_out:
        args.out = args.out_dir / "last.npz"
    formats.output_format(args.out)
    if args.log and writer:  # before any file is touched: the snapshot would overwrite the log
        refuse_same_file([(args.out, "snapshot (--out)"), (args.log, "log (--log)")])
    out = check_output(args.out, "snapshot") if writer and not default_out else args.out
    if args.log and writer:
        check_output(args.log, "log")
        check_suffix(args.log, (".csv",), "log", "--log")
    if args.resume and args.n is not None:
        raise ConfigError(f"--n does not apply with --resume: the bodies are those of {args.resume}")
    if args.resume and args.log and args.log.exists() and writer:  # most likely the interrupted part's own
        raise ConfigError(
            f"--log {args.log} exists: a resumed run would overwrite it; name a new log for the resumed part"
        )
    return _Job(args, comm, writer, out, default_out)


def _prepare_series(job: _Job, scene, start) -> None:
    """With --out-dir: the series (rank 0 makes and checks DIR, refusing another run's series, then checks
    a default --out in it) and its first step, which every rank learns."""
    from app.core.outputs import check_output
    from app.model.series import SeriesWriter

    args, comm = job.args, job.comm
    if args.out_dir is None:
        return
    series = job.series = SeriesWriter(args.out_dir, args.snapshot_every, scene.physics.dt)
    if job.writer:
        series.prepare(start, args.steps)  # DIR made and checked; another run's series refused
        if job.default_out:
            job.out = check_output(args.out, "snapshot")
    job.base = series.base if comm is None else comm.bcast(series.base if job.writer else None, root=0)


def _first_row(args, rows: _Log, measure) -> None:
    """With --log: the first state's diagnostics (on every rank: the energy may be a collective) and, on
    rank 0, its row."""
    if not args.log:
        return
    rows.d0 = measure()  # None: a signal stopped it, and the loop will not start
    if rows.file and rows.d0 is not None and not math.isfinite(rows.d0.energy):
        log.warning(
            "the energy is not finite: two bodies coincide at softening 0 (the forces "
            "skip such a pair); so are the log's energy columns; use --softening > 0"
        )
    if rows.d0 is None:
        rows.cut = 0
    elif rows.file:
        rows.write(_row(0, rows.d0, rows.d0, 0.0))


def _step_all(job: _Job, backend, stop, rows: _Log, measure) -> int:
    """The steps, in chunks of at most MAX_CHUNK that end at each log row, checkpoint and snapshot of the
    series, until --steps are done or a signal came (to any rank); returns the steps done."""
    from app.backends import distributed
    from app.core.eta import Eta

    args, series, base = job.args, job.series, job.base
    every = (args.log_every or max(1, args.steps // 20)) if args.log else args.steps
    checkpoint = args.checkpoint_every or args.steps
    done, force_ms, since = 0, 0.0, 0
    snap = series.every if series else args.steps
    if series and base % snap == 0:  # the first state (step 0, or a resumed one on the grid)
        state = backend.state()
        if job.writer and series.due(base):
            series.write(base, state)
    eta = Eta(args.steps, "step", stops=f"Ctrl-C stops and writes the state so far to {job.out}")
    with progress_bar(args, total=args.steps, unit="step", desc=backend.kernel, show=job.writer) as bar:
        while done < args.steps and not distributed.any_rank(job.comm, stop.signum):
            k = min(
                MAX_CHUNK,
                args.steps - done,
                every - done % every,
                checkpoint - done % checkpoint,
                snap - (base + done) % snap,
            )
            force_ms += backend.step(k).force_ms
            done, since = done + k, since + k
            bar.update(k)
            if job.writer:
                eta.update(done)
            if args.log and (done % every == 0 or done == args.steps):
                diag = measure()
                if diag is None:
                    rows.cut = done  # the loop ends here: stop.signum is set
                elif rows.file:
                    rows.write(_row(done, diag, rows.d0, force_ms / since))
                force_ms, since = 0.0, 0
            snapshot = series is not None and (base + done) % snap == 0
            if (done % checkpoint == 0 or snapshot) and done < args.steps:
                _save(job, backend, done, done % checkpoint == 0, snapshot)
    return done


def _save(job: _Job, backend, done: int, checkpoint: bool, snapshot: bool) -> None:
    """The state after `done` steps (read on every rank), written by rank 0 to --out (a checkpoint) and/or
    to the series (a snapshot)."""
    from app.model import formats

    state = backend.state()
    if job.writer and checkpoint:
        formats.write(job.out, state)
    if job.writer and snapshot:
        assert job.series is not None  # a snapshot is the series'
        job.series.write(job.base + done, state)


def _report(job: _Job, done: int, rows: _Log, signum, summary: str) -> int:
    """Rank 0's last lines and the exit status: what an interrupted run kept (stderr, 128 + the signal),
    else the drifts, `summary` and the series."""
    args, series = job.args, job.series
    # Stopped by a signal: before the last step, or during the last row's energy (a signal after that
    # changes nothing).
    if done < args.steps or rows.cut is not None:
        kept = f", log -> {args.log} ({_log_end(rows.last, rows.cut)})" if args.log else ""
        if series:
            kept += f", {len(series.entries)} complete snapshots -> {args.out_dir} (marked incomplete)"
        name = signal.Signals(signum).name
        print(
            f"nbody-live simulate: interrupted by {name} at step {done} of {args.steps}: state so far "
            f"-> {job.out}{kept}",
            file=sys.stderr,
        )
        return 128 + signum
    if rows.file:
        assert rows.last is not None  # step 0's row at least: a run whose first energy was stopped has none
        print(f"energy drift {rows.last[5]:.3e}, momentum drift {rows.last[12]:.3e} (relative) -> {args.log}")
    print(summary)
    if rows.lost is not None:  # the state is written; the log is not whole: say so and fail
        print(
            f"nbody-live simulate: the log {args.log} is incomplete ({_log_end(rows.last, None)}): "
            f"{rows.lost}",
            file=sys.stderr,
        )
        return 1
    if series:
        print(
            f"series: {len(series.entries)} snapshots (every {series.every} steps, up to step "
            f"{job.base + done}) -> {args.out_dir}; replay: nbody-live run {args.out_dir}"
        )
    return 0
