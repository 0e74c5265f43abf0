"""Lagrangian radii of the Plummer sphere over a run: does a kernel (the GPU tree with its refit rule) keep
the cluster in its equilibrium?

    python3 bench/lagrangian_radii.py --n 1048576 --steps 1000 --tunable theta=0.6 \\
        --tunable rebuild_every=4 --csv $OUT/lagrangian.csv

What is measured: the scene `plummer` (assets/scenes/plummer.toml: app.model.ics's generator in Hénon units,
G = M = 1, E = -1/4, virial equilibrium; the scene's seed, softening and dt unless --seed, --softening,
--dt say otherwise) at --n bodies is stepped --steps times by --backend/--kernel with the --tunable
values. At step 0 and every --every steps (and at the last step) the state is read back and the radii
enclosing the --fractions of the total mass are computed about the centre of mass, mass-weighted, in
float64 (lagrangian_radii below). Each record is a CSV row (step, time, r10, r50, r90 for the default
fractions), written and flushed as it is taken.

Pass criterion (the issue's acceptance item, "the 1M Plummer sphere keeps its Lagrangian radii
(10/50/90%) within 2% over 1,000 steps with the refit rule on"): for every fraction the largest
|r(t) / r(0) - 1| over the records is at most --tolerance (default 0.02).

Exit status: 0 every radius passes, 1 one fails (or the run blew up), 2 bad input (an argument, a
tunable, an unavailable backend, an output folder that does not exist: all said before any stepping),
128 + signal when interrupted (Ctrl-C: the CSV keeps every record taken, the summary covers them).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere in the checkout

from app.backends import backend_class, backend_names  # noqa: E402
from app.commands.options import parse_tunables, positive_float, positive_int  # noqa: E402
from app.commands.running import Interruption
from app.core.errors import RuntimeFault, UserError  # noqa: E402
from app.core.outputs import StreamedFile, check_output  # noqa: E402
from app.engine.forces import format_tunables  # noqa: E402
from app.scene import load_scene, make_bodies  # noqa: E402

TOOL = "lagrangian_radii"
SCENE = "plummer"
# Steps per backend.step() call at most: a signal or a due progress line waits for no more than this.
MAX_CHUNK = 32

EPILOG = """\
examples:
  # the acceptance run, on the GPU machine (1M bodies, GPU tree, refit every 4 evaluations):
  python3 bench/lagrangian_radii.py --n 1048576 --steps 1000 --tunable theta=0.6 \\
      --tunable rebuild_every=4 --csv $OUT/lagrangian.csv
  # the same check without refit, to compare (rebuild_every=1: a build every evaluation):
  python3 bench/lagrangian_radii.py --tunable theta=0.6 --tunable rebuild_every=1 --csv $OUT/rebuild.csv
  # a quick look on the CPU twin:
  python3 bench/lagrangian_radii.py --backend cpu --kernel cpu-tree --n 16384 --steps 200 --csv lr.csv
"""


# --- the measurement --------------------------------------------------------------------------------------
def lagrangian_radii(pos, mass, fractions) -> np.ndarray:
    """The radii about the centre of mass enclosing `fractions` of the total mass, in float64.

    Each radius is the distance of the body at which the cumulative mass, bodies taken outward by
    distance, first reaches fraction x total: the smallest sphere about the centre of mass holding at
    least that fraction. Mass-weighted, so unequal masses count by their mass, not by their number."""
    pos = np.asarray(pos, dtype=np.float64)
    mass = np.asarray(mass, dtype=np.float64)
    fractions = np.asarray(fractions, dtype=np.float64)
    if pos.ndim != 2 or pos.shape[1] != 3 or mass.shape != (pos.shape[0],) or pos.shape[0] == 0:
        raise ValueError(f"positions {pos.shape} and masses {mass.shape}: expected (N, 3) and (N,), N > 0")
    if not np.all((fractions > 0) & (fractions <= 1)):
        raise ValueError(f"fractions {fractions.tolist()}: each must be in (0, 1]")
    total = mass.sum()
    d = pos - (mass @ pos) / total
    r2 = np.einsum("ij,ij->i", d, d)  # squared distances: sorting them needs no square root per body
    order = np.argsort(r2)
    enclosed = np.cumsum(mass[order])
    # enclosed[-1] is the total up to rounding: clip so that fraction 1 (or an ulp above it) is the last body
    at = np.minimum(np.searchsorted(enclosed, fractions * enclosed[-1], side="left"), r2.size - 1)
    return np.sqrt(r2[order[at]])


def column_names(fractions: list[float]) -> list[str]:
    """0.1 -> 'r10', 0.025 -> 'r2.5': the CSV's radius columns, named by the percentage of the mass."""
    return [f"r{100 * f:g}" for f in fractions]


