"""The Controller's hot reload of the user's kernel files and of the particles' shaders (issue 27, item
2): a mixin.

While the backend offers a reload (`Backend.kernel_reload()`: the CUDA backend on one GPU, with a
kernel file loaded), a Reloader watches those files; `reload_tick()`, once a frame on the thread that
steps, moves saves through build, validation and swap, and says each outcome in `message`:

    kernel my-kernel: reloaded, live 0.62 s after the save (compile 0.41 s, validate 0.12 s)
    my.cu(12): error: expected a ";" - my-kernel keeps running the last good build

`reloads` is the history the panel lists (app.engine.kernel_reload.Reload: outcome, message, the time of
each stage). A switch to another backend ends the watch, and a switch back starts it again.

The shaders (shaders/particles.vert and .frag) are watched the same way, on every backend: a save is
compiled in place on the next frame (app.render.shaders.reload_shaders: the program's buffers and
uniforms kept), or refused with the driver's message while the program it had draws on.

Watching is polling: one os.stat per watched file per frame (about 2 microseconds each here), which
notices a save at the next frame. A watcher library (watchdog, watchfiles) would add a thread and a
dependency and could not make a save live sooner: the swap waits for the frame boundary either way.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from pathlib import Path
from typing import Any

from app.backends import all_kernel_records
from app.core.paths import SHADERS
from app.engine.forces import with_role
from app.engine.kernel_reload import HISTORY, BuildError, FileWatch, Reload, Reloader
from app.render.shaders import ShaderError, reload_shaders
from app.ui.actions import Actions

log = logging.getLogger(__name__)

SHADER_FILES = ("particles.vert", "particles.frag")  # the particles' program (app/render/particles.py)


class KernelReloads(Actions):
    """Mixed into the Controller, which gives what is declared here."""

    backend: Any
    viewer: Any
    records: list
    _why_not: dict[str, str | None]

    def _init_reloads(self, sanitizer: bool = False) -> None:
        self.reload_sanitizer = sanitizer
        self.reloads: deque[Reload] = deque(maxlen=HISTORY)
        self._reloader: Reloader | None = None
        self._reload_hooks = None
        self._reload_backend = None
        self.reload_watching: list[Path] = []
        self._tried: set[Path] = set()  # files whose build passed a trial (a save's, or a first run's)
        self._watch_backend()
        self._shader_watch = FileWatch([SHADERS / SHADER_FILES[0], SHADERS / SHADER_FILES[1]])

    def watch_kernel_files(self, sanitizer: bool) -> None:
        """Watch again, each trial under compute-sanitizer or not (run --reload-sanitizer)."""
        self.reload_sanitizer = sanitizer
        self._watch_backend()

    def _watch_backend(self) -> None:
        """Start watching for the current backend (stopping the watch of a backend switched away from)."""
        self._stop_watching()
        backend = self.backend
        self._reload_backend = backend
        try:
            hooks = backend.kernel_reload(self.reload_sanitizer)
        except Exception as e:  # noqa: BLE001 - no reload (the sandbox did not start) must not stop the viewer
            self._fail(f"kernel files are not watched: {e}")
            return
        if hooks is None:
            return
        self._reload_hooks = hooks
        self.reload_watching = hooks.paths()
        self._reloader = Reloader(
            FileWatch(self.reload_watching), hooks.build, hooks.validate, hooks.swap, hooks.snapshot
        )
        log.info(
            "watching %s: a save is compiled, validated and swapped in",
            ", ".join(map(str, self.reload_watching)),
        )
        self._try_the_running_kernel()

    def tried_first(self, name: str) -> str | None:
        """Before a kernel file's kernel first runs in the viewer (at the start, or picked in the combo):
        the trial a save gets (a hang, a stray write, a NaN or a wrong force refuses it), and what was
        tried is what runs. The reason it is refused, or None (it passed, or is not a file's)."""
        hooks = self._reload_hooks
        path = next((p for p in self.reload_watching if self._name_of(p) == name), None)
        if hooks is None or path is None or path in self._tried:
            return None
        log.info("%s: trying %s's build in its sandbox before it runs", name, path.name)
        try:
            built = hooks.build(path)
        except BuildError as e:
            return str(e)
        check = hooks.validate(built, hooks.snapshot())
        if not check.ok:
            return check.why
        hooks.swap(built)
        self._tried.add(path)
        return None

    def _try_the_running_kernel(self) -> None:
        """A run started on a kernel file's kernel: its trial before the first step; refused, the run
        starts on the plain all-pairs built-in (`shared`) instead, saying why (a kernel that never ends
        would otherwise hang the viewer before its first frame)."""
        name = self.backend.kernel
        reason = self.tried_first(name)
        if reason is None:
            return
        # the backend's plain all-pairs built-in (role "exact": `shared` on a GPU), never `best`, which may
        # pick this very kernel from a tuning
        fallback = with_role(self.backend.kernels(), "exact").name
        self.backend.set_kernel(fallback)
        self._fail(f"kernel {name} is refused: {reason} - running {fallback}; save the file to try it again")

    def _stop_watching(self) -> None:
        if self._reloader is not None:
            self._reloader.close()
        if self._reload_hooks is not None:
            self._reload_hooks.close()
        self._reloader = self._reload_hooks = None
        self.reload_watching = []

    @property
    def reload_busy(self) -> bool:
        return self._reloader is not None and self._reloader.busy

    def reload_tick(self) -> list[Reload]:
        """Between two steps: the saves seen, the builds and validations finished, the swaps made."""
        self._shader_tick()
        if self.backend is not self._reload_backend:
            self._watch_backend()
        if self._reloader is None:
            return []
        done = self._reloader.poll()
        for reload in done:
            self.reloads.append(reload)
            self._say(reload)
            if reload.outcome == "swapped":
                self._tried.add(reload.path)
        swapped = [r for r in done if r.outcome == "swapped"]
        if swapped:
            self.records = all_kernel_records()  # a header may have changed a doc, the tunables
            for reload in swapped:  # it compiled and passed its trial: available, with no compile now
                self._why_not[self._name_of(reload.path)] = None  # (refresh_availability would run nvcc)
        return done

    def _shader_tick(self) -> None:
        """A saved shader compiled into the particles' program in place, or refused (the old one draws)."""
        changed = self._shader_watch.changed()
        renderer = getattr(self.viewer, "renderer", None)
        if not changed or renderer is None:
            return
        t0 = time.perf_counter()
        self.viewer.set_current()
        try:
            reload_shaders(renderer.program, *SHADER_FILES, canvas=self.viewer)
        except ShaderError as e:
            first = str(e).splitlines()[0]
            self.reloads.append(Reload(changed[0], "compile error", first, time.perf_counter() - t0))
            self._fail(f"{first} - the particles keep their last good shaders")
            return
        took = time.perf_counter() - t0
        self.reloads.append(
            Reload(changed[0], "swapped", "the particles' program", took, swap_s=0.0, live_s=took)
        )
        self._ok(f"shaders: {', '.join(p.name for p in changed)} reloaded in {took * 1e3:.0f} ms")

    def _say(self, reload: Reload) -> None:
        name = self._name_of(reload.path)
        if reload.outcome == "swapped":
            self._ok(
                f"kernel {name}: reloaded, live {reload.live_s:.2f} s after the save (compile "
                f"{reload.compile_s:.2f} s, validate {reload.validate_s:.2f} s)"
            )
        else:
            self._fail(f"{reload.outcome}: {reload.message} - {name} keeps running its last good build")

    def _name_of(self, path: Path) -> str:
        return next((r.name for r in self.records if r.source == str(path)), path.name)

    def close_reloads(self) -> None:
        self._stop_watching()
