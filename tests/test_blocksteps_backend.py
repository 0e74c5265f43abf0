"""`--timesteps block` from the outside (app/backends/block.py): the scene keys and flags, simulate with
a bitwise --resume, the refusals (several devices, MPI ranks, kernels other than the tree, tunables that
make a(x) depend on history), and the backend's own surface. CPU (the twin, cpu-tree) here; the GPU's
form is in tests/test_blocksteps_gpu.py."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import one_line_error

from app.backends import backend_class
from app.backends.block import block_steps_backend_class
from app.cli import main
from app.core.errors import ConfigError
from app.model import formats
from app.model.ics import generate
from app.model.physics import Physics

BLOCK = [
    "--backend",
    "cpu",
    "--no-progress",
    "--timesteps",
    "block",
    "--dt",
    "0.03125",
    "--block-levels",
    "4",
    "--block-eta",
    "0.01",
]
PHYSICS = Physics(softening=0.01, dt=1 / 32, timesteps="block", block_levels=4, block_eta=0.01)


def _cpu_block():
    return block_steps_backend_class(backend_class("cpu"))()


def test_simulate_block_steps_resumes_bitwise_from_a_checkpoint(tmp_path, capsys):
    """8 max steps straight against 4 + a --resume of 4: bitwise x, v and time, with levels that differ
    between bodies and change during the run (the npz keeps them, which the default rule "settled"
    needs). The control: the same resume at another eta gives another trajectory."""
    whole, half, other = tmp_path / "whole.npz", tmp_path / "half.npz", tmp_path / "other.npz"
    scene = ["collision", "--n", "2048", "--seed", "3"]
    assert main(["simulate", *scene, "--steps", "8", "--out", str(whole), *BLOCK]) == 0
    said = capsys.readouterr().out
    assert "with cpu-tree, block steps L=4 eta=0.01 coarsen=settled:" in said
    assert "% of the bodies active" in said
    assert main(["simulate", *scene, "--steps", "4", "--out", str(half), *BLOCK]) == 0
    resume = ["simulate", "collision", "--steps", "4", "--resume", str(half), *BLOCK]
    assert main([*resume, "--out", str(other), "--block-eta", "0.02"]) == 0
    assert main([*resume, "--out", str(half)]) == 0
    a, b, c = formats.read(whole), formats.read(half), formats.read(other)
    assert a.time == b.time == c.time == 0.25
    assert np.array_equal(a.pos, b.pos) and np.array_equal(a.vel, b.vel)
    assert not np.array_equal(a.pos, c.pos)
    levels = []
    backend = _cpu_block()
    backend.load(generate("collision", 2048, 3), PHYSICS)
    for _ in range(2):
        backend.step(4)
        levels.append(backend.levels_histogram())
    backend.close()
    assert np.count_nonzero(levels[0]) >= 2 and not np.array_equal(levels[0], levels[1])


@pytest.mark.parametrize(
    "extra, named",
    [
        (["--gpus", "2"], "--gpus 2: block time steps run on one device"),
        (
            ["--kernel", "cpu-simd"],
            "block time steps walk the tree (cpu-tree); shared time steps run cpu-simd",
        ),
        (["--tunable", "rebuild_every=4"], "drop rebuild_every"),
        (["--tunable", "opening=rel"], "use opening=cube or bmax"),
        (["--integrator", "euler-damped"], "block time steps are a leapfrog"),
        (["--timesteps", "blocks"], "physics.timesteps = 'blocks' is not allowed; one of: shared, block"),
        (["--block-levels", "21"], "physics.block_levels"),
        (
            ["--block-coarsen", "never"],
            "block_coarsen = 'never' is not allowed; one of: settled, boundary, aligned",
        ),
    ],
)
def test_what_block_steps_cannot_do_is_refused_with_the_fix(tmp_path, capsys, extra, named):
    rc = main(
        [
            "simulate",
            "collision",
            "--n",
            "512",
            "--steps",
            "2",
            "--out",
            str(tmp_path / "o.npz"),
            *BLOCK,
            *extra,
        ]
    )
    one_line_error(capsys, rc, 2, named)
    assert not (tmp_path / "o.npz").exists()


def test_block_steps_refuse_mpi_ranks():
    from app.commands.assembly import make_rank_run
    from app.scene import load_scene

    scene = load_scene("collision", {"physics.timesteps": "block"})
    with pytest.raises(ConfigError, match="one process on one device; run without mpiexec"):
        make_rank_run(object(), scene)


def test_a_scene_file_asks_for_block_steps(tmp_path):
    from app.commands.assembly import make_backend
    from app.scene import load_scene

    path = tmp_path / "b.toml"
    path.write_text(
        '[initial]\ngenerator = "plummer"\nn = 256\n[physics]\ndt = 0.0625\ntimesteps = "block"\n'
        'block_levels = 3\nblock_eta = 0.02\nblock_coarsen = "aligned"\n[run]\nbackend = "cpu"\n'
    )
    backend = make_backend(load_scene(str(path)))
    try:
        assert backend.timesteps == "block" and backend.kernel == "cpu-tree"
        assert (backend.physics.block_levels, backend.physics.block_eta) == (3, 0.02)
        backend.step(1)
        assert "coarsen=aligned" in backend.block_summary()
        assert backend.levels_histogram().shape == (4,) and backend.time == 0.0625
    finally:
        backend.close()


def test_the_backend_surface(tmp_path):
    """Kernels and tunables as the panel sees them; a(x) and the force error's halves at the synchronised
    state; render arrays are the state in float32; a tunable or physics change re-derives the levels."""
    backend = _cpu_block()
    bodies = generate("collision", 1024, 2)
    backend.set_tunables(theta=0.6)  # before a load: kept for it
    backend.load(bodies, PHYSICS)
    assert [r.name for r in backend.kernels()] == ["cpu-tree"] and backend.tunables()["theta"] == 0.6
    names = [s.name for s in backend.tunable_specs()]
    assert "theta" in names and "opening" in names and "rebuild_every" not in names
    with pytest.raises(ConfigError, match="shared time steps run cpu-simd"):
        backend.set_kernel("cpu-simd")
    with pytest.raises(ConfigError, match="use opening=cube or bmax"):
        backend.set_tunables(opening="rel")
    assert backend.tunables()["opening"] == "cube"
    timings = backend.step(2)
    assert timings.steps == 2 and 0 < timings.extra["active_fraction"] < 1 and timings.interactions > 0
    acc = backend.accelerations()
    approx, exact = backend.force_error_sample(np.arange(0, 1024, 8))
    assert np.array_equal(approx, acc[::8])
    rel = np.linalg.norm(approx - exact, axis=1) / np.linalg.norm(exact, axis=1)
    assert np.percentile(rel, 99) < 5e-3 and rel.max() > 0
    rows, speed = backend.host_render_arrays()
    state = backend.state()
    assert np.array_equal(rows[:, :3], state.pos.astype(np.float32))
    assert np.allclose(speed, np.linalg.norm(state.vel, axis=1), rtol=1e-6)
    fine = backend.levels_histogram()
    backend.set_physics(PHYSICS.with_(block_eta=0.04))  # a looser criterion: coarser levels
    backend.step(1)
    coarse = backend.levels_histogram()
    assert backend.time == 3 / 32 and coarse.sum() == fine.sum() == 1024
    assert coarse @ np.arange(5) < fine @ np.arange(5)
    backend.close()


def test_settled_levels_travel_with_the_npz_and_resume_bitwise(tmp_path, caplog):
    """Coarsening rule "settled" remembers the boundary before, so its resume needs the levels: 8 max
    steps straight against 4 + a resume of 4 from the npz (which keeps them) are bitwise; the control, the
    same state through a csv (exact x and v, no levels), continues differently and the writer says why."""
    import logging

    settled = [*BLOCK, "--block-coarsen", "settled"]
    scene = ["collision", "--n", "2048", "--seed", "3"]
    whole, half, text = tmp_path / "whole.npz", tmp_path / "half.npz", tmp_path / "half.csv"
    assert main(["simulate", *scene, "--steps", "8", "--out", str(whole), *settled]) == 0
    assert main(["simulate", *scene, "--steps", "4", "--out", str(half), *settled]) == 0
    mid = formats.read(half)
    assert mid.step_levels is not None and mid.step_levels.coarsen == "settled"
    assert (mid.step_levels.max_level, mid.step_levels.dt_max) == (4, 1 / 32)
    with caplog.at_level(logging.WARNING):
        formats.write(text, mid)
    assert "keeps no block-step levels, which coarsening rule settled needs" in caplog.text
    resume = ["simulate", "collision", "--steps", "4", *settled]
    assert main([*resume, "--resume", str(text), "--out", str(tmp_path / "from-csv.npz")]) == 0
    assert main([*resume, "--resume", str(half), "--out", str(half)]) == 0
    a, b, c = formats.read(whole), formats.read(half), formats.read(tmp_path / "from-csv.npz")
    assert np.array_equal(a.pos, b.pos) and np.array_equal(a.vel, b.vel)
    assert np.array_equal(a.step_levels.levels, b.step_levels.levels)
    assert not np.array_equal(a.pos, c.pos)  # without the levels: another continuation


def test_step_levels_in_npz_round_trip_and_bad_forms_are_named(tmp_path):
    from app.core.errors import InputFileError
    from app.model.bodies import StepLevels

    bodies = generate("plummer", 64, 1)
    bodies.step_levels = StepLevels(np.arange(64, dtype=np.int32) % 5, 4, 0.125, "settled")
    formats.write(tmp_path / "ok.npz", bodies)
    back = formats.read_npz(tmp_path / "ok.npz").step_levels
    assert np.array_equal(back.levels, bodies.step_levels.levels)
    assert (back.max_level, back.dt_max, back.coarsen) == (4, 0.125, "settled")
    base = {"pos": bodies.pos, "vel": bodies.vel, "mass": bodies.mass}
    good = {
        "step_levels": np.zeros(64, np.int32),
        "step_levels_max": 4,
        "step_levels_dt": 0.1,
        "step_levels_rule": np.array("settled"),
    }
    cases = [
        ({"step_levels": np.zeros(64, np.int32)}, "go together; found only step_levels"),
        ({**good, "step_levels": np.zeros(63, np.int32)}, "must be (64,) integers"),
        ({**good, "step_levels": np.full(64, 5, np.int32)}, "levels in [5, 5]"),
        ({**good, "step_levels_dt": -1.0}, "step_levels_dt -1.0 (> 0)"),
        ({**good, "step_levels_rule": np.array("never")}, "step_levels_rule 'never'"),
    ]
    for i, (arrays, named) in enumerate(cases):
        path = tmp_path / f"bad{i}.npz"
        np.savez(path, **base, **arrays)
        with pytest.raises(InputFileError) as err:
            formats.read_npz(path)
        assert named in str(err.value), (named, str(err.value))


# --- frames inside a max step (step_parts, run.frames_per_step) -----------------------------------------
def _drawn(backend) -> np.ndarray:
    return backend.host_render_arrays()[0][:, :3].astype(np.float64)


def test_frames_inside_a_max_step_leave_the_trajectory_as_it_is():
    """K parts of a max step end where step(1) ends, bitwise, for K = 3 and 8: the state is never changed
    for a drawing (and the load copies the bodies, which the CPU twin's ops step in place). Between parts
    the drawn time is the part's and the state is not synchronised; a snapshot or a force error sample
    asked for inside the max step leaves the trajectory alone too."""
    bodies = generate("collision", 2048, 3)
    whole = _cpu_block()
    whole.load(bodies, PHYSICS)
    whole.step(2)
    want = whole.state()
    assert np.array_equal(bodies.pos, generate("collision", 2048, 3).pos)  # load took a copy
    for per_step in (3, 8):
        parts = _cpu_block()
        parts.load(bodies, PHYSICS)
        for p in range(1, per_step):
            timings = parts.step_parts(1, per_step)
            assert not parts.synchronised and parts.time == pytest.approx(p / per_step * PHYSICS.dt)
            assert timings.steps == 0
        assert parts.step_parts(1, per_step).steps == 1 and parts.synchronised
        parts.step_parts(2, per_step)
        approx, exact = parts.force_error_sample(np.arange(0, 2048, 16))  # inside the second max step
        rel = np.linalg.norm(approx - exact, axis=1) / np.linalg.norm(exact, axis=1)
        assert np.percentile(rel, 99) < 5e-3
        mid = parts.time
        got = parts.state()  # runs the max step in flight to its end
        assert parts.synchronised and got.time == want.time == 2 * PHYSICS.dt > mid
        assert np.array_equal(got.pos, want.pos) and np.array_equal(got.vel, want.vel)
        parts.close()
    whole.close()


def test_frames_inside_a_max_step_move_along_the_drift():
    """64 frames per max step of 16 ticks (a frame every quarter tick): the drawn positions are predicted
    along each body's drift, so they change direction only where a kick turns a velocity. The largest
    second difference of the drawn positions over the frames is measured against the control, the same
    frames drawn at the last substep's positions (which stand still between substep ends, then jump)."""

    def second_differences(predict: bool) -> float:
        backend = _cpu_block()
        backend.load(generate("collision", 2048, 3), PHYSICS)
        if not predict:
            backend._ahead = lambda: 0.0
        drawn = [_drawn(backend)]
        for _ in range(64):
            backend.step_parts(1, 64)
            drawn.append(_drawn(backend))
        backend.close()
        d = np.asarray(drawn)
        return float(np.abs(d[2:] - 2 * d[1:-1] + d[:-2]).max())

    smooth, jumps = second_differences(True), second_differences(False)
    assert smooth < 0.05 * jumps, (smooth, jumps)


def test_the_energy_monitor_waits_for_the_end_of_a_max_step_drawn_in_parts():
    from app.ui.energy import EnergyMonitor

    backend = _cpu_block()
    backend.load(generate("plummer", 512, 1), PHYSICS)
    mon = EnergyMonitor(every=1)
    backend.step_parts(1, 4)
    mon.tick(backend)
    mon.wait()
    assert mon._base is None  # due, not taken: velocities are mid-step
    backend.step_parts(3, 4)
    mon.tick(backend)
    mon.wait()
    assert mon._base is not None
    backend.close()


def test_frames_per_step_needs_block_steps(tmp_path, capsys):
    rc = main(
        [
            "simulate",
            "plummer",
            "--n",
            "256",
            "--steps",
            "1",
            "--backend",
            "cpu",
            "--frames-per-step",
            "4",
            "--out",
            str(tmp_path / "o.npz"),
        ]
    )
    one_line_error(capsys, rc, 2, "frames are drawn inside a step only with block time steps")
    assert not (tmp_path / "o.npz").exists()
