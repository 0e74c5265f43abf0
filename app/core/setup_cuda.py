"""Install pycuda built WITH CUDA–GL interop, when this machine has an NVIDIA driver (run by `make`).

PyPI's pycuda is an sdist whose default build has no GL support, and the viewer's whole data path
(CUDA kernels writing the vertex buffer OpenGL draws) needs `pycuda.gl`. So: fetch the sdist with pip
(which honours PIP_FIND_LINKS / PIP_NO_INDEX for offline machines), run its `configure.py
--cuda-enable-gl`, build a wheel once and keep it in the user cache, keyed by pycuda version, Python
ABI and CUDA version, then install that wheel.

It also installs CuPy (`cupy-cuda<major>x` for the toolkit's CUDA major version), whose device radix sort
the GPU tree code (`--kernel tree`) uses; without it every other CUDA kernel still works and `tree` says
what to install. And NCCL's runtime wheel (`nvidia-nccl-cu<major>`), which `--exchange nccl` loads
through CuPy's binding (app/backends/cuda/nccl.py); without it the other exchanges work and `info` says
what to install. And cuda-core (`cuda-core[cu<major>]`), whose NVRTC compiles a saved kernel file for
the viewer's hot reload; without it nvcc does, slower.

Machines without an NVIDIA driver skip all of this silently: the CPU backend needs none of it.
Missing build prerequisites (nvcc, GL/gl.h) are named with the package that provides them, and the
setup carries on without CUDA rather than failing `make`.

    python -m app.core.setup_cuda            # what `make run` / `make test` call
    python -m app.core.setup_cuda --force    # rebuild even if a GL-enabled pycuda imports already
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from pathlib import Path

PYCUDA_SPEC = os.environ.get("NBODY_PYCUDA_SPEC", "pycuda>=2024.1")


def say(msg: str) -> None:
    print(f"setup-cuda: {msg}", flush=True)


def nvidia_driver_present() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def pycuda_gl_works() -> bool:
    """True when the installed pycuda imports and was built with GL (pycuda.gl's extension loads)."""
    code = "import pycuda.driver, pycuda.gl, pycuda._driver as d; assert hasattr(d, 'RegisteredBuffer')"
    return subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def find_cuda_root() -> Path | None:
    nvcc = shutil.which("nvcc")
    for cand in filter(
        None,
        [
            os.environ.get("CUDA_HOME"),
            os.environ.get("CUDA_PATH"),
            nvcc and str(Path(nvcc).resolve().parent.parent),
            "/usr/local/cuda",
        ],
    ):
        if (Path(cand) / "bin" / "nvcc").exists():
            return Path(cand)
    return None


def cuda_version(root: Path) -> str:
    out = subprocess.run([str(root / "bin" / "nvcc"), "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release (\d+\.\d+)", out)
    return m.group(1) if m else "unknown"


def gl_header_present() -> bool:
    dirs = ["/usr/include", "/usr/local/include", *os.environ.get("CPATH", "").split(":")]
    return any((Path(d) / "GL" / "gl.h").exists() for d in dirs if d)


def cache_dir() -> Path:
    try:
        from platformdirs import user_cache_dir

        return Path(user_cache_dir("nbody-live")) / "wheels"
    except ImportError:
        return Path.home() / ".cache" / "nbody-live" / "wheels"


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], check=True)


def missing_build_tools() -> list[str]:
    """setuptools and numpy if absent; `wheel` only for setuptools too old to build wheels itself."""
    import importlib.util

    missing = [m for m in ("setuptools", "numpy") if importlib.util.find_spec(m) is None]
    if (
        "setuptools" not in missing
        and importlib.util.find_spec("setuptools.command.bdist_wheel") is None
        and importlib.util.find_spec("wheel") is None
    ):
        missing.append("wheel")
    return missing


def build_wheel(cuda_root: Path, dest: Path) -> Path:
    with tempfile.TemporaryDirectory(prefix="pycuda-build-") as tmp_name:
        tmp = Path(tmp_name)
        # Build tools come from this environment, not an isolated one: offline (PIP_NO_INDEX) there is
        # no index to fill an isolated build environment from, even to read the sdist's metadata.
        missing = missing_build_tools()
        if missing:
            pip("install", "--quiet", *missing)
        say(f"fetching the pycuda sdist ({PYCUDA_SPEC})")
        pip(
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--no-build-isolation",
            "-d",
            str(tmp),
            PYCUDA_SPEC,
        )
        sdist = next(tmp.glob("pycuda-*.tar.gz"))
        with tarfile.open(sdist) as tf:
            tf.extractall(tmp, filter="data")
        src = next(p for p in tmp.iterdir() if p.is_dir() and p.name.startswith("pycuda-"))
        say(f"configuring {src.name} with --cuda-enable-gl (CUDA at {cuda_root})")
        subprocess.run(
            [sys.executable, "configure.py", f"--cuda-root={cuda_root}", "--cuda-enable-gl"],
            cwd=src,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        say("building the pycuda wheel (a few minutes, once; cached afterwards)")
        pip("wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist"), str(src))
        built = next((tmp / "dist").glob("pycuda-*.whl"))
        dest.mkdir(parents=True, exist_ok=True)
        final = dest / built.name
        shutil.copy2(built, final)
        return final


