"""The panel of a replay (`nbody-live run DIR`): a time slider, play/pause and the snapshot steps over a
ReplayBackend (app.backends.replay), which feeds the viewer the series' positions, interpolated in time.

    panel = ReplayPanel(viewer)              # viewer.backend is a ReplayBackend; Tab hides the panel
    panel.controller.seek(t); panel.controller.toggle_play(); panel.close()

A replay computes nothing, so this panel has none of the simulation panel's kernels, parameters or
benchmark; it keeps its Record button (V, app.render.live_recording), its component list (the same
section as the live panel's View tab, app.ui.components_panel: the series' components, each with its
colour swatch, show/hide checkbox and brightness slider, through the render.components keys) and its
conventions (app.ui.overlay_panel): the actions are `ReplayController` methods (no ImGui in them; scene
keys through app.ui.actions, as `--set` would), the scene is drawn in the part of the window the panel
leaves free, Escape closes an open popup first, and per frame the panel records where its widgets were
drawn (`item_rects`, logical pixels) so that tests click them with synthesised vispy events.

Keys: Space play / pause, Left / Right the previous / next snapshot, Home / End the first / last,
V record, Tab hide the panel, Escape quit (F, C and the mouse move the camera as in a live run).
"""

from __future__ import annotations

import logging
import math
import time

from app.render.live_recording import ViewRecorder
from app.ui.actions import Actions
from app.ui.components_panel import components_section
from app.ui.overlay_panel import OverlayPanel

log = logging.getLogger(__name__)

SPEED_RANGE = (0.1, 120.0)  # snapshots per second the speed slider offers
KEYS_HELP = "Space play/pause · Left/Right snapshot · Home/End · V record · F fit · Tab hide · Esc quit"
DIM = (0.60, 0.64, 0.70, 1.0)
ACCENT = (1.0, 0.62, 0.22, 1.0)
RED = (1.0, 0.42, 0.38, 1.0)


class ReplayController(Actions):
    """What the replay panel and the keys do to the ReplayBackend; each action returns None or a message.
    Scene keys (`set_value`): render.* and camera.* only, as on a replay's command line."""

    def __init__(self, viewer):
        self.viewer = viewer
        self.message = ""
        self.view_recorder = ViewRecorder(viewer, self._report)
        viewer.key_actions.update(
            {
                "Space": self.toggle_play,
                "Left": lambda: self.step_snapshot(-1),
                "Right": lambda: self.step_snapshot(+1),
                "Home": lambda: self.replay.seek_snapshot(0),
                "End": self.to_last,
                "V": self.view_recorder.toggle,
                "R": lambda: self.replay.seek_snapshot(0),
            }
        )
        for key in ("[", "]", "S"):  # kernels and snapshots of a live run: nothing to do in a replay
            viewer.key_actions.pop(key, None)

    @property
    def replay(self):
        return self.viewer.backend

    @property
    def series(self):
        return self.replay.series

    def toggle_play(self) -> None:
        self.replay.set_playing(not self.replay.playing)

    def seek(self, t: float) -> None:
        self.replay.seek(t)

    def step_snapshot(self, direction: int) -> None:
        """To the next (+1) or previous (-1) snapshot from the time shown; pauses the replay."""
        r = self.replay
        i, f = self.series.index_at(r.t)
        target = i + 1 if direction > 0 else (i if f > 0 else i - 1)
        r.set_playing(False)
        r.seek_snapshot(target)

    def to_last(self) -> None:
        """The last snapshot, paused there (playing on would start again at the first)."""
        self.replay.set_playing(False)
        self.replay.seek_snapshot(len(self.series) - 1)

    def snapshots_per_s(self) -> float:
        s = self.series
        span = (s.end - s.start) / max(len(s) - 1, 1)
        return self.replay.rate / span if span > 0 else 1.0

    def set_snapshots_per_s(self, value: float) -> None:
        s = self.series
        span = (s.end - s.start) / max(len(s) - 1, 1)
        if span > 0 and value > 0 and math.isfinite(value):
            self.replay.rate = span * value

    def on_frame(self) -> None:
        return None

    def close(self) -> None:
        self.view_recorder.close()


