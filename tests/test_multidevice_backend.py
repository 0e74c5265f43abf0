"""`--gpus N` end to end over K CPU "devices" (app/backends/multi.py): the multi-device Backend that run,
simulate, record, bench and the panel drive, its timings, and the command line's checks and errors.

The GPU form is the same class over app/backends/cuda/multi.py (tests/test_cuda_multi.py)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import one_line_error
from test_multidevice import one_device

from app.backends import backend_class
from app.backends.cpu import CPUBackend
from app.backends.multi import MultiDeviceBackend, multi_backend_class, needs_rebalance
from app.cli import main
from app.core.errors import ConfigError
from app.engine.timing import StepTimings, device_entries
from app.model.bodies import Bodies
from app.model.physics import Physics, relative_errors
from app.parallel.multidevice import parse_device_count, resolve_device_count
from app.scene import load_scene, make_bodies

CPU = ["--backend", "cpu"]


def cloud(n: int = 257, seed: int = 5) -> Bodies:
    rng = np.random.default_rng(seed)
    return Bodies.from_arrays(
        rng.normal(size=(n, 3)), rng.normal(scale=0.3, size=(n, 3)), rng.uniform(0.5, 1.5, n) / n
    )


def make_plummer(n: int) -> Bodies:
    return make_bodies(load_scene("plummer", {"initial.n": n}))


# --- pure parts ------------------------------------------------------------------------------------------
def test_device_counts_are_parsed_and_bounded():
    assert parse_device_count("2") == 2 and parse_device_count(" ALL ") == "all"
    for bad in ("0", "-1", "two", "1.5", ""):
        with pytest.raises(ConfigError, match="number of devices >= 1, or all"):
            parse_device_count(bad)
    assert resolve_device_count("all", 4) == 4 and resolve_device_count(3, 4) == 3
    with pytest.raises(ConfigError, match="--gpus 2: this machine has 1 GPUs; ask for at most 1"):
        resolve_device_count("2", 1)


def test_rebalance_only_when_the_devices_disagree():
    assert not needs_rebalance([1.0])
    assert not needs_rebalance([1.0, 1.05])
    assert needs_rebalance([1.0, 1.5])
    assert not needs_rebalance([0.0, 1.5])  # a device without a measurement


def test_device_entries_round_trip_through_step_timings():
    extra = device_entries(["cpu0", "cpu1"], [1.5, 2.5], 0.25)
    t = StepTimings(kernel="k", steps=1, n=2, extra=extra)
    assert t.devices == {"0 cpu0": 1.5, "1 cpu1": 2.5} and t.exchange_ms == 0.25
    assert StepTimings(kernel="k", steps=1, n=2).devices == {}


# --- the backend over K CPU devices -------------------------------------------------------------------------
@pytest.mark.parametrize("driver", ["threads", "single"])
def test_k_cpu_devices_as_a_backend_step_bitwise_like_one(driver):
    bodies, physics = cloud(), Physics(softening=0.02, dt=2e-3)
    cls = multi_backend_class(CPUBackend, 3, driver)
    assert issubclass(cls, MultiDeviceBackend) and cls.name == "cpu" and cls.k == 3
    backend = cls()
    try:
        backend.load(bodies, physics, "cpu-fp64")
        assert np.array_equal(backend.accelerations(), one_device(bodies, physics, "cpu-fp64"))
        timings = [backend.step(5) for _ in range(4)]
        state = backend.state()
        pos, speed = backend.host_render_arrays()
    finally:
        backend.close()
    ref_pos, ref_vel = one_device(bodies, physics, "cpu-fp64", steps=20)
    assert np.array_equal(state.pos, ref_pos) and np.array_equal(state.vel, ref_vel)
    assert state.time == pytest.approx(20 * physics.dt)
    assert pos.shape == (bodies.n, 4) and pos.dtype == np.float32 and speed.shape == (bodies.n,)
    for t in timings:
        assert list(t.devices) == ["0 cpu0", "1 cpu1", "2 cpu2"] and all(ms > 0 for ms in t.devices.values())
        assert t.exchange_ms > 0 and t.force_ms > 0 and t.interactions == 5 * bodies.n**2


def test_switching_kernel_physics_and_tunables_reloads_the_devices_from_the_state():
    bodies = cloud()
    backend = multi_backend_class(CPUBackend, 2)()
    try:
        backend.load(bodies, Physics(softening=0.02), "cpu-simd")
        backend.step(3)
        before = backend.state()
        backend.set_kernel("cpu-fp64")
        assert backend.kernel == "cpu-fp64"
        after = backend.state()
        assert np.array_equal(before.pos, after.pos) and after.time == before.time
        backend.set_physics(Physics(softening=0.05))
        assert np.array_equal(backend.accelerations(), one_device(after, Physics(softening=0.05), "cpu-fp64"))
        backend.set_kernel("cpu-tree")
        backend.set_tunables(theta=0.3)
        assert backend.tunables()["theta"] == 0.3
        assert all(d.evaluator.tunables["theta"] == 0.3 for d in backend._run.devices)
        with pytest.raises(ConfigError, match="theta"):
            backend.set_tunables(theta=9.0)
        backend.step(1)
    finally:
        backend.close()


# --- the live force error over K devices (Backend.force_error_sample) ---------------------------------------
SAMPLE_PHYSICS = Physics(softening=0.01, dt=1e-3)


def sample_rows(n: int) -> np.ndarray:
    """Rows over every share of K <= 3 devices, their first and last rows included, in no order."""
    return np.array([n - 1, 0, n // 3, n // 3 - 1, n // 2, 7, 2 * n // 3, 2 * n // 3 + 1, n - 2, 1])


def single_sample(state: Bodies, kernel: str, rows, physics=SAMPLE_PHYSICS):
    """One CPU backend's (approx, exact) for `state` (its a(x) evaluated at load: what a step caches)."""
    backend = CPUBackend()
    try:
        backend.load(state, physics, kernel)
        return backend.force_error_sample(rows)
    finally:
        backend.close()


