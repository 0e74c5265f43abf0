"""pycuda import, device facts and the primary-context scope (everything that needs a driver lives here).

Importing this module never imports pycuda: `driver()` does, on first use, and `why_not()` turns every
way that can fail (pycuda missing, no libcuda, no device, no nvcc) into one line saying what to do.

Context policy: each device object (app/backends/cuda/device.py) retains its GPU's *primary* context
(shared with any runtime-API library, e.g. CuPy, NCCL or a profiler) and pushes it only for the
duration of each call (`ContextScope`, re-entrant), so pycuda's context stack is empty between calls
and at exit; PyCUDA aborts the interpreter at exit when a pushed context was never popped. Nothing here
is per process but the driver module itself and cached facts, both keyed by device ordinal.

`NBODY_CUDA_DEVICE` only names the default ordinal a backend opens when the caller names none.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import subprocess
from contextlib import contextmanager
from dataclasses import asdict, dataclass

log = logging.getLogger(__name__)

PIP_HINT = "pip install pycuda (built with GL: see README)"
DEVICE_ENV = "NBODY_CUDA_DEVICE"


class CudaUnavailable(Exception):
    """Carries the one-line why_not."""


def driver():
    """The pycuda.driver module, initialised; raises CudaUnavailable with the reason."""
    return _driver()


@functools.lru_cache(maxsize=1)
def _driver_or_reason():
    if os.environ.get("NBODY_DISABLE_CUDA"):
        return None, "disabled by the NBODY_DISABLE_CUDA environment variable"
    try:
        import pycuda.driver as drv
    except ModuleNotFoundError as e:
        if not _nvidia_driver_present():  # installing pycuda would not help: no advice unless asked (-v)
            advice = f"; with a driver: {PIP_HINT}" if log.isEnabledFor(logging.DEBUG) else ""
            return None, f"no NVIDIA driver (and no pycuda) on this machine{advice}"
        if (e.name or "").split(".")[0] == "pycuda":
            return None, f"pycuda is not installed: {PIP_HINT}"
        return None, f"pycuda cannot be imported ({e}): {PIP_HINT}"
    except ImportError as e:
        text = str(e)
        if "libcuda" in text or "libnvidia" in text:
            return None, f"no NVIDIA driver (libcuda not found: {text})"
        return None, f"pycuda cannot be imported ({text}): reinstall it, {PIP_HINT}"
    try:
        drv.init()
    except Exception as e:  # pycuda._driver.RuntimeError / LogicError
        return None, f"the CUDA driver did not initialise ({e}): no usable NVIDIA GPU or driver"
    try:
        count = drv.Device.count()
    except Exception as e:
        return None, f"cannot count CUDA devices ({e})"
    if count == 0:
        return None, "no CUDA device found (the NVIDIA driver reports 0 GPUs)"
    ordinal = default_ordinal()
    if not 0 <= ordinal < count:
        return None, f"{DEVICE_ENV}={ordinal} but only {count} CUDA device(s) exist"
    return drv, None


def _nvidia_driver_present() -> bool:
    """Whether the CUDA driver library (libcuda, part of the NVIDIA driver) can be loaded."""
    import ctypes
    import ctypes.util

    for name in ("libcuda.so.1", "nvcuda.dll"):
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            pass
    return ctypes.util.find_library("cuda") is not None


def _driver():
    drv, reason = _driver_or_reason()
    if drv is None:
        raise CudaUnavailable(reason)
    return drv


def driver_why_not() -> str | None:
    return _driver_or_reason()[1]


def default_ordinal() -> int:
    """The device a backend opens when none is named: $NBODY_CUDA_DEVICE, else 0."""
    try:
        return int(os.environ.get(DEVICE_ENV, "0"))
    except ValueError:
        return 0


@functools.lru_cache(maxsize=1)
def gl_module_or_reason():
    """(pycuda.gl, None) or (None, why): pycuda.gl needs pycuda built with CUDA_ENABLE_GL."""
    try:
        import pycuda.gl as cuda_gl
    except ImportError as e:
        return None, f"pycuda.gl is not importable ({e}): pycuda was built without GL; {PIP_HINT}"
    return cuda_gl, None


# --- device facts ----------------------------------------------------------------------------------------
# FP32 lanes per SM by compute capability (CUDA C programming guide, arithmetic throughput table).
def fp32_lanes_per_sm(cc: tuple[int, int]) -> int:
    if cc in ((6, 0), (7, 0), (7, 2), (7, 5), (8, 0)):
        return 64
    return 128


@dataclass(frozen=True)
class DeviceFacts:
    ordinal: int
    name: str
    compute_capability: tuple[int, int]
    sms: int
    total_memory: int  # bytes
    memory_clock_mhz: float | None
    memory_bus_bits: int | None
    sm_clock_max_mhz: float | None  # from nvidia-smi (CUDA 13 dropped the clock-rate attribute)
    sm_clock_mhz: float | None
    driver_version: str | None  # the NVIDIA driver ("580.65.06"), from nvidia-smi
    cuda_driver_api: str  # the CUDA version the driver supports ("13.0")
    pci_bus_id: str | None

    @property
    def arch(self) -> str:
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"

    @property
    def fp32_issue_limit(self) -> float | None:
        """Interactions/s if every SM issued 12 FP32 instructions per interaction at the max SM clock."""
        if not self.sm_clock_max_mhz:
            return None
        return fp32_lanes_per_sm(self.compute_capability) / 12 * self.sms * self.sm_clock_max_mhz * 1e6

    @property
    def fp32_peak_tflops(self) -> float | None:
        """The FP32 peak at the max SM clock: every lane an FMA (2 flops) per cycle."""
        if not self.sm_clock_max_mhz:
            return None
        return 2 * fp32_lanes_per_sm(self.compute_capability) * self.sms * self.sm_clock_max_mhz * 1e-6

    def as_dict(self) -> dict:
        d = asdict(self)
        d["compute_capability"] = f"{self.compute_capability[0]}.{self.compute_capability[1]}"
        d["arch"] = self.arch
        d["fp32_issue_limit_interactions_per_s"] = self.fp32_issue_limit
        d["fp32_peak_tflops"] = self.fp32_peak_tflops
        return d


def _smi_rows(extra: list[str]) -> list[str]:
    cmd = [
        "nvidia-smi",
        "--query-gpu=clocks.max.sm,clocks.sm,driver_version",
        "--format=csv,noheader,nounits",
    ]
    try:
        out = subprocess.run(cmd + extra, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return []
    return [ln for ln in out.stdout.splitlines() if ln.strip()] if out.returncode == 0 else []


def _nvidia_smi(pci_bus_id: str | None, ordinal: int) -> dict:
    """SM clocks and the driver version by nvidia-smi: by PCI bus id, else the only / the ordinal-th GPU."""
    rows = _smi_rows([f"--id={pci_bus_id}"]) if pci_bus_id else []
    if not rows:
        every = _smi_rows([])
        rows = every if len(every) == 1 else every[ordinal : ordinal + 1]
    if not rows:
        return {}
    fields = [f.strip() for f in rows[0].split(",")]

    def num(text):
        try:
            return float(text)
        except ValueError:
            return None

    return {
        "sm_clock_max_mhz": num(fields[0]) if fields else None,
        "sm_clock_mhz": num(fields[1]) if len(fields) > 1 else None,
        "driver_version": fields[2] if len(fields) > 2 else None,
    }


def device_count() -> int:
    return driver().Device.count()


@functools.cache
def device_facts(ordinal: int | None = None) -> DeviceFacts:
    """Facts of one device (default: default_ordinal()); no context needed; raises CudaUnavailable."""
    drv = driver()
    ordinal = default_ordinal() if ordinal is None else int(ordinal)
    if not 0 <= ordinal < drv.Device.count():
        raise CudaUnavailable(f"CUDA device {ordinal} does not exist ({drv.Device.count()} found)")
    dev = drv.Device(ordinal)
    attr = drv.device_attribute

    def get(name):
        a = getattr(attr, name, None)
        if a is None:
            return None
        try:
            return int(dev.get_attribute(a))
        except Exception:
            return None

    try:
        pci = dev.pci_bus_id()
    except Exception:
        pci = None
    smi = _nvidia_smi(pci, ordinal)
    clock_khz = get("CLOCK_RATE")
    sm_max = smi.get("sm_clock_max_mhz") or (clock_khz / 1000 if clock_khz else None)
    mem_khz = get("MEMORY_CLOCK_RATE")
    ver = drv.get_driver_version()
    return DeviceFacts(
        ordinal=ordinal,
        name=dev.name(),
        compute_capability=tuple(dev.compute_capability()),
        sms=get("MULTIPROCESSOR_COUNT") or 0,
        total_memory=int(dev.total_memory()),
        memory_clock_mhz=mem_khz / 1000 if mem_khz else None,
        memory_bus_bits=get("GLOBAL_MEMORY_BUS_WIDTH"),
        sm_clock_max_mhz=sm_max,
        sm_clock_mhz=smi.get("sm_clock_mhz"),
        driver_version=smi.get("driver_version"),
        cuda_driver_api=f"{ver // 1000}.{(ver % 1000) // 10}",
        pci_bus_id=pci,
    )


# --- the primary context ---------------------------------------------------------------------------------
class ContextScope:
    """`with scope:` makes one device's primary context current for the call: pushed on entry, popped on
    exit, every time. Re-entrant, nested in another device's scope, and from several threads at once
    (each thread has its own context stack). It never skips a push because the context "already is"
    current: pycuda's idea of the current context is its own stack, which the CUDA runtime under CuPy
    (the tree's sort, NCCL) changes behind its back, and a count of entries shared between threads let a
    second thread run without the context; both made two-GPU runs fail with 'invalid device context' or
    'invalid resource handle'.

    The context is the process's one retained wrapper of the GPU's primary context (`primary_context`)."""

    def __init__(self, ordinal: int):
        self.ordinal = int(ordinal)
        self.ctx = primary_context(self.ordinal)

    def __enter__(self):
        self.ctx.push()
        return self

    def __exit__(self, *exc):
        driver().Context.pop()
        return False


_PRIMARY: dict[int, object] = {}


def primary_context(ordinal: int):
    """The GPU's retained primary context: one pycuda wrapper per GPU for the life of the process.

    A wrapper per device object, dropped with it, was released by the garbage collector at any moment,
    and pycuda's release of a primary context makes it current on the collecting thread without undoing
    that: collected while another GPU's scope was open (a two-GPU run's old devices, in a later run on the
    calling thread), it left the wrong context current and the next launch failed with 'invalid resource
    handle' (seen on two H100s; never with the garbage collector off). The CUDA runtime (CuPy, NCCL) keeps
    the primary context retained for the process anyway. Released at exit (`release_primary_contexts`)."""
    ctx = _PRIMARY.get(ordinal)
    if ctx is None:
        if not _PRIMARY:
            atexit.register(release_primary_contexts)
        ctx = _PRIMARY[ordinal] = driver().Device(ordinal).retain_primary_context()
    return ctx


def release_primary_contexts() -> None:
    """At exit: drop the primary contexts, then empty this thread's context stack (else pycuda aborts)."""
    _PRIMARY.clear()
    try:
        drv = driver()
        for _ in range(32):
            if drv.Context.get_current() is None:
                break
            drv.Context.pop()
    except Exception:  # noqa: BLE001 - best effort at exit
        pass


