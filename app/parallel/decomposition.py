"""How K devices split one force evaluation: each force method's record names its decomposition.

A share of body indices is all a one-sided all-pairs kernel needs to do less work, but not every method
can use it: Newton's third law computes each pair once, for both bodies, and a tree's groups follow its
space-filling curve, so every group holds bodies of every index range. So the work split belongs to the
force method (its `KernelRecord.decomposition`), and the multi-device driver (app/parallel/multidevice.py)
runs whichever one the record names:

    targets   a range of targets against every source            exchange: positions (all-gather)
    pairs     a balanced slice of the pair tiles, partial a of    exchange: accelerations (reduce-scatter
              every body                                                    to each device's share)
    domains   a run of the tree's groups (a key range of its      exchange: accelerations in key order
              sorted order), every device building the whole tree           (all-gather), then back to
              from all positions and integrating every body                 state order on each device

Every device keeps a full copy of the positions. What differs is what each device computes, what moves
after the force, and which rows each device integrates:

- targets: device k integrates its share; after each drift its share's positions go to every other copy.
- pairs: device k adds the interactions of its slice of the pair tiles into an acceleration array of all
  N bodies (zeroed first); the reduce-scatter sums the K partial arrays into each device's share, in
  device order; it then integrates its share and exchanges positions as `targets` does.
- domains: device k builds the tree of all N positions (the same tree on every device: same input, same
  deterministic kernels), walks only the groups of its key range and writes those bodies' accelerations
  in the tree's order; the ranges are all-gathered and every device scatters them back to state order,
  then integrates every body (the same arithmetic on the same inputs on every device: the copies stay
  bitwise equal, so no positions move at all). What moves is one float4 per body, as for positions.
  Every device's tree and the walk of each group are those of one device, so K devices give bitwise one
  device's accelerations.

Under a domain split the devices keep the state itself in the tree's key order, re-sorted at each
evaluation as Bonsai keeps its bodies (`sorts_state`, DeviceState.take_key_order), with `ids` naming
the body in each row; whatever is read back (state, snapshots, the renderer's copy, picks) is put back in
load order through them (docs/multi-gpu.md, "The state in key order"). One GPU is the K = 1 case of the
same run, so all of this holds there too.

Adding a decomposition: a class here with `force(ops)` (what each device computes and the exchange that
completes a(x) on the rows it integrates), the device methods it calls (DeviceState in
app/parallel/multidevice.py) and the exchange operations it needs (each exchange: host, peer, NCCL, MPI).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from app.core.errors import ConfigError, RuntimeFault
from app.engine.forces import Span


class Decomposition:
    """One way of splitting a force evaluation over K devices (see the module docstring)."""

    name = ""
    doc = ""
    exchanges = ""  # what moves between devices after each force evaluation, in words
    integrate_all = False  # every device integrates every body (else: its share)
    exchanges_positions = True  # the new positions of each share go to every other device after a drift
    # the multi-device driver `--gpu-driver auto` picks (app/parallel/multidevice.py DRIVERS): a host thread
    # per device, where each device's part is queued without a host wait
    driver = "threads"
    # whether the devices keep the state in the force's own order (domains: the tree's key order, as
    # Bonsai keeps it), re-sorted at each evaluation (DeviceState.take_key_order; `ids` name the bodies)
    sorts_state = False

    def force(self, ops) -> None:
        """Queue each device's part of a(x) and the exchange that completes it on the rows each device
        integrates (`ops` is app.parallel.multidevice.MultiDeviceOps)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<decomposition {self.name}>"


class Targets(Decomposition):
    name = "targets"
    doc = "each device: a range of targets against every source (one-sided all-pairs)"
    exchanges = "positions (all-gather)"

    def force(self, ops) -> None:
        ops.submit(lambda i, device: ops.add_work(i, device.force()))