def cuda_major(cuda_root: Path | None) -> str:
    """The toolkit's CUDA major version, for the `-cu<major>` wheels (13 when unknown)."""
    major = cuda_version(cuda_root).split(".")[0] if cuda_root is not None else ""
    return major if major.isdigit() else "13"


def install_wheel(spec: str, check: str, purpose: str, without: str) -> None:
    """pip install `spec` unless the Python line `check` already runs; a failure is said, never fatal
    (`without`: what still works, and what the wheel would enable)."""
    if subprocess.run([sys.executable, "-c", check], capture_output=True).returncode == 0:
        return
    say(f"installing {spec} ({purpose})")
    try:
        pip("install", "--quiet", spec)
    except subprocess.CalledProcessError as e:
        say(f"installing {spec} failed ({e}): {without}; `pip install {spec}` enables it")


def install_cupy(cuda_root: Path | None) -> None:
    """CuPy for the tree's device sort (and the NCCL binding), matching the toolkit's major version."""
    install_wheel(
        f"cupy-cuda{cuda_major(cuda_root)}x",
        "import cupy",
        "the GPU tree code's device sort",
        "every CUDA kernel but `tree` works",
    )


def install_nccl(cuda_root: Path | None) -> None:
    """NCCL's runtime wheel for `--exchange nccl` (several GPUs), matching the toolkit's major version."""
    spec = f"nvidia-nccl-cu{cuda_major(cuda_root)}"
    install_wheel(
        spec,
        f"from importlib.metadata import version; version({spec!r})",
        "--exchange nccl between several GPUs",
        "the peer and host exchanges work, not nccl",
    )


def install_cuda_core(cuda_root: Path | None) -> None:
    """cuda-core, whose NVRTC `Program` compiles a saved kernel file for the viewer's hot reload
    (app/backends/cuda/reload_build.py: 0.30 s a save against nvcc's 0.71 s on an H200 machine)."""
    install_wheel(
        f"cuda-core[cu{cuda_major(cuda_root)}]",
        "from cuda.core import Program",
        "the hot reload's compiler (NVRTC)",
        "a saved kernel file is compiled by nvcc instead (slower)",
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m app.core.setup_cuda",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--force", action="store_true", help="rebuild even when pycuda with GL already works")
    args = ap.parse_args(argv)

    if not nvidia_driver_present():
        return 0  # no NVIDIA driver: the CPU backend is used; nothing to say
    install_cupy(find_cuda_root())
    install_nccl(find_cuda_root())
    install_cuda_core(find_cuda_root())
    if pycuda_gl_works() and not args.force:
        return 0
    cuda_root = find_cuda_root()
    if cuda_root is None:
        say(
            "an NVIDIA driver is present but nvcc is not: install the CUDA toolkit (Debian: "
            "nvidia-cuda-toolkit, or NVIDIA's cuda-toolkit package) and put nvcc on PATH, then rerun "
            "`make`. Continuing with the CPU backend."
        )
        return 0
    if not gl_header_present():
        say(
            "GL/gl.h is missing, so pycuda cannot be built with GL interop: install libgl-dev "
            "(Debian/Ubuntu), then rerun `make`. Continuing with the CPU backend."
        )
        return 0
    abi = sysconfig.get_config_var("SOABI") or "py"
    key = cache_dir() / f"cuda{cuda_version(cuda_root)}-{abi}-gl"
    cached = sorted(key.glob("pycuda-*.whl"))
    try:
        wheel = cached[-1] if cached and not args.force else build_wheel(cuda_root, key)
        say(f"installing {wheel.name} (built with GL interop) from {key}")
        pip("install", "--quiet", "--force-reinstall", "--no-deps", str(wheel))
        pip("install", "--quiet", "pytools", "mako", "platformdirs")
    except (subprocess.CalledProcessError, StopIteration) as e:
        say(
            f"building pycuda with GL failed ({e}); the CUDA backend stays unavailable and "
            "`nbody-live info` says why. Rerun with `python -m app.core.setup_cuda --force` to retry."
        )
        return 0
    if not pycuda_gl_works():
        say("pycuda installed but `import pycuda.gl` still fails; see `nbody-live info`")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
