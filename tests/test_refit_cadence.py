"""When a refitted tree builds next (app/engine/refit_cadence.py): the fixed cadence, the adaptive rule the
same as the one bench/tree_refit_growth.py analyses, and the rule taken on the devices' summed counts under a
domain split, so that K CPU devices keep one tree and stay bitwise one CPU backend."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from app.engine import refit_cadence
from app.engine.refit_cadence import RefitCadence

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import tree_refit_growth  # noqa: E402


def cycles_of(
    cadence: RefitCadence, curve: list[float], cycles: int = 3, base: int = 1000, bodies: int = 0
) -> list[int]:
    """Evaluations from each build to the next over `cycles` cycles, every cycle's walks following `curve`
    (g_k = curve[k]; a walk of `base` interactions after each build of `bodies` bodies)."""
    lengths = []
    cadence.built(bodies)
    cadence.observe(base)
    for _ in range(cycles):
        k = 1
        while not cadence.next_builds() and k < 64:
            cadence.refitted()
            cadence.observe(round(base * (1 + curve[min(k, len(curve) - 1)])))
            k += 1
        lengths.append(k)
        cadence.built(bodies)
        cadence.observe(base)
    return lengths


def test_a_fixed_cadence_builds_every_r_evaluations_whatever_the_counts():
    for every in (1, 2, 4, 16):
        assert cycles_of(RefitCadence(every, "fixed"), [0.0, 5.0, 9.0]) == [every] * 3
    assert not RefitCadence(1).refits and RefitCadence(2).refits
    with pytest.raises(ValueError, match="rule must be one of"):
        RefitCadence(4, "sometimes")


@pytest.mark.parametrize(
    "curve",
    [
        [0.0, 0.1, 0.3, 0.6, 1.0, 1.5, 2.1],
        [0.0, 0.119, 0.377, 0.754, 1.245],
        [0.0, 0.003, 0.009, 0.016, 0.025, 0.035, 0.049, 0.065, 0.086, 0.109],
    ],
)
@pytest.mark.parametrize("b", [0.05, 0.15, 0.5])
def test_the_adaptive_cadence_is_the_analysed_rule_capped_by_rebuild_every(curve, b):
    """In steady state (every cycle on the same curve) the cadence is the rule bench/tree_refit_growth.py
    analyses; the first cycle, with no refit measured yet, refits at least once."""
    want = tree_refit_growth.marginal_rule_cycle(curve, b)
    first, *steady = cycles_of(RefitCadence(16, "adaptive", build_cost=b), curve)
    assert first >= 2
    for got in steady:
        assert got == min(want, 16) if want < len(curve) else got >= len(curve) - 1
    assert max(cycles_of(RefitCadence(2, "adaptive", build_cost=b), curve)) <= 2  # the cap


def test_a_walk_that_does_not_grow_refits_until_the_cap_and_one_that_explodes_builds_at_once():
    assert cycles_of(RefitCadence(8, "adaptive", build_cost=0.15), [0.0] * 20) == [8, 8, 8]
    assert cycles_of(RefitCadence(8, "adaptive", build_cost=0.15), [0.0, 3.0, 6.0]) == [2, 1, 1]


def test_where_one_refit_costs_more_than_a_build_it_builds_every_time_and_tries_a_refit_again():
    """The 8M collision's case: the first refit walks more than a build costs, so the tree builds every
    evaluation; after `every` builds in a row one refit measures again, and once the motion calmed the
    refits come back."""
    cadence = RefitCadence(8, "adaptive", build_cost=0.05)
    assert cycles_of(cadence, [0.0, 0.2, 0.5], cycles=10) == [2, 1, 1, 1, 1, 1, 1, 1, 2, 1]
    calm = [0.0, 0.001, 0.002, 0.004, 0.008, 0.016, 0.03, 0.06]
    # the call's own first build is the second in a row: five more, then the probe finds the calm
    steady = tree_refit_growth.marginal_rule_cycle(calm, 0.05)
    assert steady == 6 and cycles_of(cadence, calm, cycles=10) == [1] * 5 + [steady] * 5


def test_the_model_prices_a_build_from_the_counts_as_measured_on_the_h200():
    """b from N and the walk after the build (app/engine/refit_cadence.py): ~0.11 of a 1M Plummer walk at
    theta 0.6 (3,871 interactions a body), ~0.04 of the 8M collision's at theta 0.45 (4,635), the figures
    its docstring gives; no walk measured yet: a build."""
    cadence = RefitCadence(16, "adaptive")
    assert cadence.build_fraction() == float("inf")
    for n, per_body, b in ((1 << 20, 3871, 0.11), (1 << 23, 4635, 0.04)):
        cadence.built(n)
        cadence.observe(n * per_body)
        assert cadence.build_fraction() == pytest.approx(b, rel=0.1)


def _collision_run(cls, steps: int, rule: str):
    from app.model.physics import Physics
    from app.tools.bench import bench_bodies

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


def test_k_cpu_devices_decide_on_the_summed_counts_bitwise_as_one_cpu_backend(monkeypatch):
    """A fast collision (dt 0.02): the adaptive rule builds well before the cap of 16, on the same
    evaluations on one CPU backend (its own counts) and on two and three CPU devices (their sum, told to
    every device: each walked only its key range)."""
    from app.backends.cpu import CPUBackend
    from app.backends.multi import multi_backend_class

    monkeypatch.setattr(refit_cadence, "BUILD_COST", 0.15)  # 4,096 bodies: the model's fixed cost dwarfs
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

    from app.core.errors import ConfigError
    from app.parallel.decomposition import Domains

    told = []
    evaluator = SimpleNamespace(observe_evaluation=told.append)
    driver = SimpleNamespace(finish=lambda: None)
    ops = SimpleNamespace(
        layout=([], 1),
        devices=[SimpleNamespace(evaluator=evaluator)],
        driver=driver,
        rank_sum=lambda count: count + 1000,
    )  # another rank walked 1,000 interactions
    Domains._tell_total(ops, [234])
    assert told == [1234]
    ops.rank_sum = None
    with pytest.raises(ConfigError, match="cannot sum it over its participants; use rebuild_rule=fixed"):
        Domains._tell_total(ops, [1])
    ops.layout = None  # one process: the devices' own sum
    Domains._tell_total(ops, [1, 2])
    assert told == [1234, 3]
