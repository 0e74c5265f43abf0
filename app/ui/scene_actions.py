"""The Controller's (app.ui.controller) actions on the bodies and the scene: new N, the scene's initial
bodies again (`reset`, key R), a preset (`load_preset`: its bodies, physics, camera and render settings),
and the state written to a snapshot file (`save_snapshot`, key S).

`SceneActions` is a mixin of the Controller; each action returns None or the one line saying why nothing
changed, as every action does (app.ui.actions).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from app.core.errors import ConfigError
from app.render.live_recording import ViewRecorder
from app.ui.actions import Actions
from app.ui.energy import EnergyMonitor


class SceneActions(Actions):
    """Needs `self.backend`, `self.energy` (rebased when the bodies change) and `self.view_recorder` (its
    folder takes the snapshots); sets `self.last_snapshot`."""

    backend: Any
    energy: EnergyMonitor
    view_recorder: ViewRecorder
    last_snapshot: Path | None

    def _set_n(self, trial) -> str | None:
        from app.scene import make_bodies

        if trial.initial.file:
            raise ConfigError("N is fixed by the snapshot file the bodies come from")
        n = trial.initial.n
        if n == self.backend.n:
            return None
        self._load(make_bodies(trial))
        return f"N = {n:,}: buffers re-allocated"

    def _load(self, bodies, physics=None) -> None:
        """New bodies into the running backend; new VBOs when N changed (re-registered with CUDA)."""
        self.viewer.set_current()
        b = self.backend
        b.load(bodies, physics or b.physics, b.kernel)
        b.components = bodies.components
        self.viewer.sync_buffers(force=True)
        self.energy.rebase()

    def reset(self) -> str | None:
        """The scene's initial bodies again (same seed, current N, current kernel), camera reset."""
        from app.scene import make_bodies

        try:
            self._load(make_bodies(self.scene), self.scene.physics)
        except Exception as e:  # noqa: BLE001
            return self._fail(f"reset failed: {e}")
        self.viewer.reset_camera()
        self._ok("reset to the scene's initial bodies")
        return None

    def save_snapshot(self) -> str | None:
        """Write the current state (float64, original body order, the time, the components) to
        <recording folder>/snapshot-<time>.npz atomically; loads back bitwise with `formats.read`."""
        from app.core.outputs import check_output
        from app.model import formats

        stamp = time.strftime("%Y%m%d-%H%M%S")
        folder = self.view_recorder.directory
        path, i = folder / f"snapshot-{stamp}.npz", 1
        while path.exists():
            path, i = folder / f"snapshot-{stamp}-{i}.npz", i + 1
        try:
            folder.mkdir(parents=True, exist_ok=True)
            formats.write(check_output(path, "snapshot"), self.backend.state())  # (with the components)
        except Exception as e:  # noqa: BLE001 - a failed save is reported; the viewer goes on
            return self._fail(f"snapshot not saved: {e}")
        self.last_snapshot = path
        self._ok(f"wrote {path}")
        return None

    def load_preset(self, name: str) -> str | None:
        """A preset's bodies, physics, camera and render settings; N, backend, kernel and time steps
        (shared or block, with L and η) are kept."""
        from app.scene import load_scene, make_bodies

        cur = self.scene
        try:
            new = load_scene(name, {"initial.n": cur.initial.n})
            new.run.backend, new.run.kernel = cur.run.backend, self.backend.kernel
            ph = self.backend.physics
            new.physics = new.physics.with_(
                timesteps=ph.timesteps,
                block_levels=ph.block_levels,
                block_eta=ph.block_eta,
                block_coarsen=ph.block_coarsen,
            )
            bodies = make_bodies(new)
            self.backend.set_physics(new.physics)
            self.viewer.scene = new
            self.viewer.renderer.apply_settings(new.render)
            self._load(bodies, new.physics)
        except Exception as e:  # noqa: BLE001
            self.viewer.scene = cur
            return self._fail(f"preset {name}: {e}")
        self.viewer.reset_camera()
        self._ok(f"scene {name} (N = {bodies.n:,})")
        return None
