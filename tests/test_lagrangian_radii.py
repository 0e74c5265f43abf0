"""bench/lagrangian_radii.py: the radii against a Plummer sphere's analytic profile and hand-built shells with
exact answers, the tool end to end on the CPU twin (CSV rows and columns, the summary, the exit status), an
interrupted run keeping its rows, and a missing output folder refused before any work."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "lagrangian_radii.py"
sys.path.insert(0, str(SCRIPT.parent))
import lagrangian_radii as lr  # noqa: E402

# The CPU twin of the GPU tree at a size that steps in well under a second.
CPU_RUN = ["--backend", "cpu", "--kernel", "cpu-tree", "--n", "2048", "--steps", "20", "--every", "5"]
SCENE_DT = 0.001  # assets/scenes/plummer.toml


def isotropic(rng, n):
    cos_t = rng.uniform(-1.0, 1.0, n)
    phi = rng.uniform(0.0, 2.0 * np.pi, n)
    sin_t = np.sqrt(1.0 - cos_t * cos_t)
    return np.column_stack([sin_t * np.cos(phi), sin_t * np.sin(phi), cos_t])


def read_csv(path: Path) -> tuple[list[str], list[list[float]]]:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return rows[0], [[float(v) for v in row] for row in rows[1:]]


# --- the radii --------------------------------------------------------------------------------------------
def test_a_plummer_sphere_has_its_analytic_radii_about_its_centre_of_mass():
    """200,000 bodies drawn from the Plummer profile (a = 1) by inverting M(<r) = r³ / (1 + r²)^(3/2):
    r(f) = a / sqrt(f^(-2/3) - 1). Masses unequal (independent of radius, so the profile is unchanged in
    expectation) and the sphere moved off the origin, so only a mass-weighted centre of mass finds it.
    Sampling noise at this N is about 0.3% (10%, 50%) to 0.4% (90%) one sigma: the bar is 1.5%."""
    rng = np.random.default_rng(2)
    n, a = 200_000, 1.0
    u = rng.uniform(0.0, 1.0, n)
    r = a / np.sqrt(u ** (-2.0 / 3.0) - 1.0)
    pos = r[:, None] * isotropic(rng, n) + np.array([3.0, -2.0, 7.0])
    mass = rng.uniform(0.5, 1.5, n)
    fractions = np.array([0.1, 0.5, 0.9])
    exact = a / np.sqrt(fractions ** (-2.0 / 3.0) - 1.0)  # 0.5240, 1.3048, 3.6993
    got = lr.lagrangian_radii(pos, mass, fractions)
    assert got.dtype == np.float64 and got.shape == (3,)
    np.testing.assert_allclose(got, exact, rtol=0.015)


def shells(offset=(0.0, 0.0, 0.0), seed=0):
    """Masses 1, 2, 3, 4 at distances 1, 2, 3, 4 from `offset`, each split into two bodies on opposite
    sides so that `offset` is the centre of mass; the rows shuffled. Enclosed mass fractions, body by
    body outward: 0.05 0.1 | 0.2 0.3 | 0.45 0.6 | 0.8 1.0."""
    axes = np.eye(3)[[0, 1, 2, 0]]
    pos, mass = [], []
    for k, (axis, m) in enumerate(zip(axes, (1.0, 2.0, 3.0, 4.0), strict=True)):
        for sign in (1.0, -1.0):
            pos.append(sign * (k + 1) * axis)
            mass.append(m / 2)
    order = np.random.default_rng(seed).permutation(len(mass))
    return np.array(pos)[order] + np.asarray(offset), np.array(mass)[order]


def test_shells_give_exact_radii_by_mass_not_by_count():
    pos, mass = shells(offset=(10.0, -4.0, 0.5))
    got = lr.lagrangian_radii(pos, mass, [0.07, 0.25, 0.5, 0.9, 1.0])
    # 50% by count would be the 4th of 8 bodies, r = 2; by mass it is the shell of 3
    np.testing.assert_allclose(got, [1.0, 2.0, 3.0, 4.0, 4.0], rtol=1e-12)


def test_equal_masses_take_the_body_at_ceil_f_n():
    """N equal masses at distances 1..N along ±x (pairs, centre of mass at 0): the f radius is the
    ceil(f N)-th distance."""
    d = np.repeat(np.arange(1.0, 51.0), 2)  # 100 bodies, two at each distance
    pos = np.zeros((100, 3))
    pos[:, 0] = d * np.tile([1.0, -1.0], 50)
    got = lr.lagrangian_radii(pos, np.ones(100), [0.1, 0.505, 0.9])
    np.testing.assert_allclose(got, [5.0, 26.0, 45.0])  # bodies 10, 51, 90 of 100


@pytest.mark.parametrize(
    "pos, mass, fractions",
    [
        (np.zeros((4, 2)), np.ones(4), [0.5]),
        (np.zeros((4, 3)), np.ones(3), [0.5]),
        (np.zeros((4, 3)), np.ones(4), [0.0]),
        (np.zeros((4, 3)), np.ones(4), [1.5]),
    ],
)
def test_bad_input_is_refused(pos, mass, fractions):
    with pytest.raises(ValueError):
        lr.lagrangian_radii(pos, mass, fractions)


def test_the_verdict_is_the_largest_deviation_against_the_tolerance():
    records = lr.Records(["r10", "r50", "r90"])
    records.add(0, np.array([1.0, 2.0, 4.0]))
    records.add(5, np.array([1.01, 1.9, 4.0]))
    records.add(10, np.array([0.995, 2.0, np.nan]))
    np.testing.assert_allclose(records.deviations()[:2], [0.01, 0.05])
    lines, passed = lr.summary(records, tolerance=0.02)
    assert not passed
    assert [ln.split()[-1] for ln in lines[1:]] == ["PASS", "FAIL", "FAIL"]  # a nan radius fails
    assert lines[1].split()[:5] == ["r10", "1.00000", "0.99500", "1.01000", "1.000%"]


def test_column_names_and_fractions():
    assert lr.column_names([0.1, 0.5, 0.9, 0.025]) == ["r10", "r50", "r90", "r2.5"]
    assert lr.parse_fractions("0.1, 0.5,0.9") == [0.1, 0.5, 0.9]
    for bad in ("0.1,1", "0,0.5", "a,b", "0.5,0.5"):
        with pytest.raises(lr.UserError):
            lr.parse_fractions(bad)


# --- the tool ---------------------------------------------------------------------------------------------
def test_end_to_end_on_the_cpu_twin(tmp_path):
    out = tmp_path / "lagrangian.csv"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *CPU_RUN, "--csv", str(out), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )  # not from the checkout
    assert done.returncode in (0, 1), done.stderr
    header, rows = read_csv(out)
    assert header == ["step", "time", "r10", "r50", "r90"]
    assert [int(r[0]) for r in rows] == [0, 5, 10, 15, 20]
    np.testing.assert_allclose([r[1] for r in rows], np.array([0, 5, 10, 15, 20]) * SCENE_DT, atol=1e-12)
    radii = np.array([r[2:] for r in rows])
    assert np.all(np.isfinite(radii)) and np.all(np.diff(radii, axis=1) > 0)  # r10 < r50 < r90
    # the scene's sphere: a = 3π/16, r(f) = a / sqrt(f^(-2/3) - 1); 2,048 bodies are noisy, hence 10%
    a = 3 * np.pi / 16
    np.testing.assert_allclose(radii[0], a / np.sqrt(np.array([0.1, 0.5, 0.9]) ** (-2 / 3) - 1), rtol=0.1)
    text = done.stdout
    assert "N=2,048" in text and "backend cpu, kernel cpu-tree" in text and "rebuild_every=" in text
    verdicts = [ln.split()[-1] for ln in text.splitlines() if ln.split()[:1] in (["r10"], ["r50"], ["r90"])]
    assert len(verdicts) == 3 and set(verdicts) <= {"PASS", "FAIL"}
    assert done.returncode == (0 if verdicts == ["PASS"] * 3 else 1)
    assert f"{radii[0, 1]:.5f}" in text  # the table's r(0) is the CSV's first row


def test_a_radius_beyond_the_tolerance_fails_with_exit_1(tmp_path, capsys):
    out = tmp_path / "tight.csv"
    rc = lr.main(
        [
            *CPU_RUN,
            "--tolerance",
            "1e-9",
            "--tunable",
            "theta=0.6",
            "--csv",
            str(out),
            "--progress-every",
            "0",
        ]
    )
    text = capsys.readouterr()
    assert rc == 1
    assert "FAIL: a radius moved by more than" in text.out
    assert "theta=0.6" in text.out  # the tunables used are printed
    assert text.err.count("largest |r/r0 - 1| so far") == 5  # a progress line per record
    assert len(read_csv(out)[1]) == 5


def test_an_interrupted_run_keeps_its_records_and_says_so(tmp_path, capsys, monkeypatch):
    cpu = lr.backend_class("cpu")

    class SignalledAtStep10(cpu):
        def step(self, steps: int = 1):
            timings = super().step(steps)
            if self._steps == 10:  # as if Ctrl-C came during the chunk that ends at step 10
                os.kill(os.getpid(), signal.SIGINT)
            return timings

    monkeypatch.setattr(lr, "backend_class", lambda name: SignalledAtStep10)
    out = tmp_path / "cut.csv"
    rc = lr.main([*CPU_RUN, "--csv", str(out), "--no-progress"])
    text = capsys.readouterr()
    assert rc == 128 + signal.SIGINT
    assert [int(r[0]) for r in read_csv(out)[1]] == [0, 5, 10]
    assert "interrupted by SIGINT at step 10 of 20" in text.err and "keeps 3 records" in text.err
    assert "r50" in text.out  # the table of what was measured


def test_a_missing_output_folder_exits_2_before_any_work(tmp_path, capsys, monkeypatch):
    def never(*_args, **_kwargs):
        raise AssertionError("the output must be checked before the backend or the bodies")

    monkeypatch.setattr(lr, "backend_class", never)
    monkeypatch.setattr(lr, "load_scene", never)
    target = tmp_path / "missing" / "lagrangian.csv"
    rc = lr.main([*CPU_RUN, "--csv", str(target)])
    err = capsys.readouterr().err
    assert rc == 2
    assert str(target) in err and "does not exist" in err
    assert not target.parent.exists()
