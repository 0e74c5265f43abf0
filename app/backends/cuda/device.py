"""One GPU as an object: its context, facts, loaded kernels, scratch memory, streams and clock.

A backend holds one `CudaDevice` per GPU it uses; nothing about a device is global. Every method that
touches the driver pushes the device's primary context for the call (`with device.scope:` is
re-entrant, so callers may also hold it across several calls). pycuda contexts are per thread: a
device is used from the thread that made it, or from a thread that pushes its scope itself.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from app.backends.cuda.compile import CompiledModule, compile_file, resolve_source
from app.backends.cuda.context import ContextScope, DeviceFacts, device_facts, driver
from app.backends.cuda.errors import KernelCompileError
from app.core.errors import RuntimeFault
from app.engine.clocks import EventTimer

log = logging.getLogger(__name__)

_COMPILED: dict[tuple, CompiledModule] = {}  # a cache of nvcc's output (also on disk), not device state
_FAILED: dict[tuple, KernelCompileError] = {}


def compiled(source: str, arch: str, options: tuple[str, ...] | None = None) -> CompiledModule:
    """The cubin of a kernels/ file for `arch` (memoised per process, cached on disk by compile.py);
    `options` None: compile.NVCC_OPTIONS (a record's policy names its own where they differ)."""
    path = resolve_source(source)
    key = (str(path), arch, options, _mtimes(path))
    if key in _FAILED:
        raise _FAILED[key]
    if key not in _COMPILED:
        try:
            _COMPILED[key] = compile_file(path, arch, options)
        except KernelCompileError as e:
            _FAILED[key] = e
            raise
    return _COMPILED[key]


def _mtimes(path) -> tuple:
    """Change stamp of a kernel file and the headers beside it (a memo key, not a content hash)."""
    stamps = []
    for p in [path, *sorted(resolve_source("common.cuh").parent.glob("*.cuh"))]:
        try:
            stamps.append(os.stat(p).st_mtime_ns)
        except OSError:
            stamps.append(0)
    return tuple(stamps)


def device_name(ordinal: int) -> str:
    """How a GPU is named in messages and timings: "GPU 1 (NVIDIA H200)"."""
    return f"GPU {ordinal} ({device_facts(ordinal).name})"


class CudaDevice:
    """A GPU: `scope` (its primary context), `facts`, `drv`, kernels by (source, symbol), scratch buffers
    by key, streams by key, one event clock. `close()` frees everything it allocated."""

    def __init__(self, ordinal: int):
        self.drv = driver()
        self.ordinal = int(ordinal)
        self.facts: DeviceFacts = device_facts(self.ordinal)
        self.scope = ContextScope(self.ordinal)
        # pycuda's modules, functions, allocations and streams (pycuda ships no type stubs)
        self._modules: dict[str, Any] = {}
        self._functions: dict[tuple[str, str], Any] = {}
        self._installed: dict[tuple[str, str], Any] = {}  # (source, symbol) -> a hot reload's module
        self._scratch: dict[str, Any] = {}
        self._scratch_bytes: dict[str, int] = {}
        self._pinned: dict[str, Any] = {}
        self._streams: dict[str, Any] = {}
        with self.scope:
            self.timer = EventTimer(self.drv)

    @property
    def name(self) -> str:
        return device_name(self.ordinal)

    # --- kernels ---------------------------------------------------------------------------------
    def compiled(self, source: str, options: tuple[str, ...] | None = None) -> CompiledModule:
        return compiled(source, self.facts.arch, options)

    def function(self, source: str, symbol: str, arg_types: str, options: tuple[str, ...] | None = None):
        """A prepared kernel function (compiled with `options` and loaded on first use)."""
        key = (source, symbol)
        fn = self._functions.get(key)
        if fn is None:
            with self.scope:
                module = self._installed.get(key) or self._modules.get(source)
                if module is None:
                    cubin = self.compiled(source, options).cubin
                    module = self._modules[source] = self.drv.module_from_buffer(cubin)
                try:
                    fn = module.get_function(symbol)
                except Exception as e:
                    raise RuntimeFault(
                        f"{source}: kernel symbol {symbol!r} not found on {self.name} ({e})"
                    ) from e
                fn.prepare(arg_types)
            self._functions[key] = fn
        return fn

    def install(self, source: str, cubin: bytes, symbols) -> None:
        """A hot reload's build of `source` (app/backends/cuda/hot_reload.py): `symbols` come from `cubin`
        from now on; the module loaded before is dropped, so that any other symbol of `source` is
        compiled again from the file as it is now (the build compiled only the form the run launches)."""
        with self.scope:
            module = self.drv.module_from_buffer(cubin)
            self.forget(source)
            for symbol in symbols:
                self._installed[source, symbol] = module

    def forget(self, source: str) -> None:
        """Drop what was loaded of `source` (its file changed): the next use compiles and loads it again."""
        self._modules.pop(source, None)
        for key in [k for k in (*self._functions, *self._installed) if k[0] == source]:
            self._functions.pop(key, None)
            self._installed.pop(key, None)

    def max_block(self, fn, block: int) -> int:
        """`block` capped at what the compiled function can launch with (its registers may limit it)."""
        try:
            return min(block, int(fn.get_attribute(self.drv.function_attribute.MAX_THREADS_PER_BLOCK)))
        except Exception:
            return block

    # --- memory and streams ------------------------------------------------------------------------
    def scratch(self, key: str, nbytes: int) -> int:
        """A device buffer of at least `nbytes` kept under `key` (grown, never shrunk, until close)."""
        nbytes = max(int(nbytes), 16)
        if self._scratch_bytes.get(key, 0) < nbytes:
            with self.scope:
                if key in self._scratch:
                    self._scratch.pop(key).free()
                self._scratch[key] = self.drv.mem_alloc(nbytes)
            self._scratch_bytes[key] = nbytes
        return int(self._scratch[key])

    def pinned(self, key: str, count: int, dtype):
        """A page-locked host array kept under `key`: allocating pinned memory synchronises the whole
        device, so buffers read back every few frames are allocated once."""
        buf = self._pinned.get(key)
        if buf is None or buf.size < count or buf.dtype != dtype:
            with self.scope:
                buf = self._pinned[key] = self.drv.pagelocked_empty(count, dtype)
        return buf

    def stream(self, key: str):
        """A blocking stream (ordered with the default stream) kept under `key`."""
        if key not in self._streams:
            with self.scope:
                self._streams[key] = self.drv.Stream()
        return self._streams[key]

    def mem_get_info(self) -> tuple[int, int]:
        with self.scope:
            return self.drv.mem_get_info()

    def close(self) -> None:
        """Free what this device object allocated (its context stays retained until it is dropped)."""
        with self.scope:
            for buf in self._scratch.values():
                buf.free()
            self._scratch.clear()
            self._scratch_bytes.clear()
            self._pinned.clear()
            self._streams.clear()
            self._functions.clear()
            self._installed.clear()
            self._modules.clear()  # unloads the modules while the context is current
            self.timer.release()