class Pairs(Decomposition):
    name = "pairs"
    doc = "each device: a balanced slice of the pair tiles, partial accelerations of every body (Newton 3)"
    exchanges = "accelerations (reduce-scatter), then positions (all-gather)"

    def force(self, ops) -> None:
        ops.submit(lambda i, device: ops.add_work(i, device.force_pairs()))
        if ops.exchange.moves_rows(ops.devices):
            ops.driver.finish()  # every device queued its slice: the exchange's marks come after them
            ops.exchange.reduce_scatter(ops.devices, "acc")


class Domains(Decomposition):
    name = "domains"
    doc = (
        "each device: the whole tree from all positions, the walk of its key range's groups; every "
        "device integrates every body"
    )
    exchanges = "accelerations in key order (all-gather), scattered back to state order on each device"
    integrate_all = True
    exchanges_positions = False
    # The tree's evaluation waits for its GPU twice (after the build, after the walk), between ~100
    # small launches: from a thread per GPU the threads took turns on the GIL (1M on two H100s: 1.16x one
    # GPU); one thread taking the devices' phases in turns gave 1.42x (docs/multi-gpu.md).
    driver = "single"
    sorts_state = True

    def force(self, ops) -> None:
        counted: list[int] = [0] * len(ops.devices)

        def build_and_walk(i, device):  # in phases: the single driver takes the devices' turns
            work = yield from device.force_domain_phases()
            counted[i] = work.interactions
            ops.add_work(i, work)

        ops.submit(build_and_walk)
        if ops.exchange.moves_rows(ops.devices):
            ops.driver.finish()  # the devices' key ranges are known once each has built its tree
            ops.exchange.gather_sorted(ops.devices)
        if any(device.evaluator.wants_totals() for device in ops.devices):
            self._tell_total(ops, counted)
        # the state follows the tree: acc is sacc, pos/vel/speed/ids permuted alike on every device
        ops.submit(lambda i, device: device.take_key_order())

    @staticmethod
    def _tell_total(ops, counted: list[int]) -> None:
        """Every device's evaluator learns the whole evaluation's interaction count (the devices' sum;
        MPI ranks: one small allreduce, `ops.rank_sum`), so that a decision taken on it (the tree's
        adaptive rebuild, app/engine/refit_cadence.py) is every device's: they keep building the same tree."""
        ops.driver.finish()  # (the threads driver: every device's walk counted)
        total = sum(counted)
        if ops.layout is not None:  # part of a larger run: the other participants' counts too
            if ops.rank_sum is None:
                raise ConfigError(
                    "rebuild_rule=adaptive needs the whole evaluation's interaction count, "
                    "and this run cannot sum it over its participants; use rebuild_rule=fixed"
                )
            total = ops.rank_sum(total)
        for device in ops.devices:
            device.evaluator.observe_evaluation(total)


TARGETS, PAIRS, DOMAINS = Targets(), Pairs(), Domains()
DECOMPOSITIONS = (TARGETS, PAIRS, DOMAINS)  # the package's splits (tests/test_decomposition.py walks them)


def of(record) -> Decomposition:
    """The decomposition a record declares (`KernelRecord.decomposition`; unset: targets)."""
    return getattr(record, "decomposition", None) or TARGETS


# --- the cuts of a domain split ----------------------------------------------------------------------------
def share_cuts(shares: Sequence) -> list[int]:
    """[s_0.start, s_1.start, ..., n]: where the shares begin, and the end (the cuts a domain split aims
    for: device k's domain is about its share's size)."""
    return [int(s.start) for s in shares] + [int(shares[-1].stop)]


def align_cuts(cuts: Sequence[int], boundaries: np.ndarray) -> list[int]:
    """Each cut moved to the first boundary at or after it (`boundaries`: increasing, from 0 to n, e.g.
    the tree's group starts plus the end): so that a domain is a whole run of groups. The first cut stays
    0 and the last n."""
    boundaries = np.asarray(boundaries)
    at = np.searchsorted(boundaries, np.asarray(cuts, dtype=boundaries.dtype), side="left")
    at = np.minimum(at, boundaries.shape[0] - 1)
    return [int(boundaries[i]) for i in at]


