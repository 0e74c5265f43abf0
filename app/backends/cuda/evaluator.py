"""The CUDA force evaluator: one record on one device, over spans of a device position array.

    ev = CudaEvaluator(record, device, records)
    ev.set_physics(physics)
    work = ev.evaluate(pos_ptr, acc_ptr, Span(i0, ni), Span.all(n))     # queued on the device
    force = ev.bind(pos_ptr, acc_ptr, targets, sources)                  # the same, prepared:
    work = force()                                                       # only driver calls left

`bind` does every piece of Python up front (resolving `best`, building the launch plan, offsetting the
pointers) so that a timed call costs only the launches. Plans are cached per (record, tunables,
physics arguments, span sizes).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, TypeAlias

import numpy as np

from app.backends.cuda.policies import FORMS, force_arguments
from app.core.errors import ConfigError
from app.engine.forces import ForceEvaluator, ForceWork, KernelRecord, Span, format_tunables, target_chunks
from app.model.physics import Physics

if TYPE_CHECKING:
    from app.backends.cuda.tree import TreeEvaluator

log = logging.getLogger(__name__)
MAX_PLANS = 64
# What `best` said for (GPU, N, K) when resolving for K > 1 devices: each of the K devices makes its own
# evaluator, again at every load, so the process says it once for all of them (one GPU: the evaluator's
# own memory, as before).
_SAID_FOR_DEVICES: dict[Hashable, tuple] = {}  # (GPU, N, K) -> (warning, line)


class CudaEvaluator(ForceEvaluator):
    def __init__(self, record: KernelRecord, device, records: dict[str, KernelRecord]):
        super().__init__(record)
        self.device = device
        self._records = records  # for `best`: the records it may resolve to
        self._args = force_arguments(Physics())
        self._plans: dict[tuple, Callable] = {}
        self._resolved: dict[tuple[int, int], tuple[KernelRecord, dict]] = {}  # (N, devices) -> what runs
        self._said: dict[Hashable, tuple] = {}  # N -> the (warning, line) last said of it; survives forget()

    def set_physics(self, physics: Physics) -> None:
        self._args = force_arguments(physics)

    def set_tunables(self, **values) -> None:
        super().set_tunables(**values)
        self._resolved.clear()

    def forget(self) -> None:
        """Drop `best`'s resolutions and the launch plans (a new state: the tuning cache is read again)."""
        self._resolved.clear()
        self._plans.clear()

    # --- which record and tunables run -------------------------------------------------------------
    def active(self, n: int, devices: int = 1) -> tuple[KernelRecord, dict]:
        """(record, tunables) a launch over n sources uses: `best` resolved for that N, split over
        `devices` GPUs (`--gpus K`: the tuning on K GPUs)."""
        policy = self.record.policy
        if not policy.resolves:
            return self.record, self._tunables
        if (n, devices) not in self._resolved:
            rec, tun, source, warning = policy.resolve(self._records, self.device.facts, n, devices)
            line = f"best: {source}: N = {n:,} -> {rec.name} {format_tunables(tun)}".strip()
            said, key = (
                (self._said, n) if devices == 1 else (_SAID_FOR_DEVICES, (self.device.facts.name, n, devices))
            )
            if said.get(key) != (warning, line):  # a reload resolves again: say it once, unless changed
                if warning:
                    log.warning("%s", warning)
                log.info("%s", line)
                said[key] = (warning, line)
            self._resolved[n, devices] = (rec, tun)
        return self._resolved[n, devices]

    def describe(self, n: int) -> str:
        """'register-blocked block_size=128 k=4 slices=0': what actually runs (useful for `best`)."""
        rec, tun = self.active(n)
        return f"{rec.name} {format_tunables(rec.tunables_at(tun, n))}".strip()

    def prepare(self, n: int) -> None:
        """Compile and load every entry a launch over n bodies may need (all four model / self-term
        forms), so that a later step cannot fail to compile and the first timed step loads nothing."""
        rec, tun = self.active(n)
        policy = rec.policy
        for repulsion, soft in FORMS:
            for symbol, arg_types in policy.entries(rec, repulsion, soft, tun):
                self.device.function(rec.source, symbol, arg_types, policy.nvcc_options)

    # --- evaluating --------------------------------------------------------------------------------
    def bind(self, pos: int, acc: int, targets: Span, sources: Span, stream=None) -> Callable[[], ForceWork]:
        rec, tun = self.active(sources.count)
        policy = rec.policy
        if policy.targets_within_sources and not sources.contains(targets):
            raise ConfigError(
                f"{rec.name}: targets [{targets.start}, {targets.stop}) must lie within "
                f"the sources [{sources.start}, {sources.stop}) (Newton's third law needs both "
                "ends of every pair)"
            )
        work = policy.work(targets, sources)
        if targets.count == 0:  # a grid of no blocks cannot be launched; no sources still means a = 0
            return lambda: ForceWork(evaluations=1)
        key = (rec.name, tuple(sorted(tun.items())), self._args, targets.count, sources.count)
        run = self._plans.get(key)
        if run is None:
            if len(self._plans) >= MAX_PLANS:
                self._plans.clear()
            run = self._plans[key] = policy.plan(
                self.device, rec, tun, self._args, targets.count, sources.count
            )
        row = policy.row_bytes
        t, s, a = pos + row * targets.start, pos + row * sources.start, acc + row * targets.start

        def force() -> ForceWork:
            run(t, s, a, stream)
            return work

        return force

    def evaluate(self, pos, acc, targets: Span, sources: Span, stream=None) -> ForceWork:
        return self.bind(pos, acc, targets, sources, stream)()


if TYPE_CHECKING:
    # what a CUDA record's evaluator is (make_evaluator): the launch-plan one, or its policy's own (the tree)
    GpuEvaluator: TypeAlias = "CudaEvaluator | TreeEvaluator"


def make_evaluator(record: KernelRecord, device, records: dict[str, KernelRecord]) -> GpuEvaluator:
    """The evaluator of a CUDA record on `device`: its policy's own (the tree) or the launch-plan one."""
    build = getattr(record.policy, "evaluator", None)
    return build(record, device, records) if build is not None else CudaEvaluator(record, device, records)


def reference_accelerations(
    reference,
    device,
    stacked: np.ndarray,
    k: int,
    chunk: int | None = None,
    progress=None,
    key: str = "reference",
) -> np.ndarray:
    """The accelerations of the first k rows of `stacked` ([targets; bodies], float4 rows: the layout of
    app/commands/reference.py) by the rows after them, by `reference` (the fp64 record's evaluator, its
    physics set) on `device`: (k, 3) float64. The rows go to the device as float64; in launches of `chunk`
    targets (all at once: None), each waited for and told to `progress(count)` when that is given."""
    rows = np.ascontiguousarray(stacked, np.float64)
    with device.scope:
        pos = device.scratch(f"{key}-pos", rows.nbytes)
        acc = device.scratch(f"{key}-acc", 32 * k)  # the fp64 record's dvec4 rows
        device.drv.memcpy_htod(pos, rows)
        sources = Span(k, rows.shape[0] - k)
        for targets in target_chunks(k, chunk or max(k, 1)):
            reference.evaluate(pos, acc, targets, sources)
            if progress is not None:
                device.drv.Context.synchronize()
                progress(targets.count)
        out = np.empty((k, 4))
        device.drv.memcpy_dtoh(out, acc)
    return out[:, :3].copy()
