"""What the live panel's Controller (app.ui.controller) and the replay's ReplayController (app.ui.replay)
share: the line an action leaves (`message`, logged) and scene keys changed while the viewer runs,
validated exactly as a scene file or `--set` would (app.scene.set_value), so that what a panel does can
be written in a scene file and `record` renders what the keys say.

    ctl.set_value("render.components.halo.visible", False)   # None, or the line saying why not
    ctl.current_value("render.point_size")

A subclass widens `apply_value` to the keys it can change live (the Controller: physics, N, run).
"""

from __future__ import annotations

import copy
import logging
from typing import TYPE_CHECKING

log = logging.getLogger(__name__)


if TYPE_CHECKING:
    from app.render.canvas import Viewer


class Actions:
    """Needs `self.viewer`; sets `self.message`."""

    viewer: Viewer  # set by the class it is mixed into
    LIVE_SECTIONS: tuple[str, ...] = ("camera",)  # sections whose keys apply with no further action
    message = ""

    @property
    def scene(self):
        return self.viewer.scene

    def _fail(self, msg: str) -> str:
        self.message = msg
        log.warning("%s", msg)
        return msg

    def _ok(self, msg: str) -> None:
        self.message = msg
        log.info("%s", msg)

    def _report(self, message: str, failed: bool) -> None:
        """Where the recorder's lines go: `message`, like every other action's."""
        (self._fail if failed else self._ok)(message)

    # --- scene keys ------------------------------------------------------------------------------
    def current_value(self, key: str):
        section, name = key.split(".", 1)
        if section == "render" and name.startswith("components."):
            from app.model.components import style_value

            return style_value(self.scene.render.components, self.viewer.renderer.components, key)
        return getattr(getattr(self.scene, section), name)

    def set_value(self, key: str, value) -> str | None:
        """Validate `key = value` exactly as a scene file / `--set` would, then apply it live.

        A rejected value changes nothing (the previous value stays in effect)."""
        from app.core.errors import ConfigError
        from app.scene import set_value

        trial = copy.deepcopy(self.scene)
        try:
            set_value(trial, key, value)
        except ConfigError as e:
            return self._fail(str(e))
        try:
            said = self.apply_value(key, trial)
        except Exception as e:  # noqa: BLE001 - the backend's own checks
            return self._fail(f"{key}: {e}")
        set_value(self.scene, key, value)
        self._ok(said or f"{key} = {self.current_value(key)}")
        return None

    def apply_value(self, key: str, trial) -> str | None:
        """Make `trial`'s (validated) value of `key` take effect; raises when it cannot change now.
        Returns the line to report instead of `key = value`, or None."""
        from app.core.errors import ConfigError

        section = key.split(".", 1)[0]
        if section == "render":
            self.viewer.renderer.apply_settings(trial.render)
        elif section not in self.LIVE_SECTIONS:
            raise ConfigError("cannot be changed while running")
        return None
