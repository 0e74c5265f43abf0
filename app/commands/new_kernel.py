"""`nbody-live new-kernel`: write a starter CUDA kernel file of your own, from a built-in."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "write a starter CUDA force kernel file of your own (a header and a built-in's body) to edit"
DESCRIPTION = """\
Write NAME.cu: a /* nbody-live kernel */ header (name, doc, entry, launch policy, block sizes) and the
body of a built-in kernel (--from, default shared) with its entry renamed, ready to edit and to run
beside the built-ins with --kernel-file (run, record, simulate, validate, bench, tune, info). The
header's keys and the kernel ABI are in docs/writing-kernels.md; kernel files are fp32 and launched one
thread per target ("grid"), so --from takes the built-ins launched so: naive, shared, shared-unroll,
shared-ptx-fma, gpu5-branchy, warp-shuffle. An existing file is never overwritten.

examples:
  nbody-live new-kernel my-kernel                      # my-kernel.cu from shared
  nbody-live new-kernel my-kernel --from shared-unroll --out kernels-mine/my-kernel.cu
  nbody-live validate --kernel-file my-kernel.cu --kernel my-kernel --n 4096
  nbody-live bench --kernel-file my-kernel.cu --kernels my-kernel,shared --n 65536,1048576
"""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "new-kernel", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("name", metavar="NAME", help="the kernel's name (lower-case letters, digits and '-')")
    p.add_argument(
        "--from", dest="base", default="shared", metavar="KERNEL", help="the built-in to start from"
    )
    p.add_argument("--out", type=Path, metavar="FILE.cu", help="where to write it (default ./NAME.cu)")
    p.set_defaults(func=main)


def main(args) -> int:
    from app.backends.cuda import registry
    from app.backends.cuda.user_kernels import new_kernel_text
    from app.core.errors import ConfigError
    from app.core.outputs import atomic_write, check_output, check_suffix

    out = args.out or Path(f"{args.name}.cu")
    check_suffix(out, (".cu",), "kernel file", "--out")
    check_output(out, "kernel file")  # first: a name too long to look at is its one line
    if out.exists():
        raise ConfigError(f"{out} exists: new-kernel does not overwrite a file; give another --out")
    records = {r.name: r for r in registry.RECORDS}
    if args.base not in records:
        raise ConfigError(f"--from {args.base}: not a CUDA kernel; choose from {', '.join(records)}")
    if args.name in records:
        raise ConfigError(f"new-kernel {args.name}: a built-in has that name; choose another")
    text = new_kernel_text(args.name, records[args.base])
    with atomic_write(out, "w", "kernel file") as f:
        f.write(text)
    print(f"wrote {out}: edit it, then nbody-live validate --kernel-file {out} --kernel {args.name}")
    return 0
