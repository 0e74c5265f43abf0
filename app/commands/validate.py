"""`nbody-live validate`: a kernel's accelerations against the float64 reference."""

from __future__ import annotations

import argparse
import time

import numpy as np

from app.commands.common import add_scene_options, scene_from_args

HELP = "compare a backend/kernel's accelerations with the float64 reference; exit 1 above --tol"
DESCRIPTION = """\
Compute accelerations of SCENE's initial state with the chosen kernel (one force evaluation, no
step) and with the float64 reference (app.physics), and print the per-body relative error
|a - a_ref| / |a_ref|: max, 99th percentile and RMS. |a_ref| is floored at 1e-3 of its RMS so that a
body at a near-zero net force does not turn round-off into a huge ratio. Each kernel is judged
against its own error budget (its registry record's: max 1e-4 for the fp32 all-pairs kernels, 1e-10
for fp64; `nbody-live info --kernels` lists them), or against --tol on the max when given. Exit status
0 when every kernel is within, 1 when one is not.

examples:
  nbody-live validate ../shared/data/nbabel_input16k --softening 0.01 --backend cuda --kernel shared
  nbody-live validate plummer --n 2048 --kernel all        # every available kernel in the registry
"""


def add_parser(sub) -> None:
    p = sub.add_parser("validate", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_scene_options(p)
    p.add_argument("--tol", type=float, default=None, metavar="REL",
                   help="max relative error allowed (default: each kernel's own error budget)")
    p.set_defaults(func=main)


def main(args) -> int:
    from app.backends import all_kernel_records, backend_class
    from app.errors import ConfigError
    from app.forces import ErrorBudget
    from app.physics import accelerations, relative_errors
    from app.scene import make_bodies

    if args.tol is not None and not args.tol > 0:
        raise ConfigError(f"--tol: {args.tol} must be a number > 0")
    want_all = args.kernel == "all"
    if want_all:
        args.kernel = None
    scene = scene_from_args(args)
    bodies = make_bodies(scene)
    t0 = time.perf_counter()
    ref = accelerations(bodies.pos, bodies.mass, scene.physics)
    print(f"float64 reference for N={bodies.n}: {time.perf_counter() - t0:.2f} s")
    if want_all:
        records = [r for r in all_kernel_records()
                   if scene.run.backend in ("auto", r.backend) and backend_class(r.backend).available()]
    else:
        from app.commands.common import make_backend

        probe = make_backend(scene, bodies)
        records = [next(r for r in probe.kernels() if r.name == probe.kernel)]
        probe.close()
    worst_ok = True
    for rec in records:
        backend = backend_class(rec.backend)()
        try:
            backend.load(bodies, scene.physics, rec.name)
            got = backend.accelerations()
        finally:
            backend.close()
        rel = relative_errors(got, ref)
        errors = {"max": float(rel.max()), "p99": float(np.percentile(rel, 99)),
                  "rms": float(np.sqrt(np.mean(rel ** 2)))}
        budget = ErrorBudget(max_rel=args.tol) if args.tol is not None else rec.error_budget
        over = budget.judge(errors)
        worst_ok &= not over
        print(f"{rec.backend}/{rec.name:<22} N={bodies.n:<8} max rel err {errors['max']:.3e}  "
              f"p99 {errors['p99']:.3e}  rms {errors['rms']:.3e}  budget {budget.describe()}  "
              f"{'ok' if not over else 'FAIL: ' + '; '.join(over)}")
    return 0 if worst_ok else 1
