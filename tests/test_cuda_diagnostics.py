"""CudaBackend.diagnostics(): energies and momenta reduced on the device (kernels/diagnostics.cu).

GPU tests (marked `gpu`, skipped with the backend's why_not) compare against the float64 reference
`app.model.physics.diagnostics` of `backend.state()`, with the masses rounded to float32 as the device holds
them in pos.w: energies within 1e-6 relative, momenta within 1e-6 of their scales (Σ m|v|, Σ m|r||v|).
Above 4,097 bodies the reference potential is app.ui.energy.potential_energy, the same float64 pair sum
in numba (test_panel pins it to app.model.physics.potential_energy at 1e-12): numpy's takes ~10 s at 16k.

The CPU tests (no mark) check the launch geometry, the result layout and the kernel's constants.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import gl_vbo, needs_nvcc

from app.backends import backend_class
from app.backends.cuda import diagnostics as dg
from app.backends.cuda.compile import compile_file
from app.core.paths import KERNELS
from app.model.bodies import Bodies
from app.model.physics import (
    Diagnostics,
    Physics,
    angular_momentum,
    diagnostics,
    kinetic_energy,
    linear_momentum,
    momentum_scale,
    potential_energy,
)
from app.tools.bench import bench_bodies
from app.ui.energy import potential_energy as numba_potential

CUDA = backend_class("cuda")


_gpu = pytest.mark.gpu  # (skipped where CUDA cannot run: tests/conftest.py)


NS = (1, 2, 31, 4097, 16384)
# (model, softening, H)
CONFIGS = {
    "gravity-soft": ("gravity", 0.01, 0.0),
    "gravity-eps0": ("gravity", 0.0, 0.0),
    "repulsion-soft": ("gravity-repulsion", 0.01, 1e-4),
    "repulsion-eps0": ("gravity-repulsion", 0.0, 1e-4),
}
REL = 1e-6


def physics_for(config: str, **kw) -> Physics:
    model, eps, h = CONFIGS[config]
    return Physics(G=1.0, softening=eps, model=model, repulsion=h, **kw)


# --- CPU: geometry and layout ----------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 255, 256, 257, 4097, 16384, 65536, 1_000_000])
def test_potential_plan_covers_each_tile_pair_once(n):
    tiles, chunk_tiles, chunks = dg.potential_plan(n)
    assert tiles == -(-n // dg.BLOCK) and 1 <= chunks <= dg.MAX_CHUNKS
    assert (chunks - 1) * chunk_tiles < tiles <= chunks * chunk_tiles
    if tiles <= 512:
        pairs = dg.tile_pairs(tiles, chunk_tiles, chunks)
        assert len(pairs) == len(set(pairs)) == tiles * (tiles + 1) // 2
        assert all(ti <= tj < tiles for ti, tj in pairs)


@pytest.mark.parametrize("n", [4097, 65536, 1_000_000])
@pytest.mark.parametrize("pairs", [1, 1 << 22, 1 << 30, None])
def test_potential_slices_cut_the_i_tiles_in_order(n, pairs):
    """Contiguous i-tile ranges covering the grid once; each but the last reaches `pairs` pair terms and
    would not without its last tile (the least that does)."""
    tiles = dg.potential_plan(n)[0]
    cuts = dg.potential_slices(n, pairs)
    assert cuts[0][0] == 0 and cuts[-1][1] == tiles
    assert all(a[1] == b[0] for a, b in zip(cuts, cuts[1:], strict=False)) and all(t0 < t1 for t0, t1 in cuts)

    def held(t0, t1):  # pair terms of i-tiles t0 .. t1 - 1 (the upper triangle, tile granularity)
        return sum((tiles - t) * dg.BLOCK**2 for t in range(t0, t1))

    if pairs is None:
        assert cuts == [(0, tiles)]
        return
    for t0, t1 in cuts[:-1]:
        assert held(t0, t1) >= pairs and (t1 - t0 == 1 or held(t0, t1 - 1) < pairs)


def test_a_live_slice_is_a_few_percent_of_a_tree_step():
    """N x 1,024 pairs, not below 2^30: 16M and 1M bodies take ~N / 2,048 slices, a frame each; a 4k body
    sample is one launch."""
    assert dg.potential_slices(4097, dg.live_slice_pairs(4097)) == [(0, 17)]
    for n in (1 << 20, 1 << 24):
        cuts = dg.potential_slices(n, dg.live_slice_pairs(n))
        assert n / 2048 * 0.85 < len(cuts) < n / 2048 * 1.05


def test_a_live_sample_leaves_the_potential_out_past_4m_bodies():
    assert dg.live_potential(1 << 22) and not dg.live_potential(5 << 20)  # 1,880 and 2,350 slices


def test_the_monitor_shows_why_a_sample_has_no_energy():
    from contextlib import nullcontext

    from app.ui.energy import EnergyMonitor

    values = np.arange(dg.RESULTS, dtype=np.float64) + 1.0
    note = "N = 16,777,216: the live energy drift is off"

    class Stub:
        physics, synchronised, reduces_diagnostics = Physics(), True, True

        def diagnostics_async(self):
            event = _Event()
            event.ready = True
            return dg.PendingDiagnostics(nullcontext(), event, values, 0.0, note=note)

    mon = EnergyMonitor(every=1)
    mon.tick(Stub())
    mon.tick(Stub())
    assert mon.note == note and mon.samples[-1].energy is None and mon.samples[-1].e_total is None
    assert mon.samples[-1].momentum == 0.0  # the momenta are still judged


def _stand_in_backend(n: int, log: list):
    """A backend and device whose kernels and copies only say, into `log`, what was launched as (what,
    grid, arguments): the launch sequence of dg.launch_diagnostics, on a machine without CUDA."""
    from contextlib import contextmanager, nullcontext
    from types import SimpleNamespace

    class Kernel:
        def __init__(self, name):
            self.name = name

        def prepared_call(self, grid, block, *args):
            log.append((self.name, grid, args))

    @contextmanager
    def state_arrays():
        yield "fp32", 1000, 2000  # (precision, pos, vel): pointers stand in as numbers

    drv = SimpleNamespace(
        memcpy_dtod=lambda dst, src, nbytes: log.append(("copy positions", None, (dst, src, nbytes))),
        memcpy_dtoh_async=lambda host, src: log.append(("read back", None, ())),
        Event=_Event,
    )
    device = SimpleNamespace(
        facts=SimpleNamespace(sms=132),
        scope=nullcontext(),
        drv=drv,
        pinned=lambda name, count, dtype: np.zeros(count, dtype),
        function=lambda source, symbol, types: Kernel(symbol.split("_")[1]),  # moments, potential, finalize
        scratch=lambda name, nbytes: {"diagnostics": 10_000, "diagnostics-pos": 50_000}[name],
    )
    return SimpleNamespace(
        device=device, n=n, time=0.5, physics=physics_for("gravity-soft"), diag_pending=None,
        state_arrays=state_arrays,
    )  # fmt: skip


def test_launches_queue_the_first_slice_now_and_each_later_one_per_done():
    n = 16384
    tiles, _, chunks = dg.potential_plan(n)
    cuts = dg.potential_slices(n, 1 << 23)
    assert len(cuts) > 3
    for pairs, expect in ((None, [(0, tiles)]), (1 << 23, cuts)):
        log: list = []
        pending = dg.launch_diagnostics(_stand_in_backend(n, log), slice_pairs=pairs)
        names = [entry[0] for entry in log]
        if pairs is None:  # one launch: everything queued at once, on the state itself
            assert names == ["moments", "potential", "finalize", "read back"] and pending.rest == []
        else:  # the positions copied once, the first slice now, one more per done() that finds the GPU there
            assert names == ["moments", "copy positions", "potential"] and len(pending.rest) == len(cuts)
            pending.event.ready = True
            while not pending.done():
                pass
            names = [entry[0] for entry in log]
            assert names == ["moments", "copy positions", *["potential"] * len(cuts), "finalize", "read back"]
        slices = [(args[6], args[6] + grid[0]) for name, grid, args in log if name == "potential"]
        assert slices == expect and all(grid[1] == chunks for name, grid, _ in log if name == "potential")
        source = {args[0] for name, _, args in log if name == "potential"}
        assert source == ({1000} if pairs is None else {50_000})  # the state, or its copy
        assert [args[-2] for name, _, args in log if name == "finalize"] == [tiles * chunks]


def test_past_the_live_slices_only_the_momenta_are_launched(monkeypatch):
    monkeypatch.setattr(dg, "LIVE_MAX_SLICES", 2)
    log: list = []
    pending = dg.launch_diagnostics(_stand_in_backend(16384, log), slice_pairs=1 << 23)
    assert [entry[0] for entry in log] == ["moments", "finalize", "read back"] and pending.rest == []
    assert [args[-2] for name, _, args in log if name == "finalize"] == [0] and pending.note


class _Event:
    """A pycuda Event stand-in: `query()` answers what the test sets; record() counts; `time_till` gives
    `ms` (what the test sets) from this event to any other."""

    def __init__(self):
        self.ready, self.records, self.waits, self.ms = False, 0, 0, 0.0

    def query(self):
        return self.ready

    def record(self):
        self.records += 1

    def synchronize(self):
        self.waits += 1

    def time_till(self, other):
        return self.ms


def test_pending_queues_one_slice_per_done_that_finds_the_gpu_through():
    from contextlib import nullcontext

    queued: list[int] = []
    event = _Event()

    def launches():  # two later slices and the finish
        return [lambda k=k: queued.append(k) for k in range(3)]

    host = np.zeros(dg.RESULTS)
    pending = dg.PendingDiagnostics(nullcontext(), event, host, 1.5, rest=launches(), slices=3)
    assert pending.progress == pytest.approx(1 / 4)
    assert not pending.done() and queued == []  # the GPU is not through the first slice yet
    event.ready = True
    assert not pending.done() and queued == [0] and event.records == 1
    assert not pending.done() and queued == [0, 1]
    assert not pending.done() and queued == [0, 1, 2] and pending.progress == 1.0
    assert pending.done()
    other = dg.PendingDiagnostics(nullcontext(), _Event(), host + 1.0, 2.0, rest=launches(), slices=3)
    assert other.result().kinetic == 1.0 and queued == [0, 1, 2, 0, 1, 2]  # settle queues the rest, waits
    assert other.event.waits == 1 and other.done()


def test_a_live_sample_s_slices_are_paced_to_a_share_of_the_gpu():
    """A slice that took 2 ms of GPU time: the next one goes once 2 / LIVE_GPU_SHARE ms of wall time passed
    since the GPU was found through it (at 5%, 38 ms later), not at the next frame's done()."""
    from contextlib import nullcontext

    queued: list[int] = []
    now = [100.0]
    event, started = _Event(), _Event()
    started.ms = 2.0
    pending = dg.PendingDiagnostics(
        nullcontext(), event, np.zeros(dg.RESULTS), 0.0, slices=3, started=started, share=dg.LIVE_GPU_SHARE,
        clock=lambda: now[0], rest=[lambda k=k: queued.append(k) for k in range(3)],
    )  # fmt: skip
    event.ready = True
    pause = 2e-3 * (1 / dg.LIVE_GPU_SHARE - 1)
    assert dg.LIVE_GPU_SHARE == 0.05 and pause == pytest.approx(0.038)
    assert not pending.done() and queued == []  # through the first slice: the pause starts now
    now[0] += 0.9 * pause
    assert not pending.done() and queued == []
    now[0] += 0.1 * pause
    assert not pending.done() and queued == [0] and started.records == 1  # the next slice, timed
    assert not pending.done() and queued == [0]  # its own pause
    now[0] += pause
    assert not pending.done() and queued == [0, 1]
    assert pending.result() is not None and queued == [0, 1, 2]  # settle queues the rest without pacing


