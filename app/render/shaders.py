"""GLSL files loaded by name from shaders/, compiled with errors that name the file.

`build_program("particles.vert", "particles.frag")` compiles each stage first with plain GL calls (so a
failure carries the driver's info log and the file it came from), then hands the sources to a
`vispy.gloo.Program`, forcing its compile and link at once rather than at the first draw. Needs a current
GL context (a vispy Canvas that was `set_current()`).
"""

from __future__ import annotations

from pathlib import Path

from app.core.errors import RuntimeFault
from app.core.paths import SHADERS


class ShaderError(RuntimeFault):
    """A GLSL file failed to compile or link; the message names the file(s) and quotes the info log."""

    def __init__(self, message: str, files: tuple[str, ...] = (), log: str = ""):
        super().__init__(message)
        self.files = files
        self.log = log


def load_source(name: str, directory: str | Path | None = None) -> tuple[str, Path]:
    """(source text, path) of shaders/<name>; a missing file raises ShaderError naming it."""
    path = (Path(directory) if directory is not None else SHADERS) / name
    try:
        return path.read_text(encoding="utf-8"), path
    except OSError as e:
        raise ShaderError(f"cannot read shader {path}: {e.strerror or e}", (str(path),)) from e


def _decode(v) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes | bytearray) else str(v or "")


def check_compile(source: str, stage: str, path: Path | str) -> None:
    """Compile one stage ('vertex' or 'fragment') in the current context; raise ShaderError on failure."""
    from vispy.gloo import gl
    from vispy.gloo.glir import convert_shader

    target = gl.GL_VERTEX_SHADER if stage == "vertex" else gl.GL_FRAGMENT_SHADER
    code = convert_shader("desktop", source)  # what vispy itself will hand to the driver
    handle = gl.glCreateShader(target)
    try:
        gl.glShaderSource(handle, code)
        gl.glCompileShader(handle)
        if not gl.glGetShaderParameter(handle, gl.GL_COMPILE_STATUS):
            log = _decode(gl.glGetShaderInfoLog(handle)).strip()
            first = log.splitlines()[0] if log else "(the driver gave no info log)"
            raise ShaderError(
                f"GLSL {stage} shader {path} failed to compile: {first}\n{log}", (str(path),), log
            )
    finally:
        gl.glDeleteShader(handle)


def build_program(vert: str, frag: str, directory: str | Path | None = None, canvas=None):
    """A linked `gloo.Program` from two shader files (names under shaders/ or `directory`)."""
    from vispy import gloo
    from vispy.app import Canvas

    vsrc, vpath = load_source(vert, directory)
    fsrc, fpath = load_source(frag, directory)
    check_compile(vsrc, "vertex", vpath)
    check_compile(fsrc, "fragment", fpath)
    program = gloo.Program(vsrc, fsrc)
    canvas = canvas or gloo.get_current_canvas()
    if isinstance(canvas, Canvas) or hasattr(canvas, "context"):
        try:
            canvas.context.glir.associate(program.glir)
            canvas.context.flush_commands()
        except RuntimeError as e:
            raise ShaderError(
                f"GLSL program {vpath.name} + {fpath.name} failed to link: {e}",
                (str(vpath), str(fpath)),
                str(e),
            ) from e
    return program


def reload_shaders(program, vert: str, frag: str, directory: str | Path | None = None, canvas=None) -> None:
    """`program`'s two stages read again from their files and compiled in place, its variables (uniforms,
    textures, buffers: vispy keeps them across `set_shaders`) kept. ShaderError, the program as it was,
    when a stage does not compile or the two do not link: the viewer keeps drawing (the hot reload's
    shader half, app/ui/reload_actions.py)."""
    from vispy import gloo

    vsrc, vpath = load_source(vert, directory)
    fsrc, fpath = load_source(frag, directory)
    check_compile(vsrc, "vertex", vpath)
    check_compile(fsrc, "fragment", fpath)
    old = list(program.shaders)[:2]  # (their source text)
    canvas = canvas or gloo.get_current_canvas()
    program.set_shaders(vsrc, fsrc)
    try:
        canvas.context.flush_commands()
    except RuntimeError as e:
        program.set_shaders(*old)
        canvas.context.flush_commands()
        raise ShaderError(
            f"GLSL program {vpath.name} + {fpath.name} failed to link: {e}", (str(vpath), str(fpath)), str(e)
        ) from e
