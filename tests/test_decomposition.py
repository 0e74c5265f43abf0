"""The work split each force method declares (app/parallel/decomposition.py), over K CPU "devices" (CI's twin
of K GPUs; MPI ranks: tests/test_mpi.py).

- targets (cpu-simd, cpu-fp64): tests/test_multidevice.py;
- domains (cpu-tree): K = 1, 2, 3 devices, both drivers, every device building the whole tree and walking
  its key range: accelerations and a 20-step trajectory bitwise one CPU backend's, the work counted over
  the devices one device's;
- pairs (cpu-n3l): each device a slice of the pair tiles, the partials reduce-scattered onto the shares:
  float64 accelerations within 1e-13 of one device's (another summation order), N^2 interactions counted
  once;
- a broken exchange or a wrong split fails those checks (the controls at the end);
- the pair tiles' counts and slices, and the domain cuts, as pure functions.
"""

from __future__ import annotations

import numpy as np
import pytest

from app.backends.cpu import CPUBackend
from app.backends.cpu_multi import cpu_devices
from app.backends.cpu_tree import key_order
from app.engine.forces import Span
from app.model.bodies import Bodies
from app.model.physics import Physics
from app.parallel.decomposition import (
    DECOMPOSITIONS,
    DOMAINS,
    PAIRS,
    TARGETS,
    PairTiles,
    align_cuts,
    of,
    share_cuts,
)
from app.parallel.multidevice import DRIVERS, HostExchange, MultiDeviceRun

N = 1501  # uneven shares and a last, partial tile for every K below
PHYSICS = Physics(softening=0.02, dt=2e-3)


def cloud(n: int = N, seed: int = 5) -> Bodies:
    rng = np.random.default_rng(seed)
    return Bodies.from_arrays(
        rng.normal(size=(n, 3)), rng.normal(scale=0.3, size=(n, 3)), rng.uniform(0.5, 1.5, n) / n
    )


def one_device(kernel: str, steps: int):
    backend = CPUBackend()
    try:
        backend.load(cloud(), PHYSICS, kernel)
        acc = backend.accelerations()
        timings = backend.step(steps)
        state = backend.state()
    finally:
        backend.close()
    return acc, state, timings


def k_devices(kernel: str, k: int, driver: str, steps: int):
    run = MultiDeviceRun(cpu_devices, k, driver)
    try:
        run.load(cloud(), PHYSICS, kernel)
        acc = run.accelerations()
        work = run.step(steps)
        pos, vel = (run.in_body_order(run.gathered(f)[:, :3]) for f in ("pos", "vel"))  # load order
        run.copies = [whole_copy(d) for d in run.devices]
        run.ids_at_close = None if run.ids is None else run.ids.copy()
        run.since_build_at_close = getattr(run.devices[0].evaluator, "since_build", None)
        return acc, pos.astype(np.float64), vel, work, run
    finally:
        run.close()


def whole_copy(device) -> dict[str, np.ndarray]:
    """Every row of a device's own pos, vel and acc, in load order (its `ids`): under a domain split every
    device integrates every row, so each copy must be the whole answer."""
    out = {}
    for field in ("pos", "vel", "acc"):
        rows = getattr(device, field)[:, :3]
        out[field] = np.empty_like(rows)
        out[field][device.ids] = rows
    return out


# --- which records split how -----------------------------------------------------------------------------
def test_every_cpu_record_declares_a_split_the_driver_knows():
    names = {rec.name: of(rec) for rec in CPUBackend.kernels()}
    assert names == {"cpu-simd": TARGETS, "cpu-fp64": TARGETS, "cpu-tree": DOMAINS, "cpu-n3l": PAIRS}
    for split in DECOMPOSITIONS:  # the package's splits, each described
        assert split.name and split.doc and split.exchanges
    assert len({split.name for split in DECOMPOSITIONS}) == len(DECOMPOSITIONS)


def test_every_record_names_a_split_of_the_package():
    from app.backends.cuda import registry

    for rec in (*CPUBackend.kernels(), *registry.RECORDS):
        assert of(rec) in DECOMPOSITIONS, rec.name


