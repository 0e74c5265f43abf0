"""CUDA–GL interop for a run on GPUs: the run's first GPU ("GPU 0") holds the renderer's VBOs, and every
GPU of the run copies into them.

A run keeps its state in its own buffers (app/backends/cuda/multi.py): a full position copy and a share
of the speeds on every GPU. After each `step()` call the VBOs, registered and mapped in GPU 0's primary
context (interop.py, GLBuffers), are filled by device-to-device copies (`multidevice.render_copies` says
which): all positions from GPU 0's own copy (it is whole after the exchange), and each GPU's speed rows
by a peer copy into the mapped buffer. Where GPU 0 holds every body's rows (a domain split, or the one
GPU of the single-GPU backend) and its rows are not bodies (the tree's key order), one kernel scatters
them to the bodies' rows instead (`render_rows`). No byte crosses the host per frame; map/unmap are
timed (`GLBuffers.last_map_ms`). On one GPU that is 20 bytes per body per frame, where the state used to
live in the VBOs themselves; the viewer at 1M with the tree took 13.84 ms a frame against 14.10 ms
before (one H200, docs/multi-gpu.md, "One engine").

Ordering, without a host wait: the copies are queued on GPU 0's default stream, so the unmap (which
orders GL's later draws after CUDA's earlier work) and every later kernel on GPU 0 come after them.
With several GPUs, GPU 0's stream first waits for each other GPU's queued kick (its speed rows), and
each other GPU's later work waits for these copies (`multidevice.queue_after`: events, no host wait).
With one GPU there is nothing to wait for: two copies queued behind its own step.
"""

from __future__ import annotations

import logging

from app.backends.cuda.interop import GLBuffers, fall_back, register_gl_buffers
from app.parallel.multidevice import queue_after, render_copies

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
        body's rows (MultiDeviceRun.render_whole), so every row comes from it, scattered to its body's
        row (`render_rows`) once its rows are not bodies, and no other device is read."""
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

    def capacity(self) -> int:
        """How many bodies the VBOs hold."""
        with self.scope:
            return self.gl.capacity()

    @property
    def map_ms(self) -> float:
        return self.gl.last_map_ms

    @property
    def unmap_ms(self) -> float:
        return self.gl.last_unmap_ms

    def close(self) -> None:
        with self.scope:
            self.gl.unregister()


def attach_render_target(
    position_vbo: int, speed_vbo: int, devices, n: int, whole: bool = False, ordinal: int = 0
) -> GpuRenderTarget | None:
    """The VBOs registered on the run's first GPU (`ordinal`) and filled with the current state
    (`devices` empty: nothing loaded yet; `whole`: GpuRenderTarget.publish), or None after one warning
    saying why interop cannot work (the renderer uploads from the host)."""
    from app.backends.cuda.context import ContextScope, driver

    scope = ContextScope(ordinal)  # the GPU's primary context: the one its CudaShareDevice works in
    with scope:
        gl, reason = register_gl_buffers(position_vbo, speed_vbo)
    if gl is None:
        assert reason is not None, "register_gl_buffers says why it registered nothing"
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
    log.info(
        "CUDA-GL interop active on GPU %d: the run's GPUs copy into GL buffers %d (positions) and %d "
        "(speeds)",
        ordinal,
        int(position_vbo),
        int(speed_vbo),
    )
    return target
