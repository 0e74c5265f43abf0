"""Errors of the CUDA backend (importable without pycuda)."""

from __future__ import annotations

from app.core.errors import NonFiniteState, RuntimeFault

__all__ = ["KernelCompileError", "NonFiniteState", "out_of_memory"]


class KernelCompileError(RuntimeFault):
    """nvcc rejected a kernel file; the message carries nvcc's own output and the file name."""

    def __init__(self, path, arch: str, returncode: int, log: str, command: list[str] | None = None):
        self.path = path
        self.arch = arch
        self.returncode = returncode
        self.log = log
        self.command = command
        super().__init__(
            f"{path}: nvcc could not compile it for {arch} (exit status {returncode}):\n{log.strip()}"
        )


def out_of_memory(
    n: int,
    need: int,
    free: int,
    gpu: str,
    bytes_per_body: float,
    what: str = "",
    held: int = 0,
    error: type[RuntimeFault] = RuntimeFault,
) -> RuntimeFault:
    """The one out-of-memory message of the CUDA backend, all-pairs state and tree buffers alike: what N
    needs, what is free on which GPU, and the N that would fit (95% of `free` plus the `held` bytes the
    caller gives back first, at `bytes_per_body`), as an `error` (the state's: StateOutOfMemory)."""
    fits = max(0, int((free + held) * 0.95 / max(bytes_per_body, 1.0)))
    what = f" ({what})" if what else ""
    return error(
        f"out of GPU memory: N = {n:,} bodies need {need / 2**20:,.1f} MiB{what} on {gpu} "
        f"but only {free / 2**20:,.1f} MiB are free; at most N ≈ {fits:,} fits"
    )
