"""The host float64 potential (app/engine/energy.py): the reference's value, in blocks that report progress
and can be stopped, the same whatever the number of threads."""

from __future__ import annotations

import numpy as np
import pytest

from app.engine import energy
from app.model.physics import Physics, potential_energy


def cloud(n: int, seed: int = 4):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 3)), rng.uniform(0.5, 1.5, n) / n


@pytest.mark.parametrize(
    "physics",
    [
        Physics(softening=0.02),
        Physics(softening=0.0),
        Physics(softening=0.02, model="gravity-repulsion", repulsion=1e-3),
    ],
)
@pytest.mark.parametrize("parallel", [False, True])
def test_equals_the_reference(physics, parallel):
    pos, mass = cloud(777)
    got = energy.potential_energy(pos, mass, physics, parallel=parallel)
    assert got == pytest.approx(potential_energy(pos, mass, physics), rel=1e-12)


def test_blocks_cover_every_row_with_about_equal_pairs(monkeypatch):
    n = 10_000
    blocks = energy._row_blocks(n, 64)
    assert blocks[0][0] == 0 and blocks[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:], strict=False))
    pairs = [sum(n - 1 - i for i in range(i0, i1)) for i0, i1 in blocks]
    assert max(pairs) < 1.2 * (n * (n - 1) / 2 / 64)
    pos, mass = cloud(2000)
    monkeypatch.setattr(energy, "SHORT_PAIRS", 0)  # force the blocked path at a small N
    rows = []
    blocked = energy.potential_energy(pos, mass, Physics(), progress=rows.append)
    assert sum(rows) == 2000 and len(rows) > 1
    assert blocked == energy.potential_energy(pos, mass, Physics(), parallel=True)  # thread-independent


def test_a_stop_between_blocks_interrupts(monkeypatch):
    monkeypatch.setattr(energy, "SHORT_PAIRS", 0)
    pos, mass = cloud(2000)
    calls = []

    def stop():
        calls.append(1)
        return len(calls) > 3

    with pytest.raises(energy.EnergyInterrupted):
        energy.potential_energy(pos, mass, Physics(), stop=stop)
    assert len(calls) == 4


def test_coincident_bodies_at_softening_0():
    pos = np.array([[0.0, 0, 0], [0.0, 0, 0], [1.0, 0, 0]])
    mass = np.ones(3)
    assert energy.potential_energy(pos, mass, Physics(softening=0.0)) == -np.inf
    assert energy.potential_energy(pos, mass, Physics(softening=0.0), coincident_inf=False) == -2.0