@pytest.mark.parametrize("driver", ["threads", "single"])
@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("kernel", ["cpu-tree", "cpu-fp64", "cpu-simd"])
def test_k_cpu_devices_sample_the_force_error_as_one_cpu_backend(kernel, k, driver):
    """After steps, between frames (the threads driver's threads alive): each row's approx is the cached
    a(x) of the device that owns it, exact the all-pairs sum over all N; both equal one CPU backend's for
    the same state and kernel, bitwise (every row is summed by the same kernel over the same sources; the
    tree gives a span of targets bitwise the rows of the full evaluation), with no new force evaluation."""
    from app.backends import cpu_tree
    from app.backends.cpu_forces import CpuEvaluator

    bodies = make_plummer(2048)
    rows = sample_rows(bodies.n)
    backend = multi_backend_class(CPUBackend, k, driver)()
    try:
        backend.load(bodies, SAMPLE_PHYSICS, kernel)
        if kernel == "cpu-tree":  # a build every evaluation and a geometric opening test (no history), as
            backend.set_tunables(rebuild_every=1, opening="cube")  # the one-backend sample's fresh evaluation
        backend.step(3)
        assert len({s.start for s in backend.shares() for r in rows if s.start <= r < s.stop}) == k
        evaluations = []
        with pytest.MonkeyPatch.context() as mp:  # no force evaluation: the leapfrog's a(x) is cached
            for cls in (cpu_tree.CpuTreeEvaluator, CpuEvaluator):
                mp.setattr(
                    cls,
                    "evaluate",
                    lambda self, *a, real=cls.evaluate: evaluations.append(1) or real(self, *a),
                )
            approx, exact = backend.force_error_sample(rows)
        assert not evaluations
        state = backend.state()
    finally:
        backend.close()
    assert approx.dtype == exact.dtype == np.float64 and approx.shape == exact.shape == (rows.size, 3)
    want_approx, want_exact = single_sample(state, kernel, rows)
    assert np.array_equal(approx, want_approx) and np.array_equal(exact, want_exact)
    if kernel == "cpu-tree":
        assert 0 < relative_errors(approx, exact).max() < 5e-3  # the tree's own error against all-pairs


@pytest.mark.parametrize("driver", ["threads", "single"])
@pytest.mark.parametrize("integrator", ["leapfrog", "euler-damped"])
def test_sampling_the_force_error_leaves_the_run_as_it_was(integrator, driver):
    """A sample between frames changes nothing: the run goes on bitwise as one never sampled. After an
    euler-damped step the cached a(x) is stale, so the sample evaluates it (as one backend does): the
    next step would have evaluated the same."""
    bodies = make_plummer(1000)
    physics = Physics(softening=0.01, dt=1e-3, integrator=integrator, damping=0.999)
    states = []
    for sample in (True, False):
        backend = multi_backend_class(CPUBackend, 3, driver)()
        try:
            backend.load(bodies, physics, "cpu-fp64")
            backend.step(4)
            if sample:
                approx, _exact = backend.force_error_sample(sample_rows(bodies.n))
                fresh = single_sample(backend.state(), "cpu-fp64", sample_rows(bodies.n), physics)[0]
                assert np.array_equal(approx, fresh)  # a(x) of the current positions, also after euler
            backend.step(4)
            states.append((backend.state(), backend.time))
        finally:
            backend.close()
    (a, ta), (b, tb) = states
    assert np.array_equal(a.pos, b.pos) and np.array_equal(a.vel, b.vel) and ta == tb


