"""The one small broadcast per frame of an MPI job: what rank 0 asks every rank to run at the next step.

    channel = Channel(comm)
    control = channel.exchange(Control(kernel="cpu-fp64", steps=2) if rank == 0 else None)   # every rank

A Control is JSON in a fixed buffer of CONTROL_BYTES, broadcast with a non-blocking Ibcast that the
waiting ranks poll with a short sleep: while rank 0 draws (or is paused) the others wait without taking a
core each from it, as a blocking MPICH broadcast would (it spins). Every rank, rank 0 too, gets the
decoded copy, so all apply exactly the same values.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

import numpy as np

CONTROL_BYTES = 8192
POLL_S = 0.0005  # how long a waiting rank sleeps between looks at the broadcast


@dataclass
class Control:
    kernel: str = ""
    tunables: dict = field(default_factory=dict)  # the kernel's, all of them
    physics: dict = field(default_factory=dict)  # app.model.physics.Physics.as_dict()
    steps: int = 0  # 0: no step this frame (rank 0 is paused)
    load: bool = False  # new bodies follow in a second broadcast (reset, N, a preset)
    gather: bool = False  # rank 0 wants a new view (velocities gathered) after the step
    speeds: bool = False  # rank 0 draws from its GPU: every share's speeds to it after the step
    quit: bool = False  # rank 0 is done: every rank's follow() returns

    def changes(self, before: Control) -> bool:
        """Whether this Control changes what a rank runs (not just how many steps it takes)."""
        return self.load or (self.kernel, self.tunables, self.physics) != (
            before.kernel,
            before.tunables,
            before.physics,
        )

    def encode(self) -> np.ndarray:
        data = json.dumps(asdict(self)).encode()
        if len(data) > CONTROL_BYTES - 4:
            raise ValueError(f"a Control of {len(data)} bytes is over the broadcast's {CONTROL_BYTES - 4}")
        buf = np.zeros(CONTROL_BYTES, dtype=np.uint8)
        buf[:4] = np.frombuffer(np.uint32(len(data)).tobytes(), dtype=np.uint8)
        buf[4 : 4 + len(data)] = np.frombuffer(data, dtype=np.uint8)
        return buf

    @classmethod
    def decode(cls, buf: np.ndarray) -> Control:
        size = int(np.frombuffer(buf[:4].tobytes(), dtype=np.uint32)[0])
        return cls(**json.loads(buf[4 : 4 + size].tobytes()))


class Channel:
    """Rank 0's Control to every rank, once a frame."""

    def __init__(self, comm):
        self.comm = comm

    def exchange(self, control: Control | None) -> Control:
        """Rank 0 passes its Control, the others None; every rank returns the same decoded Control."""
        if self.comm.rank == 0:
            assert control is not None, "rank 0 passes its Control"
            buf = control.encode()
        else:
            buf = np.zeros(CONTROL_BYTES, dtype=np.uint8)
        request = self.comm.Ibcast(buf, root=0)
        while not request.Test():
            time.sleep(POLL_S)
        return Control.decode(buf)
