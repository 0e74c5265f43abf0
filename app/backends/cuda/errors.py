"""Errors of the CUDA backend (importable without pycuda)."""

from __future__ import annotations

from app.errors import NonFiniteState, RuntimeFault

__all__ = ["KernelCompileError", "NonFiniteState"]


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