def test_rows_outside_the_state_are_refused():
    backend = multi_backend_class(CPUBackend, 2)()
    try:
        backend.load(cloud(), SAMPLE_PHYSICS, "cpu-tree")
        with pytest.raises(IndexError, match=r"rows must lie in \[0, 257\)"):
            backend.force_error_sample(np.array([3, 257]))
    finally:
        backend.close()


def test_cpu_devices_refuse_gpu_exchanges_and_unknown_drivers():
    with pytest.raises(ConfigError, match="--exchange peer: CPU devices share host memory"):
        multi_backend_class(CPUBackend, 2, exchange="peer")
    with pytest.raises(ConfigError, match="--gpu-driver 'many'"):
        multi_backend_class(CPUBackend, 2, driver="many")


# --- the command line -----------------------------------------------------------------------------------
def test_a_snapshot_from_several_devices_keeps_the_bodies_components(tmp_path):
    """The collision's two galaxies: `simulate --gpus 2` writes each body's component as one device does
    (the tree split by domains, its positions bitwise one device's)."""
    common = ["simulate", "collision", "--n", "4096", "--steps", "3", "--kernel", "cpu-tree", *CPU]
    assert main([*common, "--out", str(tmp_path / "one.npz")]) == 0
    assert main([*common, "--gpus", "2", "--out", str(tmp_path / "two.npz")]) == 0
    a, b = np.load(tmp_path / "one.npz"), np.load(tmp_path / "two.npz")
    assert a.files == b.files and "component" in a.files
    assert all(np.array_equal(a[k], b[k]) for k in a.files)


def test_simulate_on_three_cpu_devices_writes_one_devices_trajectory(tmp_path, capsys):
    common = ["simulate", "plummer", "--n", "300", "--steps", "30", "--kernel", "cpu-fp64", *CPU]
    assert main([*common, "--out", str(tmp_path / "one.npz")]) == 0
    assert main([*common, "--gpus", "3", "--gpu-driver", "single", "--out", str(tmp_path / "three.npz")]) == 0
    assert "on 3 CPU devices (single driver, host exchange, split by targets)" in capsys.readouterr().out
    a, b = np.load(tmp_path / "one.npz"), np.load(tmp_path / "three.npz")
    assert all(np.array_equal(a[k], b[k]) for k in a.files)


def test_more_devices_than_exist_is_a_usage_error(tmp_path, capsys):
    rc = main(
        ["simulate", "--n", "64", "--steps", "1", *CPU, "--gpus", "9", "--out", str(tmp_path / "o.npz")]
    )
    one_line_error(capsys, rc, 2, "--gpus 9", "has 8 CPU devices", "at most 8")
    assert not (tmp_path / "o.npz").exists()


def test_bad_gpus_values_are_usage_errors(tmp_path, capsys):
    rc = main(
        ["simulate", "--n", "64", "--steps", "1", *CPU, "--gpus", "zero", "--out", str(tmp_path / "o.npz")]
    )
    one_line_error(capsys, rc, 2, "run.gpus", "'zero'", "or all")


@pytest.mark.skipif(backend_class("cuda").why_not() is None, reason="a GPU is usable here")
def test_gpus_without_a_gpu_names_the_cpu_alternative(tmp_path, capsys):
    rc = main(["simulate", "--n", "64", "--steps", "1", "--gpus", "2", "--out", str(tmp_path / "o.npz")])
    one_line_error(capsys, rc, 2, "--gpus 2: no GPU is usable here", "--backend cpu --gpus N")


# --- bench --gpus ------------------------------------------------------------------------------------------
def test_scaling_rows_compare_each_count_with_the_fewest():
    from app.tools.bench import scaling_rows

    rows = [
        {"kernel": "k", "n": 10, "gpus": 1, "status": "ok", "median_ms": 8.0, "exchange_median_ms": 0.0},
        {"kernel": "k", "n": 10, "gpus": 2, "status": "ok", "median_ms": 4.5, "exchange_median_ms": 0.5},
        {"kernel": "k", "n": 10, "gpus": 4, "status": "failed"},
    ]
    one, two = scaling_rows(rows)
    assert (one["gpus"], one["speedup"], one["efficiency"]) == (1, 1.0, 1.0)
    assert (
        two["step_ms"] == 5.0
        and two["speedup"] == pytest.approx(8 / 5)
        and two["efficiency"] == pytest.approx(8 / 5 / 2)
    )


