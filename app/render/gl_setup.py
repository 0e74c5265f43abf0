"""Choose how vispy gets an OpenGL context: a glfw window, or headless EGL.

Call `configure()` before anything imports `OpenGL` or `vispy.gloo`: the environment it sets
(`PYOPENGL_PLATFORM`, `EGL_PLATFORM`) is read once, at import time, by PyOpenGL and by Mesa's EGL.

* A display ($DISPLAY or $WAYLAND_DISPLAY) that answers, and not forced headless: vispy's glfw backend
  (a real window). A display named but not there (a stale $DISPLAY over SSH or in a container) counts as
  none: `display_problem()` says why, and the callers fall back to EGL with one log line.
* Otherwise: vispy's egl backend. PyOpenGL is told `PYOPENGL_PLATFORM=egl`. On Mesa (no NVIDIA EGL vendor
  file) `EGL_PLATFORM=surfaceless` is set, because Mesa's default EGL display needs an X/Wayland server;
  on NVIDIA the default EGL display already works headless and nothing is overridden.
  Variables the user already set are never overridden.

`NBODY_HEADLESS=1` in the environment forces headless when `configure()` is given `headless=None`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import logging
import os
import sys
import time

from app.core.errors import ConfigError

log = logging.getLogger(__name__)

_EGL_VENDOR_DIRS = (
    "/usr/share/glvnd/egl_vendor.d",
    "/etc/glvnd/egl_vendor.d",
    "/usr/local/share/glvnd/egl_vendor.d",
)

_chosen: str | None = None

# An X server under load closes some new connections at once (Xvfb under a test suite's xdotool calls
# and screen grabs, for up to a second): a display is declared gone, and a window given up, only after a
# few tries. A display that is not there at all fails each try at once (no socket).
CONNECT_ATTEMPTS = 4
CONNECT_PAUSE_S = 0.3


def has_display() -> bool:
    """True when a window system is named ($DISPLAY or $WAYLAND_DISPLAY) and answers."""
    return display_problem() is None


def display_problem() -> str | None:
    """None when a window can be opened; otherwise why not, in a few words for a log line."""
    return _display_problem(
        os.environ.get("DISPLAY", ""),
        os.environ.get("WAYLAND_DISPLAY", ""),
        os.environ.get("XDG_RUNTIME_DIR", ""),
    )


@functools.cache
def _display_problem(x11: str, wayland: str, runtime_dir: str) -> str | None:
    if not x11 and not wayland:
        return "no display: $DISPLAY and $WAYLAND_DISPLAY are unset"
    problems = []
    if wayland:  # a compositor listens on a socket: its name, relative to $XDG_RUNTIME_DIR
        if os.path.exists(os.path.join(runtime_dir, wayland)):
            return None
        problems.append(f"no Wayland socket {wayland!r} in {runtime_dir or '$XDG_RUNTIME_DIR (unset)'}")
    if x11:
        why = _x11_problem(x11)
        if why is None:
            return None
        problems.append(why)
    return "; ".join(problems)


def _x11_problem(name: str) -> str | None:
    """Open and close the X display as glfw would; None if it answers (or libX11 is not there to ask:
    then glfw, which needs it too, has the last word)."""
    lib = ctypes.util.find_library("X11")
    if not lib:
        return None
    try:
        x11 = ctypes.CDLL(lib)
    except OSError:
        return None
    x11.XOpenDisplay.restype = ctypes.c_void_p
    x11.XOpenDisplay.argtypes = [ctypes.c_char_p]
    x11.XCloseDisplay.argtypes = [ctypes.c_void_p]
    for attempt in range(CONNECT_ATTEMPTS):
        if attempt:
            time.sleep(CONNECT_PAUSE_S)
        dpy = x11.XOpenDisplay(name.encode())
        if dpy:
            x11.XCloseDisplay(dpy)
            return None
    return f"cannot open display $DISPLAY={name!r} (no X server answers there)"


def nvidia_egl_present() -> bool:
    """True when glvnd will hand EGL to NVIDIA's driver (an NVIDIA vendor file, or a forced vendor list)."""
    forced = os.environ.get("__EGL_VENDOR_LIBRARY_FILENAMES", "")
    if forced:
        return "nvidia" in forced.lower()
    dirs = [d for d in os.environ.get("__EGL_VENDOR_LIBRARY_DIRS", "").split(":") if d] or _EGL_VENDOR_DIRS
    files = (f for d in dirs for f in glob.glob(os.path.join(d, "*.json")))
    return any("nvidia" in os.path.basename(f).lower() for f in files)