# --- domains: the tree --------------------------------------------------------------------------------------
@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("k", [1, 2, 3])
def test_tree_domains_are_bitwise_one_device(k, driver):
    """16 steps at the tree's defaults (refits, up to 16 evaluations a build): a(x) and the trajectory of
    K devices are one device's, bitwise; the 16th evaluation built, so the rows are in its key order."""
    steps = 16
    acc, pos, vel, work, run = k_devices("cpu-tree", k, driver, steps)
    assert run.decomposition is DOMAINS
    want_acc, want, timings = one_device("cpu-tree", steps)
    assert np.array_equal(acc, want_acc)
    assert np.array_equal(pos, want.pos) and np.array_equal(vel, want.vel.astype(vel.dtype))
    for copy in run.copies:  # every device integrates every row: each copy is the whole answer
        assert np.array_equal(copy["pos"], want.pos)
        assert np.array_equal(copy["vel"], want.vel.astype(vel.dtype))
    # the state itself follows the tree (app/parallel/multidevice.py "key order"): after a build its rows are
    # the bodies in the Morton order of their positions, each body once (a refit keeps the build's order)
    assert run.since_build_at_close == 0
    ids = run.ids_at_close
    assert ids is not None and np.array_equal(np.sort(ids), np.arange(N))
    order = key_order(want.pos[ids])[0]  # the rows' positions are in key order already
    assert np.array_equal(order, np.arange(N)) and not np.array_equal(ids, np.arange(N))
    # the work of K key ranges is the work of one device: nothing counted twice
    assert work.interactions == timings.interactions and work.pair_equivalent == steps * N * N


def test_every_device_of_a_domain_split_integrates_every_body():
    """No positions move between devices: each drifts every body itself, from the same accelerations."""
    run = MultiDeviceRun(cpu_devices, 3, "threads")
    try:
        run.load(cloud(), PHYSICS, "cpu-tree")
        run.step(5)
        assert run.ops.exchange_count == 5
        copies = [d.pos for d in run.devices]
        assert all(np.array_equal(c, copies[0]) for c in copies[1:])
        cuts = run.devices[0].domain_cuts
        assert cuts[0] == 0 and cuts[-1] == N and all(d.domain_cuts == cuts for d in run.devices)
        assert all(a < b for a, b in zip(cuts, cuts[1:], strict=False))
    finally:
        run.close()


# --- pairs: Newton's third law ------------------------------------------------------------------------------
@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize("k", [1, 2, 3])
def test_pair_slices_sum_to_one_device_within_rounding(k, driver):
    acc, pos, vel, work, run = k_devices("cpu-n3l", k, driver, 20)
    assert run.decomposition is PAIRS
    want_acc, want, _timings = one_device("cpu-n3l", 20)
    assert np.abs(acc - want_acc).max() <= 1e-13 * np.abs(want_acc).max()
    assert np.abs(pos - want.pos).max() <= 1e-12 * np.abs(want.pos).max()
    assert work.interactions == 20 * N * N and work.pair_equivalent == 20 * N * N


def test_cpu_n3l_agrees_with_the_float64_all_pairs_kernel():
    b = cloud(257)
    got, want = CPUBackend(), CPUBackend()
    got.load(b, PHYSICS, "cpu-n3l")
    want.load(b, PHYSICS, "cpu-fp64")
    a, w = got.accelerations(), want.accelerations()
    assert np.abs(a - w).max() <= 1e-13 * np.abs(w).max()


# --- the controls: a broken exchange or a wrong split must fail ---------------------------------------------
def test_a_domain_exchange_that_skips_a_range_is_caught(monkeypatch):
    def skip_the_last(self, devices):
        *kept, _lost = devices  # the last device's key range never reaches the others
        cuts = devices[0].domain_cuts
        ranges = [Span(a, b - a) for a, b in zip(cuts, cuts[1:], strict=False)]
        for owner, span in zip(kept, ranges, strict=False):
            for other in devices:
                if other is not owner:
                    other.set_rows("sacc", span, owner.rows("sacc", span))

    monkeypatch.setattr(HostExchange, "gather_sorted", skip_the_last)
    # each share's rows come from their owner, who walked (about) them itself; but every device integrates
    # every row, and device 0's copy of the last range is stale
    *_, run = k_devices("cpu-tree", 2, "single", 0)
    want_acc, _want, _t = one_device("cpu-tree", 0)
    assert np.array_equal(run.copies[1]["acc"], want_acc)
    assert not np.array_equal(run.copies[0]["acc"], want_acc)


