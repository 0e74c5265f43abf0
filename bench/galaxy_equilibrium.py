"""Does a disk galaxy stay in equilibrium? Runs a scene (default the `disk` preset) and measures the disk
every --every time units (app/model/galaxy_check.py): half-mass and 90%-mass radii, rms thickness,
sigma_R, Toomre Q per radius and each component's virial ratio. docs/galaxies.md cites its output.

    python3 bench/galaxy_equilibrium.py --n 65536 --time 2 --every 0.25 --backend cuda --kernel tree \
        --out bench/results/h200-DATE-galaxy-disk65k
    python3 bench/galaxy_equilibrium.py --ics old-disk.npz ...   # any snapshot with a "disk" component
    python3 bench/galaxy_equilibrium.py --replot PREFIX         # the plot again from PREFIX.csv

Writes PREFIX.csv (a row per checkpoint, written as it is measured: Ctrl-C keeps what was measured),
PREFIX-q.csv (Q per radial bin at each checkpoint), PREFIX.txt (the table and the issue's bounds) and
PREFIX.png. A line per checkpoint on stderr while it runs.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import numpy as np

# issue 29's acceptance on the GPU machine: (column, bound on |end / start - 1| or the floor)
BOUNDS = (("r50", 0.10), ("r90", 0.10), ("rms_z", 0.30), ("sigma_R", 0.50))
Q_FLOOR = 1.2


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--scene", default="disk", help="preset or scene file with a disk component (default disk)"
    )
    ap.add_argument("--ics", help="start from this snapshot (any format the project reads) instead")
    ap.add_argument("--n", type=int, help="bodies (default: the scene's)")
    ap.add_argument("--time", type=float, default=2.0, help="time units to run (default 2)")
    ap.add_argument("--every", type=float, default=0.25, help="time units between checkpoints (default 0.25)")
    ap.add_argument("--dt", type=float, help="time step (default: the scene's)")
    ap.add_argument("--softening", type=float, help="softening (default: the scene's)")
    ap.add_argument("--backend", default="auto", help="auto, cpu, cuda (default auto)")
    ap.add_argument("--kernel", default="auto", help="force kernel, e.g. tree or cpu-tree (default auto)")
    ap.add_argument("--disk", default="disk", help="the disk component's name (default disk)")
    ap.add_argument("--out", help="output prefix (PREFIX.csv, -q.csv, .txt, .png)")
    ap.add_argument(
        "--replot", metavar="PREFIX", help="only redraw PREFIX.png and PREFIX.txt from PREFIX.csv"
    )
    args = ap.parse_args(argv)
    if args.replot is None and args.out is None:
        ap.error("--out PREFIX is required (or --replot PREFIX)")
    for name in ("time", "every"):
        if getattr(args, name) <= 0:
            ap.error(f"--{name} must be > 0")
    return args


def scene_and_bodies(args):
    from app.model import formats
    from app.scene import load_scene, make_bodies

    overrides = {"run.backend": args.backend, "run.kernel": args.kernel}
    if args.n is not None:
        overrides["initial.n"] = args.n
    if args.dt is not None:
        overrides["physics.dt"] = args.dt
    if args.softening is not None:
        overrides["physics.softening"] = args.softening
    scene = load_scene(args.scene, overrides)
    bodies = formats.read(args.ics) if args.ics else make_bodies(scene)
    if bodies.components is None or args.disk not in bodies.components.names:
        names = ", ".join(bodies.components.names) if bodies.components is not None else "none"
        from app.core.errors import ConfigError

        raise ConfigError(f"the bodies have no component {args.disk!r} (they have: {names}); pass --disk")
    return scene, bodies


def run(args) -> Path:
    from app.commands.assembly import make_backend
    from app.model.galaxy_check import measure

    scene, bodies = scene_and_bodies(args)
    prefix = Path(args.out)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    backend = make_backend(scene, bodies)
    G, dt = scene.physics.G, scene.physics.dt
    steps_per = max(1, round(args.every / dt))
    checkpoints = int(round(args.time / (steps_per * dt)))
    print(
        f"{bodies.n:,} bodies ({bodies.components.describe()}), backend {backend.name}, kernel "
        f"{backend.kernel}, dt {dt:g}, softening {scene.physics.softening:g}: {checkpoints} checkpoints of "
        f"{steps_per} steps",
        file=sys.stderr,
    )
    components = bodies.components
    fields = None
    with (
        open(prefix.with_suffix(".csv"), "w", newline="") as fh,
        open(f"{prefix}-q.csv", "w", newline="") as qh,
    ):
        qw = csv.writer(qh)
        qw.writerow(["time", "R", "Q"])
        try:
            for k in range(checkpoints + 1):
                if k:
                    backend.step(steps_per)
                state = backend.state()
                acc = backend.accelerations()
                report = measure(
                    state.pos, state.vel, state.mass, acc, components, backend.time, G, args.disk
                )
                row = report.row()
                if fields is None:
                    fields = list(row)
                    writer = csv.DictWriter(fh, fieldnames=fields)
                    writer.writeheader()
                writer.writerow(row)
                fh.flush()
                for radius, q in zip(report.q_radii, report.q, strict=True):
                    qw.writerow([f"{report.time:.6g}", f"{radius:.6g}", f"{q:.6g}"])
                qh.flush()
                print(
                    f"t {report.time:7.3f}  r50 {report.r50:.4f}  r90 {report.r90:.4f}  "
                    f"rms z {report.rms_z:.4f}  sigma_R {report.sigma_R:.4f}  Q min {row['q_min']:.2f}  "
                    f"({time.perf_counter() - t0:.0f} s)",
                    file=sys.stderr,
                )
        except KeyboardInterrupt:
            print("interrupted: the checkpoints measured so far are kept", file=sys.stderr)
        finally:
            backend.close()
    return prefix


def read_rows(path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def summarise(prefix: Path) -> str:
    rows = read_rows(prefix.with_suffix(".csv"))
    if len(rows) < 2:
        from app.core.errors import InputFileError

        raise InputFileError(f"{prefix}.csv has {len(rows)} checkpoint(s); two are needed")
    first, last = rows[0], rows[-1]
    lines = [f"{prefix.name}: t = {float(first['time']):g} .. {float(last['time']):g}", ""]
    lines.append(f"{'quantity':<12}{'start':>10}{'end':>10}{'change':>9}{'bound':>8}  ok")
    for name, bound in BOUNDS:
        a, b = float(first[name]), float(last[name])
        change = b / a - 1.0
        lines.append(f"{name:<12}{a:10.4f}{b:10.4f}{change:+9.1%}{bound:8.0%}  {abs(change) < bound}")
    q_end = float(last["q_min"])
    lines.append(
        f"{'Q min':<12}{float(first['q_min']):10.3f}{q_end:10.3f}{'':9}{Q_FLOOR:8.2f}  {q_end >= Q_FLOOR}"
    )
    for key in first:
        if key.startswith("virial_"):
            lines.append(f"{'2K/|W| ' + key[7:]:<24}{float(first[key]):10.3f}{float(last[key]):10.3f}")
    return "\n".join(lines) + "\n"


def plot(prefix: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = read_rows(prefix.with_suffix(".csv"))
    t = np.array([float(r["time"]) for r in rows])
    fig = Figure(figsize=(11, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 2, 1)
    for name, _ in BOUNDS:
        values = np.array([float(r[name]) for r in rows])
        ax.plot(t, values / values[0], label=name)
    ax.set_xlabel("time")
    ax.set_ylabel("value / value at start")
    ax.legend()
    ax.grid(alpha=0.3)
    ax = fig.add_subplot(1, 2, 2)
    q_rows = read_rows(f"{prefix}-q.csv")
    times = sorted({float(r["time"]) for r in q_rows})
    for when in (times[0], times[-1]):
        sel = [r for r in q_rows if float(r["time"]) == when]
        radii, q = [float(r["R"]) for r in sel], [float(r["Q"]) for r in sel]
        ax.plot(radii, q, marker="o", label=f"t = {when:g}")
    ax.axhline(Q_FLOOR, color="grey", ls="--", lw=1)
    ax.set_xlabel("R")
    ax.set_ylabel("Toomre Q")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.suptitle(prefix.name)
    fig.tight_layout()
    fig.savefig(prefix.with_suffix(".png"), dpi=110)


def main(argv=None) -> int:
    from app.core.errors import ConfigError, InputFileError

    args = parse_args(argv)
    try:
        prefix = Path(args.replot) if args.replot else run(args)
        if args.replot and not prefix.with_suffix(".csv").is_file():
            raise InputFileError(f"{prefix}.csv: no such file to replot")
        text = summarise(prefix)
    except (ConfigError, InputFileError) as e:  # a scene or file the user named: one line, not a traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    prefix.with_suffix(".txt").write_text(text)
    plot(prefix)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
