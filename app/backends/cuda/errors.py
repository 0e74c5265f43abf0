"""Errors of the CUDA backend (importable without pycuda)."""

from __future__ import annotations

from app.errors import RuntimeFault


class NonFiniteState(RuntimeFault):
    """A position, mass or velocity became NaN/inf; the viewer turns this into a pause.

    `index` is the first non-finite body the GPU check found (-1 when unknown), `step` the step count
    at which the check ran.
    """

    def __init__(self, index: int, step: int | None = None, time: float | None = None, detail: str = ""):
        self.index = int(index)
        self.step = step
        self.time = time
        where = f" after step {step}" if step is not None else ""
        when = f" (t = {time:.6g})" if time is not None else ""
        msg = (f"non-finite position or velocity at body {self.index}{where}{when}: the simulation "
               "blew up; lower dt or raise the softening")
        super().__init__(msg + (f" ({detail})" if detail else ""))


class KernelCompileError(RuntimeFault):
    """nvcc rejected a kernel file; the message carries nvcc's own output and the file name."""

    def __init__(self, path, arch: str, returncode: int, log: str, command: list[str] | None = None):
        self.path = path
        self.arch = arch
        self.returncode = returncode
        self.log = log
        self.command = command
        super().__init__(f"{path}: nvcc could not compile it for {arch} (exit status {returncode}):\n"
                         f"{log.strip()}")
