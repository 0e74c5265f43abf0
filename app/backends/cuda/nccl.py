"""`--exchange nccl`: the share rows of every GPU gathered into every GPU's copy by NCCL.

The binding is CuPy's `cupy.cuda.nccl` (CuPy is already the tree code's dependency); the library is the
`nvidia-nccl-cu13` runtime wheel (`make` installs it through app/core/setup_cuda.py). CuPy looks for
libnccl.so.2 on the loader's path, where a wheel's copy is not, so `load_nccl` loads the wheel's file
first (RTLD_GLOBAL) and CuPy's binding then finds it.

One process drives every GPU: `NcclCommunicator.initAll(ordinals)` makes one communicator per GPU, and
each exchange is one NCCL group. The shares are uneven (split's remainders, re-balancing), which NCCL's
all-gather (equal counts) cannot take, so the group is an all-gather-v: one broadcast per owner, in
place, rooted at the owner, over the same device pointers the peer exchange copies between (the owner's
rows of each GPU's full copy). The group is issued on each GPU's legacy stream (the primary context's,
which pycuda's work is on too), so it is ordered after each GPU's update and before its force by the
streams alone: nothing waits on the host. Each GPU's part is timed on its event clock as "exchange".

NCCL cannot put two ranks on one GPU: the two-devices-on-GPU-0 arrangement of the one-GPU tests runs the
peer exchange; NCCL is tested there with a one-GPU communicator.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import os

from app.core.errors import ConfigError
from app.parallel.multidevice import domain_spans

WHEEL = "nvidia-nccl-cu13"
FIX = f"pip install {WHEEL} (`make` installs it with CuPy on a machine with an NVIDIA driver)"
_LOADED: list = []  # the wheel's library, kept loaded for the process


def wheel_library() -> str | None:
    """The libnccl.so.2 of an installed nvidia-nccl-cu* wheel (under site-packages/nvidia/), or None."""
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        found = sorted(glob.glob(os.path.join(root, "**", "libnccl.so*"), recursive=True))
        if found:
            return found[0]
    return None


def load_nccl():
    """CuPy's NCCL module with a library behind it; ConfigError naming the fix when there is none."""
    path = wheel_library()
    if path and not _LOADED:
        try:
            _LOADED.append(ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL))
        except OSError as e:
            raise ConfigError(f"--exchange nccl: {path} does not load ({e}); reinstall: {FIX}") from e
    try:
        from cupy.cuda import nccl
    except ImportError as e:
        raise ConfigError(
            f"--exchange nccl needs CuPy's NCCL binding, which does not import ({e}): "
            "pip install cupy-cuda13x, and " + FIX
        ) from e
    if not getattr(nccl, "available", True):
        raise ConfigError(f"--exchange nccl: NCCL is not installed: {FIX}")
    return nccl


def summary() -> str:
    """One line for `info`: the NCCL the exchange would use, or what to install."""
    try:
        nccl = load_nccl()
        version = nccl.get_version()
    except Exception as e:  # noqa: BLE001 - info reports, never fails
        return f"not usable ({e})"
    major, minor, patch = version // 10000, version // 100 % 100, version % 100
    return f"NCCL {major}.{minor}.{patch} through cupy.cuda.nccl ({wheel_library() or 'system library'})"


class NcclExchange:
    """Each GPU's share rows broadcast from it into every other GPU's copy, in one NCCL group."""

    name = "nccl"

    def __init__(self, devices):
        ordinals = [d.device.ordinal for d in devices]
        if len(set(ordinals)) != len(ordinals):
            raise ConfigError(
                f"--exchange nccl: GPUs {ordinals} repeat one; NCCL takes one rank per GPU "
                "(use --exchange peer)"
            )
        self.nccl = load_nccl()
        self.comms = self.nccl.NcclCommunicator.initAll(ordinals)

    @staticmethod
    def moves_rows(devices) -> bool:
        """Always, as asked for: with one GPU a one-rank communicator broadcasts to itself."""
        return True

    def gather(self, devices, field: str) -> None:
        """Each owner's share rows of `field` broadcast into every GPU's copy (an all-gather-v)."""
        self._grouped(devices, field, [d.share for d in devices], "broadcast")

    def gather_sorted(self, devices) -> None:
        """domains: each GPU's key range of 'sacc' broadcast into every GPU's (an all-gather-v)."""
        self._grouped(devices, "sacc", domain_spans(devices), "broadcast")

    def reduce_scatter(self, devices, field: str) -> None:
        """pairs: each owner's share rows of `field` become the sum over every GPU's partial rows there
        (one reduce rooted at each owner, in place on it)."""
        self._grouped(devices, field, [d.share for d in devices], "reduce")

    def _grouped(self, devices, field: str, spans, how: str) -> None:
        """One NCCL group: per owner (root) a broadcast or a sum-reduce of its span's rows of `field`."""
        nccl = self.nccl
        floats = devices[0].row_bytes(field) // 4  # every field is rows of float32
        starts = []
        for device in devices:
            with device.device.scope:
                starts.append(device.timer.start())
        nccl.groupStart()
        try:
            for root, span in enumerate(spans):
                if not span.count:
                    continue
                for device, comm in zip(devices, self.comms, strict=True):
                    rows = device.row_pointer(field, span)
                    with device.device.scope:
                        if how == "broadcast":
                            comm.broadcast(rows, rows, floats * span.count, nccl.NCCL_FLOAT32, root, 0)
                        else:
                            comm.reduce(
                                rows, rows, floats * span.count, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, root, 0
                            )
        finally:
            nccl.groupEnd()
        for device, start in zip(devices, starts, strict=True):
            with device.device.scope:
                device.timer.stop("exchange", start)

    def close(self) -> None:
        for comm in self.comms:
            comm.destroy()
        self.comms = []