def test_a_domain_split_where_every_device_walks_the_first_range_is_caught(monkeypatch):
    """The wrong split: each device walks key range 0 whatever its index, so the other ranges are never
    computed; the exchange copies what each device says is its range, and the answer is wrong."""
    from app.backends.cpu_tree import CpuTreeEvaluator

    real = CpuTreeEvaluator.domain_phases

    def always_first(self, pos, out, cuts, index, prev=None):
        return (yield from real(self, pos, out, cuts, 0, prev))

    monkeypatch.setattr(CpuTreeEvaluator, "domain_phases", always_first)
    acc, *_ = k_devices("cpu-tree", 2, "single", 0)
    want_acc, _want, _t = one_device("cpu-tree", 0)
    assert not np.array_equal(acc, want_acc)


def test_a_pair_exchange_that_drops_the_partials_is_caught(monkeypatch):
    monkeypatch.setattr(HostExchange, "reduce_scatter", lambda self, devices, field: None)
    acc, *_ = k_devices("cpu-n3l", 2, "single", 0)
    want_acc, _want, _t = one_device("cpu-n3l", 0)
    assert np.abs(acc - want_acc).max() > 1e-3 * np.abs(want_acc).max()


def test_pair_slices_that_overlap_are_caught(monkeypatch):
    real = PairTiles.slices

    def overlapping(self, weights):
        out = real(self, weights)
        return [(lo, min(hi + 3, self.tasks)) for lo, hi in out]  # each slice takes three more tasks

    monkeypatch.setattr(PairTiles, "slices", overlapping)
    acc, *_ = k_devices("cpu-n3l", 2, "single", 0)
    want_acc, _want, _t = one_device("cpu-n3l", 0)
    assert np.abs(acc - want_acc).max() > 1e-6 * np.abs(want_acc).max()


# --- pure parts --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 63, 64, 65, 128, 1000, 4097])
@pytest.mark.parametrize("ti,tj,chunk", [(128, 64, 4), (64, 64, 1), (128, 64, 64), (64, 64, 3)])
def test_pair_tiles_count_every_ordered_pair_once(n, ti, tj, chunk):
    tiles = PairTiles(n, ti, tj, chunk)
    assert tiles.interactions.sum() == n * n and (tiles.interactions >= 0).all()
    assert tiles.tasks == tiles.rows * tiles.chunks_per_row


@pytest.mark.parametrize("weights", [[1], [1, 1], [1, 1, 1], [3, 1], [1, 0, 2]])
def test_pair_slices_tile_the_tasks_in_proportion(weights):
    tiles = PairTiles(10_000, 128, 64, 4)
    slices = tiles.slices(weights)
    assert slices[0][0] == 0 and slices[-1][1] == tiles.tasks
    assert all(a[1] == b[0] for a, b in zip(slices, slices[1:], strict=False))
    total = tiles.work(0, tiles.tasks)
    biggest = int(tiles.interactions.max())
    for (lo, hi), w in zip(slices, weights, strict=True):
        assert abs(tiles.work(lo, hi) - total * w / sum(weights)) <= biggest
    with pytest.raises(ValueError):
        tiles.slices([0, 0])


def test_cuts_move_to_the_next_group_start():
    starts = np.array([0, 64, 128, 150, 214, 300])
    assert align_cuts([0, 100, 150, 300], starts) == [0, 128, 150, 300]
    assert align_cuts([0, 299, 300], starts) == [0, 300, 300]
    assert share_cuts([Span(0, 5), Span(5, 7), Span(12, 0)]) == [0, 5, 12, 12]


# --- identity: a domain split never reorders the state ----------------------------------------------------
def test_bodies_keep_their_ids_and_order_under_a_domain_split():
    """The tree sorts its own copies and the key ranges' results come back in state order: after steps
    (and a re-balance) `--gpus 3` hands back the bodies in the order they were loaded, with their ids,
    bitwise one device's state, so colours, components, picks and snapshots follow the same bodies."""
    from app.backends.multi import multi_backend_class

    rng = np.random.default_rng(11)
    bodies = cloud()
    ids = rng.permutation(10 * N)[:N]  # file ids in no particular order
    bodies = Bodies.from_arrays(bodies.pos, bodies.vel, bodies.mass, ids=ids)
    multi = multi_backend_class(CPUBackend, 3, "threads")()
    single = CPUBackend()
    try:
        multi.load(bodies, PHYSICS, "cpu-tree")
        single.load(bodies, PHYSICS, "cpu-tree")
        multi.step(5)
        multi.rebalance()  # rows change hands: the state's order must not
        multi.step(5)
        single.step(10)
        got, want = multi.state(), single.state()
    finally:
        multi.close()
        single.close()
    assert np.array_equal(got.ids, ids) and np.array_equal(got.pos, want.pos)
    assert np.array_equal(got.vel, want.vel)
