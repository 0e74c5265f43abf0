"""The peer exchange of share rows between GPUs (`--exchange peer`, and `auto` where every pair of GPUs can
reach each other): device-to-device copies with peer access enabled. Under unified addressing a plain
cuMemcpyDtoD between two GPUs' pointers is a peer copy (pycuda 2026.1's `memcpy_peer` ignores the
contexts it is given: its None checks are inverted), so this uses memcpy_dtod_async. No host wait: the
copies are ordered after the owners' writes, and the owners' next writes after the copies, by marks and
waits on the GPUs (`queue_after`). Where a pair cannot reach each other, `make_exchange` falls back to
the host exchange (app/parallel/exchange.py) with one log line.
"""

from __future__ import annotations

import logging

from app.backends.cuda.share_device import CudaShareDevice
from app.engine.forces import Span
from app.parallel.exchange import HostExchange, domain_spans, queue_after

log = logging.getLogger(__name__)


class PeerExchange:
    """Share rows copied GPU to GPU (peer access enabled both ways between every pair)."""

    name = "peer"
    moves_rows = staticmethod(HostExchange.moves_rows)  # not with one GPU

    def __init__(self, devices: list[CudaShareDevice]):
        for a in devices:
            for b in devices:
                if a is not b and a.device.ordinal != b.device.ordinal:
                    with a.device.scope:
                        try:
                            a.device.drv.Context.enable_peer_access(b.device.scope.ctx)
                        except a.device.drv.LogicError as e:  # already enabled: fine
                            if "ALREADY" not in str(e).upper():
                                raise

    def gather(self, devices: list[CudaShareDevice], field: str) -> None:
        """Each GPU pulls every other share's rows into its copy, on its own stream, without a host
        wait: its copies start after the owners' queued updates, and an owner's later work (the next
        update of those rows) after every copy of them. Timed on each receiving GPU as "exchange"."""
        self._gather_spans(devices, field, [d.share for d in devices])

    def gather_sorted(self, devices: list[CudaShareDevice]) -> None:
        """domains: each GPU pulls every other GPU's key range of 'sacc' (as `gather` pulls shares)."""
        self._gather_spans(devices, "sacc", domain_spans(devices))

    def _gather_spans(self, devices, field: str, spans: list[Span]) -> None:
        if not self.moves_rows(devices):
            return
        size = CudaShareDevice.row_bytes(field)
        queue_after(devices, devices, f"{field}-written")
        for other in devices:
            with other.device.scope, other.timer.time("exchange"):
                for owner, span in zip(devices, spans, strict=True):
                    if other is not owner and span.count:
                        other.device.drv.memcpy_dtod_async(
                            other.row_pointer(field, span), owner.row_pointer(field, span), size * span.count
                        )
        queue_after(devices, devices, f"{field}-read")

    def reduce_scatter(self, devices: list[CudaShareDevice], field: str) -> None:
        """pairs: each GPU pulls every other GPU's partial rows of its share (after their slices) and
        adds them to its own, in device order; the others zero and refill their partials (the next
        force) only after these copies. Timed on each receiving GPU as "exchange"."""
        if not self.moves_rows(devices):
            return
        size = CudaShareDevice.row_bytes(field)
        queue_after(devices, devices, f"{field}-partial")
        for owner in devices:
            span = owner.share
            if not span.count:
                continue
            with owner.device.scope, owner.timer.time("exchange"):
                slot = owner.device.scratch("reduce-slot", size * span.count)
                for other in devices:
                    if other is not owner:  # stream order: each add reads the slot before the next copy
                        owner.device.drv.memcpy_dtod_async(
                            slot, other.row_pointer(field, span), size * span.count
                        )
                        owner.add_rows(field, span, slot)
        queue_after(devices, devices, f"{field}-reduced")


def make_exchange(devices: list[CudaShareDevice]):
    """Peer copies where every pair of GPUs can reach each other, else host-staged copies (one log line):
    `--exchange auto` and `--exchange peer`."""
    ordinals = [d.device.ordinal for d in devices]
    drv = devices[0].device.drv
    blocked = [
        (a, b)
        for a in ordinals
        for b in ordinals
        if a != b and not drv.Device(a).can_access_peer(drv.Device(b))
    ]
    if blocked:
        log.warning(
            "GPUs %s cannot reach each other directly: positions are exchanged through host memory",
            ", ".join(f"{a}->{b}" for a, b in blocked),
        )
        return HostExchange()
    return PeerExchange(devices)
