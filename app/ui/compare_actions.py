"""The Controller's (app.ui.controller) A/B and force-error colours: what the Compare tab's widgets change,
and what each frame does for them.

    ctl.set_compare_kernel("cpu-fp64")    # kernel B: a kernel of the running backend (another's is refused)
    ctl.set_compare(True)                 # A/B on: B timed at the state every frame (app/engine/compare.py)
    ctl.set_error_view("error")           # colour by force error against the exact sum; "error-ab": against
                                          # B (turns A/B on); "off": the colour by before
    ctl.compare.ab.latest                 # ABResult: both times, B / A, the difference (median, p99)
    ctl.compare.exact.latest              # ExactSummary: the error against the exact sum over all N

Each frame (`compare_tick`, from `on_frame`; nothing while A/B is off and no error view is shown) A's
force time of the frame's step is noted, B is evaluated when due (ABCompare), and the error view's exact
sum takes its piece (ExactErrors, app/engine/error_colours.py), through the backend's CompareOps
(`backend.compare_ops()`, made again when the backend object changes). After each frame's steps
(`viewer.after_advance`) the colour buffer goes into the renderer's per-body float (`paint`): uploaded on
the host path, copied on the device with CUDA-GL interop. A backend that cannot compare (several devices,
MPI ranks, block steps, a replay) leaves one line in the tab saying so; a failure of B or of the exact sum
is one line in the panel (`message`) and turns that part off.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from app.core.errors import ConfigError
from app.engine.compare import ABCompare, CompareOps
from app.engine.error_colours import ExactErrors
from app.engine.forces import with_role
from app.render.particles import ERROR_VIEWS

if TYPE_CHECKING:
    from app.render.canvas import Viewer

log = logging.getLogger(__name__)
MAX_EVERY = 1000  # frames between B's evaluations, at most


@dataclass
class CompareState:
    """What the Compare tab holds between frames."""

    ab: ABCompare = field(default_factory=ABCompare)
    exact: ExactErrors = field(default_factory=ExactErrors)
    on: bool = False  # A/B on
    ops: CompareOps | None = None  # the backend's side, for `ops_of`
    ops_of: Any = None  # the backend object the ops were made for
    note: str = ""  # why A/B or the colours show nothing now
    view: str = ""  # the colour by of the last frame
    previous_color_by: str = "speed"  # what "off" goes back to
    hooked: bool = False  # the paint is in viewer.after_advance
    ms: float = 0.0  # what the last frame's tick cost (wall time)


class CompareActions:
    """Needs `self.viewer`, `self.backend`, `self.scene`, `self.records`, `self.record`, `self.why_not`,
    `self.set_value`, `self._fail`, `self._ok` (the Controller's)."""

    viewer: Viewer
    backend: Any
    scene: Any
    records: list
    record: Any
    why_not: Any
    set_value: Any
    _fail: Any
    _ok: Any

    @property
    def compare(self) -> CompareState:
        state = self.__dict__.get("_compare")
        if state is None:
            state = self.__dict__["_compare"] = CompareState()
        return state

    # --- the actions -------------------------------------------------------------------------------
    def why_not_b(self, name: str) -> str | None:
        """Why `name` cannot be B beside the running kernel now (None: it can)."""
        try:
            rec = self.record(name)
        except ConfigError as e:
            return f"A/B: {e}"
        backend = self.backend
        if rec.backend != backend.name:
            return (
                f"A/B: {rec.name} is a {rec.backend} kernel and A ({backend.kernel}) a {backend.name} one: "
                "A and B must be kernels of one backend"
            )
        reason = self.why_not(rec.name)
        return f"A/B: {rec.name} is unavailable: {reason}" if reason else None

    def set_compare_kernel(self, name: str) -> str | None:
        """Kernel B, from the next frame on (A is the running kernel)."""
        reason = self.why_not_b(name)
        if reason:
            return self._fail(reason)
        self.compare.ab.kernel_b = self.record(name).name
        self._ok(f"A/B: kernel B = {name}" + ("" if self.compare.on else " (turn A/B on to compare)"))
        return None

    def _default_b(self) -> str | None:
        """B when none was picked: the backend's float64 reference record (cpu-fp64, fp64), if it has one."""
        try:
            return with_role(type(self.backend).kernels(), "reference").name
        except ConfigError:
            return None

    def set_compare(self, on: bool) -> str | None:
        """A/B on (kernel B: the one picked, else the backend's reference record) or off; off also turns an
        error-ab view back to the colour by before it."""
        state = self.compare
        if on:
            name = state.ab.kernel_b or self._default_b()
            if name is None:
                return self._fail("A/B: pick kernel B first")
            reason = self.why_not_b(name)
            if reason:
                return self._fail(reason)
            state.ab.kernel_b, state.on = name, True
            self._ok(f"A/B on: {self.backend.kernel} (A) against {name} (B) on the same state")
            return None
        state.on = False
        if self.scene.render.color_by == "error-ab":
            return self.set_error_view("off")
        self._ok("A/B off")
        return None

    def start_compare(self, name: str) -> str | None:
        """`run --compare NAME`: B = NAME and A/B on."""
        return self.set_compare_kernel(name) or self.set_compare(True)

    def set_compare_every(self, frames) -> str | None:
        """B evaluated every `frames`-th frame whose state changed (1: every one)."""
        try:
            k = int(frames)
        except (TypeError, ValueError):
            k = 0
        if not 1 <= k <= MAX_EVERY or k != frames:
            return self._fail(f"A/B every: {frames!r} must be a whole number of frames from 1 to {MAX_EVERY}")
        self.compare.ab.every = k
        self._ok(f"A/B: B evaluated every {k} frame{'s' if k > 1 else ''}")
        return None

    def set_error_view(self, view: str) -> str | None:
        """Colour by force error: "error" (against the exact sum), "error-ab" (against kernel B; turns A/B
        on) or "off" (back to the colour by before): render.color_by, validated as --set is."""
        state = self.compare
        current = self.scene.render.color_by
        if view == "off":
            target = state.previous_color_by if current in ERROR_VIEWS else current
        elif view in ERROR_VIEWS:
            if view == "error-ab" and not state.on:
                failed = self.set_compare(True)
                if failed:
                    return failed
            target = view
        else:
            return self._fail(f"error view: {view!r} is not one of off, {', '.join(ERROR_VIEWS)}")
        if current not in ERROR_VIEWS:
            state.previous_color_by = current
        return None if target == current else self.set_value("render.color_by", target)

    def compare_line(self) -> str | None:
        """The latest A/B as one line (the run's report), or None."""
        latest = self.compare.ab.latest
        return None if latest is None else latest.line()

    def close_compare(self) -> None:
        """The backend's scratch buffers given back (a GPU's while its context is still held), the paint
        unhooked; A/B and the error view stay as they are set."""
        state = self.compare
        if state.ops is not None:
            state.ops.close()
        state.ops, state.ops_of = None, None
        if state.hooked:
            self.viewer.after_advance.remove(self._paint_errors)
            state.hooked = False

    # --- each frame --------------------------------------------------------------------------------
    def _ops(self) -> CompareOps | None:
        """The running backend's CompareOps (made again for another backend object), or None with a note."""
        state = self.compare
        backend = self.backend
        if state.ops_of is not backend:
            if state.ops is not None:
                state.ops.close()
            state.ops, state.ops_of, state.note = None, backend, ""
            state.ab.reset()
            state.exact.reset()
            try:
                state.ops = backend.compare_ops()
                state.ops.clear_colours()
            except NotImplementedError as e:
                state.note = f"A/B and error colours: {e}"
            except Exception as e:  # noqa: BLE001 - the viewer goes on; the tab says why
                state.note = f"A/B and error colours: {type(e).__name__}: {e}"
                log.warning("%s", state.note)
        return state.ops

    def compare_tick(self) -> None:
        """Once per frame (on_frame): A's time, B when due, a piece of the exact sum (module doc)."""
        state = self.compare
        if not state.hooked:
            self.viewer.after_advance.append(self._paint_errors)
            state.hooked = True
        view, changed = self.scene.render.color_by, self.scene.render.color_by != state.view
        if changed and state.view in ERROR_VIEWS and view not in ERROR_VIEWS:
            self.viewer.sync_buffers(force=True)  # the speeds back where the colours were (paused too)
        state.view = view
        if view not in ERROR_VIEWS and not state.on:
            state.ms = 0.0
            if state.ops is not None:  # nothing compared: the scratch buffers go back
                state.ops.close()
                state.ops, state.ops_of = None, None
            return
        t0 = time.perf_counter()
        try:
            self._tick(state, view, changed)
        finally:
            state.ms = (time.perf_counter() - t0) * 1e3

    def _tick(self, state: CompareState, view: str, changed: bool) -> None:
        backend = self.backend
        ops = self._ops()
        if ops is None or backend.n == 0:
            return
        if changed:  # another error view: its colours start from nothing
            state.exact.reset()
            ops.clear_colours()
        if view == "error-ab" and not state.on and self.set_compare(True):  # (set by a scene or the View tab)
            self.set_error_view("off")  # no kernel B here: once, not every frame
            return
        key = (backend.kernel, backend.n, tuple(sorted(backend.tunables().items())), backend.physics)
        if state.on:
            self._tick_ab(state, ops, key, view == "error-ab")
        if view == "error":
            try:
                state.exact.tick(ops, key, backend.time)
            except Exception as e:  # noqa: BLE001 - one line, and the colour by goes back
                state.exact.reset()
                self.set_error_view("off")
                self._fail(f"error colours: the exact sum failed: {type(e).__name__}: {e}")

    def _tick_ab(self, state: CompareState, ops: CompareOps, key: tuple, colour: bool) -> None:
        ab = state.ab
        ab.observe_step(self.viewer.stats.step)
        reason = self.why_not_b(ab.kernel_b) if ab.kernel_b else "A/B: pick kernel B"
        if reason:  # (A moved to another backend since B was picked)
            state.note = reason
            return
        state.note = ""
        ab.colour = colour
        try:
            ab.tick(ops, key, self.backend.time, self.backend.n)
        except Exception as e:  # noqa: BLE001 - one line, and A/B off
            state.on = False
            self._fail(f"A/B stopped: {ab.kernel_b} failed: {type(e).__name__}: {e}")

    def _paint_errors(self) -> None:
        """After the frame's steps filled the renderer's buffers: the colour buffer into its per-body float,
        while an error view is shown."""
        state = self.compare
        if (
            self.scene.render.color_by not in ERROR_VIEWS
            or state.ops is None
            or state.ops_of is not self.backend
        ):
            return
        try:
            values = state.ops.paint()
        except Exception as e:  # noqa: BLE001 - one line, and the colour by goes back
            self.set_error_view("off")
            self._fail(f"error colours: drawing them failed: {type(e).__name__}: {e}")
            return
        renderer = self.viewer.renderer
        if values is not None and values.shape[0] == renderer.n:
            renderer.upload_values(values)