@dataclass
class Records:
    """What the run measured so far: a row per record, and each radius' extremes and largest deviation."""

    names: list[str]
    steps: list[int] = field(default_factory=list)
    radii: list[np.ndarray] = field(default_factory=list)

    def add(self, step: int, radii: np.ndarray) -> None:
        self.steps.append(step)
        self.radii.append(radii)

    @property
    def initial(self) -> np.ndarray:
        return self.radii[0]

    def deviations(self) -> np.ndarray:
        """Per fraction, the largest |r / r(0) - 1| over the records (nan where a radius is not finite)."""
        r = np.array(self.radii)
        with np.errstate(invalid="ignore", divide="ignore"):
            dev = np.abs(r / self.initial - 1.0).max(axis=0)
        return np.where(np.isfinite(r).all(axis=0), dev, np.nan)


# --- arguments --------------------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lagrangian_radii.py",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--backend", default="cuda", choices=backend_names(), help="cuda (default) or cpu")
    p.add_argument(
        "--kernel", default="tree", help="a kernel of the backend (default tree; the CPU twin: cpu-tree)"
    )
    p.add_argument("--n", type=positive_int, default=1 << 20, help="bodies (default 1048576)")
    p.add_argument("--steps", type=positive_int, default=1000, help="steps to take (default 1000)")
    p.add_argument(
        "--every",
        type=positive_int,
        default=10,
        help="steps between records (default 10); the last step is always recorded. Each record "
        "reads the state back and sorts N distances",
    )
    p.add_argument(
        "--tunable",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a tunable of the kernel, repeatable: e.g. --tunable theta=0.6 --tunable "
        "rebuild_every=4 (the rest keep the record's defaults, printed at the end)",
    )
    p.add_argument(
        "--fractions",
        default="0.1,0.5,0.9",
        help="mass fractions whose radii are recorded, comma-separated, each in (0, 1) "
        "(default 0.1,0.5,0.9: columns r10, r50, r90)",
    )
    p.add_argument(
        "--tolerance",
        type=positive_float,
        default=0.02,
        help="the pass bar: largest |r/r0 - 1| allowed per radius (default 0.02)",
    )
    p.add_argument("--seed", type=int, help="the bodies' seed (default: the scene's, 42)")
    p.add_argument("--softening", type=float, help="override the scene's softening (0.01)")
    p.add_argument("--dt", type=positive_float, help="override the scene's time step (0.001)")
    p.add_argument(
        "--csv",
        type=Path,
        required=True,
        metavar="PATH",
        help="the records, a row each (step, time, a column per fraction); its folder must exist",
    )
    p.add_argument(
        "--progress-every",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="a progress line on stderr at most this often (default 5; 0: at every record)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress lines")
    return p


def parse_fractions(text: str) -> list[float]:
    """'0.1,0.5,0.9' -> [0.1, 0.5, 0.9]; UserError (exit 2) naming what is wrong."""
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise UserError(
            f"--fractions {text!r}: expected numbers separated by commas, e.g. 0.1,0.5,0.9"
        ) from None
    bad = [v for v in values if not 0 < v < 1]
    if bad:
        raise UserError(f"--fractions {text!r}: {bad[0]:g} is not in (0, 1)")
    if len(set(column_names(values))) != len(values):
        raise UserError(f"--fractions {text!r}: a fraction is given twice")
    return values