def _emulated_potential(pos, mass, physics: Physics, block: int) -> float:
    """The kernel's sum order in numpy: the plan's (i-tile, j-tile) blocks, j > i in diagonal tiles."""
    n = len(mass)
    tiles = -(-n // block)
    chunk_tiles = max(1, -(-tiles // dg.MAX_CHUNKS))
    eps2, g, h = physics.softening**2, physics.G, physics.h
    total = 0.0
    for ti, tj in dg.tile_pairs(tiles, chunk_tiles, -(-tiles // chunk_tiles)):
        i = np.arange(ti * block, min((ti + 1) * block, n))
        j = np.arange(tj * block, min((tj + 1) * block, n))
        if i.size == 0 or j.size == 0:
            continue
        s2 = ((pos[j][None, :, :] - pos[i][:, None, :]) ** 2).sum(-1) + eps2
        keep = j[None, :] > i[:, None]
        s = np.sqrt(np.where(keep, s2, 1.0))
        pair = np.where(keep, mass[j][None, :] * (-g / s + h / (3 * s**3)), 0.0)
        total += float(np.sum(mass[i][:, None] * pair))
    return total


@pytest.mark.parametrize("n", [1, 2, 31, 300])
@pytest.mark.parametrize("config", ["gravity-soft", "repulsion-eps0"])
def test_tile_order_is_the_pair_sum(n, config):
    b = bench_bodies(n)
    phys = physics_for(config)
    emulated = _emulated_potential(b.pos, b.mass, phys, block=16)  # small tiles: many diagonal/edge cases
    assert emulated == pytest.approx(potential_energy(b.pos, b.mass, phys), rel=1e-12, abs=1e-300)


def test_results_layout():
    out = np.arange(dg.RESULTS, dtype=np.float64) + 1.0
    d = dg.from_results(out, 2.5)
    assert isinstance(d, Diagnostics)
    assert d.time == 2.5 and d.kinetic == 1.0 and d.momentum == (2.0, 3.0, 4.0)
    assert d.angular_momentum == (5.0, 6.0, 7.0) and d.momentum_scale == 8.0 and d.angular_scale == 9.0
    assert d.potential == 10.0 and d.energy == 11.0
    assert dg.potential_symbol("f32", True, False) == "diag_potential_f32_repulsion_plain"


def test_kernel_constants_match_the_host():
    text = (KERNELS / dg.SOURCE).read_text()
    defines = dict(re.findall(r"^#define (DIAG_\w+) (\d+)", text, re.M))
    assert int(defines["DIAG_BLOCK"]) == dg.BLOCK
    assert int(defines["DIAG_MOMENTS"]) == dg.MOMENTS
    assert int(defines["DIAG_RESULTS"]) == dg.RESULTS


@needs_nvcc
def test_every_symbol_the_host_launches_exists(tmp_path, monkeypatch):
    monkeypatch.setenv("NBODY_CACHE_DIR", str(tmp_path))
    module = compile_file(KERNELS / dg.SOURCE, "sm_90")
    wanted = {"diag_finalize"} | {f"diag_moments_{p}" for p in ("f32", "f64")}
    wanted |= {
        dg.potential_symbol(p, r, s) for p in ("f32", "f64") for r in (False, True) for s in (False, True)
    }
    assert wanted <= set(module.functions), sorted(wanted - set(module.functions))
    assert not module.problems()


def test_energy_monitor_uses_device_diagnostics_and_angular_scale():
    from app.ui.energy import EnergyMonitor

    class Stub:
        physics = Physics()
        calls = 0
        synchronised, reduces_diagnostics = True, True  # (as a Backend's)

        def diagnostics_async(self):  # (Backend's default: no asynchronous form)
            return None

        def diagnostics(self):
            self.calls += 1
            lz = 1.0 + 1e-3 * (self.calls - 1)
            return dg.DeviceDiagnostics(
                time=0.0,
                kinetic=1.0,
                potential=-2.0,
                momentum=(0.0, 0.0, 0.0),
                angular_momentum=(0.0, 0.0, lz),
                momentum_scale=100.0,
                angular_scale=10.0,
            )

        def state(self):
            raise AssertionError("the device path must not read the state back")

    stub = Stub()
    mon = EnergyMonitor(every=1)
    mon.tick(stub)
    mon.tick(stub)
    assert mon.source == "device diagnostics()"
    assert mon.samples[-1].angular == pytest.approx(1e-3 / 10.0)  # judged against Σ m|r||v|


# --- GPU --------------------------------------------------------------------------------------------------
@pytest.fixture
def backend():
    b = CUDA()
    yield b
    b.close()


def reference(state: Bodies, physics: Physics, fp32_mass: bool = True) -> tuple[Diagnostics, float]:
    """(float64 diagnostics, Σ m|r||v|) of a host state."""
    mass = state.mass.astype(np.float32).astype(np.float64) if fp32_mass else state.mass
    b = Bodies(pos=state.pos, vel=state.vel, mass=mass, time=state.time)
    if b.n <= 4097:
        ref = diagnostics(b, physics)
    else:  # app.model.physics for the O(N) parts, the same float64 pair sum in numba for the O(N²) one
        ref = Diagnostics(
            time=b.time,
            kinetic=kinetic_energy(b.vel, b.mass),
            potential=numba_potential(b.pos, b.mass, physics, parallel=True),
            momentum=tuple(linear_momentum(b.vel, b.mass)),
            angular_momentum=tuple(angular_momentum(b.pos, b.vel, b.mass)),
            momentum_scale=momentum_scale(b.vel, b.mass),
        )
    lscale = float(np.sum(b.mass * np.linalg.norm(b.pos, axis=1) * np.linalg.norm(b.vel, axis=1)))
    return ref, lscale


def assert_close(d, ref: Diagnostics, lscale: float, rel: float = REL) -> None:
    def near(a, b, what):
        err = abs(a - b) / abs(b)
        assert err <= rel, f"{what}: device {a!r} vs float64 {b!r} (relative error {err:.3g})"

    assert d.time == pytest.approx(ref.time)
    if ref.kinetic:
        near(d.kinetic, ref.kinetic, "kinetic")
    else:
        assert d.kinetic == 0.0
    if ref.potential:
        near(d.potential, ref.potential, "potential")
    else:
        assert d.potential == 0.0
    if ref.momentum_scale:
        near(d.momentum_scale, ref.momentum_scale, "momentum_scale")
    if lscale:
        near(d.angular_scale, lscale, "angular_scale")
    pscale = max(ref.momentum_scale, 1e-300)
    assert np.max(np.abs(np.subtract(d.momentum, ref.momentum))) <= rel * pscale, (d.momentum, ref.momentum)
    lref = max(lscale, 1e-300)
    assert np.max(np.abs(np.subtract(d.angular_momentum, ref.angular_momentum))) <= rel * lref, (
        d.angular_momentum,
        ref.angular_momentum,
    )


@_gpu
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("n", NS)
def test_matches_float64_reference(backend, n, config):
    phys = physics_for(config)
    backend.load(bench_bodies(n), phys, kernel="shared")
    d = backend.diagnostics()
    assert isinstance(d, Diagnostics) and isinstance(d, dg.DeviceDiagnostics)
    assert_close(d, *reference(backend.state(), phys))


@_gpu
@pytest.mark.parametrize("integrator", ["leapfrog", "euler-damped"])
def test_after_steps_and_deterministic(backend, integrator):
    phys = physics_for("gravity-soft", integrator=integrator, dt=1e-3, damping=0.999)
    backend.load(bench_bodies(4097), phys, kernel="shared")
    backend.step(10)
    first, second = backend.diagnostics(), backend.diagnostics()
    assert first == second  # fixed reduction order: bitwise reproducible
    assert first.time == pytest.approx(10e-3)
    assert_close(first, *reference(backend.state(), phys))


@_gpu
def test_async_launches_keep_their_own_values(backend):
    """A second launch reuses the pinned buffer only after the first handle has kept its values."""
    backend.load(bench_bodies(4097), physics_for("gravity-soft"), kernel="shared")
    now = backend.diagnostics()
    first = backend.diagnostics_async()
    backend.step(20)
    second = backend.diagnostics_async()
    later = second.result()
    assert first.result() == now  # deterministic reduction of the same state
    assert later.time > now.time and later.kinetic != now.kinetic
    assert first.done() and second.done()


@_gpu
def test_a_sliced_sample_is_the_one_launch_sum_of_its_own_state(backend):
    """A live sample's potential in slices, one queued per done(), with steps taken between them: the same
    ten doubles, bit for bit, as one launch on the state it started from (the slices read its copy)."""
    backend.load(bench_bodies(16384), physics_for("gravity-soft", dt=1e-3), kernel="shared")
    backend.step(2)
    whole = dg.launch_diagnostics(backend).result()
    pending = dg.launch_diagnostics(backend, slice_pairs=1 << 23)
    assert pending.slices > 10
    polls = 0
    while not pending.done():
        backend.step(1)  # the state moves on while the slices run
        polls += 1
    assert polls >= pending.slices  # a slice a poll, then the finish
    assert pending.result() == whole
    assert backend.time > whole.time


@_gpu
def test_past_the_live_slices_a_sample_has_the_momenta_and_no_potential(backend, monkeypatch):
    backend.load(bench_bodies(16384), physics_for("gravity-soft"), kernel="shared")
    whole = dg.launch_diagnostics(backend).result()
    monkeypatch.setattr(dg, "LIVE_MAX_SLICES", 4)
    pending = dg.launch_diagnostics(backend, slice_pairs=1 << 23)
    assert pending.note and pending.slices == 0 and pending.progress == 1.0  # all queued at once
    d = pending.result()
    assert np.isnan(d.potential) and d.kinetic == whole.kinetic and d.momentum == whole.momentum


@_gpu
def test_reload_other_n_on_one_backend(backend):
    plan = ((4097, "repulsion-soft"), (31, "gravity-eps0"), (16384, "gravity-soft"), (2, "gravity-soft"))
    for n, config in plan:
        phys = physics_for(config)
        backend.load(bench_bodies(n), phys)
        assert_close(backend.diagnostics(), *reference(backend.state(), phys))
    phys = physics_for("repulsion-eps0")
    backend.set_physics(phys)  # the potential follows the current physics
    assert_close(backend.diagnostics(), *reference(backend.state(), phys))


@_gpu
def test_fp64_kernel_reduces_the_double_state(backend):
    if "fp64" not in [r.name for r in CUDA.kernels()]:
        pytest.skip("no fp64 kernel record")
    phys = physics_for("repulsion-soft", integrator="leapfrog", dt=1e-3)
    backend.load(bench_bodies(4097), phys, kernel="fp64")
    backend.step(5)
    d = backend.diagnostics()
    # state() is the double state here, exact masses: only the double rounding of the sums is left
    assert_close(d, *reference(backend.state(), phys, fp32_mass=False), rel=1e-11)


@_gpu
def test_energy_monitor_on_the_device(backend):
    from app.ui.energy import EnergyMonitor

    phys = physics_for("gravity-soft")
    backend.load(bench_bodies(4097), phys)
    mon = EnergyMonitor(every=1)
    mon.tick(backend)
    assert not mon.samples  # launched, not waited for: a later tick collects it
    backend.step(5)
    mon.tick(backend)  # collects the first (step() waited for the GPU), launches the second
    assert len(mon.samples) == 1
    mon.wait()
    assert mon.source == "device diagnostics()" and len(mon.samples) == 2
    assert mon.samples[0].energy == 0.0 and 0.0 <= mon.samples[1].energy < 1e-3


# --- with CUDA-GL interop (positions in the mapped VBO) -----------------------------------------------------
@_gpu
@pytest.mark.gl
def test_with_interop(egl_canvas, backend):
    n = 4097
    phys = physics_for("repulsion-soft")
    backend.load(bench_bodies(n), phys)
    pos_vbo, pos_name = gl_vbo(egl_canvas, np.zeros((n, 4), np.float32))
    speed_vbo, speed_name = gl_vbo(egl_canvas, np.zeros((n, 1), np.float32))
    assert backend.attach_gl_buffers(pos_name, speed_name), backend.data_path
    backend.step(3)
    d = backend.diagnostics()
    assert backend.gl_buffers.is_mapped is False  # mapped for the launches only
    assert_close(d, *reference(backend.state(), phys))
    backend.detach_gl_buffers()
    del pos_vbo, speed_vbo
