"""`validate` at real N: a seeded sample of targets, the float64 reference for those rows only (GPU,
numba or numpy), the backend checked first, and the kernel's error split from the input rounding."""

import numpy as np
import pytest

from app.backends import backend_class
from app.cli import main
from app.commands import reference, validate
from app.core.errors import ConfigError
from app.model import formats, ics
from app.model.physics import Physics, accelerations

PHYSICS = (Physics(softening=0.05), Physics(softening=0.0))


def _cloud(n=300, seed=1):
    b = ics.generate("plummer", n, seed)
    return b.pos, b.mass


@pytest.mark.parametrize("physics", PHYSICS)
def test_accelerations_of_an_index_array_are_those_rows(physics):
    pos, mass = _cloud()
    rows = np.array([5, 0, 299, 17])
    assert np.array_equal(
        accelerations(pos, mass, physics, targets=rows), accelerations(pos, mass, physics)[rows]
    )


@pytest.mark.parametrize("engine", ["cpu", "numpy"])
@pytest.mark.parametrize("physics", PHYSICS)
def test_reference_engines_agree_on_sampled_rows(engine, physics):
    pos, mass = _cloud()
    rows = np.array([0, 3, 150, 299])
    seen = []
    got = reference.reference_accelerations(pos, mass, physics, rows, engine, seen.append)
    np.testing.assert_allclose(got, accelerations(pos, mass, physics)[rows], rtol=1e-12, atol=1e-12)
    assert sum(seen) == rows.size


def test_a_kernel_is_never_its_own_reference():
    assert reference.reference_engine(judged="cpu-fp64") in ("cuda", "numpy")
    assert reference.reference_engine(judged="fp64") in ("cpu", "numpy")


def test_sample_is_seeded_and_only_above_the_threshold():
    assert validate._sample(16384, None, 1) is None
    rows = validate._sample(16385, None, 1)
    assert rows.size == 4096 and np.array_equal(rows, np.unique(rows))
    assert np.array_equal(rows, validate._sample(16385, None, 1))
    assert not np.array_equal(rows, validate._sample(16385, None, 2))
    assert validate._sample(100_000, 0, 1) is None
    assert validate._sample(1000, 10, 1).size == 10
    with pytest.raises(ConfigError, match="--sample"):
        validate._sample(1000, -1, 1)


def test_validate_samples_above_16k_and_prints_the_seed(capsys):
    rc = main(
        [
            "validate",
            "plummer",
            "--n",
            "16500",
            "--seed",
            "9",
            "--backend",
            "cpu",
            "--kernel",
            "cpu-simd",
            "--sample",
            "512",
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0
    assert "sample of 512 of 16,500 bodies (seed 9" in out and "max rel err" in out


def test_unavailable_backend_is_refused_before_any_work(capsys, monkeypatch):
    if backend_class("cuda").available():
        pytest.skip("CUDA is available here")
    import app.scene

    def refuse(*_a, **_k):
        raise AssertionError("bodies were made before the backend was checked")

    monkeypatch.setattr(app.scene, "make_bodies", refuse)
    rc = main(["validate", "plummer", "--n", "100000", "--backend", "cuda"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "cuda" in err and "Traceback" not in err


def test_input_rounding_is_reported_not_judged(tmp_path, capsys):
    """Far from the origin float32 loses most of a small cloud's geometry: the total error is far over
    the fp32 budget, the kernel's own (against the rounded inputs) is within it."""
    b = ics.generate("plummer", 512, 3)
    b.pos += 3000.0
    path = tmp_path / "far.npz"
    formats.write(path, b)
    rc = main(["validate", str(path), "--backend", "cpu", "--kernel", "cpu-simd"])
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "cpu-simd" in ln)
    assert rc == 0 and " ok " in line
    judged = float(line.split("max rel err ")[1].split()[0])
    total = float(line.split("total with input rounding: max ")[1].split(",")[0])
    assert judged < 1e-4 < total


CUDA = backend_class("cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("physics", PHYSICS)
def test_cuda_reference_on_sampled_rows(physics):
    pos, mass = _cloud(5000)
    rows = np.sort(np.random.default_rng(0).choice(5000, 1500, replace=False))
    got = reference.reference_accelerations(pos, mass, physics, rows, "cuda")
    np.testing.assert_allclose(got, accelerations(pos, mass, physics)[rows], rtol=1e-11, atol=1e-12)


def test_float32_exact_inputs_need_one_reference(tmp_path, capsys):
    b = ics.generate("plummer", 300, 4)
    b.pos = b.pos.astype(np.float32).astype(np.float64)
    b.mass = b.mass.astype(np.float32).astype(np.float64)
    path = tmp_path / "f32.npz"
    formats.write(path, b)
    assert main(["validate", str(path), "--backend", "cpu", "--kernel", "cpu-simd"]) == 0
    assert capsys.readouterr().out.count("float64 reference on") == 1
