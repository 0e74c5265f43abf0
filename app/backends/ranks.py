"""The Backend of an MPI job: rank 0 drives it (the viewer and its panel, or `bench`), every rank computes.

    cls = ranks_backend_class(comm, CPUBackend)   # on every rank; a Backend class like any other
    backend = cls(); backend.load(bodies, physics, "cpu-fp64")
    rank 0:  viewer.run()  -> backend.step(k) / backend.idle() once a frame, backend.close() at the end
    others:  backend.follow()                      -> the same steps, until rank 0 closes

Once a frame, before the step, rank 0 broadcasts one small `Control` (app/backends/rank_control.py): the
kernel, its tunables, the physics, how many steps (0 while paused), whether new bodies follow (a load: reset,
N, a preset) and whether rank 0 wants a new view. Every rank, rank 0 included, applies the same Control at
the same point through the same code (`_apply`), so every rank's state stays the same: a changed kernel or
physics reloads the rank's device from the gathered state, changed tunables go to its evaluator. What
rank 0's panel sets (`set_kernel`, `set_tunables`, `set_physics`, `load`) is what it asks for, shown at
once and applied by every rank at the next step.

Every step's exchange already leaves all positions on every rank, rank 0 included (an all-gather of
positions, or a domain split whose ranks integrate every body), so rank 0 draws current positions every
frame. GPU ranks draw through CUDA-GL interop on rank 0's GPU (`attach_gl_buffers`): each frame's Control
then asks every rank to bring its share's speeds to the others (none on a domain split) and rank 0's GPU
fills the VBOs. CPU ranks upload from the host, the speeds from rank 0's view: velocities live on their
owners, and every `gather_every` frames (a setting, in the panel) rank 0 gathers them (Gatherv) into its
view, which also gives `state()` (the energy monitor, snapshots). A view is gathered only after the last
one was read, so `bench` (which never reads) never pays for it.

Every `check_every` steps the ranks check their shares for non-finite bodies together (RankRun): every
rank raises the same NonFiniteState (naming the body and its rank) at the same step, so rank 0's viewer
pauses as for one process and the others keep following; `bench` records the row as failed on every
rank, as one process does.

After each step every rank's force and exchange time go to every rank (one small allgather): the
StepTimings' force_ms is the slowest rank's (the job's), interactions the sum, and
`extra` holds each rank's split (app.engine.timing.rank_entries) for the panel and `bench`.

Anything that would need the ranks outside this protocol (accelerations(), a device diagnostics, the
force-error probe) is not offered: rank 0 would wait in a collective the others never enter.
"""

from __future__ import annotations

import hashlib
import json
import signal
from collections import deque
from contextlib import suppress
from typing import Any

import numpy as np

from app.backends.base import (
    Backend,
    DeviceKind,
    RenderTarget,
    TunablesPerKernel,
    check_physics,
    wrapped_capabilities,
)
from app.backends.distributed import RankRun, device_maker
from app.backends.rank_control import Channel, Control
from app.core.errors import BackendUnavailable, NonFiniteState
from app.engine.timing import StepTimings, imbalance, rank_entries
from app.model.bodies import Bodies, speeds
from app.model.physics import Physics

SPLIT_FRAMES = 256  # per-rank splits rank 0 keeps for its summary


def ranks_backend_class(comm, inner: type[Backend], gather_every: int = 1) -> type[RanksBackend]:
    """A Backend class for this job: `inner` (cpu or cuda) on every rank, constructed with no arguments
    (bench makes its own)."""
    return type(
        f"Ranks{inner.__name__}",
        (RanksBackend,),
        {
            **wrapped_capabilities(inner),
            "comm": comm,
            "inner": inner,
            "ranks": comm.size,
            "gather_every": gather_every,
        },
    )


