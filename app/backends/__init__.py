"""Backend discovery over the one table (app/core/backend_table.py), which the CLI, the panel and the tests
walk.

`cuda` is imported lazily so that machines without pycuda never touch it; its absence becomes a
`why_not`, not an ImportError.
"""

from __future__ import annotations

import importlib
import logging

from app.backends.base import Backend, KernelRecord, StepTimings
from app.core.backend_table import backend_module, backend_names, register_backend
from app.core.errors import BackendUnavailable, ConfigError

log = logging.getLogger(__name__)


class _Missing(Backend):
    """Stands in for a backend whose module cannot even be imported (e.g. pycuda not installed)."""

    reason = ""

    @classmethod
    def why_not(cls):
        return cls.reason

    @classmethod
    def kernels(cls):
        return []

    def __init__(self):  # pragma: no cover - never constructed: why_not is never None
        raise BackendUnavailable(self.reason)


def backend_class(name: str) -> type[Backend]:
    module_name = backend_module(name)
    if module_name is None:
        raise ConfigError(f"unknown backend {name!r}; choose from auto, {', '.join(backend_names())}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        return type(f"Missing_{name}", (_Missing,), {"name": name, "reason": f"cannot import: {e}"})
    cls = getattr(module, "BACKEND", None)
    if cls is None:
        return type(
            f"Missing_{name}",
            (_Missing,),
            {"name": name, "reason": f"{module.__name__} defines no BACKEND (incomplete install?)"},
        )
    if cls.name != name:
        reason = f"{module.__name__}.BACKEND is named {cls.name!r}, not {name!r}"
        return type(f"Missing_{name}", (_Missing,), {"name": name, "reason": reason})
    return cls


def backend_classes() -> dict[str, type[Backend]]:
    return {name: backend_class(name) for name in backend_names()}


def all_kernel_records() -> list[KernelRecord]:
    """Every kernel of every backend, available or not, in backend-preference order."""
    return [rec for cls in backend_classes().values() for rec in cls.kernels()]


def find_kernel(name: str) -> KernelRecord:
    for rec in all_kernel_records():
        if rec.name == name:
            return rec
    names = ", ".join(r.name for r in all_kernel_records())
    raise ConfigError(f"unknown kernel {name!r}; choose from: {names}")


def select_backend(name: str = "auto", kernel: str | None = None) -> type[Backend]:
    """Resolve 'auto' / an explicit name / a kernel's owning backend to an available backend class.

    'auto' falls back with one log line per skipped backend; an explicit name that cannot run raises
    BackendUnavailable carrying its why_not.
    """
    if kernel and kernel != "auto":
        owner = find_kernel(kernel).backend
        if name not in ("auto", owner):
            raise ConfigError(f"kernel {kernel!r} belongs to backend {owner!r}, not {name!r}")
        name = owner
    if name != "auto":
        cls = backend_class(name)
        reason = cls.why_not()
        if reason:
            raise BackendUnavailable(f"backend {name!r} is not available: {reason}")
        return cls
    for cand in backend_names():
        cls = backend_class(cand)
        reason = cls.why_not()
        if reason is None:
            return cls
        log.info("backend %s skipped: %s", cand, reason)
    raise BackendUnavailable("no backend is available (the cpu backend needs numba)")


__all__ = [
    "Backend",
    "KernelRecord",
    "StepTimings",
    "backend_names",
    "register_backend",
    "backend_class",
    "backend_classes",
    "all_kernel_records",
    "find_kernel",
    "select_backend",
]
