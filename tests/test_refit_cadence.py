"""When a refitted tree builds next (app/refit_cadence.py): the fixed cadence, the adaptive rule the same as
the one bench/tree_refit_growth.py analyses, and the rule taken on the devices' summed counts under a
domain split, so that K CPU devices keep one tree and stay bitwise one CPU backend."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from app.refit_cadence import RefitCadence

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import tree_refit_growth  # noqa: E402


def cycle_of(cadence: RefitCadence, curve: list[float], base: int = 1000) -> int:
    """Evaluations from a build to the next build, the walks' counts following `curve`."""
    cadence.built()
    cadence.observe(base)
    for k in range(1, 64):
        if cadence.next_builds():
            return k
        cadence.refitted()
        cadence.observe(round(base * (1 + curve[min(k, len(curve) - 1)])))
    return 64


def test_a_fixed_cadence_builds_every_r_evaluations_whatever_the_counts():
    for every in (1, 2, 4, 16):
        assert cycle_of(RefitCadence(every, "fixed"), [0.0, 5.0, 9.0]) == every
    assert not RefitCadence(1).refits and RefitCadence(2).refits
    with pytest.raises(ValueError, match="rule must be one of"):
        RefitCadence(4, "sometimes")


@pytest.mark.parametrize("curve", [[0.0, 0.1, 0.3, 0.6, 1.0, 1.5, 2.1], [0.0, 0.119, 0.377, 0.754, 1.245],
                                   [0.0, 0.003, 0.009, 0.016, 0.025, 0.035, 0.049, 0.065, 0.086, 0.109]])
@pytest.mark.parametrize("b", [0.05, 0.15, 0.5])
def test_the_adaptive_cadence_is_the_analysed_rule_capped_by_rebuild_every(curve, b):
    want = tree_refit_growth.marginal_rule_cycle(curve, b)
    got = cycle_of(RefitCadence(16, "adaptive", build_cost=b), curve)
    assert got == min(want, 16) if want < len(curve) else got >= len(curve) - 1
    assert cycle_of(RefitCadence(2, "adaptive", build_cost=b), curve) <= 2  # the cap


def test_a_walk_that_does_not_grow_refits_until_the_cap_and_one_that_explodes_builds_at_once():
    assert cycle_of(RefitCadence(8, "adaptive"), [0.0] * 20) == 8
    assert cycle_of(RefitCadence(8, "adaptive"), [0.0, 3.0, 6.0]) == 2


def _collision_run(cls, steps: int, rule: str):
    from app.bench import bench_bodies
    from app.physics import Physics

    bodies = bench_bodies(4096, scene="collision")
    backend = cls()
    try:
        backend.load(bodies, Physics(softening=0.02, dt=0.02), "cpu-tree")
        backend.set_tunables(rebuild_every=16, rebuild_rule=rule)
        cadence = []
        for _ in range(steps):
            backend.step(1)
            run = getattr(backend, "_run", None)
            evaluators = [d.evaluator for d in run.devices] if run is not None else [backend.evaluator()]
            cadence.append([ev.since_build for ev in evaluators])
        return backend.state().pos, cadence
    finally:
        backend.close()


def test_k_cpu_devices_decide_on_the_summed_counts_bitwise_as_one_cpu_backend():
    """A fast collision (dt 0.02): the adaptive rule builds well before the cap of 16, on the same
    evaluations on one CPU backend (its own counts) and on two and three CPU devices (their sum, told to
    every device: each walked only its key range)."""
    from app.backends.cpu import CPUBackend
    from app.backends.multi import multi_backend_class

    one, cadence = _collision_run(CPUBackend, 12, "adaptive")
    since = [c[0] for c in cadence]
    assert 0 in since[1:] and max(since) < 15  # built early, more than once
    for k in (2, 3):
        many, cadence_k = _collision_run(multi_backend_class(CPUBackend, k, "single"), 12, "adaptive")
        assert cadence_k == [[s] * k for s in since]
        assert np.array_equal(one, many)
    fixed, cadence = _collision_run(CPUBackend, 12, "fixed")
    assert [c[0] for c in cadence] == list(range(1, 13))  # the control: no early build


def test_part_of_a_larger_run_sums_the_counts_over_its_participants_or_refuses():
    """Under MPI a rank's devices are part of a larger run (`ops.layout`): the total is the ranks' sum
    (`ops.rank_sum`, an allreduce; tests/test_mpi.py runs it), told to every evaluator; a run that cannot
    sum refuses with what to use."""
    from types import SimpleNamespace

    from app.decomposition import Domains
    from app.errors import ConfigError

    told = []
    evaluator = SimpleNamespace(observe_evaluation=told.append)
    driver = SimpleNamespace(finish=lambda: None)
    ops = SimpleNamespace(layout=([], 1), devices=[SimpleNamespace(evaluator=evaluator)], driver=driver,
                          rank_sum=lambda count: count + 1000)  # another rank walked 1,000 interactions
    Domains._tell_total(ops, [234])
    assert told == [1234]
    ops.rank_sum = None
    with pytest.raises(ConfigError, match="cannot sum it over its participants; use rebuild_rule=fixed"):
        Domains._tell_total(ops, [1])
    ops.layout = None  # one process: the devices' own sum
    Domains._tell_total(ops, [1, 2])
    assert told == [1234, 3]