class ReplayPanel(OverlayPanel):
    def __init__(self, viewer, visible: bool = True):
        super().__init__(viewer, ReplayController(viewer), visible)

    def draw(self, viewer) -> None:
        t0 = time.perf_counter()
        self.controller.on_frame()
        if self.visible:
            self.bridge.frame(self.build)
        self.cost_ms = (time.perf_counter() - t0) * 1e3

    def build(self) -> None:
        imgui = self.imgui
        ctl = self.controller
        r, s = ctl.replay, ctl.series
        if self._begin_window("Replay###replay", 0.0):  # (0: as tall as its content)
            imgui.text_colored(imgui.ImVec4(*ACCENT), f"{self.viewer.stats.fps:6.1f} FPS")
            imgui.same_line()
            imgui.text_disabled(f"  {s.name}  ·  N = {s.n:,}  ·  {len(s)} snapshots")
            i, f = s.index_at(r.t)
            where = f"snapshot {i + 1} of {len(s)}" + (f" (+{f:.2f} toward {i + 2})" if f > 0 else "")
            imgui.text(f"t = {r.t:.6g}   {where}")
            self._rect("time_label")
            if not s.complete:
                imgui.text_colored(imgui.ImVec4(*RED), "series of an interrupted run: its complete snapshots")
            self._transport()
            imgui.set_next_item_width(-1)
            changed, t = imgui.slider_float(
                "##time",
                float(r.t),
                float(s.start),
                float(s.end),
                "t = %.4g",
                imgui.SliderFlags_.no_round_to_format,
            )
            self._rect("time_slider")
            self._tooltip(
                "the time shown: drag or click to move through the series; positions between two "
                "snapshots are interpolated linearly in time (velocities too, for the colours)"
            )
            if changed:
                ctl.seek(t)
            imgui.set_next_item_width(200)
            changed, sps = imgui.slider_float(
                "snapshots / s",
                float(ctl.snapshots_per_s()),
                *SPEED_RANGE,
                "%.3g",
                imgui.SliderFlags_.logarithmic,
            )
            self._rect("speed")
            self._tooltip(
                "playback speed in snapshots per second of wall time (mean spacing); each drawn "
                "frame shows the interpolated positions at its own time"
            )
            if changed:
                ctl.set_snapshots_per_s(sps)
            changed, loop = imgui.checkbox("loop", r.loop)
            self._rect("loop")
            if changed:
                r.loop = loop
            self._record_row()
            components_section(self)  # the live panel's own: what the series' bodies are, drawn how
            imgui.push_text_wrap_pos(0.0)
            if ctl.message:  # (below the widgets: a new message moves none of them)
                imgui.text_colored(imgui.ImVec4(*DIM), ctl.message)
            imgui.text_colored(imgui.ImVec4(*DIM), KEYS_HELP)
            imgui.pop_text_wrap_pos()
        self._end_window()

    def _transport(self) -> None:
        imgui = self.imgui
        ctl = self.controller
        r = ctl.replay
        if imgui.button("|<"):
            r.seek_snapshot(0)
        self._rect("first")
        imgui.same_line()
        if imgui.button("<"):
            ctl.step_snapshot(-1)
        self._rect("previous")
        imgui.same_line()
        if imgui.button("Pause (Space)" if r.playing else "Play (Space)", imgui.ImVec2(120, 0)):
            ctl.toggle_play()
        self._rect("play")
        imgui.same_line()
        if imgui.button(">"):
            ctl.step_snapshot(+1)
        self._rect("next")
        imgui.same_line()
        if imgui.button(">|"):
            ctl.to_last()
        self._rect("last")

    def _record_row(self) -> None:
        imgui = self.imgui
        vr = self.controller.view_recorder
        rec = vr.recording
        if imgui.button("Stop (V)" if rec else "Record (V)"):
            vr.toggle()
        self._rect("record")
        self._tooltip(
            f"V: record what the viewer draws (without this panel) into {vr.directory}/"
            f"recording-<time>.mp4 at {vr.fps:g} fps of wall time; for a clip that spans the "
            "series frame by frame, use `nbody-live record DIR`"
        )
        imgui.same_line()
        imgui.align_text_to_frame_padding()
        if rec is not None:
            imgui.text_colored(imgui.ImVec4(*RED), f"REC {rec.elapsed:.1f} s · {rec.drawn} frames")
        elif vr.recordings:
            imgui.text_disabled(str(vr.recordings[-1].path))
        else:
            imgui.text_disabled(f"to {vr.directory}/")
