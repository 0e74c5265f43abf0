"""The hot reload's compile (app/backends/cuda/reload_build.py) measured: nvcc against NVRTC (cuda-core's
Program), the whole kernel file against the one form a run launches, each the median of 5 compiles of
a fresh edit (no cache serves one); then NVRTC's four forms on four threads, and how each compiler's
first error reads.

    python3 bench/reload_compile.py KERNEL.cu     # e.g. a `nbody-live new-kernel` starter
"""

from __future__ import annotations

import concurrent.futures
import statistics
import sys
import tempfile
import time
from pathlib import Path

from app.backends.cuda import reload_build
from app.backends.cuda.errors import KernelCompileError
from app.backends.cuda.user_kernels import first_compile_error

ARCH = "sm_90"


def main(path: Path) -> None:
    source = path.read_text()
    folder = Path(tempfile.mkdtemp())
    edits = iter(range(10**6))

    def timed(compiler: str, form: int | None) -> float:
        edit = next(edits)
        copy = folder / f"k{edit}.cu"
        copy.write_text(source.replace("#include", f"// edit {edit}\n#include", 1) + f"\n// edit {edit}\n")
        t0 = time.perf_counter()
        reload_build.compile_one_form(copy, ARCH, None, form, compiler)
        return time.perf_counter() - t0

    def line(what: str, times: list[float]) -> str:
        return f"{what}: median {statistics.median(times):.3f} s, all {[round(t, 3) for t in times]}"

    for compiler in ("nvcc", "nvrtc"):
        for form in (None, 0):
            print(line(f"{compiler:6s} form={form}", [timed(compiler, form) for _ in range(5)]), flush=True)
    parallel = []
    for _ in range(3):
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda form: timed("nvrtc", form), range(4)))
        parallel.append(time.perf_counter() - t0)
    print(line("nvrtc, the 4 forms on 4 threads", parallel))
    bad = folder / "bad.cu"
    bad.write_text(source.replace("NBODY_FORCE_ENTRIES", "int x = ;\nNBODY_FORCE_ENTRIES", 1))
    for compiler in ("nvcc", "nvrtc"):
        try:
            reload_build.compile_one_form(bad, ARCH, None, 0, compiler)
        except KernelCompileError as e:
            print(f"{compiler} error -> {first_compile_error(e.log)}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
