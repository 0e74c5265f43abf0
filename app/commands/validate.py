"""`nbody-live validate`: a kernel's accelerations against the float64 reference."""

from __future__ import annotations

import argparse
import logging
import time

import numpy as np

from app.commands.assembly import check_fits, scene_from_args
from app.commands.options import add_kernel_file_options, add_scene_options
from app.commands.running import progress_bar

log = logging.getLogger("nbody-live")

HELP = "compare a backend/kernel's accelerations with the float64 reference; exit 1 above --tol"
DESCRIPTION = """\
Compute accelerations of SCENE's initial state with the chosen kernel (one force evaluation, no
step) and with the float64 reference, and print the per-body relative error |a - a_ref| / |a_ref|:
max, 99th percentile, median and RMS. |a_ref| is floored at 1e-3 of its RMS so that a body at a
near-zero net force does not turn round-off into a huge ratio. A kernel with tunables prints the values
it ran with (--tunable NAME=VALUE sets them, e.g. --tunable theta=0.7 for cpu-tree).

Two errors are printed. The kernel's error is against float64 evaluated on the inputs the kernel
really sees (positions and masses rounded to float32 for an fp32 kernel): that is what each kernel is
judged on, against its own error budget (its registry record's: max 1e-4 for the fp32 all-pairs
kernels, 1e-10 for fp64; a tree code on its 99th percentile, p99 <= 1e-3 for cpu-tree, and a looser
max; `nbody-live info --kernels` lists them), or against --tol on the max when given. A tree under its
default opening test (rel, which reads each body's last acceleration) has none yet here: its one
evaluation is the cube test at theta, as a run's first step, and the row says so. The total
error, against the exact inputs, adds the input rounding the kernel cannot avoid; it is reported, not
judged. Exit status 0 when every kernel is within, 1 when one is not.

Above 16,384 bodies the reference is computed for a random sample of --sample target bodies (against
all N), seeded by --seed (printed; for a generator SCENE it seeds the bodies too); --sample 0 takes
every body. The reference runs in float64 on the
GPU when CUDA works, else numba, else numpy.

examples:
  nbody-live validate ../shared/data/nbabel_input16k --softening 0.01 --backend cuda --kernel shared
  nbody-live validate plummer --n 2048 --kernel all        # every available kernel in the registry
  nbody-live validate collision --n 81920 --kernel all --sample 8192 --seed 7
  nbody-live validate plummer --n 16384 --backend cpu --kernel cpu-tree --tunable opening=cube \
      --tunable theta=0.7
"""

SAMPLE_ABOVE = 16384  # bodies above which the reference is sampled by default
DEFAULT_SAMPLE = 4096


