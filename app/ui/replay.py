"""The panel of a replay (`nbody-live run DIR`): a time slider, play/pause and the snapshot steps over a
ReplayBackend (app.backends.replay), which feeds the viewer the series' positions, interpolated in time.

    panel = ReplayPanel(viewer)              # viewer.backend is a ReplayBackend; Tab hides the panel
    panel.controller.seek(t); panel.controller.toggle_play(); panel.close()

A replay computes nothing, so this panel has none of the simulation panel's kernels, parameters or
benchmark; it keeps its Record button (V, app.render.live_recording) and its conventions: the actions
are `ReplayController` methods (no ImGui in them), and per frame the panel records where its widgets
were drawn (`item_rects`, logical pixels) so that tests click them with synthesised vispy events.

Keys: Space play / pause, Left / Right the previous / next snapshot, Home / End the first / last,
V record, Tab hide the panel, Escape quit (F, C and the mouse move the camera as in a live run).
"""

from __future__ import annotations

import logging
import math
import time

from app.render.live_recording import ViewRecorder

log = logging.getLogger(__name__)

PANEL_W = 440.0
SPEED_RANGE = (0.1, 120.0)  # snapshots per second the speed slider offers
KEYS_HELP = "Space play/pause · Left/Right snapshot · Home/End · V record · F fit · Tab hide · Esc quit"
DIM = (0.60, 0.64, 0.70, 1.0)
ACCENT = (1.0, 0.62, 0.22, 1.0)
RED = (1.0, 0.42, 0.38, 1.0)


class ReplayController:
    """What the replay panel and the keys do to the ReplayBackend; each action returns None or a message."""

    def __init__(self, viewer):
        self.viewer = viewer
        self.message = ""
        self.view_recorder = ViewRecorder(viewer, self._report)
        viewer.key_actions.update({
            "Space": self.toggle_play, "Left": lambda: self.step_snapshot(-1),
            "Right": lambda: self.step_snapshot(+1), "Home": lambda: self.replay.seek_snapshot(0),
            "End": self.to_last, "V": self.view_recorder.toggle,
            "R": lambda: self.replay.seek_snapshot(0)})
        for key in ("[", "]", "S"):  # kernels and snapshots of a live run: nothing to do in a replay
            viewer.key_actions.pop(key, None)

    @property
    def replay(self):
        return self.viewer.backend

    @property
    def series(self):
        return self.replay.series

    def _report(self, message: str, failed: bool) -> None:
        self.message = message
        (log.warning if failed else log.info)("%s", message)

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


class ReplayPanel:
    def __init__(self, viewer, visible: bool = True):
        from imgui_bundle import imgui

        from app.ui.imgui_bridge import ImGuiBridge

        self.imgui = imgui
        self.viewer = viewer
        self.controller = ReplayController(viewer)
        self.bridge = ImGuiBridge(viewer)
        self.visible = visible
        self.bridge.enabled = visible
        self.item_rects: dict[str, tuple[float, float, float, float]] = {}
        self.cost_ms = 0.0
        viewer.overlays.append(self.draw)
        viewer.key_actions["Tab"] = self.toggle
        self._keys_are_ui = lambda: self.visible and self.imgui.get_io().want_text_input
        viewer.capture_keyboard.append(self._keys_are_ui)

    def toggle(self) -> None:
        self.visible = not self.visible
        self.bridge.enabled = self.visible

    def draw(self, viewer) -> None:
        t0 = time.perf_counter()
        self.controller.on_frame()
        if self.visible:
            self.bridge.frame(self.build)
        self.cost_ms = (time.perf_counter() - t0) * 1e3

    def close(self) -> None:
        from app.ui.imgui_bridge import detach_panel

        detach_panel(self.viewer, self.draw, self.toggle, self._keys_are_ui)
        self.bridge.close()
        self.controller.close()

    def _rect(self, name: str) -> None:
        a, b = self.imgui.get_item_rect_min(), self.imgui.get_item_rect_max()
        self.item_rects[name] = (a.x, a.y, b.x, b.y)

    def _tooltip(self, text: str) -> None:
        if self.imgui.is_item_hovered(self.imgui.HoveredFlags_.for_tooltip):
            self.imgui.set_tooltip(text)

    def build(self) -> None:
        imgui = self.imgui
        ctl = self.controller
        r, s = ctl.replay, ctl.series
        self.item_rects = {}
        imgui.set_next_window_pos(imgui.ImVec2(8, 8), imgui.Cond_.first_use_ever)
        imgui.set_next_window_size(imgui.ImVec2(PANEL_W, 0), imgui.Cond_.first_use_ever)
        expanded, _ = imgui.begin("Replay###replay", None, imgui.WindowFlags_.no_collapse)
        if expanded:
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
            changed, t = imgui.slider_float("##time", float(r.t), float(s.start), float(s.end), "t = %.4g",
                                            imgui.SliderFlags_.no_round_to_format)
            self._rect("time_slider")
            self._tooltip("the time shown: drag or click to move through the series; positions between two "
                          "snapshots are interpolated linearly in time (velocities too, for the colours)")
            if changed:
                ctl.seek(t)
            imgui.set_next_item_width(200)
            changed, sps = imgui.slider_float("snapshots / s", float(ctl.snapshots_per_s()), *SPEED_RANGE,
                                              "%.3g", imgui.SliderFlags_.logarithmic)
            self._rect("speed")
            self._tooltip("playback speed in snapshots per second of wall time (mean spacing); each drawn "
                          "frame shows the interpolated positions at its own time")
            if changed:
                ctl.set_snapshots_per_s(sps)
            changed, loop = imgui.checkbox("loop", r.loop)
            self._rect("loop")
            if changed:
                r.loop = loop
            self._record_row()
            imgui.push_text_wrap_pos(0.0)
            if ctl.message:
                imgui.text_colored(imgui.ImVec4(*DIM), ctl.message)
            imgui.text_colored(imgui.ImVec4(*DIM), KEYS_HELP)
            imgui.pop_text_wrap_pos()
        pos, size = imgui.get_window_pos(), imgui.get_window_size()
        self.item_rects["window"] = (pos.x, pos.y, pos.x + size.x, pos.y + size.y)
        imgui.end()

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
        self._tooltip(f"V: record what the viewer draws (without this panel) into {vr.directory}/"
                      f"recording-<time>.mp4 at {vr.fps:g} fps of wall time; for a clip that spans the "
                      "series frame by frame, use `nbody-live record DIR`")
        imgui.same_line()
        imgui.align_text_to_frame_padding()
        if rec is not None:
            imgui.text_colored(imgui.ImVec4(*RED), f"REC {rec.elapsed:.1f} s · {rec.drawn} frames")
        elif vr.recordings:
            imgui.text_disabled(str(vr.recordings[-1].path))
        else:
            imgui.text_disabled(f"to {vr.directory}/")
