"""What every launch policy (policies.py) shares: the force kernels' arguments as the host passes them, the
launch call, and `GridPolicy`, one thread per target, which the other policies derive from.

Every force entry takes the range ABI of kernels/common.cuh:
    (targets, sources, acc, ni, nj, eps2, G, H, ...extra)
with the host passing `pos + i0`, `pos + j0`, `acc + i0`; atomics-n3l, which needs both ends of each
pair, takes one set of bodies (n3l_policy.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from app.core.errors import ConfigError
from app.core.values import IntChoice
from app.engine.forces import ForceWork, Span, all_pairs_work
from app.model.physics import Physics

SOFT_EPS2_MIN = 1e-12  # NBODY_MIN_SOFT_EPS2 in kernels/common.cuh: below it the PLAIN form is used
FLT_MIN = 1.1754943508222875e-38
BLOCK_SIZES = (64, 128, 256, 512, 1024)
SMALL_BLOCKS = (64, 128, 256)
FORMS = tuple((r, s) for r in (False, True) for s in (True, False))  # (repulsion, soft) specialisations

Run = Callable[[int, int, int, object], None]


def force_arguments(physics: Physics) -> tuple[bool, bool, float, float, float]:
    """(repulsion, soft, eps2, G, H) as the force kernels take them.

    The branch-free SOFT form needs ε² >= 1e-12 (so 1/s⁵ stays finite in fp32); below that the PLAIN
    form skips s² = 0 instead, with ε² itself (0 when it would be denormal).
    """
    eps2 = float(physics.softening) ** 2
    soft = eps2 >= SOFT_EPS2_MIN
    if eps2 < FLT_MIN:
        eps2 = 0.0
    h = float(physics.h)
    return h != 0.0, soft, eps2, float(physics.G), h


def suffix(repulsion: bool, soft: bool) -> str:
    return f"{'repulsion' if repulsion else 'gravity'}_{'soft' if soft else 'plain'}"


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def launch(fn, grid, block: int, stream, *args, shared: int = 0) -> None:
    if stream is None:
        fn.prepared_call(grid, (block, 1, 1), *args, shared_size=shared)
    else:
        fn.prepared_async_call(grid, (block, 1, 1), stream, *args, shared_size=shared)


def block_size(choices: Sequence[int] = BLOCK_SIZES, default: int = 256) -> IntChoice:
    return IntChoice("block_size", tuple(choices), default, "threads per block")


# --- one thread per target: naive, shared, gpu5, shared-unroll, shared-ptx-fma, warp-shuffle, ... -------
class GridPolicy:
    """ceil(ni / B) blocks of B threads, one target each; `shared_bytes_per_thread` of dynamic tile."""

    arg_types = "PPPiifff"
    row_bytes = 16  # float4 [x, y, z, m]
    targets_within_sources = False  # True: targets must lie inside the sources (Newton's third law)
    resolves = False  # True: `best`, which runs another record

    def __init__(self, shared_bytes_per_thread: int = 0, nvcc_options: tuple[str, ...] | None = None):
        self.shared_bytes_per_thread = shared_bytes_per_thread
        self.nvcc_options = nvcc_options  # None: compile.NVCC_OPTIONS

    def symbol(self, rec, repulsion: bool, soft: bool, tun: dict) -> str:
        return f"{rec.entry}_{suffix(repulsion, soft)}"

    def helpers(self, rec, repulsion: bool, soft: bool, tun: dict) -> list[tuple[str, str]]:
        """(symbol, arg types) of the helper kernels a launch also needs (register-blocked's reduce, the
        streams tail)."""
        return []

    def entries(self, rec, repulsion: bool, soft: bool, tun: dict) -> list[tuple[str, str]]:
        """(symbol, arg types) of every kernel one launch with these tunables uses, the force entry first."""
        return [
            (self.symbol(rec, repulsion, soft, tun), self.arg_types),
            *self.helpers(rec, repulsion, soft, tun),
        ]

    def symbols(self, rec) -> list[str]:
        """Every entry this record can launch over its allowed tunables (compile tests, preloading)."""
        out: set[str] = set()
        for tun in self.symbol_tunables(rec):
            for repulsion, soft in FORMS:
                out.update(symbol for symbol, _types in self.entries(rec, repulsion, soft, tun))
        return sorted(out)

    def symbol_tunables(self, rec) -> list[dict]:
        """The tunable settings that change which symbol runs (only the defaults here)."""
        return [rec.default_tunables()]

    def work(self, targets: Span, sources: Span) -> ForceWork:
        return all_pairs_work(targets, sources)

    def function(self, dev, rec, repulsion: bool, soft: bool, tun: dict):
        """The prepared force entry of this specialisation on `dev`."""
        symbol = self.symbol(rec, repulsion, soft, tun)
        return dev.function(rec.source, symbol, self.arg_types, self.nvcc_options)

    def plan(self, dev, rec, tun: dict, args: tuple, ni: int, nj: int) -> Run:
        repulsion, soft, eps2, g, h = args
        fn = self.function(dev, rec, repulsion, soft, tun)
        block = dev.max_block(fn, int(tun["block_size"]))
        grid, shared = (ceil_div(ni, block), 1), self.shared_bytes_per_thread * block

        def run(t, s, a, stream=None):
            launch(fn, grid, block, stream, t, s, a, ni, nj, eps2, g, h, shared=shared)

        return run

    def candidates(self, rec, n: int, sms: int) -> list[dict]:
        """Tunable settings `tune` tries at N, the defaults first."""
        return sweep(rec, [{"block_size": b} for b in (128, 512, 64, 1024, 256)])


def sweep(rec, changes: list[dict]) -> list[dict]:
    """The record's defaults, then each allowed change of them, without repeats."""
    default = rec.default_tunables()
    out = [default]
    for change in changes:
        cfg = {**default, **change}
        try:
            rec.validate_tunables(cfg)
        except ConfigError:
            continue
        if cfg not in out:
            out.append(cfg)
    return out
