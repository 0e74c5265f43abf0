"""atomics-n3l's launch policy: each pair once, Newton's third law by float atomics (kernels/atomics-n3l.cu),
its warp tasks (rows of target tiles x chunks of source tiles), the chunk picked from N and the SM count,
and one device's slice of the tasks for a pair split over several devices (app/parallel/decomposition.py)."""

from __future__ import annotations

from app.backends.cuda.policy_base import GridPolicy, ceil_div, launch, suffix, sweep
from app.engine.forces import ForceWork, all_pairs_work
from app.parallel.decomposition import PairTiles


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

            def run_in_place(t, s, a, stream=None):
                whole(s, a, stream)

            return run_in_place

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
        return sweep(rec, [*changes, {"block_size": 64}])
