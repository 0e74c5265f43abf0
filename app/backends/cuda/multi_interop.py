"""`--gpus N` with CUDA–GL interop: GPU 0 holds the renderer's VBOs, the other GPUs copy into them.

The single-GPU backend keeps its state in the VBOs themselves. A multi-GPU run keeps a full position
copy and a share of the speeds on every GPU (app/backends/cuda/multi.py), so after each `step()` call the
VBOs, registered and mapped in GPU 0's primary context (interop.py, the same GLBuffers), are filled by
device-to-device copies (`multidevice.render_copies` says which): all positions from GPU 0's own copy
(it is whole after the exchange), and each GPU's speed rows by a peer copy into the mapped buffer. Under
a domain split GPU 0 holds every body in the tree's key order, and one kernel scatters its rows to the
bodies' rows instead (`render_rows`). No byte crosses the host per frame; map/unmap are timed as on one
GPU (`GLBuffers.last_map_ms`).

Ordering, without a host wait: the copies are queued on GPU 0's default stream, so the unmap (which
orders GL's later draws after CUDA's earlier work) and every later kernel on GPU 0 come after them.
With several GPUs, GPU 0's stream first waits for each other GPU's queued kick (its speed rows), and
each other GPU's later work waits for these copies (`multidevice.queue_after`: events, no host wait).
With one GPU there is nothing to wait for: two copies queued behind its own step.
"""

from __future__ import annotations

import logging

from app.backends.cuda.interop import GLBuffers, fall_back, register_gl_buffers
from app.multidevice import queue_after, render_copies

log = logging.getLogger(__name__)
ROW_BYTES = {"pos": 16, "speed": 4}  # float4 [x, y, z, m] positions, float speeds: the VBOs' layout


class GpuRenderTarget:
    """The renderer's VBOs registered on GPU 0 (`scope`: its context), filled by `copy_async(dst, src,
    nbytes)` (pycuda's memcpy_dtod_async: a peer copy between two GPUs' pointers under unified
    addressing) from the devices' buffers (`row_pointer(field, span)`)."""

    def __init__(self, gl: GLBuffers, scope, copy_async):
        self.gl, self.scope, self.copy_async = gl, scope, copy_async

    def publish(self, devices, n: int, whole: bool = False) -> None:
        """The devices' current positions and speeds into the VBOs (RuntimeFault if they hold fewer
        than n bodies). The copies are queued, not waited for. `whole`: the first device holds every
        body (a domain split integrates every body on every device, in the tree's key order), so every
        row comes from it, scattered to its body's row (`render_rows`), and no other device is read."""
        shares = [d.share for d in devices]
        with self.scope, self.gl.mapped_for(n) as mapped:
            base = {"pos": mapped.pos, "speed": mapped.speed}
            queue_after(devices[:1], devices, "speed-written")  # GPU 0 copies after every GPU's kick
            if whole:
                devices[0].render_rows(mapped.pos, mapped.speed)
                shares = []
            for copy in render_copies(shares):
                size = ROW_BYTES[copy.field]
                source = devices[copy.device].row_pointer(copy.field, copy.span)
                self.copy_async(base[copy.field] + size * copy.span.start, source, size * copy.span.count)
            queue_after(devices[1:], devices[:1], "rendered")  # the others rewrite their speeds after these

    @property
    def map_ms(self) -> float:
        return self.gl.last_map_ms

    @property
    def unmap_ms(self) -> float:
        return self.gl.last_unmap_ms

    def close(self) -> None:
        with self.scope:
            self.gl.unregister()


def attach_to_gpu0(position_vbo: int, speed_vbo: int, devices, n: int,
                   whole: bool = False) -> GpuRenderTarget | None:
    """The VBOs registered on GPU 0 and filled with the current state (`devices` empty: nothing loaded
    yet; `whole`: GPU 0 holds every speed, GpuRenderTarget.publish), or None after one warning saying why
    interop cannot work (the renderer uploads from the host)."""
    from app.backends.cuda.context import ContextScope, driver

    scope = ContextScope(0)  # GPU 0's primary context: the one its CudaShareDevice works in
    with scope:
        gl, reason = register_gl_buffers(position_vbo, speed_vbo)
    if gl is None:
        fall_back(reason)
        return None
    drv = driver()
    target = GpuRenderTarget(gl, scope, drv.memcpy_dtod_async)
    if devices:
        try:
            target.publish(devices, n, whole)
            with scope:
                drv.Context.synchronize()  # a failing first copy is reported here, not on a later frame
        except Exception as e:
            target.close()
            fall_back(str(e))
            return None
    log.info("CUDA-GL interop active on GPU 0: every GPU copies into GL buffers %d (positions) and %d "
             "(speeds)", int(position_vbo), int(speed_vbo))
    return target
