"""The hot reload's compile of a kernel file (issue 27, item 2): only the form the run launches (its
model and self term: one of the four entries NBODY_FORCE_ENTRIES defines, `-DNBODY_ONE_FORM=i`), to a
cubin, by NVRTC (cuda.core's `Program`) where cuda-core imports, else by nvcc, with today's options
either way (-O3, --use_fast_math unless the policy leaves it out, -std=c++17, -lineinfo; ptxas's -v
resource report kept).

Why one form and why NVRTC, measured on an H200 machine (32 cores) with a `new-kernel` starter
(bench/reload_compile.py; bench/results/h200-2026-11-26-reload-compile.txt, medians of 5): nvcc took
2.15 s for the whole file and 0.71 s for one form; NVRTC 1.23 s and 0.30 s. ptxas takes ~0.1 s per
entry, so one form by NVRTC leaves room in the 1.5 s from save to swap for the trial. (The four forms on
four threads by NVRTC took 0.55 s.) The other three forms are compiled after the swap, in the
background, by the ordinary nvcc path (its disk cache): a physics change that needs another form loads
it from there.
"""

from __future__ import annotations

import io
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from app.backends.cuda.compile import FunctionResources, compile_file, default_options, parse_ptxas
from app.backends.cuda.errors import KernelCompileError
from app.backends.cuda.policy_base import FORMS, force_arguments
from app.backends.cuda.user_kernels import first_compile_error, user_record
from app.core.errors import ConfigError, InputFileError
from app.core.paths import KERNELS
from app.engine.forces import KernelRecord
from app.engine.kernel_reload import BuildError
from app.model.physics import Physics

log = logging.getLogger(__name__)

# nvcc's options NVRTC takes as its own (-O3 is NVRTC's default for device code); any other option keeps
# the build on nvcc, so that the reload never compiles with options the launch would not use
_NVRTC_FLAGS = {"-O3": {}, "--use_fast_math": {"use_fast_math": True}, "-lineinfo": {"lineinfo": True}}
_STD = re.compile(r"^-std=(c\+\+\d\d)$")


def form_of(repulsion: bool, soft: bool) -> int:
    """The index NBODY_ONE_FORM takes for this model and self term (policy_base.FORMS' order)."""
    return FORMS.index((repulsion, soft))


@dataclass(frozen=True)
class OneForm:
    """A kernel file compiled for one form: its cubin, which compiler made it, and ptxas's report."""

    cubin: bytes
    form: int | None  # None: every form (the whole file)
    compiler: str  # "nvrtc" or "nvcc"
    log: str
    functions: dict[str, FunctionResources]


@dataclass(frozen=True)
class Built:
    """A build of a saved kernel file: its record (the header as saved), its one form, and the symbols
    that form defines."""

    record: KernelRecord
    build: OneForm
    symbols: tuple[str, ...]


def build(path: Path, arch: str, physics: Physics, name: str | None = None, compiler: str = "auto") -> Built:
    """The hot reload's build of kernel file `path` (Reloader's `build`, on its worker thread): the header
    read again and the form `physics` launches compiled for `arch`. A bad header, a new name (`name`: the
    one it has now), or a compile error is a BuildError of one line: the compiler's first error with its
    file and line, and how many more there are."""
    try:
        record = user_record(path)
    except (ConfigError, InputFileError) as e:
        raise BuildError(str(e)) from None
    if name is not None and record.name != name:
        raise BuildError(
            f"{path}: name {record.name!r} was {name!r}: a kernel keeps its name while the viewer runs "
            "(restart to rename it)"
        )
    repulsion, soft, *_ = force_arguments(physics)
    defaults = record.default_tunables()
    symbols = tuple(symbol for symbol, _types in record.policy.entries(record, repulsion, soft, defaults))
    try:
        one = compile_one_form(path, arch, record.policy.nvcc_options, form_of(repulsion, soft), compiler)
    except KernelCompileError as e:
        raise BuildError(first_compile_error(e.log) or str(e).splitlines()[0]) from None
    return Built(record, one, symbols)


def nvrtc_options(options) -> dict | None:
    """cuda.core ProgramOptions' keywords for nvcc `options`, or None where one has no NVRTC form."""
    out: dict = {}
    for option in options:
        if option in _NVRTC_FLAGS:
            out.update(_NVRTC_FLAGS[option])
        elif m := _STD.match(option):
            out["std"] = m.group(1)
        else:
            return None
    return out


def nvrtc_available() -> bool:
    try:
        import cuda.core  # noqa: F401 - only whether it imports
    except Exception:  # noqa: BLE001 - missing, or its bindings do not load: nvcc instead
        return False
    return True


def compile_one_form(path: Path, arch: str, options, form: int | None, compiler: str = "auto") -> OneForm:
    """Kernel file `path` for `arch`, form `form` only (None: all four); KernelCompileError with the
    compiler's log (its `file(line): error:` lines) when it does not compile. `compiler`: "nvrtc",
    "nvcc" or "auto" (NVRTC where it imports and takes the options)."""
    options = tuple(default_options(path) if options is None else options)
    keywords = nvrtc_options(options)
    use_nvrtc = compiler == "nvrtc" or (compiler == "auto" and keywords is not None and nvrtc_available())
    if use_nvrtc:
        if keywords is None:
            raise KernelCompileError(path, arch, -1, f"NVRTC has no form of the options {' '.join(options)}")
        return _nvrtc(path, arch, keywords, form)
    one = () if form is None else (f"-DNBODY_ONE_FORM={form}",)
    module = compile_file(path, arch, (*options, *one))
    return OneForm(module.cubin, form, "nvcc", module.log, module.functions)


def _nvrtc(path: Path, arch: str, keywords: dict, form: int | None) -> OneForm:
    from cuda.core import Program, ProgramOptions

    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise KernelCompileError(path, arch, -1, f"{path}: cannot read it ({e})") from None
    options = ProgramOptions(
        name=str(path),  # the compiler's messages name the file, as nvcc's do
        arch=arch,
        include_path=[str(KERNELS), str(path.parent)],
        define_macro=None if form is None else [("NBODY_ONE_FORM", str(form))],
        ptxas_options="-v",
        **keywords,
    )
    logs = io.StringIO()
    try:
        code = Program(source, "c++", options=options).compile("cubin", logs=logs)
    except Exception as e:  # noqa: BLE001 - cuda.core raises its own error types, with the log in them
        raise KernelCompileError(path, arch, 1, f"{logs.getvalue()}\n{e}".strip()) from None
    text = logs.getvalue().replace("\x00", "")
    return OneForm(bytes(code.code), form, "nvrtc", text, parse_ptxas(text))
