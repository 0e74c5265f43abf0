"""`alpha`'s default follows N (docs/tree.md, "alpha's default"): a FloatRange may take "auto", which
stands for a number that depends on the body count (`by_n`); the tree's walk turns it into that number
for the tree it walks (all N bodies, on any device count), and what the run reports (`validate`, bench's
tunables_used) is the number. Against the CPU twin, with the steps moved to small N so that a test can
cross one: auto walks bitwise as the number it stands for."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
from test_cpu_backend import plummer_like
from test_cpu_tree import RECORD, SOFT

from app.backends.cpu_forces import cpu_record
from app.backends.cpu_multi import cpu_devices
from app.backends.cpu_tree import ALPHA_BY_N
from app.core.errors import ConfigError
from app.core.values import AUTO, FloatRange, default_text
from app.engine.forces import Span
from app.model.physics import Physics
from app.parallel.multidevice import MultiDeviceRun

SPEC = FloatRange("a", 0.0, 0.1, AUTO, lo_open=True, by_n=((0, 0.001), (1000, 0.004)))


def test_auto_is_a_value_of_a_range_with_steps_and_stands_for_the_step_of_n():
    assert SPEC.validate("auto") == AUTO and SPEC.validate("0.002") == 0.002
    with pytest.raises(ConfigError, match=r"rec.a: 'fast' is not in \(0, 0.1\] or auto"):
        SPEC.validate("fast", "rec")
    assert [SPEC.value_at(AUTO, n) for n in (0, 999, 1000, 10**9)] == [0.001, 0.001, 0.004, 0.004]
    assert SPEC.value_at(0.003, 5000) == 0.003  # a number set stays that number at any N
    assert SPEC.describe_auto() == "0.001; 0.004 from 1,000 bodies"
    assert default_text(SPEC) == "auto: 0.001; 0.004 from 1,000 bodies"
    plain = FloatRange("theta", 0.0, 1.5, 0.5, lo_open=True)
    with pytest.raises(ConfigError, match=r"theta: 'auto' is not in \(0, 1.5\]$"):
        plain.validate("auto")  # no steps: no auto
    assert default_text(plain) == "0.5"


@pytest.mark.parametrize(
    "by_n, default, why",
    [
        (((10, 0.001),), AUTO, "must start at N = 0"),
        (((0, 0.001), (5, 0.002), (5, 0.003)), AUTO, "must start at N = 0 and rise"),
        (((0, 0.001), (5, 0.5)), AUTO, r"0.5 is not in"),
        ((), AUTO, "by_n gives it no numbers"),
    ],
)
def test_steps_that_cannot_stand_for_a_number_are_refused_when_declared(by_n, default, why):
    with pytest.raises((ValueError, ConfigError), match=why):
        FloatRange("a", 0.0, 0.1, default, lo_open=True, by_n=by_n)


def test_the_tree_default_takes_the_measured_steps():
    """0.001 to just below 1M bodies, 0.002 from 1,048,576, 0.003 from 8,388,608 (cpu_tree.ALPHA_BY_N says
    which measurements chose them)."""
    assert RECORD.default_tunables()["alpha"] == AUTO and RECORD.tunable("alpha").by_n == ALPHA_BY_N
    want = {81_920: 0.001, 262_144: 0.001, 1_048_575: 0.001, 1_048_576: 0.002, 4_194_304: 0.002}
    want |= {8_388_607: 0.002, 8_388_608: 0.003, 16_777_216: 0.003}
    for n, alpha in want.items():
        assert RECORD.tunables_at(RECORD.default_tunables(), n)["alpha"] == alpha, n
    assert RECORD.tunables_at({"alpha": 0.004}, 16_777_216) == {"alpha": 0.004}
    # a tunable the record lacks passes through (CUDA `best` reports its resolved variant's tunables)
    assert RECORD.tunables_at({"block_size": 128, "alpha": AUTO}, 1 << 20) == {
        "block_size": 128,
        "alpha": 0.002,
    }


# the tree's record with its steps at small N: the walk must choose by the tree's N
SMALL_STEPS = dataclasses.replace(
    RECORD,
    tunables=tuple(
        dataclasses.replace(spec, by_n=((0, 0.001), (2000, 0.004))) if spec.name == "alpha" else spec
        for spec in RECORD.tunables
    ),
)


def second_walk(n: int, **tunables) -> tuple[np.ndarray, int]:
    """a(x) of the second evaluation (the first, having no last accelerations, takes the cube test) and
    its interactions."""
    pos = plummer_like(n, seed=3).pos4(np.float32)
    ev = SMALL_STEPS.policy.evaluator(SMALL_STEPS, SOFT)
    ev.set_tunables(**tunables)
    acc = np.full(pos.shape, np.nan, pos.dtype)
    for _ in range(2):
        work = ev.evaluate(pos, acc, Span(0, n), Span(0, n))
    return acc[:, :3], work.interactions


def test_the_walk_takes_auto_as_the_number_for_its_n():
    above, below = 3000, 1500
    auto, auto_work = second_walk(above)
    four, four_work = second_walk(above, alpha=0.004)
    one, one_work = second_walk(above, alpha=0.001)
    assert np.array_equal(auto, four) and auto_work == four_work
    assert not np.array_equal(auto, one) and auto_work < one_work  # the looser test walks less
    assert np.array_equal(second_walk(below)[0], second_walk(below, alpha=0.001)[0])


@pytest.mark.parametrize("k", [2, 3])
def test_k_devices_take_auto_for_the_whole_n_not_their_share(k):
    """Every device of a domain split walks a tree of all N bodies: auto gives them the number for N
    (0.004 at 3,000 bodies here), not for their share (1,500 or 1,000: 0.001), so K devices step bitwise
    as one device with the number set."""
    physics = Physics(softening=0.02, dt=2e-3)

    def lookup(name):
        return SMALL_STEPS if name == "cpu-tree" else cpu_record(name)

    bodies = plummer_like(3000, seed=3)

    def two_steps(devices: int, **tunables) -> np.ndarray:
        run = MultiDeviceRun(functools.partial(cpu_devices, lookup=lookup), devices, "single")
        try:
            run.load(bodies, physics, "cpu-tree")
            assert run.devices[0].evaluator.record is SMALL_STEPS
            for device in run.devices:  # (as app/backends/multi.py hands a set value on)
                device.evaluator.set_tunables(**tunables)
            run.step(2)
            return run.in_body_order(run.gathered("pos")[:, :3])
        finally:
            run.close()

    auto = two_steps(k)
    assert np.array_equal(auto, two_steps(1, alpha=0.004))
    assert not np.array_equal(auto, two_steps(1, alpha=0.001))
