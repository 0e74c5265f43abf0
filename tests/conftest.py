"""Shared test helpers: the GPU skip (every `gpu`-marked test skips with the CUDA backend's own reason
where it cannot run: written once, here), the published data sets in ../shared/data (skipped cleanly
when absent), and an NVIDIA EGL context with VBOs for the CUDA-GL interop tests (and reading them back)."""

import os
from pathlib import Path

import numpy as np
import pytest

from app.backends.cuda.compile import find_nvcc
from app.core.paths import SHARED_DATA

# compile-only tests (PTX, SASS of the kernels) need nvcc, not a GPU: CI has nvcc, and no GPU
needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found (CUDA toolkit not installed)")


def pytest_collection_modifyitems(config, items):
    """`gpu`-marked tests skip, with the reason the CUDA backend gives, where it cannot run."""
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu:
        return
    from app.backends import backend_class

    reason = backend_class("cuda").why_not()
    if reason is not None:
        for item in gpu:
            item.add_marker(pytest.mark.skip(reason=f"CUDA unavailable: {reason}"))


@pytest.fixture
def shared_data() -> Path:
    """The shared data folder (it may be absent; use `shared_file` to skip on a missing file)."""
    return SHARED_DATA


def shared_file(name: str) -> Path:
    """Path of a shared data file; skips the calling test, saying which file, when it is absent."""
    path = SHARED_DATA / name
    if not path.is_file():
        pytest.skip(f"shared data file {path} is absent")
    return path


@pytest.fixture(scope="module")
def egl_canvas():
    os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
    try:
        from vispy import app

        app.use_app("egl")
        canvas = app.Canvas(show=False, size=(64, 64))
    except Exception as e:
        pytest.skip(f"no vispy EGL context: {e}")
    canvas.set_current()
    from OpenGL import GL

    renderer = GL.glGetString(GL.GL_RENDERER)
    renderer = renderer.decode() if isinstance(renderer, bytes) else str(renderer)
    if "nvidia" not in renderer.lower():
        canvas.close()
        pytest.skip(f"the EGL context renders with {renderer!r}: CUDA-GL interop needs NVIDIA's EGL")
    yield canvas
    canvas.close()


def gl_vbo(canvas, data: np.ndarray):
    """A gloo.VertexBuffer holding `data`, and its GL name (after the GLIR queue was flushed)."""
    from vispy import gloo

    vbo = gloo.VertexBuffer(np.ascontiguousarray(data, dtype=np.float32))
    canvas.set_current()
    canvas.context.glir.associate(vbo.glir)
    canvas.context.flush_commands()
    name = canvas.context.shared.parser.get_object(vbo.id).handle
    return vbo, int(name)


def read_gl(canvas, name: int, nbytes: int) -> np.ndarray:
    """The buffer's bytes as GL sees them (glGetBufferSubData), as float32."""
    from OpenGL import GL

    canvas.set_current()
    for _ in range(16):  # drop errors left by earlier GL calls
        if GL.glGetError() == GL.GL_NO_ERROR:
            break
    out = np.zeros(nbytes, dtype=np.uint8)
    GL.glBindBuffer(GL.GL_ARRAY_BUFFER, name)
    try:
        GL.glGetBufferSubData(GL.GL_ARRAY_BUFFER, 0, nbytes, out)
    finally:
        GL.glBindBuffer(GL.GL_ARRAY_BUFFER, 0)
    assert GL.glGetError() == GL.GL_NO_ERROR
    return out.view(np.float32)


def one_line_error(capsys, rc, code, *words) -> str:
    """Asserts a CLI failure: exit status `code`, one line on stderr with every word, no traceback."""
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == code and len(lines) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]