def add_parser(sub) -> None:
    p = sub.add_parser(
        "validate", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_scene_options(p)
    p.add_argument(
        "--tol",
        type=float,
        default=None,
        metavar="REL",
        help="max relative error allowed (default: each kernel's own error budget)",
    )
    p.add_argument(
        "--sample",
        type=int,
        default=None,
        metavar="K",
        help=f"target bodies the reference is computed for (default: {DEFAULT_SAMPLE:,} above "
        f"{SAMPLE_ABOVE:,} bodies, else all; 0 = all)",
    )
    add_kernel_file_options(p)
    p.set_defaults(func=main)


def _records(scene, want_all: bool):
    """The kernel records to validate, every backend checked before any work."""
    from app.backends import all_kernel_records, backend_class, select_backend
    from app.core.errors import BackendUnavailable

    if want_all:
        return [
            r
            for r in all_kernel_records()
            if scene.run.backend in ("auto", r.backend) and backend_class(r.backend).available()
        ]
    kernel = scene.run.kernel if scene.run.kernel != "auto" else None
    cls = select_backend(scene.run.backend, kernel)
    if kernel is None:
        probe = cls()
        kernel = probe.kernel  # the backend's default
        probe.close()
    reason = cls.kernel_why_not(kernel)
    if reason:
        raise BackendUnavailable(f"kernel {kernel!r} cannot run: {reason}")
    return [cls.record(kernel)]


def _sample(n: int, requested: int | None, seed: int) -> np.ndarray | None:
    """Sorted target rows of the reference, or None for all of them."""
    from app.core.errors import ConfigError

    if requested is not None and requested < 0:
        raise ConfigError(f"--sample: {requested} must be >= 0 (0 = every body)")
    k = requested if requested is not None else (DEFAULT_SAMPLE if n > SAMPLE_ABOVE else 0)
    if k == 0 or k >= n:
        return None
    return np.sort(np.random.default_rng(seed).choice(n, size=k, replace=False))


def _inputs(bodies) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(positions, masses) as each precision's kernels see them: fp32 kernels the float32 rows they are
    given, back in float64. One entry when rounding changes nothing (a Tipsy file is float32 already),
    so that the reference is not computed twice."""
    exact = (bodies.pos, bodies.mass)
    pos4 = bodies.pos4(np.float32).astype(np.float64)
    rounded = (pos4[:, :3], pos4[:, 3])
    if np.array_equal(rounded[0], exact[0]) and np.array_equal(rounded[1], exact[1]):
        return {"fp64": exact}
    return {"fp64": exact, "fp32": rounded}


class _References:
    """The float64 reference of the sampled targets, computed once per (inputs' precision, engine)."""

    def __init__(self, args, bodies, physics, targets: np.ndarray):
        self.args, self.physics, self.targets, self.n = args, physics, targets, bodies.n
        self.inputs = _inputs(bodies)
        self.cache: dict[tuple[str, str], np.ndarray] = {}

    def get(self, precision: str, engine: str) -> np.ndarray:
        from app.commands.reference import reference_accelerations

        precision = precision if precision in self.inputs else "fp64"
        if (precision, engine) not in self.cache:
            t0 = time.perf_counter()
            pos, mass = self.inputs[precision]
            with progress_bar(
                self.args,
                total=self.targets.size,
                unit="body",
                leave=False,
                desc=f"float64 reference ({precision} inputs)",
            ) as bar:
                self.cache[precision, engine] = reference_accelerations(
                    pos, mass, self.physics, self.targets, engine, bar.update
                )
            print(
                f"float64 reference on {precision} inputs for {self.targets.size:,} of N={self.n:,} on "
                f"{engine}: {time.perf_counter() - t0:.2f} s"
            )
        return self.cache[precision, engine]


def _judge(rec, scene, bodies, targets: np.ndarray, refs: _References, tol: float | None) -> bool:
    """One record's accelerations of `targets` against the reference, printed; whether within budget."""
    from app.backends import backend_class
    from app.commands.reference import reference_engine
    from app.engine.forces import ErrorBudget, format_tunables
    from app.model.physics import error_summary, relative_errors

    backend = backend_class(rec.backend)()
    try:
        backend.load(bodies, scene.physics, rec.name)
        if scene.run.tunables:
            backend.set_tunables(**scene.run.tunables)
        values = rec.tunables_at(backend.tunables(), bodies.n)  # alpha's auto as its number at this N
        tunables = f"{format_tunables(values)}  " if rec.tunables else ""
        got = backend.accelerations()[targets]
    finally:
        backend.close()
    engine = reference_engine(judged=rec.name)
    errors = error_summary(got, refs.get(rec.precision, engine))
    total = float(relative_errors(got, refs.get("fp64", engine)).max())
    budget = ErrorBudget(max_rel=tol) if tol is not None else rec.error_budget
    over = budget.judge(errors)
    print(
        f"{rec.backend}/{rec.name:<22} N={bodies.n:<8} {tunables}max rel err {errors['max']:.3e}  "
        f"p99 {errors['p99']:.3e}  median {errors['median']:.3e}  rms {errors['rms']:.3e}  "
        f"budget {budget.describe()}  "
        f"{'ok' if not over else 'FAIL: ' + '; '.join(over)}  "
        f"(total with input rounding: max {total:.3e}, not judged)"
    )
    if values.get("opening") == "rel":  # the trees' relative test (docs/tree.md, step 5)
        print(
            "  note: opening=rel reads each body's last acceleration, which one evaluation of the initial "
            f"state has not: these errors are the cube test's at theta={values.get('theta')} "
            "(a run's first step); the relative test's own are bench's error sample after its timed steps, "
            "or the panel's live force error"
        )
    return not over


def main(args) -> int:
    from app.core.errors import ConfigError
    from app.scene import make_bodies

    if args.tol is not None and not args.tol > 0:
        raise ConfigError(f"--tol: {args.tol} must be a number > 0")
    want_all = args.kernel == "all"
    if want_all:
        args.kernel = None
    scene = scene_from_args(args)
    if scene.physics.timesteps != "shared":
        log.warning(
            "physics.timesteps = %s: validate takes one force evaluation and no step, so time "
            "steps do not apply here (the tree's forces are the same under block steps)",
            scene.physics.timesteps,
        )
    if want_all and scene.run.tunables:
        raise ConfigError("--tunable applies to one kernel: name it with --kernel, not all")
    records = _records(scene, want_all)
    bodies = make_bodies(scene)
    for rec in records:
        check_fits(bodies, rec)
    n = bodies.n
    rows = _sample(n, args.sample, scene.initial.seed)
    if rows is not None:
        print(
            f"reference for a random sample of {rows.size:,} of {n:,} bodies (seed {scene.initial.seed}; "
            "--sample 0 for all)"
        )
    targets = rows if rows is not None else np.arange(n)
    refs = _References(args, bodies, scene.physics, targets)
    worst_ok = True
    for rec in records:  # every record judged and printed, even after a failure
        worst_ok &= _judge(rec, scene, bodies, targets, refs, args.tol)
    return 0 if worst_ok else 1