# --- the run ----------------------------------------------------------------------------------------------
def open_backend(args, tunables: dict):
    """(the loaded backend, the scene): the bodies generated, loaded and tuned; UserError before the
    bodies are made for an unavailable backend, an unknown kernel or a bad tunable."""
    cls = backend_class(args.backend)
    reason = cls.why_not()
    if reason:
        raise UserError(f"backend {args.backend!r} is not available here: {reason}")
    cls.record(args.kernel).validate_tunables(tunables)  # ConfigError naming kernel and tunable
    overrides = {"initial.n": args.n}
    for key, value in (
        ("initial.seed", args.seed),
        ("physics.softening", args.softening),
        ("physics.dt", args.dt),
    ):
        if value is not None:
            overrides[key] = value
    scene = load_scene(SCENE, overrides)
    bodies = make_bodies(scene)
    backend = cls()
    try:
        backend.load(bodies, scene.physics, args.kernel)
        if tunables:
            backend.set_tunables(**tunables)
    except BaseException:
        backend.close()
        raise
    return backend, scene


def device_name(backend) -> str:
    from app.tools.bench import device_info  # the GPU's name from the CUDA backend, the CPU model otherwise

    return str(device_info(backend).get("name", "?"))


def csv_line(values) -> str:
    return ",".join(f"{v:.17g}" if isinstance(v, float) else str(v) for v in values) + "\n"


class Progress:
    """A line on stderr at most every `seconds` of wall time: steps done, elapsed, the deviations so far.
    Plain lines rather than a tqdm bar: the GPU runs log to a file, where a bar is hidden or garbled."""

    def __init__(self, total: int, seconds: float, enabled: bool):
        self.total, self.seconds, self.enabled = total, seconds, enabled
        self.start = self.last = time.perf_counter()

    def update(self, done: int, records: Records, force: bool = False) -> None:
        now = time.perf_counter()
        if not self.enabled or (now - self.last < self.seconds and not force):
            return
        self.last = now
        elapsed = now - self.start
        left = f", ~{elapsed * (self.total - done) / done:.0f} s left" if done else ""
        devs = " ".join(f"{n} {d:.3%}" for n, d in zip(records.names, records.deviations(), strict=True))
        print(
            f"step {done:,}/{self.total:,}, {elapsed:.1f} s{left}; largest |r/r0 - 1| so far: {devs}",
            file=sys.stderr,
            flush=True,
        )


def step_and_record(backend, args, fractions, records: Records, out: StreamedFile, stop) -> tuple[int, dict]:
    """Record step 0, then step to --steps recording every --every; returns (steps done, wall seconds
    split into 'stepping' and 'radii'). Stops between two chunks when `stop` caught a signal."""
    spent = {"stepping": 0.0, "radii": 0.0}
    progress = Progress(args.steps, args.progress_every, not args.no_progress)

    def record(step: int) -> None:
        t = time.perf_counter()
        state = backend.state()  # a synchronising read-back on the GPU: part of the radii's cost
        radii = lagrangian_radii(state.pos, state.mass, fractions)
        spent["radii"] += time.perf_counter() - t
        records.add(step, radii)
        out.write(csv_line([step, float(backend.time), *map(float, radii)]))
        progress.update(step, records, force=args.progress_every == 0)

    record(0)
    done = 0
    while done < args.steps and stop.signum is None:
        k = min(MAX_CHUNK, args.steps - done, args.every - done % args.every)
        t = time.perf_counter()
        backend.step(k)
        spent["stepping"] += time.perf_counter() - t
        done += k
        if done % args.every == 0 or done == args.steps:
            record(done)
        else:
            progress.update(done, records)
    return done, spent