def cut_spans(cuts: Sequence[int]) -> list[Span]:
    """The ranges between consecutive cuts: [cuts[0], cuts[1]), [cuts[1], cuts[2]), ..."""
    return [Span(a, b - a) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]


def agreed_ranges(comm, device) -> list[Span]:
    """MPI ranks: the key ranges of a domain split from this rank's device, checked to be every rank's
    (one small allgather of the cuts): a rank that built another tree would exchange the wrong rows."""
    cuts = list(device.domain_cuts)
    every = comm.allgather(cuts)
    if any(c != cuts for c in every):
        raise RuntimeFault(f"the ranks disagree about their key ranges ({every}): their trees differ")
    return cut_spans(cuts)


# --- the pair tiles of Newton's third law ------------------------------------------------------------------
@dataclass(frozen=True)
class PairTiles:
    """The task grid of a Newton-3 evaluation (kernels/atomics_n3l.cu, and its CPU twin `cpu-n3l`): row r
    is the i-tile of `ti` bodies [r ti, (r + 1) ti); it meets the j-tiles of `tj` bodies from its own
    first one (the diagonal, evaluated on the i side only) to the last, in chunks of `chunk` j-tiles; a
    task is one (row, chunk), numbered row * chunks_per_row + chunk (empty chunks past the last j-tile do
    nothing). A task's interactions are counted as all-pairs counts them (ordered pairs, i = j included):
    the tasks of all rows add up to n^2 exactly."""

    n: int
    ti: int
    tj: int
    chunk: int

    @property
    def rows(self) -> int:
        return -(-self.n // self.ti)

    @property
    def jtiles(self) -> int:
        return -(-self.n // self.tj)

    @property
    def chunks_per_row(self) -> int:
        return -(-self.jtiles // self.chunk)

    @property
    def tasks(self) -> int:
        return self.rows * self.chunks_per_row

    @cached_property
    def interactions(self) -> np.ndarray:
        """Interactions of every task (int64, `tasks` long)."""
        r = self.ti // self.tj
        row, chunk = np.divmod(np.arange(self.tasks, dtype=np.int64), self.chunks_per_row)
        t0 = row * r + chunk * self.chunk
        t1 = np.minimum(t0 + self.chunk, self.jtiles)
        t1 = np.maximum(t1, t0)  # empty past the last j-tile
        ni = np.minimum((row + 1) * self.ti, self.n) - row * self.ti
        bodies = np.minimum(self.tj * t1, self.n) - np.minimum(self.tj * t0, self.n)
        diag_end = np.minimum(t1, (row + 1) * r)
        diagonal = np.maximum(np.minimum(self.tj * diag_end, self.n) - np.minimum(self.tj * t0, self.n), 0)
        return ni * (diagonal + 2 * (bodies - diagonal))

    def slices(self, weights: Sequence[float]) -> list[tuple[int, int]]:
        """Contiguous task ranges [lo, hi), one per weight, whose interactions are in proportion to the
        weights (cut at the task where the running total crosses each boundary)."""
        w = np.asarray(weights, dtype=np.float64)
        if w.size == 0 or (w < 0).any() or w.sum() <= 0:
            raise ValueError(f"weights must be >= 0 with a positive sum, not {list(weights)}")
        total = np.cumsum(self.interactions)
        goals = np.cumsum(w)[:-1] / w.sum() * (total[-1] if total.size else 0)
        wanted = [0, *(int(c) for c in np.searchsorted(total, goals, side="left") + 1), self.tasks]
        cuts = np.minimum(np.maximum.accumulate(wanted), self.tasks)
        return [(int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]

    def work(self, lo: int, hi: int) -> int:
        """Interactions of the tasks [lo, hi)."""
        return int(self.interactions[lo:hi].sum())
