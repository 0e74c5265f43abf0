"""One GPU as a device of the multi-device driver (app/parallel/multidevice.py): a CudaShareDevice, of every
run on GPUs: the single-GPU backend's one (backend.py, the K = 1 run), each of `--gpus K`, each MPI
rank's (multi.py makes them).

Each GPU holds a full float4 copy of the positions and its share of the velocities, accelerations and
speeds (all of them for a domain split, whose devices integrate every body); the force is split as the
record says (app/parallel/decomposition.py): `force` evaluates the record over (share, all) with the GPU's
CudaEvaluator, `force_pairs` runs its slice of atomics-n3l's task grid into partial accelerations of every
body, `force_domain` builds the whole tree and walks its key range into `sacc` (key order), and
`take_key_order` moves the whole state into that order once the key ranges were gathered (`ids`: the body
in each row; the renderer's copy is scattered back to load order through them, `render_rows`). The
updates are kernels/integrate.cu on the rows it integrates (the host offsets the pointers). Work is
queued asynchronously on the legacy stream of the GPU's primary context and timed by the GPU's event clock
(`CudaDevice.timer`), read without a wait while the viewer draws. Nothing waits on a GPU per step: the
order between GPUs is events (`mark`) and cuStreamWaitEvent on the legacy stream (`wait_for`,
context.legacy_stream_wait), queued where one GPU reads what another wrote (app/parallel/exchange.py,
`queue_after`). The exchanges between GPUs read and write its rows through `row_pointer` (peer.py,
nccl.py, ipc.py).

The fp64 record runs on a run of one GPU only (the single-GPU backend, backend.py): its double state is
rows of the GPU's GpuState; several GPUs refuse it with a ConfigError.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np

from app.backends.cuda import registry
from app.backends.cuda.context import StreamMark, legacy_stream_wait
from app.backends.cuda.device import CudaDevice
from app.backends.cuda.evaluator import make_evaluator
from app.backends.cuda.force_sample import exact_rows, sample_evaluator
from app.backends.cuda.nonfinite import NonFiniteCheck
from app.backends.cuda.policies import ceil_div, force_arguments
from app.backends.cuda.state import FP64, ROW_BYTES, STATE, GpuState
from app.backends.cuda.state_ops import INTEGRATE_SOURCE, Fp32Ops, Fp64Ops
from app.core.errors import ConfigError
from app.engine.forces import ForceWork, Span, drain
from app.model.bodies import Bodies
from app.model.physics import Physics
from app.parallel.decomposition import share_cuts

if TYPE_CHECKING:
    from app.backends.cuda.evaluator import GpuEvaluator

log = logging.getLogger(__name__)
# the state a GPU of a run holds (state.py, as the single-GPU backend's): sacc, a domain split's
# accelerations in the tree's key order; ids, int32, the body (load order) in each row
FIELDS = STATE + ("sacc", "ids")
KEY_ORDER_SCRATCH = ("vel", "speed", "ids")  # take_key_order's gather goes through scratch rows of these


class CudaShareDevice:
    """One GPU of a run: the single-GPU backend's one, each of --gpus K, each MPI rank's (module doc)."""

    domain_cuts: list[int]  # a domain split's key ranges' bounds after its last force_domain (K + 1)

    def __init__(
        self, ordinal: int, record_name: str, physics: Physics, bodies: Bodies, share: Span, devices: int = 1
    ):
        """`devices`: how many devices the run has (its `best` runs the tuning on that many GPUs; the fp64
        record runs on one only)."""
        self._records = {r.name: r for r in registry.RECORDS}
        self.devices_in_run = devices
        self.device = CudaDevice(ordinal)
        self.name = self.device.name
        self.share = share
        self.n = bodies.n
        self.everyone = Span.all(self.n)
        self.physics = physics
        self.integrate_all = False  # set by the run from its decomposition
        self.index, self.shares, self.domain_cuts = 0, [share], []
        self._pair_plans: dict[tuple, tuple[Callable, ForceWork]] = {}  # a pair slice's launch and work
        self._exact: GpuEvaluator | None = None  # the "exact" record's, made by the first force-error sample
        self.timer = self.device.timer  # CUDA events on the GPU's legacy stream
        self._marks: dict[str, StreamMark] = {}
        # the updates over the rows it integrates, and what they were made for (a span, or "fp64")
        self._share_ops: Fp32Ops | Fp64Ops | None = None
        self._ops_key: Span | str | None = None
        self._check = NonFiniteCheck(self.device)  # the non-finite check, on this share's rows
        self.state = GpuState(self.device, self.name)
        with self.device.scope:
            try:
                self.evaluator = self._evaluator_for(record_name)
                self.evaluator.prepare(self.n)
                self.state.allocate(self.n, FIELDS + (FP64 if self.fp64 else ()))
            except BaseException:
                self.state.free()
                self.device.close()
                raise
            self.state.upload(bodies)  # ids: rows are bodies until a domain split re-sorts them
            self._check.prepare()
        self.fp64_current = self.fp64  # the double state is the state (else the float rows moved on)
        self.ptr = {f: self.state.pointer(f) for f in self.state_fields}  # fixed (the exchanges', IPC's)
        # the host's copy of "ids" (None: read it again)
        self._ids: np.ndarray | None = np.arange(self.n, dtype=np.int64)
        self.key_ordered = False  # rows are bodies until the first take_key_order

    def _evaluator_for(self, record_name: str):
        """The record's evaluator on this GPU with the run's physics; for `best`, that of the record it
        picks for this N and device count (whose decomposition the run uses), with its tunables."""
        record = self._records[record_name]
        if record.precision != "fp32" and self.devices_in_run > 1:
            raise ConfigError(f"{record.name}: several GPUs run the fp32 records only")
        evaluator = make_evaluator(record, self.device, self._records)
        evaluator.set_physics(self.physics)
        if record.policy.resolves:
            chosen, tunables = evaluator.active(self.n, self.devices_in_run)  # the tuning on K GPUs, if any
            evaluator = make_evaluator(chosen, self.device, self._records)
            evaluator.set_physics(self.physics)
            evaluator.set_tunables(**tunables)
        return evaluator

    @property
    def fp64(self) -> bool:
        """The running record is the fp64 one (its double state is the state)."""
        return self.evaluator.record.precision == "fp64"

    @property
    def state_fields(self) -> tuple[str, ...]:
        return FIELDS + (FP64 if self.state.holds("pos64") else ())

    def use_record(self, record_name: str, mass_rows: np.ndarray) -> None:
        """Run another record on the same state (one GPU's kernel switch): compiled first, so that a
        failure leaves the current one; a switch to fp64 promotes the float rows to the double state
        (`mass_rows`: float64 masses in row order) unless that is still current."""
        evaluator = self._evaluator_for(record_name)
        with self.device.scope:
            evaluator.prepare(self.n)
            if evaluator.record.precision == "fp64" and not self.fp64_current:
                self.state.extend(FP64)
                self.ptr = {f: self.state.pointer(f) for f in self.state_fields}
                self.state.promote(mass_rows)
                self.fp64_current = True
        self.evaluator = evaluator
        self._share_ops, self._ops_key = None, None
        self._pair_plans.clear()

    def reload_record(self, record, cubin: bytes, symbols, tunables: dict) -> None:
        """A hot reload's build of a kernel file (CudaBackend.install_build): its record, and `symbols`
        from `cubin` on this GPU; the running evaluator made again when it runs that record (its launch
        plans held the old functions). The state is not touched."""
        self._records[record.name] = record
        self.device.install(record.source, cubin, symbols)
        if self.evaluator.record.name == record.name:
            evaluator = make_evaluator(record, self.device, self._records)
            evaluator.set_physics(self.physics)
            evaluator.set_tunables(**tunables)
            self.evaluator = evaluator
            self._share_ops, self._ops_key = None, None
            self._pair_plans.clear()

    def set_physics(self, physics: Physics) -> None:
        """New force parameters for the evaluators (their cached launches are keyed by them)."""
        self.physics = physics
        for evaluator in (self.evaluator, self._exact):
            if evaluator is not None:
                evaluator.set_physics(physics)

    def state_pointers(self) -> tuple[str, int, int]:
        """(precision, positions, velocities) of the state: dvec4 rows for "fp64", float4 rows for "fp32"."""
        if self.fp64:
            return "fp64", self.ptr["pos64"], self.ptr["vel64"]
        return "fp32", self.ptr["pos"], self.ptr["vel"]

    @staticmethod
    def row_bytes(field: str) -> int:
        return ROW_BYTES[field]

    def row_pointer(self, field: str, span: Span) -> int:
        """The device address of `span`'s first row of `field` in this GPU's buffers (the exchanges')."""
        return self.state.row_pointer(field, span)

    def _ops(self):
        """The element-wise updates on the rows it integrates (its share, or every row for a domain
        split; the force is `force`, over the whole copy), made again only when those change."""
        s = self.everyone if self.integrate_all else self.share
        key: Span | str
        if self.fp64:
            key = "fp64"  # (one GPU: every row)
        else:
            key = s
            self.fp64_current = False  # the float32 state moves on without the double one
        if self._ops_key != key:
            self._share_ops = self.state.ops64(self.force) if self.fp64 else self.state.ops(self.force, s)
            self._ops_key = key
        return self._share_ops

    def force(self) -> ForceWork:
        pos, acc = ("pos64", "acc64") if self.fp64 else ("pos", "acc")
        with self.device.scope, self.timer.time("force"):
            return self.evaluator.evaluate(self.ptr[pos], self.ptr[acc], self.share, self.everyone)

    def force_pairs(self) -> ForceWork:
        """Its slice of the pair tiles (app/parallel/decomposition.py): partial accelerations of every row
        into acc, zeroed first; the slices cut in proportion to the shares."""
        rec, tun = self.evaluator.active(self.n)
        policy, args = rec.policy, force_arguments(self.physics)
        weights = tuple(s.count for s in self.shares)
        key = (tuple(sorted(tun.items())), args, weights, self.index)
        with self.device.scope, self.timer.time("force"):
            plan = self._pair_plans.get(key)
            if plan is None:
                tiles = policy.tiles(self.device, tun, self.n)
                lo, hi = tiles.slices(weights)[self.index]
                run = policy.plan_slice(self.device, rec, tun, args, self.n, lo, hi)
                work = ForceWork(
                    interactions=tiles.work(lo, hi), pair_equivalent=self.share.count * self.n, evaluations=1
                )
                plan = self._pair_plans[key] = (run, work)
            run, work = plan
            run(self.ptr["pos"], self.ptr["acc"])
        return work

    def force_domain(self) -> ForceWork:
        """The whole tree from every position, the walk of its key range into sacc (key order)."""
        return drain(self.force_domain_phases())

    def force_domain_phases(self):
        """`force_domain` in the tree's phases (TreeEvaluator.domain_phases), timed as "force" from the
        first phase's queue to the last's; each phase makes this GPU's context current itself."""
        with self.device.scope:
            start = self.timer.start()
        work, self.domain_cuts = yield from self.evaluator.domain_phases(
            self.ptr["pos"],
            self.ptr["sacc"],
            self.n,
            share_cuts(self.shares),
            self.index,
            prev=self.ptr["acc"],
        )
        with self.device.scope:
            self.timer.stop("force", start)
        return work

    def take_key_order(self) -> None:
        """After a domain split's exchange (sacc whole): every row moves to its place in the last tree's key
        order, as Bonsai keeps its bodies, so that sacc is acc as it is: pos from the tree's gathered copy,
        vel, speed and ids gathered through scratch rows (kernels/integrate.cu). Every GPU builds the same
        tree from the same positions, so every copy is permuted alike and stays whole. After a refit
        (rebuild_every > 1) the rows are in the tree's order already: only sacc becomes acc."""
        n = self.n
        if not n:
            return
        if self.evaluator.kept_order:  # a refit: the rows are in its order already, sacc is acc
            with self.device.scope, self.timer.time("force"):
                self.device.drv.memcpy_dtod_async(self.ptr["acc"], self.ptr["sacc"], ROW_BYTES["acc"] * n)
            self.key_ordered = True
            return
        order, spos = self.evaluator.last_order()
        scratch = {f: self.device.scratch(f"multi-s{f}", ROW_BYTES[f] * n) for f in KEY_ORDER_SCRATCH}
        grid = (ceil_div(n, 256), 1)
        with self.device.scope, self.timer.time("force"):
            gather = self.device.function(INTEGRATE_SOURCE, "key_order_gather", "PiPPPPPP")
            gather.prepared_call(
                grid,
                (256, 1, 1),
                order,
                n,
                *(self.ptr[f] for f in KEY_ORDER_SCRATCH),
                *(scratch[f] for f in KEY_ORDER_SCRATCH),
            )
            take = self.device.function(INTEGRATE_SOURCE, "key_order_take", "iPPPPPPPPPP")
            take.prepared_call(
                grid,
                (256, 1, 1),
                n,
                spos,
                self.ptr["sacc"],
                *(scratch[f] for f in KEY_ORDER_SCRATCH),
                self.ptr["pos"],
                self.ptr["acc"],
                *(self.ptr[f] for f in KEY_ORDER_SCRATCH),
            )
        self._ids = None
        self.key_ordered = True

    @property
    def ids(self) -> np.ndarray:
        """The body (load order) in each row: the host's copy of the device's ids, read once per re-sort
        and only when the host asks (a state read, a force-error sample; never per frame)."""
        if self._ids is None:
            with self.device.scope:
                self._ids = self.state.rows("ids", self.everyone).astype(np.int64)
        return self._ids

    def render_rows(self, pos: int, speed: int) -> None:
        """Every row's position and speed into the renderer's buffers (device pointers on this GPU) at the
        row of its body: the renderer's rows are bodies in load order (its colours and components are).
        Two copies while the rows are bodies, else one scatter through ids."""
        if self.n and not self.key_ordered:
            with self.device.scope:
                self.device.drv.memcpy_dtod_async(pos, self.ptr["pos"], ROW_BYTES["pos"] * self.n)
                self.device.drv.memcpy_dtod_async(speed, self.ptr["speed"], ROW_BYTES["speed"] * self.n)
        elif self.n:
            fn = self.device.function(INTEGRATE_SOURCE, "scatter_by_id", "iPPPPP")
            with self.device.scope:
                fn.prepared_call(
                    (ceil_div(self.n, 256), 1),
                    (256, 1, 1),
                    self.n,
                    self.ptr["ids"],
                    self.ptr["pos"],
                    self.ptr["speed"],
                    pos,
                    speed,
                )

    def add_rows(self, field: str, span: Span, part: int) -> None:
        """rows `span` of `field` += the float4 rows at device pointer `part` (a reduce-scatter's sum)."""
        if span.count:
            fn = self.device.function(INTEGRATE_SOURCE, "add_rows", "PPi")
            fn.prepared_call(
                (ceil_div(span.count, 256), 1), (256, 1, 1), self.row_pointer(field, span), part, span.count
            )

    def rank_exchange(self, comm, shares: list[Span], host):
        """MPI ranks (app/backends/distributed.py RankRun): a CUDA IPC exchange (ipc.py) where every rank of
        the job is on this node, else None (the `host` exchange through MPI; one log line). Collective."""
        from mpi4py import MPI

        from app.backends.cuda.ipc import IpcExchange

        node = comm.Split_type(MPI.COMM_TYPE_SHARED)
        together = node.size == comm.size
        node.Free()
        if not together:
            if comm.rank == 0:
                log.info("MPI ranks on several nodes: rows are exchanged through host memory (MPI)")
            return None
        return IpcExchange(comm, shares, self, host)

    @contextmanager
    def timed(self, category: str):
        """Its scope pushed and the work queued inside timed on its clock (the exchanges' copies)."""
        with self.device.scope, self.timer.time(category):
            yield

    def kick_drift(self, half_dt: float, dt: float) -> None:
        with self.device.scope, self.timer.time("integrate"):
            if self.share.count or self.integrate_all:
                self._ops().kick_drift(half_dt, dt)

    def kick(self, half_dt: float) -> None:
        with self.device.scope, self.timer.time("integrate"):
            if self.share.count or self.integrate_all:
                self._ops().kick(half_dt)

    def euler_damped(self, dt: float, damping: float) -> None:
        with self.device.scope, self.timer.time("integrate"):
            if self.share.count or self.integrate_all:
                self._ops().euler_damped(dt, damping)

    def launch_check(self) -> None:
        """Queue the non-finite check of the share's rows (nonfinite.py; no host wait)."""
        with self.device.scope:
            self._check.launch(self.ptr["pos"], self.ptr["vel"], self.share)

    def check_result(self, wait: bool) -> int:
        """The first non-finite body (state index) of the share a finished check found, or -1; `wait`:
        the newest check's, waiting for it."""
        with self.device.scope:
            return self._check.result(wait)

    def mark(self, tag: str):
        """An event after the work queued so far (one event per tag, recorded again each time: a wait
        already queued keeps the record it was queued behind)."""
        with self.device.scope:
            event = self._marks.get(tag)
            if event is None:
                event = self._marks[tag] = StreamMark()
            event.record()
        return event

    def wait_for(self, marker) -> None:
        with self.device.scope:
            legacy_stream_wait(marker)

    def take_times(self, lagged: bool) -> dict[str, float] | None:
        """ms per category: this step() call's (waits for its last event), or with `lagged` the newest
        earlier one finished (None while none is)."""
        with self.device.scope:
            return self.timer.collect_lagged() if lagged else self.timer.collect()

    def forget_times(self) -> None:
        with self.device.scope:
            self.timer.discard()

    def synchronize(self) -> None:
        with self.device.scope:
            self.device.drv.Context.synchronize()

    def rows(self, field: str, span: Span) -> np.ndarray:
        """A host copy of rows `span` of `field`: positions, velocities and accelerations at the state's
        precision (the double rows for the fp64 record)."""
        if self.fp64 and field in ("pos", "vel", "acc"):
            field += "64"
        with self.device.scope:
            return self.state.rows(field, span)

    def set_rows(self, field: str, span: Span, values) -> None:
        with self.device.scope:
            self.state.set_rows(field, span, values)

    def rows_at(self, field: str, rows: np.ndarray) -> np.ndarray:
        """A host copy of the rows `rows` (state indices) of a float4 field, gathered on the GPU behind
        its queued work (force_sample.py, as one GPU reads its sample)."""
        return self.state.rows_at(field, rows)

    def exact_rows(self, rows: np.ndarray) -> np.ndarray:
        """Float64 (K, 3): the all-pairs accelerations of `rows` due to every position of this GPU's copy
        (whole after each exchange), behind its queued work: one GPU's exact sum (force_sample.py)."""
        if self._exact is None:
            self._exact = sample_evaluator(self.device, self._records, self.physics)
        return exact_rows(self.device, self._exact, self.ptr["pos"], self.n, rows)

    def close(self) -> None:
        with self.device.scope:
            for mark in self._marks.values():
                mark.close()
            self._check.forget()
            self.state.free()
        self._marks.clear()
        self._share_ops = None  # it holds self.force: without this, only the garbage collector frees us
        self._pair_plans.clear()
        self.device.close()