def wants_headless(headless: bool | None = None) -> bool:
    """Resolve `headless=None` (auto): headless when forced by NBODY_HEADLESS=1 or when no display exists."""
    if headless is not None:
        return bool(headless)
    if os.environ.get("NBODY_HEADLESS", "").strip().lower() in ("1", "true", "yes"):
        return True
    return not has_display()


def _egl_environment() -> None:
    if "OpenGL" in sys.modules and os.environ.get("PYOPENGL_PLATFORM") != "egl":
        log.warning(
            "PyOpenGL was imported before the EGL setup; its GL entry points may not resolve "
            "(import app.render.gl_setup and call configure() first)"
        )
    if display_problem() and (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        # named but not there: hide it from what follows (vispy's DPI probe runs xdpyinfo on $DISPLAY,
        # Mesa may try it), so that a stale display behaves exactly as none
        for name in ("DISPLAY", "WAYLAND_DISPLAY"):
            os.environ.pop(name, None)
    os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
    if "EGL_PLATFORM" not in os.environ and not nvidia_egl_present():
        os.environ["EGL_PLATFORM"] = "surfaceless"


def configure(headless: bool | None = None) -> str:
    """Select vispy's app backend once per process; return 'glfw' or 'egl'.

    Idempotent: a later call with `headless=None` or asking for the same kind returns the kind chosen
    first; asking for the other kind raises RuntimeError (vispy allows one app backend per process).
    """
    global _chosen
    if headless is None and _chosen is not None:
        return _chosen
    name = "egl" if wants_headless(headless) else "glfw"
    if _chosen is not None:
        if _chosen != name:
            raise RuntimeError(
                f"the GL backend is already {_chosen!r} in this process; cannot switch to "
                f"{name!r} (start a new process, e.g. with NBODY_HEADLESS=1)"
            )
        return _chosen
    if name == "egl":
        _egl_environment()
    try:
        import vispy
    except ImportError as e:  # a broken environment: one line, not a traceback
        raise ConfigError(
            f"drawing needs vispy, which does not import here ({e}); `make` installs it"
        ) from None
    vispy.use(app=name)
    _chosen = name
    return name


def backend_name() -> str | None:
    """'glfw', 'egl', or None before `configure()`."""
    return _chosen


def gl_info(canvas=None) -> dict:
    """Renderer, version, vendor and GLSL version of a GL context, plus the vispy backend that made it.

    With `canvas` None a small hidden canvas is created (and closed) just to ask; needs `configure()` first
    (called with auto-detection if not).
    """
    from vispy import app, gloo

    if _chosen is None:
        configure()
    own = canvas is None
    if own:
        canvas = app.Canvas(size=(64, 64), show=False)
    try:
        canvas.set_current()
        gl = gloo.gl
        info = {
            "renderer": gl.glGetParameter(gl.GL_RENDERER),
            "version": gl.glGetParameter(gl.GL_VERSION),
            "vendor": gl.glGetParameter(gl.GL_VENDOR),
            "glsl": gl.glGetParameter(gl.GL_SHADING_LANGUAGE_VERSION),
            "backend": _chosen,
        }
    finally:
        if own:
            canvas.close()
    info = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in info.items()}
    info["software"] = is_software_renderer(info["renderer"])
    return info


def is_software_renderer(renderer: str) -> bool:
    """llvmpipe / softpipe / swrast: Mesa's CPU rasterisers (CUDA-GL interop cannot work there)."""
    r = (renderer or "").lower()
    return any(s in r for s in ("llvmpipe", "softpipe", "swrast", "software"))


def gl_name(canvas, obj) -> int:
    """The GL name of vispy gloo object `obj` (a buffer, texture or framebuffer) in `canvas`'s context, for
    CUDA-GL interop or raw GL calls: its GLIR commands are flushed first, so that it exists in GL with its
    size."""
    ctx = canvas.context
    ctx.glir.associate(obj.glir)
    ctx.flush_commands()
    return int(ctx.shared.parser.get_object(obj.id).handle)
