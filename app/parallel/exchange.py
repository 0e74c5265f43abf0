"""Rows between the devices of a multi-device run (app/parallel/multidevice.py): the order kept on the
devices themselves (`queue_after`: a writer's mark, a reader's wait; no host wait), the exchange through
host memory (`HostExchange`; GPUs have peer, NCCL and CUDA IPC exchanges of their own), a domain split's
key ranges (`domain_spans`), and the copies that fill the renderer's buffers after a step
(`render_copies`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.core.errors import RuntimeFault
from app.engine.forces import Span
from app.parallel.decomposition import cut_spans
from app.parallel.device_state import DeviceState


# --- order between devices, kept on the devices ----------------------------------------------------------
def queue_after(waiters: Sequence[DeviceState], devices: Sequence[DeviceState], tag: str) -> None:
    """Every device of `waiters` starts its later work only after all work queued so far on every other
    device of `devices`: each of those queues a mark, each waiter queues a wait for the others' marks.
    No host wait, and nothing at all where no waiter has another device to wait for (one device)."""
    marks = {}
    for waiter in waiters:
        for device in devices:
            if device is not waiter:
                if id(device) not in marks:
                    marks[id(device)] = device.mark(tag)
                waiter.wait_for(marks[id(device)])


# --- exchange ------------------------------------------------------------------------------------------
class HostExchange:
    """Every device's share rows copied to every other device through host memory: the fallback where
    devices cannot reach each other (and CPU "devices", where host memory is all there is)."""

    name = "host"

    @staticmethod
    def moves_rows(devices: Sequence[DeviceState]) -> bool:
        """Whether `gather` has rows to move: not with one device, which holds them all."""
        return len(devices) > 1

    def gather(self, devices: Sequence[DeviceState], field: str) -> None:
        """Host copies wait for the owner's queued work themselves (a host read of a GPU's rows does)."""
        for owner in devices:
            others = [d for d in devices if d is not owner]
            if not others:
                continue
            rows = owner.rows(field, owner.share)
            for other in others:
                with other.timed("exchange"):
                    other.set_rows(field, owner.share, rows)

    def reduce_scatter(self, devices: Sequence[DeviceState], field: str) -> None:
        """pairs: each device's share rows of `field` become the sum of every device's partial rows there,
        its own first, then the others' in device order (every partial is read before any share is
        written: a share's rows on its owner are read by no other device)."""
        if not self.moves_rows(devices):
            return
        sums = []
        for owner in devices:
            total = owner.rows(field, owner.share).copy()
            for other in devices:
                if other is not owner:
                    total += other.rows(field, owner.share)
            sums.append(total)
        for owner, total in zip(devices, sums, strict=True):
            with owner.timed("exchange"):
                owner.set_rows(field, owner.share, total)

    def gather_sorted(self, devices: Sequence[DeviceState]) -> None:
        """domains: every device's key range of 'sacc' copied into every other device's (the ranges are
        `domain_cuts`, which every device computed alike from the same tree)."""
        ranges = domain_spans(devices)
        for owner, span in zip(devices, ranges, strict=True):
            others = [d for d in devices if d is not owner]
            if not others or not span.count:
                continue
            rows = owner.rows("sacc", span)
            for other in others:
                with other.timed("exchange"):
                    other.set_rows("sacc", span, rows)


def domain_spans(devices: Sequence[DeviceState]) -> list[Span]:
    """The key ranges of a domain split, one per device, from the cuts the devices computed (checked to
    agree: a device that built another tree would exchange the wrong rows)."""
    cuts = [list(d.domain_cuts) for d in devices]
    if any(c != cuts[0] for c in cuts[1:]):
        raise RuntimeFault(f"the devices disagree about their key ranges ({cuts}): their trees differ")
    if len(cuts[0]) != len(devices) + 1:
        raise RuntimeFault(f"{len(devices)} devices but {len(cuts[0]) - 1} key ranges ({cuts[0]})")
    return cut_spans(cuts[0])


# --- what reaches the renderer ------------------------------------------------------------------------
@dataclass(frozen=True)
class RenderCopy:
    """One copy into the renderer's buffers: rows `span` of `field` from device `device`, to the same
    rows of the buffer."""

    device: int
    field: str  # "pos" (float4 rows) or "speed" (float rows)
    span: Span


def render_copies(shares: Sequence[Span]) -> list[RenderCopy]:
    """What fills the renderer's buffers after a step, and from where: every position from device 0
    (after the exchange each device holds them all: one copy, no gather), each share's speeds from the
    device that owns them (a device updates the speeds of its share only). Empty shares copy nothing."""
    n = sum(s.count for s in shares)
    copies = [RenderCopy(0, "pos", Span.all(n))] if n else []
    return copies + [RenderCopy(i, "speed", s) for i, s in enumerate(shares) if s.count]
