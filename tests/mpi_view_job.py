"""The viewer's control broadcast for tests/test_mpi_view.py:
`[mpiexec -n R] python tests/mpi_view_job.py OUT`.

Rank 0 opens the headless viewer with its panel and, at fixed frames, does what a user would do in the
panel: reset, pause, resume, switch kernels (to the tree and back), set theta, change dt and softening,
single-step.
Every other rank follows (RanksBackend.follow). At the end each rank writes OUT/rank<r>.json: the
fingerprints of its state after every change it applied (the same on every rank if the broadcast kept
them together), and rank 0 also writes OUT/state.npz, the final state. Without mpiexec the same script is
one process (the plain CPU backend), whose final state the ranks' must equal.

`... mpi_view_job.py OUT --nan`: the bodies rank 0 loads (and broadcasts) carry a NaN velocity in the last
body (NAN_BODY: the last rank's), the integrator is euler-damped and the ranks check every step, so
the first check finds that body alone. Rank 0 draws NAN_FRAMES frames and writes OUT/nan.json: whether
its viewer paused, its message and the time at the pause and after; every rank then ends as usual.
"""

from __future__ import annotations

import json
import sys
from contextlib import nullcontext
from pathlib import Path

import numpy as np

from app.backends.distributed import agree, fail_together, world
from app.commands.assembly import make_backend
from app.scene import load_scene

FRAMES = 24
NAN_FRAMES = 4
N = 301
NAN_BODY = N - 1  # in the last rank's share, whatever the rank count


def actions(ctl) -> dict:
    """frame -> what the panel does before that frame is drawn."""
    return {
        3: ctl.reset,
        5: ctl.toggle_pause,
        7: ctl.toggle_pause,  # two frames paused: no steps anywhere
        9: lambda: ctl.switch_kernel("cpu-tree"),
        11: lambda: ctl.set_tunable("theta", 0.7),
        13: lambda: ctl.set_value("physics.dt", "0.0005"),
        15: lambda: ctl.switch_kernel("cpu-fp64"),
        17: lambda: ctl.set_value("physics.softening", "0.03"),
        19: ctl.toggle_pause,
        20: ctl.single_step,
    }  # paused, then exactly one step


def lead(scene, backend) -> None:
    from app.render.canvas import open_viewer
    from app.ui import Panel

    viewer = open_viewer(scene, backend, (320, 180), headless=True)
    panel = Panel(viewer)
    try:
        todo = actions(panel.controller)
        for frame in range(FRAMES):
            if frame in todo:
                message = todo[frame]()
                assert message is None, message
            viewer.step_and_render()
        quit_all = getattr(viewer.backend, "quit_all", None)
        if quit_all is not None:
            quit_all()
    finally:
        panel.close()
        viewer.close()


def nan_lead(scene, backend, out: Path) -> None:
    """Rank 0 with --nan: NAN_FRAMES frames; the pause it reports (the others still following)."""
    from app.render.canvas import open_viewer

    viewer = open_viewer(scene, backend, (320, 180), headless=True)
    try:
        paused_at = None
        for _ in range(NAN_FRAMES):
            viewer.step_and_render()
            if viewer.paused and paused_at is None:
                paused_at = backend.time
        (out / "nan.json").write_text(
            json.dumps(
                {
                    "paused": viewer.paused,
                    "message": viewer.stats.extra.get("message", ""),
                    "time_at_pause": paused_at,
                    "time_after": backend.time,
                }
            )
        )
        quit_all = getattr(viewer.backend, "quit_all", None)
        if quit_all is not None:
            quit_all()
    finally:
        viewer.close()


def poisoned(scene):
    """The scene's bodies with a NaN velocity in NAN_BODY."""
    from app.scene import make_bodies

    bodies = make_bodies(scene)
    bodies.vel[NAN_BODY, 1] = np.nan
    return bodies


def main(out: Path, nan: bool) -> None:
    from app.render.gl_setup import configure

    comm = world()
    settings = {
        "initial.n": N,
        "run.backend": "cpu",
        "run.kernel": "cpu-fp64",
        "physics.softening": 0.02,
        "physics.dt": 2e-3,
        "run.steps_per_frame": 2,
    }
    if nan:
        from app.backends.distributed import RankRun

        settings.update({"physics.integrator": "euler-damped", "physics.damping": 0.999})
        RankRun.check_every = 1  # every rank alike: the first step's check sees the injected body alone
    scene = load_scene("plummer", settings)
    rank = 0 if comm is None else comm.rank
    with fail_together(comm) if comm is not None else nullcontext():
        if comm is not None:
            agree(comm, {"argv": sys.argv[1:]})
        if rank == 0:
            configure(headless=True)
        bodies = poisoned(scene) if nan else None
        backend = make_backend(scene, bodies, comm=comm)
        try:
            if rank == 0 and nan:
                nan_lead(scene, backend, out)
            elif rank == 0:
                lead(scene, backend)
                state = backend.state()
                np.savez(out / "state.npz", pos=state.pos, vel=state.vel, time=state.time)
            else:
                backend.follow()
        finally:
            backend.close()
        fingerprints = getattr(backend, "fingerprints", [])
        (out / f"rank{rank}.json").write_text(json.dumps({"fingerprints": fingerprints}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), "--nan" in sys.argv[2:])