def test_scaling_rows_never_compare_other_scenes_or_settings():
    """Each series (kernel, scene, N, setting) against its own fewest-device row: a faster scene or θ on
    one count must not stand in for another's (the first two-GPU run's table did exactly that)."""
    from app.tools.bench import scaling_at_budget, scaling_rows

    def row(scene, theta, gpus, ms, p99):
        return {
            "kernel": "tree",
            "scene": scene,
            "n": 10,
            "tunables": {"theta": theta},
            "gpus": gpus,
            "status": "ok",
            "median_ms": ms,
            "exchange_median_ms": 0.0,
            "step_median_ms": ms,
            "error": {"p99": p99, "budget_p99": 1e-3},
        }

    rows = [
        row("a", 0.5, 1, 8.0, 5e-4),
        row("a", 0.9, 1, 2.0, 5e-3),
        row("b", 0.5, 1, 4.0, 5e-4),
        row("a", 0.5, 2, 5.0, 5e-4),
        row("a", 0.9, 2, 1.5, 5e-3),
        row("b", 0.5, 2, 2.0, 5e-4),
    ]
    got = {(r["scene"], r["tunables"]["theta"], r["gpus"]): r["speedup"] for r in scaling_rows(rows)}
    assert got == {
        ("a", 0.5, 1): 1.0,
        ("a", 0.5, 2): 8 / 5,
        ("a", 0.9, 1): 1.0,
        ("a", 0.9, 2): 2 / 1.5,
        ("b", 0.5, 1): 1.0,
        ("b", 0.5, 2): 2.0,
    }
    from app.tools.bench_sweep import fastest_within_budget

    result = {
        "gpu_counts": [1, 2],
        "scaling": scaling_rows(rows),
        "fastest_within_budget": fastest_within_budget(rows),
    }
    kept = {(r["scene"], r["tunables"]["theta"], r["gpus"]) for r in scaling_at_budget(result)}
    assert kept == {("a", 0.5, 1), ("a", 0.5, 2), ("b", 0.5, 1), ("b", 0.5, 2)}  # θ 0.9 is over budget


