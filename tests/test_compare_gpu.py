"""A/B and the force-error colours on one GPU (app/backends/cuda/compare.py): the numbers against float64
references computed on the host, the colours in load order through a tree's key-ordered rows, the exact
sum in pieces, the state bitwise that of a run without A/B, and with CUDA-GL interop the colours copied into
the speed VBO on the device. Skipped where CUDA cannot run (tests/conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import gl_vbo, read_gl
from test_compare import PHYS, key_of, reference

from app.engine.compare import ABCompare
from app.engine.error_colours import ExactErrors, error_positions
from app.model.physics import error_summary, relative_errors
from app.scene import load_scene, make_bodies

pytestmark = pytest.mark.gpu

N = 4096  # masses 1/N, exact in float32: the GPU's rows hold the reference's masses


def cuda():
    from app.backends.cuda.backend import CudaBackend

    return CudaBackend()


@pytest.fixture
def backend():
    b = cuda()
    yield b
    b.close()


def loaded(backend, kernel: str, **tunables):
    backend.load(make_bodies(load_scene("plummer", {"initial.n": N})), PHYS, kernel)
    if tunables:
        backend.set_tunables(**tunables)
    return backend


def compared(backend, kernel_b: str, steps: int = 2, colour: bool = False):
    ops = backend.compare_ops()
    ab = ABCompare(k=2 * N)
    ab.kernel_b, ab.colour = kernel_b, colour
    for _ in range(steps):
        ab.observe_step(backend.step(1))
        ab.tick(ops, key_of(backend), backend.time, backend.n)
    return ab.latest, ops


def test_shared_against_fp64_differs_by_round_off_and_matches_the_host_float64(backend):
    r, ops = compared(loaded(backend, "shared"), "fp64")
    expect = error_summary(backend.accelerations(), reference(backend))
    assert r is not None and r.n == r.k == N and r.a_ms > 0 and r.b_ms > 0
    assert r.median == pytest.approx(expect["median"], rel=1e-5)
    assert r.p99 == pytest.approx(expect["p99"], rel=1e-5)
    assert 1e-9 < r.median < 1e-6
    ops.close()


def test_a_tree_in_key_order_against_fp64_and_its_colours_are_in_load_order(backend):
    r, ops = compared(loaded(backend, "tree", theta=1.0), "fp64", colour=True)
    acc = backend.accelerations()  # load order
    errors = relative_errors(acc, reference(backend))
    assert r.median == pytest.approx(float(np.median(errors)), rel=1e-5) and r.median > 1e-4
    colours = ops.paint()  # no GL attached: the host copy
    assert colours is not None and colours.shape == (N,)
    np.testing.assert_allclose(colours, error_positions(errors), atol=1e-4)
    ops.close()


def test_b_a_tree_on_an_fp32_state_and_the_exact_sum_in_pieces(backend):
    loaded(backend, "tree", theta=1.0)
    backend.set_kernel("shared")  # B runs with the tunables set for it (theta 1.0)
    r, ops = compared(backend, "tree")
    assert r is not None and r.kernel_a == "shared" and r.median > 1e-4
    exact = ExactErrors()
    exact.rows = 500  # pieces of 500 targets at first
    while exact.tick(ops, key_of(backend), backend.time) is None:
        assert exact.progress is not None
    s = exact.latest
    errors = relative_errors(backend.accelerations(), reference(backend))
    assert s.frames >= 2 and s.cost_ms > 0 and s.median == pytest.approx(float(np.median(errors)), rel=1e-5)
    np.testing.assert_allclose(ops.paint(), error_positions(errors), atol=1e-4)
    ops.close()


def test_the_state_is_bitwise_that_of_a_run_without_ab(backend):
    plain = cuda()
    try:
        for kernel, other, tunables in (("tree", "fp64", {"rebuild_every": 4}), ("shared", "tree", {})):
            loaded(plain, kernel, **tunables)
            loaded(backend, kernel, **tunables)
            ops = backend.compare_ops()
            ab, exact = ABCompare(), ExactErrors()
            ab.kernel_b, ab.colour = other, True
            for _ in range(6):
                plain.step(1)
                ab.observe_step(backend.step(1))
                ab.tick(ops, key_of(backend), backend.time, backend.n)
                exact.tick(ops, key_of(backend), backend.time)
                ops.paint()
            a, b = plain.state(), backend.state()
            assert a.pos.tobytes() == b.pos.tobytes() and a.vel.tobytes() == b.vel.tobytes(), kernel
            ops.close()
    finally:
        plain.close()


@pytest.mark.gl
def test_with_interop_the_colours_are_copied_into_the_speed_vbo(egl_canvas, backend):
    loaded(backend, "tree", theta=1.0)
    _pv, pos_name = gl_vbo(egl_canvas, np.zeros((N, 4), np.float32))
    _sv, speed_name = gl_vbo(egl_canvas, np.zeros((N, 1), np.float32))
    assert backend.attach_gl_buffers(pos_name, speed_name), backend.data_path
    _, ops = compared(backend, "fp64", colour=True)
    assert ops.paint() is None  # written on the device
    expect = error_positions(relative_errors(backend.accelerations(), reference(backend)))
    np.testing.assert_allclose(read_gl(egl_canvas, speed_name, 4 * N), expect, atol=1e-4)
    backend.step(1)  # a step's copies put the speeds back ...
    ops.paint()  # ... and the paint after it the colours
    np.testing.assert_allclose(read_gl(egl_canvas, speed_name, 4 * N), expect, atol=1e-4)
    ops.close()