@functools.lru_cache(maxsize=1)
def _libcuda():
    """The CUDA driver library through ctypes, for the three calls pycuda does not offer on events."""
    import ctypes

    for name in ("libcuda.so.1", "nvcuda.dll"):  # the library pycuda uses: loading it again shares it
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    else:
        raise CudaUnavailable("the CUDA driver library (libcuda) cannot be loaded for its event calls")
    handle, stream = ctypes.c_void_p, ctypes.c_void_p
    lib.cuEventCreate.argtypes = (ctypes.POINTER(handle), ctypes.c_uint)
    lib.cuEventRecord.argtypes = (handle, stream)
    lib.cuStreamWaitEvent.argtypes = (stream, handle, ctypes.c_uint)
    lib.cuEventDestroy_v2.argtypes = (handle,)
    for fn in (lib.cuEventCreate, lib.cuEventRecord, lib.cuStreamWaitEvent, lib.cuEventDestroy_v2):
        fn.restype = ctypes.c_int
    return lib


def _checked(call: str, code: int) -> None:
    if code != 0:
        raise RuntimeError(f"{call} failed with CUresult {code}")


class StreamMark:
    """A CUDA event (no timing) made through the driver API, recorded on the current context's legacy
    default stream (where pycuda's launches and copies without a stream go). pycuda's Event does not
    expose its CUevent handle, and pycuda cannot make the legacy stream wait on an event; this one can be
    waited on from any context (`legacy_stream_wait`). Create, record and close it with its context
    current."""

    CU_EVENT_DISABLE_TIMING = 2

    def __init__(self):
        import ctypes

        handle = ctypes.c_void_p()
        code = _libcuda().cuEventCreate(ctypes.byref(handle), self.CU_EVENT_DISABLE_TIMING)
        _checked("cuEventCreate", code)
        self.handle = handle.value

    def record(self) -> None:
        _checked("cuEventRecord", _libcuda().cuEventRecord(self.handle, None))

    def close(self) -> None:
        if self.handle is not None:
            _libcuda().cuEventDestroy_v2(self.handle)
            self.handle = None


def legacy_stream_wait(mark: StreamMark) -> None:
    """The current context's legacy default stream starts its later work only after `mark` (possibly
    another GPU's) has happened: ordering between GPUs without a host wait (cuStreamWaitEvent on
    stream 0; the event may belong to another context)."""
    _checked("cuStreamWaitEvent", _libcuda().cuStreamWaitEvent(None, mark.handle, 0))


@contextmanager
def pushed(ordinal: int | None = None):
    """A one-off scope (for code outside a backend, e.g. the tests)."""
    scope = ContextScope(default_ordinal() if ordinal is None else ordinal)
    with scope:
        yield scope