class RanksBackend(TunablesPerKernel, Backend):
    timing = (
        "time.perf_counter around each rank's force evaluation of its share; a step's time is the "
        "slowest rank's"
    )
    comm: Any = None  # the job's mpi4py communicator (mpi4py ships no type stubs)
    inner: type[Backend]  # the backend every rank runs (set by ranks_backend_class)
    gather_every = 1  # frames between rank 0's gathers of the velocities (the view)

    # --- discovery: the inner backend's kernels --------------------------------------------------------
    @classmethod
    def why_not(cls) -> str | None:
        return cls.inner.why_not()

    @classmethod
    def kernels(cls):
        return cls.inner.kernels()

    @classmethod
    def kernel_why_not(cls, name: str) -> str | None:
        reason = cls.inner.kernel_why_not(name)
        kind = cls.inner.device_kind()  # each rank is one device of that kind: what it refuses, ranks refuse
        refused = kind.why_not(cls.record(name)) if reason is None and kind is not None else None
        return f"MPI ranks: {refused}" if refused else reason

    def __init__(self):
        self.lead = self.comm.rank == 0
        self.channel = Channel(self.comm)
        self._kernel, make = device_maker(self.comm, self.inner, None)
        self.run = RankRun(self.comm, make)
        self._physics = Physics()
        self._tunables: dict[str, dict] = {}  # kernel -> values set, over the record's defaults
        self._bodies: Bodies | None = None  # rank 0: bodies loaded since the last step (they go to all)
        self._applied: Control | None = None  # what this rank runs now
        self._view: Bodies | None = None  # rank 0: the state last gathered
        self._view_read = True
        self._frames_since_view = 0
        self._n = 0
        self._gl_target: RenderTarget | None = None  # rank 0: the VBOs filled on its GPU (attach_gl_buffers)
        self.quit_seen = False
        self.splits: deque[tuple[list[float], list[float]]] = deque(maxlen=SPLIT_FRAMES)
        self.fingerprints: list[str] = []  # after each applied change: the same on every rank

    # --- what rank 0 asks for (shown at once, applied by every rank at the next step) -------------------
    @classmethod
    def _kind(cls) -> DeviceKind:
        """The inner backend's device kind (every rank's device)."""
        kind = cls.inner.device_kind()
        assert kind is not None, "device_maker refused an inner backend without one when this was made"
        return kind

    def _last_view(self) -> Bodies:
        """Rank 0's view: the bodies it loaded, then the state it last gathered."""
        assert self._view is not None, "rank 0 holds a view from its load on"
        return self._view

    def _runnable(self, name: str) -> str:
        name = self.record(name).name
        reason = self.kernel_why_not(name)
        if reason:
            raise BackendUnavailable(f"kernel {name}: {reason}")
        return name

    def load(self, bodies: Bodies, physics: Physics, kernel: str | None = None) -> None:
        self._physics = check_physics(physics)
        self._kernel = self._runnable(kernel or self._kernel)
        self._bodies = Bodies(
            pos=bodies.pos.copy(),
            vel=bodies.vel.copy(),
            mass=bodies.mass.copy(),
            time=float(bodies.time),
            ids=None if bodies.ids is None else bodies.ids.copy(),
        )
        self._n = bodies.n
        self._view, self._view_read = self._bodies, True

    @property
    def kernel(self) -> str:
        return self._kernel

    def set_kernel(self, name: str) -> None:
        self._kernel = self._runnable(name)

    def set_physics(self, physics: Physics) -> None:
        self._physics = check_physics(physics)

    @property
    def n(self) -> int:
        return self._n

    @property
    def time(self) -> float:
        return self.run.time if self._applied is not None else float(self._last_view().time)

    def _wanted(self, steps: int) -> Control:
        due = self._view_read and self._frames_since_view + 1 >= max(int(self.gather_every), 1)
        return Control(
            kernel=self._kernel,
            tunables=self.tunables(),
            physics=self._physics.as_dict(),
            steps=int(steps),
            load=self._bodies is not None,
            gather=bool(due),
            speeds=self._gl_target is not None,
        )

    # --- the per-frame protocol (every rank, the same calls in the same order) --------------------------
    def step(self, steps: int = 1) -> StepTimings:
        """One frame: rank 0's Control to every rank, applied; `steps` steps (rank 0's number); the split."""
        control = self.channel.exchange(self._wanted(steps) if self.lead else None)
        return self._frame(control)

    def idle(self) -> None:
        """A frame without steps (rank 0 paused): the others wait in it, and changes still reach them."""
        self.step(0)

    def follow(self) -> None:
        """The ranks other than 0: run rank 0's frames until it quits (Ctrl-C is rank 0's to answer).
        A non-finite body is found by every rank at the same step (RankRun's agreed check): rank 0's
        viewer pauses on it, and this rank follows on (its next frames are rank 0's paused ones)."""
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            while not self.quit_seen:
                with suppress(NonFiniteState):
                    self.step(0)
        finally:
            signal.signal(signal.SIGINT, previous)

    def _frame(self, control: Control) -> StepTimings:
        if control.quit:
            self.quit_seen = True
            return StepTimings(kernel=self._kernel, steps=0, n=self._n)
        self._apply(control)
        step = self.run.step(control.steps) if control.steps else None
        if step is not None and control.speeds:
            self._draw_from_gpu()
        mine = (
            (
                step.force_ms,
                step.extra["exchange_ms"],
                step.integrate_ms,
                step.interactions,
                step.pair_equivalent,
                step.body_cell,
            )
            if step
            else (0.0, 0.0, 0.0, 0, 0, 0)
        )
        every = self.comm.allgather(mine)
        force, exchange = [e[0] for e in every], [e[1] for e in every]
        if control.gather:
            self._gather_view()
        if step is None:
            return StepTimings(kernel=self.run.kernel, steps=0, n=self._n)
        if self.lead:
            self.splits.append((force, exchange))
            self._frames_since_view += 1
        drawn = self._gl_target if self.lead else None  # rank 0's map / unmap of the VBOs, as one GPU times
        return StepTimings(
            kernel=self.run.kernel,
            steps=control.steps,
            n=self._n,
            force_ms=max(force),
            integrate_ms=max(e[2] for e in every),
            interactions=sum(e[3] for e in every),
            pair_equivalent=sum(e[4] for e in every),
            body_cell=sum(e[5] for e in every),
            force_evals=step.force_evals,
            map_ms=drawn.map_ms if drawn else 0.0,
            unmap_ms=drawn.unmap_ms if drawn else 0.0,
            extra={"exchange_ms": max(exchange), **rank_entries(force, exchange)},
        )

    def _apply(self, control: Control) -> None:
        """Make this rank run `control`: new bodies, another kernel or physics (a reload from the
        gathered state), tunables. The same on every rank, so collective calls match."""
        was = self._applied
        physics = Physics(**control.physics)
        changed = (
            control.load or was is None or (control.kernel, control.physics) != (was.kernel, was.physics)
        )
        remade = control.load  # a device made again: it takes the tunables afresh
        if control.load:
            bodies = self.comm.bcast(self._bodies if self.lead else None, root=0)
            self._bodies = None
            self.run.load(bodies, physics, control.kernel)
        elif changed:
            remade = self.run.reload(physics, control.kernel)
        # (set again without a change they would restart a tree's refit cadence, which one process keeps)
        if remade or was is None or control.tunables != was.tunables:
            self.run.set_tunables(control.tunables)
        if not self.lead:  # what rank 0 asked for is what this rank now runs
            self._kernel, self._physics, self._n = control.kernel, physics, self.run.n
            self._tunable_store()[control.kernel] = dict(control.tunables)
        self._applied = control
        if was is None or control.changes(was):
            self.fingerprints.append(self.fingerprint())

    def _draw_from_gpu(self) -> None:
        """Rank 0 draws from its GPU (interop): its positions are whole after every step; the speeds of
        the other shares come to it first (collective), unless it integrates every body (a domain split)
        and holds them already. Then rank 0's GPU fills the VBOs: no host round trip per frame."""
        if not self.run.decomposition.integrate_all:
            self.run.gathered_on_device("speed")
        if self.lead and self._gl_target is not None:
            self._gl_target.publish([self.run.device], self._n, whole=True)

    def _gather_view(self) -> None:
        view = self.run.state_on_root()
        if self.lead:
            self._view, self._view_read, self._frames_since_view = view, False, 0

    def fingerprint(self) -> str:
        """A hash of what this rank runs and holds: the applied Control (less the step count) and its
        whole copy of the positions (every rank's is the same after each exchange)."""
        c = self._applied
        assert c is not None, "taken after a Control is applied"
        what = json.dumps([c.kernel, c.tunables, c.physics, self.run.time], sort_keys=True).encode()
        pos = np.ascontiguousarray(self.run.positions())
        return hashlib.sha256(what + pos.tobytes()).hexdigest()

    # --- rank 0's reads: local, never collective --------------------------------------------------------
    def state(self) -> Bodies:
        """The state rank 0 last gathered (at most gather_every frames old)."""
        if not self.lead:
            raise RuntimeError("only rank 0 holds the gathered state")
        self._view_read = True
        v = self._last_view()
        return Bodies(
            pos=v.pos.copy(),
            vel=v.vel.copy(),
            mass=v.mass.copy(),
            time=v.time,
            ids=None if v.ids is None else v.ids.copy(),
            components=self.components,
        )

    def host_render_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Current positions (rank 0 holds them all after each exchange); the speeds rank 0 holds where it
        integrates every body (a domain split: no view to gather for them), else those of the last view."""
        if self._applied is not None and self.run.decomposition.integrate_all:
            own = np.asarray(self.run.own_rows("speed"), dtype=np.float32)
            return np.array(self.run.positions(), dtype=np.float32), own.reshape(-1)
        self._view_read = True
        v = self._last_view()
        if self._applied is None:
            return v.pos4(np.float32), speeds(v.vel)
        return np.array(self.run.positions(), dtype=np.float32), speeds(v.vel)

    def accelerations(self) -> np.ndarray:
        raise NotImplementedError(
            "the accelerations of MPI ranks are gathered collectively "
            "(app.backends.distributed.RankRun.accelerations), not by rank 0 alone"
        )

    # --- rank 0's VBOs through its GPU's CUDA-GL interop (GPU ranks) -------------------------------------
    def attach_gl_buffers(self, position_vbo: int, speed_vbo: int) -> bool:
        """Rank 0's renderer offers its VBOs: True when rank 0's device kind can fill them on the GPU (GPU
        ranks: interop on rank 0's GPU 0), after which every frame's Control asks the ranks for what rank 0
        draws (`_draw_from_gpu`); False (CPU ranks, no interop) keeps the host upload."""
        self.detach_gl_buffers()
        if not self.lead:
            return False
        device = self.run.device if self._applied is not None and self.run.n == self._n else None
        whole = device is not None and self.run.decomposition.integrate_all
        self._gl_target = self._kind().gl_target(
            position_vbo, speed_vbo, [device] if whole else [], self._n, whole
        )
        return self._gl_target is not None

    def detach_gl_buffers(self) -> None:
        if self._gl_target is not None:
            target, self._gl_target = self._gl_target, None
            target.close()

    @property
    def data_path(self) -> str:
        if self._gl_target is not None:
            return f"CUDA-GL interop on rank 0's GPU, {self.ranks} MPI ranks"
        return f"host upload, {self.ranks} MPI ranks"

    def device_info(self) -> dict:
        name = self._kind().rank_device_name()
        return {
            "name": f"{self.ranks} MPI ranks, each: {name}",
            "ranks": self.ranks,
            "backend": self.inner.name,
        }

    def split_line(self) -> str:
        """Median force and exchange ms per rank over the last frames, and the force imbalance."""
        if not self.splits:
            return f"{self.ranks} MPI ranks: no steps taken"
        force = np.median([f for f, _ in self.splits], axis=0)
        exchange = np.median([e for _, e in self.splits], axis=0)
        return (
            f"{self.ranks} MPI ranks (median ms per rank): force "
            + " / ".join(f"{v:.2f}" for v in force)
            + ", exchange "
            + " / ".join(f"{v:.2f}" for v in exchange)
            + f"; imbalance {100 * imbalance(force):.0f}%"
        )

    def lead_says(self, value):
        """Rank 0's `value` on every rank (a broadcast every rank makes at the same point): e.g. bench's
        --max-seconds read from rank 0's clock, which would otherwise stop one rank's steps and not
        another's."""
        return self.comm.bcast(value, root=0)

    def quit_all(self) -> None:
        """Rank 0, at the viewer's normal end: every rank's `follow` returns. (Not on an error: then
        app.backends.distributed.fail_together ends the job.)"""
        if not self.quit_seen:
            self._frame(self.channel.exchange(Control(quit=True) if self.lead else None))

    def close(self) -> None:
        """This rank's device; nothing collective (it also runs while an error unwinds)."""
        self.detach_gl_buffers()
        self.run.close()
