"""The Plots tab: frame and kernel time over the last seconds, and the energy and momentum drift."""

from __future__ import annotations

import numpy as np

from app.ui.controller import HISTORY_S
from app.ui.style import WARN_TEXT


def draw(panel) -> None:
    _history(panel)
    _energy(panel)


def _history(panel) -> None:
    imgui, implot = panel.imgui, panel.implot
    ctl = panel.controller
    panel._header(f"Frame and kernel time, last {HISTORY_S:.0f} s (markers: switches)")
    t, d = ctl.history.window(HISTORY_S, ("frame_ms", "force_ms", "draw_ms"))
    if implot.begin_plot("##history", imgui.ImVec2(-1, 170)):
        implot.setup_axes("", "ms", 0, implot.AxisFlags_.auto_fit)
        implot.setup_axis_limits(implot.ImAxis_.x1, -HISTORY_S, 0.0, implot.Cond_.always)
        # kernels differ by orders of magnitude (a CPU kernel next to a GPU one): log time axis
        implot.setup_axis_scale(implot.ImAxis_.y1, implot.Scale_.log10)
        implot.setup_legend(
            implot.Location_.north_west, implot.LegendFlags_.horizontal | implot.LegendFlags_.outside
        )
        if t.size:
            x = t - t[-1]
            for name, label in (("frame_ms", "frame"), ("force_ms", "force"), ("draw_ms", "draw")):
                implot.plot_line(label, x, np.maximum(d[name], 1e-3))
            t_end = t[-1]
            marks = [m for m in ctl.markers if m.t >= t_end - HISTORY_S]
            if marks:
                xs = np.array([m.t - t_end for m in marks])
                spec = implot.Spec()
                spec.line_color = imgui.ImVec4(0.85, 0.85, 0.90, 0.55)
                spec.flags = implot.ItemFlags_.no_legend
                implot.plot_inf_lines("switches", xs, spec)
                tag = imgui.ImVec4(0.20, 0.25, 0.34, 1.0)
                top = implot.get_plot_limits().y.max
                for m in marks:
                    implot.annotation(
                        m.t - t_end, top, tag, imgui.ImVec2(2, 2), True, m.label.replace("%", "%%")
                    )
        implot.end_plot()
    panel._rect("history_plot")


def _energy(panel) -> None:
    imgui, implot = panel.imgui, panel.implot
    en = panel.controller.energy
    panel._header("Conservation: energy and momentum drift")
    last = en.latest
    how = (
        f"sampled every {en.every} frames ({en.source or '...'}); |dE/E0|: energy drift since the "
        "baseline; |dP|: linear momentum drift / sum m|v|; |dL|: angular momentum drift / sum m|r||v|"
    )
    flight = en.in_flight
    if flight is not None and flight < 1.0:  # a large N's potential runs a slice a frame
        how += f"; the sample in flight is {flight:.0%} queued (its O(N²) potential runs a slice a frame)"
    if last is None:
        imgui.text_disabled("waiting for the first sample" + ("" if flight is None else f" ({flight:.0%})"))
    else:
        e = "n/a" if last.energy is None else f"{last.energy:.2e}"
        panel._mono(f"|dE/E0| {e}   |dP| {last.momentum:.1e}   |dL| {last.angular:.1e}")
    panel._tooltip(how)
    if en.note:
        imgui.push_text_wrap_pos(0.0)
        imgui.text_colored(imgui.ImVec4(*WARN_TEXT), en.note)
        imgui.pop_text_wrap_pos()
    if len(en.samples) >= 3 and implot.begin_plot("##energy", imgui.ImVec2(-1, 120)):
        implot.setup_axes("", "drift", implot.AxisFlags_.auto_fit, implot.AxisFlags_.auto_fit)
        implot.setup_axis_scale(implot.ImAxis_.y1, implot.Scale_.log10)
        implot.setup_legend(implot.Location_.south_east, implot.LegendFlags_.horizontal)
        samples = en.samples[1:]  # the first is the baseline: zero drift by definition
        ts = np.array([s.time for s in samples])
        for name in ("energy", "momentum", "angular"):
            ys = np.array([np.nan if getattr(s, name) is None else getattr(s, name) for s in samples])
            ys = np.where(ys > 0, ys, 1e-17)
            if np.isfinite(ys).any():
                implot.plot_line(name, ts, ys)
        implot.end_plot()