def summary(records: Records, tolerance: float) -> tuple[list[str], bool]:
    """The table of initial radius, min, max and largest deviation per fraction with PASS/FAIL; and whether
    every radius passed (a non-finite radius fails)."""
    r = np.array(records.radii)
    devs = records.deviations()
    lines = [
        f"{'radius':>6} {'r(0)':>10} {'min':>10} {'max':>10} {'max |r/r0 - 1|':>15}  "
        f"verdict (tolerance {tolerance:.2%})"
    ]
    passed = True
    for i, name in enumerate(records.names):
        ok = bool(devs[i] <= tolerance)  # nan compares False: a blown-up radius fails
        passed &= ok
        lines.append(
            f"{name:>6} {r[0, i]:>10.5f} {r[:, i].min():>10.5f} {r[:, i].max():>10.5f} "
            f"{devs[i]:>15.3%}  {'PASS' if ok else 'FAIL'}"
        )
    return lines, passed


def report(args, backend, scene, records: Records, done: int, spent: dict, wall: float) -> bool:
    """Print what was run and the table; True when every radius passed."""
    phys = scene.physics
    print(
        f"Lagrangian radii of the {SCENE} sphere: N={backend.n:,}, seed {scene.initial.seed}, softening "
        f"{phys.softening:g}, dt {phys.dt:g}, {phys.integrator}; {done:,} of {args.steps:,} steps "
        f"(t = {backend.time:.6g}), {len(records.steps)} records (every {args.every} steps) -> {args.csv}"
    )
    used = backend.record(backend.kernel).tunables_at(backend.tunables(), backend.n)  # alpha's auto: a number
    print(
        f"device: {device_name(backend)}; backend {backend.name}, kernel {backend.kernel}; tunables: "
        f"{format_tunables(used) or '(none)'}"
    )
    lines, passed = summary(records, args.tolerance)
    print("\n".join(lines))
    print(
        f"time: {wall:.1f} s in all (with making and loading the bodies), stepping "
        f"{spent['stepping']:.1f} s, the radii (read-back + sort) {spent['radii']:.1f} s"
    )
    return passed


def run(args) -> int:
    fractions = parse_fractions(args.fractions)
    tunables = parse_tunables(args.tunable)
    if args.progress_every < 0 or not math.isfinite(args.progress_every):
        raise UserError(f"--progress-every {args.progress_every}: must be a number of seconds >= 0")
    try:
        check_output(args.csv, "CSV")  # before the bodies, the backend or any step
    except RuntimeFault as e:  # a folder that is not there is a wrong argument here: exit 2
        raise UserError(str(e)) from None
    t0 = time.perf_counter()
    backend, scene = open_backend(args, tunables)
    records = Records(column_names(fractions))
    out = StreamedFile(args.csv, "CSV")
    done, spent, failure, passed = 0, {"stepping": 0.0, "radii": 0.0}, None, False
    try:
        out.write(csv_line(["step", "time", *records.names]))
        with Interruption() as stop:
            try:
                done, spent = step_and_record(backend, args, fractions, records, out, stop)
            except RuntimeFault as e:  # blew up (non-finite state), out of memory: the rows so far stay
                failure = e
        if records.steps:
            passed = report(args, backend, scene, records, done, spent, time.perf_counter() - t0)
    finally:
        out.close()
        backend.close()
    if failure is not None:
        print(
            f"{TOOL}: stopped at step {done} of {args.steps}: {failure}; the CSV keeps "
            f"{len(records.steps)} records",
            file=sys.stderr,
        )
        return 1
    if stop.signum is not None:
        print(
            f"{TOOL}: interrupted by {stop.name} at step {done:,} of {args.steps:,}: the CSV keeps "
            f"{len(records.steps)} records (steps 0 .. {records.steps[-1]:,}) in {args.csv}; the table "
            "covers those only",
            file=sys.stderr,
        )
        return stop.exit_code
    if passed:
        print(f"PASS: every radius within {args.tolerance:.2%} of its initial value over {done:,} steps")
        return 0
    print(f"FAIL: a radius moved by more than {args.tolerance:.2%} of its initial value over {done:,} steps")
    return 1


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return run(args)
    except UserError as e:  # ConfigError, BackendUnavailable, bad --fractions, a missing folder
        print(f"{TOOL}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before the stepping (making 1M bodies takes seconds): nothing measured
        print(f"{TOOL}: interrupted before the first record", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
