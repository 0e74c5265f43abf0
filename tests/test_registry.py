"""Every kernel record in the registry: documented, uniquely named, and agreeing with float64.

Parametrized over `all_kernel_records()`, so records added later (CUDA variants) are checked without
touching this file. Records of unavailable backends are skipped with the backend's own why_not.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest

from app.backends import all_kernel_records, backend_class, backend_names
from app.engine.forces import KernelRecord
from app.model.bodies import Bodies
from app.model.physics import Physics, accelerations, relative_errors

_FOLDER = tempfile.TemporaryDirectory(prefix="nbody-user-kernel-")  # removed when the session ends


def _starter() -> KernelRecord:
    """A kernel file of the user's as `nbody-live new-kernel` writes it (from `shared`): walked by every
    test here like a built-in (issue 27: "the user record is walked by the same registry tests")."""
    from app.backends.cuda import registry
    from app.backends.cuda.user_kernels import new_kernel_text, user_record

    path = Path(_FOLDER.name) / "user-starter.cu"
    path.write_text(new_kernel_text("user-starter", {r.name: r for r in registry.RECORDS}["shared"]))
    return user_record(path)


USER = _starter()
RECORDS = [*all_kernel_records(), USER]


def plummer_like(n: int, seed: int) -> Bodies:
    """A seeded Plummer-like cloud: Plummer radii, isotropic directions, Gaussian velocities, M = 1."""
    rng = np.random.default_rng(seed)
    u = rng.uniform(0.05, 0.95, n)
    r = 1.0 / np.sqrt(u ** (-2.0 / 3.0) - 1.0)
    direction = rng.normal(size=(n, 3))
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    vel = rng.normal(scale=0.4, size=(n, 3))
    return Bodies.from_arrays(r[:, None] * direction, vel, np.full(n, 1.0 / n))


@pytest.mark.parametrize("backend", backend_names())
def test_each_backend_has_one_record_per_role_it_is_asked_for(backend):
    """Callers ask a backend's records for a role, never a name (app.engine.forces.ROLES): each role is played
    by at most one record per precision, "default" and "reference" by exactly one, a role's precision is
    the one it promises (reference: fp64), and the tune order is a permutation of 0..k-1 over the swept
    records that have one."""
    from app.engine.forces import ROLES, with_role

    records = [r for r in RECORDS if r.backend == backend]
    for role in ROLES:
        for precision in ("fp32", "fp64"):
            players = [r.name for r in records if role in r.roles and r.precision == precision]
            assert len(players) <= 1, f"{backend}: {role} in {precision} played by {players}"
    assert with_role(records, "default").name and with_role(records, "reference").precision == "fp64"
    ranks = sorted(r.tune_rank for r in records if r.tune_rank is not None)
    assert ranks == list(range(len(ranks)))
    assert all(r.tuned for r in records if r.tune_rank is not None)


def test_an_unknown_role_or_a_missing_one_is_an_error():
    from app.core.errors import ConfigError
    from app.engine.forces import KernelRecord, with_role

    with pytest.raises(ValueError, match="unknown roles \\['fastest'\\]"):
        KernelRecord(name="x", doc="x", backend="cpu", roles=frozenset({"fastest"}))
    with pytest.raises(ConfigError, match="no kernel plays the role 'block-steps'"):
        with_role([KernelRecord(name="x", doc="x", backend="cpu")], "block-steps")


def test_registry_is_well_formed():
    assert RECORDS, "no kernel records at all"
    names = [r.name for r in RECORDS]
    assert len(names) == len(set(names)), f"duplicate kernel names: {names}"
    for rec in RECORDS:
        assert rec.name and rec.name == rec.name.strip() and " " not in rec.name
        assert rec.doc.strip() and "\n" not in rec.doc, f"{rec.name}: doc must be one non-empty line"
        assert rec.backend in backend_names(), f"{rec.name}: unknown backend {rec.backend!r}"
        assert rec.precision in ("fp32", "fp64"), f"{rec.name}: unknown precision {rec.precision!r}"
        assert rec.origin.strip(), f"{rec.name}: say which write-up the variant comes from"
        assert rec.max_n is None or rec.max_n >= 1
        assert 0 < rec.error_budget.max_rel < 1e-2, f"{rec.name}: state a usable error budget"
        assert rec.policy is not None, f"{rec.name}: a record is its own descriptor: give it its policy"
        names = [t.name for t in rec.tunables]
        assert len(names) == len(set(names)), f"{rec.name}: duplicate tunables {names}"
        for spec in rec.tunables:  # typed, documented, and the default is allowed
            assert spec.doc and spec.validate(spec.default, rec.name) == spec.default, (rec.name, spec)


def test_every_backend_has_a_default_kernel_in_the_table():
    assert any(r.name == "cpu-simd" and r.backend == "cpu" for r in RECORDS)
    assert any(r.name == "cpu-fp64" and r.precision == "fp64" for r in RECORDS)


def _params():
    for rec in RECORDS:
        marks = [pytest.mark.gpu] if rec.backend == "cuda" else []
        yield pytest.param(rec, id=rec.name, marks=marks)


@pytest.mark.parametrize("model", ["gravity", "gravity-repulsion"])
@pytest.mark.parametrize("n", [1, 31, 1000])
@pytest.mark.parametrize("record", list(_params()))
def test_record_agrees_with_float64(record, n, model, monkeypatch):
    if record is USER:  # loaded as --kernel-file loads it
        from app.backends.cuda import registry

        monkeypatch.setattr(registry, "RECORDS", (*registry.RECORDS, USER))
    cls = backend_class(record.backend)
    reason = cls.why_not() or cls.kernel_why_not(record.name)
    if reason:
        pytest.skip(f"{record.name}: {reason}")
    if record.max_n is not None and n > record.max_n:
        pytest.skip(f"{record.name}: N = {n} exceeds its max_n = {record.max_n}")
    bodies = plummer_like(n, seed=1000 + n)
    physics = Physics(softening=0.01, model=model, repulsion=1e-3)
    backend = cls()
    try:
        backend.load(bodies, physics, kernel=record.name)
        assert backend.kernel == record.name and backend.n == n
        start = backend.state()  # the positions the kernel sees (rounded to its precision)
        got = backend.accelerations()
    finally:
        backend.close()
    assert got.shape == (n, 3) and got.dtype == np.float64
    ref = accelerations(start.pos, start.mass, physics)
    rel = relative_errors(got, ref)  # judged on the max, and on the 99th percentile where the budget has one
    over = record.error_budget.judge({"max": float(rel.max()), "p99": float(np.percentile(rel, 99))})
    assert not over, f"{record.name}: {'; '.join(over)}"
