"""Launch policies: how one CUDA force record is named, compiled, launched and tuned.

A record's `policy` is one of these objects (app/backends/cuda/registry.py); the evaluator
(evaluator.py) asks it for a `plan`: a closure that launches the force for fixed tunables, physics
and span sizes, `run(targets_ptr, sources_ptr, acc_ptr, stream)`. All the Python (symbols, grid
geometry, task counts) happens when the plan is built, once per configuration, so that between the
two CUDA events of a timed force evaluation only driver calls remain (at N = 4,096 a launch runs for
~20 µs: a few hundred µs of Python there would be timed as GPU time).

Every force entry takes the range ABI of kernels/common.cuh:
    (targets, sources, acc, ni, nj, eps2, G, H, ...extra)
with the host passing `pos + i0`, `pos + j0`, `acc + i0`; atomics-n3l, which needs both ends of each
pair, takes one set of bodies (see N3LPolicy). Adding a variant: one .cu file plus one record whose
policy is one of these (or a new subclass when its launch is new).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence

from app.core.errors import ConfigError
from app.engine.forces import ForceWork, IntChoice, Span, all_pairs_work
from app.model.physics import Physics
from app.parallel.decomposition import PairTiles

log = logging.getLogger(__name__)

SOFT_EPS2_MIN = 1e-12  # NBODY_MIN_SOFT_EPS2 in kernels/common.cuh: below it the PLAIN form is used
FLT_MIN = 1.1754943508222875e-38
MAX_SCRATCH_BYTES = 512 * 2**20
REDUCE_BLOCK = 256
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
        out = set()
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
        return _sweep(rec, [{"block_size": b} for b in (128, 512, 64, 1024, 256)])


def _sweep(rec, changes: list[dict]) -> list[dict]:
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


class BlockTemplatePolicy(GridPolicy):
    """A compile-time block size: symbol block_template_b<B>_<form>."""

    def symbol(self, rec, repulsion, soft, tun):
        return f"block_template_b{tun['block_size']}_{suffix(repulsion, soft)}"

    def symbol_tunables(self, rec):
        return [{"block_size": b} for b in rec.tunable("block_size").values]


class MultiThreadPolicy(GridPolicy):
    """q threads per target share its source range and reduce by shuffles: ceil(ni q / B) blocks."""

    def symbol(self, rec, repulsion, soft, tun):
        return f"multi_thread_q{tun['q']}_{suffix(repulsion, soft)}"

    def symbol_tunables(self, rec):
        return [{"q": q} for q in rec.tunable("q").values]

    def plan(self, dev, rec, tun, args, ni, nj):
        repulsion, soft, eps2, g, h = args
        fn = self.function(dev, rec, repulsion, soft, tun)
        block = int(tun["block_size"])
        grid, shared = (ceil_div(ni * int(tun["q"]), block), 1), self.shared_bytes_per_thread * block

        def run(t, s, a, stream=None):
            launch(fn, grid, block, stream, t, s, a, ni, nj, eps2, g, h, shared=shared)

        return run

    def candidates(self, rec, n, sms):
        return _sweep(rec, [{"q": q, "block_size": b} for q in (2, 8, 16, 32, 4) for b in (256, 128, 512)])


class StreamsPolicy(GridPolicy):
    """The check-free tiled kernel on floor(ni / B) B targets on one stream, the remainder kernel on a
    second stream, concurrently (both blocking streams: ordered with the default stream)."""

    def helpers(self, rec, repulsion, soft, tun):
        return [(f"streams_remainder_tail_{suffix(repulsion, soft)}", self.arg_types)]

    def plan(self, dev, rec, tun, args, ni, nj):
        repulsion, soft, eps2, g, h = args
        fn = self.function(dev, rec, repulsion, soft, tun)
        tail = dev.function(rec.source, *self.helpers(rec, repulsion, soft, tun)[0], self.nvcc_options)
        block = int(tun["block_size"])
        s1, s2 = dev.stream("streams-main"), dev.stream("streams-tail")
        nfull, shared = (ni // block) * block, self.shared_bytes_per_thread * block

        def run(t, s, a, stream=None):
            if nfull:
                launch(fn, (nfull // block, 1), block, s1, t, s, a, ni, nj, eps2, g, h, shared=shared)
            if ni > nfull:
                launch(tail, (1, 1), block, s2, t, s, a, ni, nj, eps2, g, h, shared=shared)

        return run


# --- register blocking --------------------------------------------------------------------------------
def slice_plan(n: int, block: int, slices: int) -> tuple[int, int]:
    """(slice_len, slices actually used): slice_len is a multiple of `block` covering n in `slices`."""
    slices = max(1, min(int(slices), ceil_div(max(n, 1), block)))
    slice_len = ceil_div(ceil_div(max(n, 1), slices), block) * block
    return slice_len, ceil_div(max(n, 1), slice_len)


def auto_slices(ni: int, nj: int, block: int, k: int, sms: int, warps_per_sm: int = 16) -> int:
    """How many source slices register-blocked needs so that every SM has enough warps and equal work.

    Scores each distinct slice count by (blocks per SM / its ceiling: the balance of the last wave) x
    (resident warps per SM / warps_per_sm, capped at 1), with a small preference for fewer slices
    (less partial-sum traffic); at large N this is 1.
    """
    body_blocks = ceil_div(max(ni, 1), block * k)
    best, best_score = 1, -1.0
    seen = set()
    for s in range(1, 129):
        _slice_len, used = slice_plan(nj, block, s)
        if used in seen:
            continue
        seen.add(used)
        per_sm = body_blocks * used / max(sms, 1)
        balance = per_sm / math.ceil(per_sm)
        occupancy = min(1.0, per_sm * (block // 32) / warps_per_sm)
        score = balance * occupancy / (1.0 + 0.003 * used)
        if score > best_score + 1e-9:
            best, best_score = used, score
    return best


REGBLOCK_REDUCE = ("regblock_reduce", "PPiiif")  # (partial, acc, ni, npad, slices, scale)


class RegisterBlockedPolicy(GridPolicy):
    """K targets per thread; a 2-D grid of (target tiles of B K) x (source slices); with more than one
    slice a second kernel (regblock_reduce) adds the partial sums from a scratch buffer."""

    arg_types = "PPPiifffPi"

    def symbol(self, rec, repulsion, soft, tun):
        return f"regblock_k{tun['k']}_b{tun['block_size']}_{suffix(repulsion, soft)}"

    def helpers(self, rec, repulsion, soft, tun):
        return [REGBLOCK_REDUCE]

    def symbol_tunables(self, rec):
        return [
            {"k": k, "block_size": b}
            for k in rec.tunable("k").values
            for b in rec.tunable("block_size").values
        ]

    def plan(self, dev, rec, tun, args, ni, nj):
        repulsion, soft, eps2, g, h = args
        fn = self.function(dev, rec, repulsion, soft, tun)
        block, k = int(tun["block_size"]), int(tun["k"])
        slices = int(tun.get("slices", 0)) or auto_slices(ni, nj, block, k, dev.facts.sms)
        body_blocks = ceil_div(ni, block * k)
        npad = body_blocks * block * k
        while slices > 1 and slices * npad * 16 > MAX_SCRATCH_BYTES:
            slices //= 2
        slice_len, slices = slice_plan(nj, block, slices)
        if slices == 1:

            def run(t, s, a, stream=None):
                launch(fn, (body_blocks, 1), block, stream, t, s, a, ni, nj, eps2, g, h, 0, slice_len)

            return run
        red = dev.function(rec.source, *REGBLOCK_REDUCE, self.nvcc_options)
        nbytes, scale, rgrid = slices * npad * 16, 1.0 if repulsion else g, ceil_div(ni, REDUCE_BLOCK)

        def run(t, s, a, stream=None):
            partial = dev.scratch("regblock-partial", nbytes)  # looked up per launch: it may have grown
            launch(fn, (body_blocks, slices), block, stream, t, s, a, ni, nj, eps2, g, h, partial, slice_len)
            launch(red, (rgrid, 1), REDUCE_BLOCK, stream, partial, a, ni, npad, slices, scale)

        return run

    def candidates(self, rec, n, sms):
        allowed = rec.tunable("slices").values
        changes = []
        for k, b in ((6, 128), (4, 64), (6, 64), (2, 64), (4, 256), (2, 128), (6, 256), (1, 64), (4, 128)):
            auto = auto_slices(n, n, b, k, sms)
            others = (auto // 2, auto * 2, auto + auto // 2)
            near = {auto} | {slice_plan(n, b, s)[1] for s in others if s >= 1}
            changes += [
                {"k": k, "block_size": b, "slices": 0 if s == auto else s}
                for s in sorted(near)
                if (0 if s == auto else s) in allowed
            ]
        return _sweep(rec, changes)


# --- Newton's third law ----------------------------------------------------------------------------------
def n3l_tasks(n: int, ki: int, chunk: int) -> int:
    """Non-empty warp tasks of atomics-n3l: rows of 32*ki bodies x chunks of 64-body j-tiles."""
    ntj = ceil_div(n, 64)
    nti = ceil_div(n, 32 * ki)
    r = ki // 2
    return sum(ceil_div(ntj - row * r, chunk) for row in range(nti) if ntj - row * r > 0)


def auto_chunk(n: int, ki: int, sms: int, tasks_per_sm: int = 64) -> int:
    """The largest chunk (fewest atomics) that still gives every SM `tasks_per_sm` warp tasks."""
    for chunk in (64, 32, 16, 8, 4, 2):
        if n3l_tasks(n, ki, chunk) >= sms * tasks_per_sm:
            return chunk
    return 1


def n3l_geometry(n: int, ki: int, chunk: int, block: int) -> tuple[int, int, int]:
    """(chunk, chunks_per_row, blocks), chunk raised if needed to keep the thread count below 2^31."""
    ntj = ceil_div(n, 64)
    nti = ceil_div(n, 32 * ki)
    chunk = max(1, chunk)
    while nti * ceil_div(ntj, chunk) * 32 >= 2**31 - block:
        chunk *= 2
    cpr = ceil_div(ntj, chunk)
    return chunk, cpr, ceil_div(nti * cpr * 32, block)


class N3LPolicy(GridPolicy):
    """Each pair once, the reaction added to the source by float atomics: it evaluates one set of bodies
    against itself, `(pos, acc, n, ...)`. Targets that are a proper part of the sources are evaluated
    by running the whole source set into a scratch buffer and copying their rows (the work counted is
    that of the whole set); targets outside the sources cannot be done this way."""

    arg_types = "PPifffiiii"
    targets_within_sources = True

    def symbol(self, rec, repulsion, soft, tun):
        return f"n3l_ki{tun['ki']}_{suffix(repulsion, soft)}"

    def symbol_tunables(self, rec):
        return [{"ki": ki} for ki in rec.tunable("ki").values]

    def work(self, targets, sources):
        whole = all_pairs_work(sources, sources)
        return ForceWork(whole.interactions, targets.count * sources.count, evaluations=1)

    def plan(self, dev, rec, tun, args, ni, nj):
        repulsion, soft, eps2, g, h = args
        fn = self.function(dev, rec, repulsion, soft, tun)
        ki, block = int(tun["ki"]), int(tun["block_size"])
        chunk = int(tun.get("chunk", 0)) or auto_chunk(nj, ki, dev.facts.sms)
        chunk, cpr, blocks = n3l_geometry(nj, ki, chunk, block)
        drv = dev.drv

        tasks = ceil_div(nj, 32 * ki) * cpr

        def whole(s, a, stream):
            if stream is None:
                drv.memset_d32(a, 0, 4 * nj)
            else:
                drv.memset_d32_async(a, 0, 4 * nj, stream)
            launch(fn, (blocks, 1), block, stream, s, a, nj, eps2, g, h, chunk, cpr, 0, tasks)

        if ni == nj:  # the evaluator checked that the targets lie within the sources: they are the sources

            def run(t, s, a, stream=None):
                whole(s, a, stream)

            return run

        def run(t, s, a, stream=None):
            scratch = dev.scratch("n3l-acc", 16 * nj)
            whole(s, scratch, stream)
            if stream is None:
                drv.memcpy_dtod(a, scratch + (t - s), 16 * ni)
            else:
                drv.memcpy_dtod_async(a, scratch + (t - s), 16 * ni, stream)

        return run

    def tiles(self, dev, tun: dict, n: int) -> PairTiles:
        """The task grid a launch over n bodies with these tunables runs (app/parallel/decomposition.py)."""
        ki, block = int(tun["ki"]), int(tun["block_size"])
        chunk = int(tun.get("chunk", 0)) or auto_chunk(n, ki, dev.facts.sms)
        chunk = n3l_geometry(n, ki, chunk, block)[0]
        return PairTiles(int(n), 32 * ki, 64, chunk)

    def plan_slice(self, dev, rec, tun: dict, args: tuple, n: int, task_lo: int, task_hi: int):
        """A launch of the tasks [task_lo, task_hi) over all n bodies, adding into a zeroed acc: one
        device's slice of a pair split. run(pos, acc, stream) zeroes acc (n rows) and launches."""
        repulsion, soft, eps2, g, h = args
        fn = self.function(dev, rec, repulsion, soft, tun)
        block = int(tun["block_size"])
        tiles = self.tiles(dev, tun, n)
        blocks = max(1, ceil_div((task_hi - task_lo) * 32, block))
        drv = dev.drv

        def run(pos, acc, stream=None):
            if stream is None:
                drv.memset_d32(acc, 0, 4 * n)
            else:
                drv.memset_d32_async(acc, 0, 4 * n, stream)
            if task_hi > task_lo:
                launch(
                    fn,
                    (blocks, 1),
                    block,
                    stream,
                    pos,
                    acc,
                    n,
                    eps2,
                    g,
                    h,
                    tiles.chunk,
                    tiles.chunks_per_row,
                    task_lo,
                    task_hi,
                )

        return run

    def candidates(self, rec, n, sms):
        changes = []
        for ki in (4, 2):
            auto = auto_chunk(n, ki, sms)
            changes += [{"ki": ki, "chunk": c} for c in (0, max(1, auto // 2), auto * 2, max(1, auto // 4))]
        return _sweep(rec, [*changes, {"block_size": 64}])


# --- double precision --------------------------------------------------------------------------------------
class Fp64Policy(GridPolicy):
    """Double state: positions are dvec4 rows (32 bytes) and the accelerations land in a double buffer
    (the evaluator's `acc`); the kernel's float copy of them goes to scratch, nothing reads it."""

    arg_types = "PPPiidddP"
    row_bytes = 32

    def plan(self, dev, rec, tun, args, ni, nj):
        repulsion, soft, eps2, g, h = args
        fn = self.function(dev, rec, repulsion, soft, tun)
        block = dev.max_block(fn, int(tun["block_size"]))
        grid, shared = (ceil_div(ni, block), 1), self.shared_bytes_per_thread * block

        def run(t, s, a, stream=None):
            acc32 = dev.scratch("fp64-acc32", 16 * ni)
            launch(fn, grid, block, stream, t, s, acc32, ni, nj, eps2, g, h, a, shared=shared)

        return run


# --- the chooser -------------------------------------------------------------------------------------------
class BestPolicy(GridPolicy):
    """Runs another record, chosen per N for this GPU: the tuning cache's entry (`nbody-live tune`), else
    the committed heuristic table's pick for this GPU's family (heuristic.py), else the safe pick at its
    defaults on a GPU the table does not know. Under `--gpus K` the cache's tuning on K GPUs (`nbody-live
    tune --gpus K`), else the one-GPU pick with a warning. The evaluator asks `resolve` per N."""

    resolves = True

    def __init__(self, safe: str, table=None):
        super().__init__()
        self.safe = safe
        self.table = table  # None: heuristic.TABLE (a test points it elsewhere)

    def symbols(self, rec) -> list[str]:
        return []

    def resolve(self, records: dict, facts, n: int, devices: int = 1) -> tuple:
        """(record, tunables, source, warning) for N split over `devices` GPUs (`--gpus K`; 1: one GPU).

        One GPU: `source` is the log line's "which": "tuned cache for <gpu>", "heuristic from <file> for
        <family> (<why no cache>; run `nbody-live tune` to tune)" or "safe pick ..."; `warning` is None, or
        why a cache or table that exists was not usable. K > 1: the cache's tuning on K GPUs ("tuned cache
        for <gpu> on K GPUs": what scales on K devices may not be what is fastest on one), else what one
        GPU would run, its source saying so and a warning naming `nbody-live tune --gpus K` (nothing
        falls back silently)."""
        if devices > 1:
            rec, tun, why = self._cached(records, facts, n, devices)
            if rec is not None:
                return rec, tun, f"tuned cache for {facts.name} on {devices} GPUs", None
            rec, tun, source, warning = self.resolve(records, facts, n)
            fallback = (
                f"best: no tuning on {devices} GPUs for N = {n:,} ({why}); running the one-GPU pick "
                f"{rec.name}; run `nbody-live tune --gpus {devices}` to tune on {devices} GPUs"
            )
            return (
                rec,
                tun,
                f"{source}, the one-GPU pick (none tuned on {devices} GPUs)",
                "; ".join(w for w in (warning, fallback) if w),
            )
        from app.backends.cuda import heuristic

        warning = None
        rec, tun, why = self._cached(records, facts, n, 1)
        if rec is not None:
            return rec, tun, f"tuned cache for {facts.name}", None
        hint = f"{why}; run `nbody-live tune` to tune"
        table_path = self.table or heuristic.TABLE
        try:
            table = heuristic.load_table(records.values(), table_path)
        except heuristic.HeuristicTableError as e:
            table, warning = None, f"best: {e}; using the safe pick {self.safe}"
        family = heuristic.family_for(table, facts) if table is not None else None
        if family is not None:
            pick = heuristic.nearest(family["picks"], n)
            rec = records[pick["variant"]]
            source = (
                f"heuristic from {heuristic.shown(table_path)} for "
                f"{heuristic.describe_family(family, facts)} ({hint})"
            )
            return rec, rec.with_tunables(pick.get("tunables", {})), source, warning
        rec = records[self.safe]
        unknown = "" if table is None else f", a GPU {heuristic.shown(table_path)} does not know"
        return rec, rec.default_tunables(), f"safe pick for {facts.name}{unknown} ({hint})", warning

    @staticmethod
    def _cached(records: dict, facts, n: int, devices: int) -> tuple:
        """(record, tunables, '') of the tuning cache's entry for N on `devices` GPUs, else (None, None,
        why not)."""
        from app.backends.cuda import tuning_cache

        try:
            choice, why = tuning_cache.lookup(n, facts, list(records.values()), devices)
        except Exception as e:  # a broken cache must never stop the viewer
            choice, why = None, f"tuning cache unreadable ({e})"
        if choice is None:
            return None, None, why
        try:
            rec = records[choice["variant"]]
            tun = rec.with_tunables(
                {
                    k: v
                    for k, v in choice.get("tunables", {}).items()
                    if any(t.name == k for t in rec.tunables)
                }
            )
        except (ConfigError, KeyError, TypeError, ValueError) as e:
            return None, None, f"the cached choice cannot be used ({e})"
        return rec, tun, ""
