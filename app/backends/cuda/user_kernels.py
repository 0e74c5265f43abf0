"""The user's own CUDA force kernels: a `.cu` file anywhere, described by a header comment, becomes a
KernelRecord beside the built-ins (`--kernel-file PATH.cu`, `--kernel-dir DIR`).

The header is the file's first block comment, opened by `/* nbody-live kernel` and holding TOML:

    /* nbody-live kernel
    name = "my-kernel"                 # unique among every backend's kernels: --kernel, the panel's combo
    doc = "shared tiles, my way"       # one line
    origin = "my notes"                # optional: where the idea comes from
    entry = "my_force"                 # the prefix NBODY_FORCE_ENTRIES(my_force, ...) defines entries of
    policy = "grid"                    # how it is launched (below)
    tile = true                        # grid: a float4 of dynamic shared memory per thread
    precision = "fp32"
    budget_max = 1e-4                  # optional: the error budget against float64 (default fp32's)
    block_sizes = [64, 128, 256, 512]  # optional: the block_size tunable's values ...
    block_size = 256                   # ... and its default
    */
    #include "common.cuh"
    ...
    NBODY_FORCE_ENTRIES(my_force, my_force)

Policies: "grid" (app.backends.cuda.policy_base.GridPolicy: one thread per target, ceil(N / B) blocks of
B = block_size threads, the launch `shared` uses). It is the one policy whose entry names come from the
header; the others' (block-template, K bodies per thread, q threads per body) are written into their
policy classes, and a header naming one is refused, saying so. The file is compiled by the same nvcc
call as the built-ins, with kernels/ on the include path (`common.cuh`).

A header that is missing, not TOML, lacks a key or has a wrong one, or a name another kernel has, is a
ConfigError naming the file and the key (exit status 2). `new_kernel_text` writes a starter file from a
built-in of the grid policy (`nbody-live new-kernel`).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from app.core.errors import ConfigError, InputFileError
from app.engine.forces import FP32_BUDGET, ErrorBudget, KernelRecord

MARK = "nbody-live kernel"
HEADER = re.compile(r"\A\s*/\*\s*" + re.escape(MARK) + r"[ \t]*\n(.*?)\*/", re.DOTALL)
POLICIES = ("grid",)
REFUSED_POLICIES = {
    "block-template": "its entry names (block_template_b<B>) are written into its policy",
    "register-blocked": "its entry names and reduce kernel are written into its policy",
    "multi-thread": "its entry names (multi_thread_q<q>) are written into its policy",
}
KEYS = {
    "name": str,
    "doc": str,
    "origin": str,
    "entry": str,
    "policy": str,
    "tile": bool,
    "precision": str,
    "budget_max": float,
    "block_sizes": list,
    "block_size": int,
}
REQUIRED = ("name", "doc", "entry", "policy")
NAME = re.compile(r"^[a-z][a-z0-9-]{0,39}$")
ENTRY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
TILE = 16  # bytes of dynamic shared memory per thread with tile = true: one float4 (as registry.TILE)


def header(path: Path) -> tuple[dict, str]:
    """(the header's keys, checked for their types, and the file's text); InputFileError / ConfigError
    naming the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputFileError(f"--kernel-file {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputFileError(f"--kernel-file {path}: cannot read it ({e})") from None
    found = HEADER.match(text)
    if found is None:
        raise ConfigError(
            f"{path}: no kernel header: the file must open with a /* {MARK} ... */ comment of TOML keys "
            "(name, doc, entry, policy); `nbody-live new-kernel NAME` writes a starter"
        )
    try:
        keys = tomllib.loads(found.group(1))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: the kernel header is not TOML: {e}") from None
    for key, value in keys.items():
        kind = KEYS.get(key)
        if kind is None:
            raise ConfigError(f"{path}: unknown header key {key!r}; the keys are {', '.join(KEYS)}")
        if not _of_kind(value, kind):
            raise ConfigError(f"{path}: header key {key!r} = {value!r} must be a {kind.__name__}")
    missing = [key for key in REQUIRED if key not in keys]
    if missing:
        raise ConfigError(f"{path}: the kernel header lacks {', '.join(missing)}")
    return keys, text


def _of_kind(value, kind: type) -> bool:
    """TOML's value of the key's type (a bool is not an int; an int is a float)."""
    if isinstance(value, bool):
        return kind is bool
    return isinstance(value, kind) or (kind is float and isinstance(value, int))


NAME_RULE = "lower-case letters, digits and '-', starting with a letter"


def user_record(path) -> KernelRecord:
    """The KernelRecord of the kernel file at `path` (its header checked, not compiled)."""
    from app.backends.cuda.policy_base import GridPolicy, block_size

    path = Path(path).expanduser().resolve()
    keys, text = header(path)
    name, entry, policy = keys["name"], keys["entry"], keys["policy"]
    if not NAME.match(name):
        raise ConfigError(
            f"{path}: name {name!r}: lower-case letters, digits and '-', starting with a letter"
        )
    if not ENTRY.match(entry):
        raise ConfigError(f"{path}: entry {entry!r} is not a C identifier")
    if policy in REFUSED_POLICIES:
        raise ConfigError(
            f"{path}: policy {policy!r} is not offered to kernel files yet ({REFUSED_POLICIES[policy]}); "
            f"use {' or '.join(repr(p) for p in POLICIES)}"
        )
    if policy not in POLICIES:
        raise ConfigError(f"{path}: policy {policy!r}: choose from {', '.join(POLICIES)}")
    if keys.get("precision", "fp32") != "fp32":
        raise ConfigError(f"{path}: precision {keys['precision']!r}: kernel files are fp32 (float4 rows)")
    if "NBODY_FORCE_ENTRIES" not in text:
        raise ConfigError(f"{path}: no NBODY_FORCE_ENTRIES(...): the entries of {entry!r} are never defined")
    budget = keys.get("budget_max")
    if budget is not None and not 0 < budget < 1:
        raise ConfigError(f"{path}: budget_max {budget!r} must be in (0, 1)")
    return KernelRecord(
        name=name,
        doc=keys["doc"],
        backend="cuda",
        source=str(path),
        entry=entry,
        tunables=(_block_size(path, keys, block_size),),
        origin=keys.get("origin") or f"user kernel file {path}",
        budget=ErrorBudget(max_rel=float(budget)) if budget is not None else FP32_BUDGET,
        policy=GridPolicy(TILE if keys.get("tile", False) else 0),
    )


def _block_size(path: Path, keys: dict, block_size):
    values = keys.get("block_sizes", [64, 128, 256, 512, 1024])
    default = keys.get("block_size", 256 if 256 in values else values[0] if values else 0)
    if not values or not all(isinstance(v, int) and v in (32, 64, 128, 256, 512, 1024) for v in values):
        raise ConfigError(f"{path}: block_sizes {values!r}: powers of two from 32 to 1024")
    if default not in values:
        raise ConfigError(f"{path}: block_size {default!r} is not one of block_sizes {values}")
    return block_size(tuple(values), default)


def is_starter_base(rec: KernelRecord) -> bool:
    """Whether `new-kernel --from` can start from built-in `rec`: fp32, launched as a kernel file is (the
    plain grid), for any N (pair-matrix's grid is the heatmap's, up to 8,192 bodies)."""
    from app.backends.cuda.policy_base import GridPolicy

    return (
        type(rec.policy) is GridPolicy
        and rec.precision == "fp32"
        and rec.max_n is None
        and rec.source is not None
        and not is_user(rec)
    )


def is_user(rec: KernelRecord) -> bool:
    """Whether `rec` came from a kernel file (its source is that file's absolute path)."""
    return rec.backend == "cuda" and rec.source is not None and Path(rec.source).is_absolute()


def kernel_files(files, dirs) -> list[Path]:
    """The files of --kernel-file and every `*.cu` opening with a header in each --kernel-dir, once each."""
    out: list[Path] = [Path(f).expanduser().resolve() for f in files or ()]
    for d in dirs or ():
        folder = Path(d).expanduser()
        if not folder.is_dir():
            raise ConfigError(f"--kernel-dir {d}: not a folder")
        for path in sorted(folder.glob("*.cu")):
            with open(path, encoding="utf-8", errors="replace") as f:
                if MARK in f.read(200):
                    out.append(path.resolve())
    return list(dict.fromkeys(out))


def load(files, dirs) -> list[KernelRecord]:
    """Add the kernels of `files` and `dirs` to the CUDA registry (before any backend is made; a file
    loaded already is read again and replaces its record); a name that another kernel (any backend's) or
    another file has is a ConfigError naming both."""
    from app.backends import all_kernel_records
    from app.backends.cuda import registry

    records = [user_record(path) for path in kernel_files(files, dirs)]
    again = {
        rec.source for rec in records
    }  # a file loaded before (a second command in one process): replaced
    registry.RECORDS = tuple(rec for rec in registry.RECORDS if rec.source not in again)
    taken = {rec.name: rec.source or rec.backend for rec in all_kernel_records()}
    for rec in records:
        if rec.name in taken:
            by = taken[rec.name]
            raise ConfigError(
                f"{rec.source}: name {rec.name!r} is taken (by {by}); give the kernel another name"
            )
        taken[rec.name] = rec.source or ""
    registry.RECORDS = registry.RECORDS + tuple(records)
    return records


def new_kernel_text(name: str, base: KernelRecord) -> str:
    """A starter kernel file: built-in `base` (a grid-policy record) under a header naming it `name`, its
    entry renamed to match."""
    from app.backends.cuda.compile import resolve_source

    if not is_starter_base(base):
        raise ConfigError(
            f"--from {base.name}: a starter is made from an fp32 built-in launched one thread per target "
            f"(policy 'grid'): e.g. shared, naive, shared-unroll"
        )
    if not NAME.match(name):
        raise ConfigError(f"new-kernel {name!r}: {NAME_RULE}")
    assert base.entry is not None and base.source is not None  # (is_starter_base)
    entry = name.replace("-", "_") + "_force"
    body = re.sub(
        rf"\b{re.escape(base.entry)}\b", entry, resolve_source(base.source).read_text(encoding="utf-8")
    )
    tile = base.policy.shared_bytes_per_thread > 0
    return (
        f"/* {MARK}\n"
        f'name = "{name}"\n'
        f'doc = "my variant of {base.name}: say in one line what it does differently"\n'
        f'origin = "nbody-live new-kernel {name} --from {base.name}"\n'
        f'entry = "{entry}"  # NBODY_FORCE_ENTRIES(...) at the end defines {entry}_<model>_<self>\n'
        f'policy = "grid"  # one thread per target, ceil(N / block_size) blocks\n'
        f"tile = {'true' if tile else 'false'}  # a float4 of dynamic shared memory per thread\n"
        f'precision = "fp32"\n'
        f"block_sizes = [64, 128, 256, 512, 1024]\n"
        f"block_size = 256\n"
        f"*/\n"
        f"// Started from kernels/{base.source} ({base.name}): {base.doc}.\n"
        f"// Edit the body below. `nbody-live validate --kernel-file THIS --kernel {name}` checks it\n"
        f"// against float64; `nbody-live bench --kernel-file THIS --kernels {name},shared` times it.\n"
        + body
    )


COMPILER_ERROR = re.compile(r"^(?P<where>.+\(\d+\)): error: (?P<what>.*)$", re.MULTILINE)


def first_compile_error(log: str) -> str | None:
    """nvcc's first `file(line): error: ...`, and how many more errors there are, in one line."""
    errors = list(COMPILER_ERROR.finditer(log))
    if not errors:
        return None
    first = f"{errors[0]['where']}: error: {errors[0]['what'].strip()}"
    return first + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else "")
