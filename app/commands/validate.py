"""`nbody-live validate`: a kernel's accelerations against the float64 reference."""

from __future__ import annotations

import argparse
import time

from app.commands.common import add_scene_options, scene_from_args

HELP = "compare a backend/kernel's accelerations with the float64 reference; exit 1 above --tol"
DESCRIPTION = """\
Compute accelerations of SCENE's initial state with the chosen kernel (one force evaluation, no
step) and with the float64 reference (app.physics), and print the per-body relative error
|a - a_ref| / |a_ref|, max and RMS. |a_ref| is floored at 1e-3 of its RMS so that a body at a
near-zero net force does not turn round-off into a huge ratio. Exit status 0 when the max error
is within --tol, 1 when it is not.

examples:
  nbody-live validate ../shared/data/nbabel_input16k --softening 0.01 --backend cuda --kernel shared
  nbody-live validate plummer --n 2048 --kernel all        # every available kernel in the registry
"""


def add_parser(sub) -> None:
    p = sub.add_parser("validate", help=HELP, description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_scene_options(p)
    p.add_argument("--tol", type=float, default=None, metavar="REL",
                   help="max relative error allowed (default: 1e-4 for fp32 kernels, 1e-10 for fp64)")
    p.set_defaults(func=main)


def main(args) -> int:
    from app.backends import all_kernel_records, backend_class
    from app.physics import accelerations, relative_error
    from app.scene import make_bodies

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
        mx, rms = relative_error(got, ref)
        tol = args.tol if args.tol is not None else (1e-10 if rec.precision == "fp64" else 1e-4)
        ok = mx <= tol
        worst_ok &= ok
        print(f"{rec.backend}/{rec.name:<22} N={bodies.n:<8} max rel err {mx:.3e}  rms {rms:.3e}  "
              f"tol {tol:.0e}  {'ok' if ok else 'FAIL'}")
    return 0 if worst_ok else 1
