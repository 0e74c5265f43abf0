"""GPUs as the devices of a multi-device run (app/parallel/multidevice.py): the GPU device kind of
app/backends/multi.py (`KIND`, `GpuDevices`: how many, their names, the factory of devices, the exchange,
the render target, MPI ranks' devices) and `gpu_devices`, the factory every run on GPUs uses: the
single-GPU backend's one device (backend.py, the K = 1 run), each of `--gpus K`, each MPI rank's.

The parts: one GPU's device, `CudaShareDevice` (share_device.py); the exchanges of the share rows between
GPUs (`--exchange`, `GpuDevices.exchange`): `PeerExchange` (peer.py: device-to-device copies with peer
access enabled), `NcclExchange` (nccl.py: NCCL over the same device pointers), and the host exchange
(app/parallel/exchange.py) where peer access is impossible, with one log line saying so. MPI ranks on one
node use these devices with the CUDA IPC exchange of ipc.py (`CudaShareDevice.rank_exchange`).

Rendering: GPU 0 holds the renderer's VBOs through CUDA–GL interop, and the GPUs copy into them after
each step (multi_interop.py); without interop the renderer reads the state back.

Run on two H100s (NV18) on 2026-11-25: docs/multi-gpu.md, "Measured scaling".
"""

from __future__ import annotations

from app.backends.cuda import registry
from app.backends.cuda.peer import PeerExchange, make_exchange
from app.backends.cuda.share_device import FIELDS, KEY_ORDER_SCRATCH, CudaShareDevice
from app.engine.forces import Span
from app.model.bodies import Bodies
from app.model.physics import Physics
from app.parallel.exchange import HostExchange

__all__ = [  # the kind, its factory, and the names of the modules it was split into (their importers' path)
    "FIELDS",
    "KEY_ORDER_SCRATCH",
    "KIND",
    "CudaShareDevice",
    "GpuDevices",
    "PeerExchange",
    "gpu_devices",
    "local_rank",
    "make_exchange",
]


def gpu_devices(ordinals: list[int]):
    """A MultiDeviceRun factory: the share i on GPU ordinals[i] (the same ordinal twice gives two devices
    on one GPU, which exercises the driver and the exchange on a one-GPU machine)."""

    def make(bodies: Bodies, physics: Physics, kernel: str, shares: list[Span]) -> list[CudaShareDevice]:
        devices = []
        try:
            for ordinal, share in zip(ordinals, shares, strict=True):
                devices.append(CudaShareDevice(ordinal, kernel, physics, bodies, share, len(shares)))
        except BaseException:  # one GPU failed (out of memory names it): release the others
            for device in devices:
                device.close()
            raise
        return devices

    return make


def local_rank() -> int:
    """This rank's index among the ranks of its node (to pick a GPU), from the launcher's variables."""
    import os

    for name in ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"):
        value = os.environ.get(name)
        if value and value.isdigit():
            return int(value)
    return 0


class GpuDevices:
    """The GPU device kind of app/backends/multi.py: GPUs 0..K-1 for `--gpus K`; one GPU's backend
    (backend.py) uses its own ordinal through `gpu_devices`."""

    what = "GPUs"
    default_kernel = registry.DEFAULT_KERNEL

    @staticmethod
    def count() -> int:
        from app.backends.cuda.context import device_count

        return device_count()

    @classmethod
    def all_count(cls) -> int:
        return cls.count()  # every GPU

    @staticmethod
    def names(k: int) -> list[str]:
        """The names the GPUs will have (CudaDevice.name), before any context is made."""
        from app.backends.cuda.device import device_name

        return [device_name(i) for i in range(k)]

    @staticmethod
    def rank_device_name() -> str:
        """What each MPI rank's device is: one of its node's GPUs, by its local rank."""
        return "GPU by local rank (cuda)"

    @staticmethod
    def rank_maker(comm):
        """make_device(rank, bodies, physics, kernel, share) for this MPI rank (app/backends/distributed.py's
        RankRun): one GPU per rank, picked by its local rank (ranks beyond the node's GPUs share them,
        round robin)."""
        from app.backends.cuda.context import device_count

        ordinal = local_rank() % device_count()

        def make(rank, bodies, physics, kernel, share):
            # `best` runs the tuning on as many GPUs as there are ranks (same splits, another exchange)
            return CudaShareDevice(ordinal, kernel, physics, bodies, share, comm.size)

        return make

    @staticmethod
    def why_not(record) -> str | None:
        if record.precision != "fp32":
            return f"kernel {record.name!r}: several GPUs run the fp32 records only"
        return None

    @staticmethod
    def check_exchange(name: str) -> None:
        """Every exchange is possible on GPUs; NCCL is checked when the devices exist."""

    @staticmethod
    def factory(k: int):
        return gpu_devices(list(range(k)))

    @staticmethod
    def gl_target(
        position_vbo: int, speed_vbo: int, devices: list, n: int, whole: bool = False, ordinal: int = 0
    ):
        """CUDA-GL interop for the renderer's VBOs on the run's first GPU (`ordinal`; multi_interop.py),
        or None (it said why); `whole`: that GPU holds every body's rows."""
        from app.backends.cuda.multi_interop import attach_render_target

        return attach_render_target(position_vbo, speed_vbo, devices, n, whole, ordinal)

    @staticmethod
    def exchange(name: str):
        if name == "host":
            return lambda devices: HostExchange()
        if name == "nccl":
            from app.backends.cuda.nccl import NcclExchange

            return NcclExchange
        return make_exchange


KIND = GpuDevices()
