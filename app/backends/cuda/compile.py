"""Compile kernels/*.cu to cubins with nvcc, cached on disk; no pycuda needed (CI runs this too).

Every file is compiled whole (`nvcc -cubin -arch=sm_XY -O3 --use_fast_math ... -Xptxas -v`, or the
options its record's launch policy names: the baseline shared.cu is built without --use_fast_math, as
NVIDIA's samples build it; or, for a kernels/ file no record launches, its own in FILE_OPTIONS) with
kernels/ on the include path, so each variant sees the one `common.cuh`. The cubin and ptxas's
resource report (registers, stack frame, spills per entry) are cached in the user cache dir
(platformdirs; `NBODY_CACHE_DIR` overrides), keyed by a hash of the .cu, every header beside it, the
options, the arch and nvcc's version: editing common.cuh recompiles every variant.

A compile failure raises KernelCompileError carrying nvcc's own output, which names the file and line.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from app.backends.cuda.errors import KernelCompileError
from app.core import paths
from app.core.paths import KERNELS

NVCC_OPTIONS: tuple[str, ...] = ("-O3", "--use_fast_math", "-std=c++17", "-lineinfo")
# kernels/ files built with options of their own whenever the caller names none (a force kernel's come
# from its record's policy). splat.cu: its projection must round as its numba twin's (app/render/splat.py),
# so no FMA contraction and no fast math (approximate division, subnormals flushed to zero).
FILE_OPTIONS: dict[str, tuple[str, ...]] = {
    "splat.cu": ("-O3", "-fmad=false", "-std=c++17", "-lineinfo"),
}
COMPILE_TIMEOUT_S = 600
_HEADER_GLOBS = ("*.cuh", "*.h", "*.hpp")


# --- the compiler -------------------------------------------------------------------------------------
def find_nvcc() -> str | None:
    """nvcc from $NBODY_NVCC, PATH, $CUDA_HOME / $CUDA_PATH, /usr/local/cuda, newest /usr/local/cuda-*."""
    explicit = os.environ.get("NBODY_NVCC")
    if explicit:
        return explicit if Path(explicit).is_file() else None
    found = shutil.which("nvcc")
    if found:
        return found
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    roots += sorted(glob.glob("/usr/local/cuda-*"), reverse=True)
    for root in filter(None, roots):
        cand = Path(root) / "bin" / "nvcc"
        if cand.is_file():
            return str(cand)
    return None


@functools.lru_cache(maxsize=8)
def nvcc_version(nvcc: str) -> str:
    """The last line of `nvcc --version` (e.g. 'Build cuda_13.0.r13.0/compiler.36424714_0')."""
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return f"unknown ({e})"
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    return " | ".join(lines[-2:]) if lines else "unknown"


def arch_for(compute_capability: tuple[int, int]) -> str:
    """'sm_90' for (9, 0)."""
    major, minor = compute_capability
    return f"sm_{major}{minor}"


def cache_dir() -> Path:
    return paths.cache_dir("cuda")


# --- ptxas's report -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FunctionResources:
    """What ptxas -v says about one entry function."""

    name: str
    registers: int = 0
    stack_frame: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    barriers: int = 0
    shared_bytes: int = 0  # static shared memory only (dynamic tiles are not in the report)

    def problems(self) -> list[str]:
        out = []
        if self.spill_stores or self.spill_loads:
            out.append(
                f"{self.name}: {self.spill_stores} bytes spill stores, {self.spill_loads} bytes spill loads"
            )
        if self.stack_frame:
            out.append(f"{self.name}: {self.stack_frame} bytes stack frame")
        return out


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_BARRIERS = re.compile(r"used (\d+) barriers")
_SMEM = re.compile(r"(\d+) bytes smem")


def parse_ptxas(log: str) -> dict[str, FunctionResources]:
    """Entry name -> resources, from `-Xptxas -v` output (sm_70+ format)."""
    found: dict[str, dict] = {}
    entry = props = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            entry = m.group(1)
            found.setdefault(entry, {"name": entry})
            continue
        if m := _PROPS.search(line):
            props = m.group(1)
            continue
        if (m := _FRAME.search(line)) and props is not None:
            target = found.setdefault(props, {"name": props})
            target.update(
                stack_frame=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3))
            )
            continue
        if (m := _USED.search(line)) and entry is not None:
            rec = found[entry]
            rec["registers"] = int(m.group(1))
            if b := _BARRIERS.search(line):
                rec["barriers"] = int(b.group(1))
            if s := _SMEM.search(line):
                rec["shared_bytes"] = int(s.group(1))
    return {name: FunctionResources(**fields) for name, fields in found.items()}


@dataclass
class CompiledModule:
    path: Path
    arch: str
    cubin: bytes
    log: str  # nvcc + ptxas output (warnings, the -v report)
    functions: dict[str, FunctionResources] = field(default_factory=dict)
    cached: bool = False
    key: str = ""

    def problems(self) -> list[str]:
        """Register spills and stack frames: each one is a performance bug in a hot kernel."""
        return [p for f in self.functions.values() for p in f.problems()]


# --- compiling ------------------------------------------------------------------------------------------
def resolve_source(source: str | os.PathLike) -> Path:
    """A registry `source` ('shared.cu') is relative to kernels/; an absolute path is taken as is."""
    path = Path(source)
    return path if path.is_absolute() else KERNELS / path


def default_options(path: Path) -> tuple[str, ...]:
    """The options a kernels/ file is built with when the caller names none."""
    own = FILE_OPTIONS.get(path.name) if path.resolve().parent == KERNELS.resolve() else None
    return NVCC_OPTIONS if own is None else own


def _include_dirs(path: Path, extra) -> list[Path]:
    dirs = [KERNELS, path.parent, *(Path(d) for d in (extra or ()))]
    out: list[Path] = []
    for d in dirs:
        d = d.resolve()
        if d not in out:
            out.append(d)
    return out


def cache_key(path: Path, arch: str, options, include_dirs, nvcc: str) -> str:
    h = hashlib.sha256()
    h.update(f"nvcc={nvcc_version(nvcc)}\narch={arch}\noptions={' '.join(options)}\n".encode())
    h.update(b"source\0" + path.read_bytes())
    for d in include_dirs:
        for pattern in _HEADER_GLOBS:
            for header in sorted(d.glob(pattern)):
                h.update(f"\0{header.name}\0".encode() + header.read_bytes())
    return h.hexdigest()


def compile_file(
    source: str | os.PathLike,
    arch: str,
    options=None,
    include_dirs=None,
    use_cache: bool = True,
    nvcc: str | None = None,
) -> CompiledModule:
    """Compile one .cu to a cubin for `arch` (e.g. 'sm_90'); served from the disk cache when unchanged.

    `options` None: the file's own (FILE_OPTIONS) or NVCC_OPTIONS."""
    path = resolve_source(source)
    if not path.is_file():
        raise KernelCompileError(path, arch, -1, f"{path}: no such kernel file")
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        raise KernelCompileError(
            path, arch, -1, "nvcc not found (install the CUDA toolkit, or set CUDA_HOME or NBODY_NVCC)"
        )
    dirs = _include_dirs(path, include_dirs)
    options = tuple(default_options(path) if options is None else options)
    key = cache_key(path, arch, options, dirs, nvcc)
    stem = f"{path.stem}-{arch}-{key[:24]}"
    cdir = cache_dir()
    if use_cache:
        hit = _read_cache(cdir, stem, path, arch, key)
        if hit is not None:
            return hit
    with tempfile.TemporaryDirectory(prefix="nbody-nvcc-") as tmp:
        out = Path(tmp) / f"{path.stem}.cubin"
        cmd = [nvcc, "-cubin", f"-arch={arch}", *options, "-Xptxas", "-v"]
        for d in dirs:
            cmd += ["-I", str(d)]
        cmd += ["-o", str(out), str(path)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S, cwd=tmp)
        except subprocess.TimeoutExpired as e:
            msg = f"nvcc timed out after {COMPILE_TIMEOUT_S} s"
            raise KernelCompileError(path, arch, -1, msg, cmd) from e
        except OSError as e:
            raise KernelCompileError(path, arch, -1, f"cannot run {nvcc}: {e}", cmd) from e
        log = (proc.stdout + proc.stderr).strip()
        if proc.returncode != 0 or not out.is_file():
            raise KernelCompileError(path, arch, proc.returncode, log, cmd)
        cubin = out.read_bytes()
    module = CompiledModule(
        path=path, arch=arch, cubin=cubin, log=log, functions=parse_ptxas(log), cached=False, key=key
    )
    if use_cache:
        _write_cache(cdir, stem, module)
    return module


