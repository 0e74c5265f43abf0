"""`nbody-live info`: what this machine can run, and what the project offers."""

from __future__ import annotations

import argparse
import platform
import sys

from app.commands.options import add_kernel_file_options
from app.parallel.decomposition import of as decomposition_of

HELP = "show Python, backends (available / why not), kernels, GL renderer, CUDA device, presets"
DESCRIPTION = """\
Print what NBody Live finds on this machine: Python and package versions, each backend with
`available` or the reason it is not, the GL renderer a context gets (headless EGL when there is no
display), and the CUDA device; with CUDA, every GPU, which pairs have peer access and the link between
them (NVLink or a PCIe path, from nvidia-smi topo -m), and the NCCL that --exchange nccl would use. With
a flag, list one table instead.

examples:
  nbody-live info
  nbody-live info --kernels      # every kernel record: precision, doc, error budget, tunables, how
                                 # several devices split it, and for a tree its memory per body
  nbody-live info --keys         # every scene key with its allowed values
"""


def _split(rec) -> str:
    """How several devices split a record (app/parallel/decomposition.py); `best` splits as the record it
    picks."""
    if getattr(rec.policy, "resolves", False):
        return "as the record it picks for N"
    split = decomposition_of(rec)
    return f"{split.name}: {split.doc}"


def add_parser(sub) -> None:
    p = sub.add_parser(
        "info", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    what = p.add_mutually_exclusive_group()
    what.add_argument("--kernels", action="store_true", help="list the kernel registry")
    what.add_argument("--scenes", action="store_true", help="list the scene presets")
    what.add_argument("--generators", action="store_true", help="list initial-condition generators")
    what.add_argument("--keys", action="store_true", help="list every scene key and its allowed values")
    p.add_argument("--no-gl", action="store_true", help="do not open a GL context to name the renderer")
    add_kernel_file_options(p)
    p.set_defaults(func=main)


def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    out = []
    for pkg in ("numpy", "numba", "vispy", "PyOpenGL", "imgui-bundle", "av", "pycuda"):
        try:
            out.append(f"{pkg} {version(pkg)}")
        except PackageNotFoundError:
            out.append(f"{pkg} -")
    return ", ".join(out)


DEVICE_FACTS = (
    ("arch", "{}"),
    ("sms", "{} SMs"),
    ("sm_clock_max_mhz", "{:.0f} MHz"),
    ("driver_version", "driver {}"),
)


def _device_line(cls) -> str:
    """The device from the backend's own `device_info()` (the CUDA backend's: an instance, so a context)."""
    try:
        backend = cls()
        try:
            d = backend.device_info()
        finally:
            backend.close()
    except Exception as e:  # noqa: BLE001 - info reports whatever breaks, it never crashes on it
        return f"unknown ({type(e).__name__}: {e})"
    if d is None:
        return "(the backend states no device facts)"
    facts = ", ".join(text.format(d[key]) for key, text in DEVICE_FACTS if d.get(key))
    return str(d.get("name", "?")) + (f" ({facts})" if facts else "")


MEMORY_N = 1 << 20  # the N at which `info --kernels` states a record's memory per body


def _memory(backend, name: str) -> int | None:
    """ForceEvaluator.bytes_per_body(MEMORY_N) of a record on a backend instance (None: not reported)."""
    if backend is None:
        return None
    try:
        return backend.evaluator(name).bytes_per_body(MEMORY_N)
    except Exception:  # noqa: BLE001 - info reports what it can; a backend without evaluators has no figure
        return None


def print_kernels() -> None:
    from app.backends import backend_classes
    from app.backends.cuda.user_kernels import is_user
    from app.core.values import default_text

    for name, cls in backend_classes().items():
        reason = cls.why_not()
        print(f"[{name}] {'available' if reason is None else 'unavailable: ' + reason}")
        try:
            backend = cls() if reason is None else None
        except Exception:  # noqa: BLE001 - the listing does not need an instance
            backend = None
        try:
            for rec in cls.kernels():
                why = cls.kernel_why_not(rec.name) if reason is None else None
                flag = "" if why is None else f"  (unavailable: {why})"
                print(f"  {rec.name:<24} {rec.precision:<5} {rec.doc}{flag}")
                tunables = "; ".join(
                    f"{t.name} {t.describe()} (default {default_text(t)})" for t in rec.tunables
                )
                print(
                    f"  {'':<24} {'':<5} error budget {rec.error_budget.describe()}"
                    + (f"; tunables: {tunables}" if tunables else "")
                )
                memory = _memory(backend, rec.name) if why is None else None
                if memory is not None:
                    where = cls.memory
                    print(
                        f"  {'':<24} {'':<5} memory {memory:,} bytes per body at N = {MEMORY_N:,} "
                        f"({where}, beside the state; default tunables)"
                    )
                print(f"  {'':<24} {'':<5} on several devices (--gpus, MPI ranks): {_split(rec)}")
                if is_user(rec):
                    print(f"  {'':<24} {'':<5} yours: {rec.source} ({rec.entry}, policy grid)")
        finally:
            if backend is not None:
                backend.close()


def print_keys() -> None:
    from app.model.config import SCHEMA

    for section, fields in SCHEMA.items():
        print(f"[{section}]")
        for name, f in fields.items():
            print(f"  {section}.{name:<16} {f.describe():<44} {f.doc}")
    print("  initial.<param>     generator parameters: see `nbody-live info --generators`")
    print(
        '[[components]]        tables of name = "..." and rows = [first, end): the bodies\' components '
        "(docs/components.md)"
    )


def print_generators() -> None:
    from app.model import ics

    for name, gen in ics.GENERATORS.items():
        print(f"{name:<10} {gen.doc}")
        for pname, spec in gen.params.items():
            print(f"    initial.{pname:<14} default {spec.default!r:<8} {spec.doc}")


def print_scenes() -> None:
    from app.scene import load_scene, preset_names

    for name in preset_names():
        s = load_scene(name)
        print(f"{name:<12} N={s.initial.n:<8} {s.description}")


def main(args) -> int:
    if args.kernels:
        print_kernels()
        return 0
    if args.keys:
        print_keys()
        return 0
    if args.generators:
        print_generators()
        return 0
    if args.scenes:
        print_scenes()
        return 0
    print(f"Python {sys.version.split()[0]} on {platform.platform()}")
    print(f"packages: {_versions()}")
    from app.backends import backend_classes

    for name, cls in backend_classes().items():
        reason = cls.why_not()
        print(f"backend {name}: {'available' if reason is None else 'unavailable: ' + reason}")
        if reason is None:
            print(f"  device: {_device_line(cls)}")
            for line in cls.system_lines():
                print(f"  {line}")
    if not args.no_gl:
        try:
            from app.render.gl_setup import display_problem, gl_info

            why = display_problem()  # (asked first: falling back to EGL hides a stale display)
            gi = gl_info()  # a window's context when a display answers, else headless EGL
            print(
                f"GL: {gi.get('renderer')} | {gi.get('version')} | via {gi.get('backend')}"
                + (f" ({why})" if why and gi.get("backend") == "egl" else "")
            )
        except Exception as e:  # noqa: BLE001 - info reports whatever breaks, it never crashes on it
            print(f"GL: no context ({type(e).__name__}: {e})")
    print("kernels: " + ", ".join(r.name for cls in backend_classes().values() for r in cls.kernels()))
    from app.backends.distributed import summary

    print(f"MPI: {summary()}")
    return 0