def test_bench_gpus_plots_step_time_and_speed_up(tmp_path):
    out = tmp_path / "scaling.png"
    rc = main(
        [
            "bench",
            *CPU,
            "--kernels",
            "cpu-simd,cpu-n3l",
            "--n",
            "256,512",
            "--gpus",
            "1,2",
            "--warmup",
            "1",
            "--repeats",
            "1",
            "--no-progress",
            "--plot",
            str(out),
        ]
    )
    assert rc == 0 and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_gpus_writes_rows_per_count_and_scaling_rows(tmp_path, capsys):
    import json

    out = tmp_path / "scaling.json"
    rc = main(
        [
            "bench",
            *CPU,
            "--kernels",
            "cpu-simd",
            "--n",
            "256,512",
            "--gpus",
            "1,2",
            "--warmup",
            "1",
            "--repeats",
            "2",
            "--no-progress",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "cpu-simd ×2" in printed and "speed-up" in printed
    result = json.loads(out.read_text())
    assert result["gpu_counts"] == [1, 2] and result["device"]["devices"] == ["cpu0", "cpu1"]
    rows = {(r["gpus"], r["n"]): r for r in result["results"]}
    assert set(rows) == {(1, 256), (1, 512), (2, 256), (2, 512)}
    assert all(r["status"] == "ok" for r in rows.values())
    assert list(rows[2, 512]["devices_median_ms"]) == ["0 cpu0", "1 cpu1"]
    # each row says how it ran: the kernel's split and the driver `auto` resolved to (none for one device)
    assert {(k, r["split"], r["gpu_driver"]) for (k, _n), r in rows.items()} == {
        (1, "targets", "single"),
        (2, "targets", "threads"),
    }
    for s in result["scaling"]:
        base, this = rows[1, s["n"]], rows[s["gpus"], s["n"]]
        expected = (base["median_ms"] + base["exchange_median_ms"]) / (
            this["median_ms"] + this["exchange_median_ms"]
        )
        assert s["speedup"] == pytest.approx(expected)
        assert s["efficiency"] == pytest.approx(expected / s["gpus"])
    assert len(result["scaling"]) == 4


def test_bench_gpus_names_the_fastest_setting_within_the_budget_per_device_count(tmp_path, capsys):
    import json

    out = tmp_path / "tree-scaling.json"
    rc = main(
        [
            "bench",
            *CPU,
            "--kernels",
            "cpu-tree",
            "--n",
            "2048",
            "--gpus",
            "1,2",
            "--warmup",
            "1",
            "--repeats",
            "1",
            "--tunable",
            "theta=0.3,0.9",
            "--error-sample",
            "256",
            "--no-progress",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    result = json.loads(out.read_text())
    entries = {e["gpus"]: e for e in result["fastest_within_budget"]}
    assert set(entries) == {1, 2} and all(e["settings"] == 2 for e in entries.values())
    for k, e in entries.items():  # each count judged on its own rows
        own = [r for r in result["results"] if r["gpus"] == k and r["error"]["p99"] <= e["budget_p99"]]
        fastest = min(own, key=lambda r: r["step_median_ms"])
        assert e["tunables"] == fastest["tunables"] and e["step_median_ms"] == fastest["step_median_ms"]
    printed = capsys.readouterr().out
    assert "cpu-tree · plummer · N = 2,048 · 1 GPU(s): fastest" in printed
    assert "N = 2,048 · 2 GPU(s)" in printed
    assert {(r["split"], r["gpu_driver"]) for r in result["results"]} == {("domains", "single")}


def test_mpi_ranks_refuse_gpus():
    from app.commands.assembly import make_rank_run
    from app.scene import load_scene

    with pytest.raises(ConfigError, match="--gpus 2: under mpiexec each rank takes one GPU"):
        make_rank_run(None, load_scene("plummer", {"run.gpus": "2", "run.backend": "cpu"}))


def test_the_auto_driver_is_the_kernels_split_choice_and_follows_a_kernel_switch():
    """`--gpu-driver auto` (the default): one thread taking the devices' phases in turns for the tree's
    domain split, a thread per device for the all-pairs splits; a kernel switch in the panel re-resolves it,
    and the device line says which runs."""
    from app.backends.multi import devices_line

    cls = multi_backend_class(CPUBackend, 2)
    assert cls.driver == "auto"
    backend = cls()
    try:
        backend.load(cloud(), Physics(softening=0.02), "cpu-tree")
        assert backend.driver_name == "single" and backend.device_info()["gpu_driver"] == "single"
        assert "(single driver," in devices_line(backend)
        backend.set_kernel("cpu-fp64")
        assert backend.driver_name == "threads" and "split by targets" in devices_line(backend)
    finally:
        backend.close()
    forced = multi_backend_class(CPUBackend, 2, "threads")()
    try:
        forced.load(cloud(), Physics(softening=0.02), "cpu-tree")
        assert forced.driver_name == "threads"
    finally:
        forced.close()


@pytest.mark.parametrize("k", [1, 2, 3])
def test_the_bodies_keep_their_identity_across_re_sorts_and_a_kernel_switch(k):
    """The tree's domain split keeps the state in key order, re-sorted at every evaluation: what leaves
    the backend (state, the renderer's arrays, accelerations, a force error sample by body) is in load
    order, bitwise one CPU backend's, also after a switch to an all-pairs kernel (which keeps the rows as
    they are) and back."""
    bodies, physics = cloud(1201, seed=9), Physics(softening=0.02, dt=2e-3)
    rows = np.array([0, 5, 600, 1200, 77])
    seen = {}
    for name, backend in (("one", CPUBackend()), ("k", multi_backend_class(CPUBackend, k)())):
        try:
            backend.load(bodies, physics, "cpu-tree")
            backend.step(4)
            out = {
                "state": backend.state(),
                "render": [np.array(a) for a in backend.host_render_arrays()],
                "sample": backend.force_error_sample(rows),
            }
            if name == "k":
                ids = backend._run.ids
                assert ids is not None and not np.array_equal(ids, np.arange(bodies.n))  # really re-sorted
            backend.set_kernel("cpu-fp64")
            backend.step(3)
            backend.set_kernel("cpu-tree")
            backend.step(2)
            out["after"], out["acc"] = backend.state(), backend.accelerations()
            seen[name] = out
        finally:
            backend.close()
    one, several = seen["one"], seen["k"]
    for key in ("state", "after"):
        a, b = one[key], several[key]
        assert np.array_equal(a.pos, b.pos) and np.array_equal(a.vel, b.vel)
        assert np.array_equal(a.mass, b.mass)
    assert all(np.array_equal(x, y) for x, y in zip(one["render"], several["render"], strict=True))
    assert all(np.array_equal(x, y) for x, y in zip(one["sample"], several["sample"], strict=True))
    assert np.array_equal(one["acc"], several["acc"])