def _read_cache(cdir: Path, stem: str, path: Path, arch: str, key: str) -> CompiledModule | None:
    try:
        cubin = (cdir / f"{stem}.cubin").read_bytes()
        meta = json.loads((cdir / f"{stem}.json").read_text())
        if meta.get("key") != key:
            return None
        functions = {name: FunctionResources(**f) for name, f in meta.get("functions", {}).items()}
    except (OSError, ValueError, TypeError):
        return None
    return CompiledModule(
        path=path, arch=arch, cubin=cubin, log=meta.get("log", ""), functions=functions, cached=True, key=key
    )


def _write_cache(cdir: Path, stem: str, module: CompiledModule) -> None:
    """Atomic (app.core.outputs): concurrent processes never read half a cubin."""
    from app.core.errors import RuntimeFault
    from app.core.outputs import atomic_write

    try:
        cdir.mkdir(parents=True, exist_ok=True)
        meta = {
            "key": module.key,
            "source": str(module.path),
            "arch": module.arch,
            "log": module.log,
            "functions": {name: asdict(f) for name, f in module.functions.items()},
        }
        for suffix, data in ((".cubin", module.cubin), (".json", json.dumps(meta, indent=1).encode())):
            with atomic_write(cdir / f"{stem}{suffix}", "wb", "compiled kernel") as f:
                f.write(data)
    except (OSError, RuntimeFault):
        pass  # a read-only cache only costs a recompile next time


def kernel_files() -> list[Path]:
    return sorted(KERNELS.glob("*.cu"))
