"""The Compare tab: A/B (the running kernel A against kernel B on the same state: both force times, B / A,
the accelerations' difference) and the colour by force error, against the exact sum or against B, with its
legend (app/ui/compare_actions.py changes them; app/engine/compare.py and error_colours.py measure)."""

from __future__ import annotations

import math

from app.engine.error_colours import ERROR_HI, ERROR_LO, legend_ticks
from app.render.colormaps import colormap
from app.render.particles import CMAP_LOW
from app.ui.sections.kernel import kernel_rows
from app.ui.style import ACCENT, DIM_TEXT, RED_TEXT

VIEWS = (("off", "off"), ("error", "against the exact sum"), ("error-ab", "against kernel B"))
LEGEND_W, LEGEND_H, LEGEND_STEPS = 300.0, 14.0, 60


def draw(panel) -> None:
    imgui = panel.imgui
    state = panel.controller.compare
    panel._header("A/B: the running kernel (A) against kernel B, same state")
    _kernel_b_combo(panel)
    changed, on = imgui.checkbox("A/B on", state.on)
    panel._rect("compare:on")
    if changed:
        panel.controller.set_compare(on)
    panel._tooltip(
        "B is evaluated at the state of every frame (every k-th: the field beside) into a scratch copy of "
        "the accelerations, never into the state; A's time is its force time in the frame's steps"
    )
    imgui.same_line()
    imgui.set_next_item_width(90.0)
    flags = imgui.InputTextFlags_.auto_select_all | imgui.InputTextFlags_.enter_returns_true
    changed, every = imgui.input_int("every k frames", state.ab.every, 1, 10, flags)
    panel._rect("compare:every")
    if changed:
        panel.controller.set_compare_every(max(int(every), 1))
    if state.note:
        _text(panel, "compare:note", state.note, RED_TEXT)
    if state.on:
        _results(panel)
    _error_view(panel)


def _text(panel, key: str, text: str, color=None) -> None:
    """A wrapped line, kept in panel.texts[key] (what the tab said in its last frame)."""
    imgui = panel.imgui
    imgui.push_text_wrap_pos(0.0)
    if color is None:
        imgui.text(text)
    else:
        imgui.text_colored(imgui.ImVec4(*color), text)
    imgui.pop_text_wrap_pos()
    panel._rect(key)
    panel.texts[key] = text


def _kernel_b_combo(panel) -> None:
    """Every record; an unavailable one greyed with the reason. Another backend's kernel is refused with a
    line when picked (A and B are kernels of one backend)."""
    imgui = panel.imgui
    ctl = panel.controller
    current = ctl.compare.ab.kernel_b or "(pick kernel B)"
    imgui.set_next_item_width(200.0)
    opened = imgui.begin_combo("kernel B##compare", current, imgui.ComboFlags_.height_large)
    panel._combo_rect("compare:kernel_b", opened)
    if opened:
        kernel_rows(panel, current, "compare:kernel_b=", ctl.set_compare_kernel)
        imgui.end_combo()


def _ms(ms: float) -> str:
    return "-" if not math.isfinite(ms) else f"{ms:.3f} ms" if ms < 1000 else f"{ms:.0f} ms"


def _results(panel) -> None:
    """Both times, B / A and the difference of the latest evaluation; what A/B costs a frame."""
    imgui = panel.imgui
    state = panel.controller.compare
    r = state.ab.latest
    if r is None:
        _text(panel, "compare:waiting", "A/B: waiting for a frame that steps", DIM_TEXT)
        return
    T = imgui.TableFlags_
    if imgui.begin_table("compare", 3, T.sizing_stretch_prop | T.row_bg | T.borders_inner_v):
        rows = (
            ("A", r.kernel_a, _ms(r.a_ms), "compare:a_ms"),
            ("B", r.kernel_b, _ms(r.b_ms), "compare:b_ms"),
            (
                "B / A",
                "force time",
                "-" if not math.isfinite(r.ratio) else f"{r.ratio:.2f}x",
                "compare:ratio",
            ),
            ("median", "|a_A - a_B| / |a_B|", f"{r.median:.2e}", "compare:median"),
            ("p99", f"over {r.k:,} bodies", f"{r.p99:.2e}", "compare:p99"),
        )
        for name, what, value, key in rows:
            imgui.table_next_row()
            imgui.table_next_column()
            imgui.text(name)
            imgui.table_next_column()
            imgui.text_disabled(what)
            imgui.table_next_column()
            panel._mono(value, ACCENT if key == "compare:ratio" else None)
            panel._rect(key)
            panel.texts[key] = value
        imgui.end_table()
    panel._tooltip(
        "A: the median force time per evaluation of its last steps; B: of its last evaluations on the "
        "scratch copy; both the backend's clock (CUDA events on a GPU, perf_counter on the CPU)"
    )
    imgui.text_disabled(f"A/B costs {state.ab.ms:.2f} ms a frame where B is evaluated")


def _error_view(panel) -> None:
    """The colour by force error (render.color_by) and its legend, with the exact sum's cost."""
    imgui = panel.imgui
    ctl = panel.controller
    panel._header("Colour by force error")
    current = panel.viewer.scene.render.color_by
    for view, label in VIEWS:
        chosen = current == view or (view == "off" and current not in ("error", "error-ab"))
        if imgui.radio_button(f"{label}##errview", chosen) and not chosen:
            ctl.set_error_view(view)
        panel._rect(f"compare:view={view}")
        if view != VIEWS[-1][0]:
            imgui.same_line()
    if current not in ("error", "error-ab"):
        return
    _legend(panel)
    exact = ctl.compare.exact
    if current == "error" and exact.progress is not None:
        _text(
            panel, "compare:exact", f"exact sum (float64, all N): {100 * exact.progress:.0f}% done", DIM_TEXT
        )
    elif current == "error" and exact.latest is not None:
        s = exact.latest
        every = max(exact.interval_s, s.cost_ms / 1e3 / exact.share)
        _text(
            panel,
            "compare:exact",
            f"{s.kernel} against the exact sum over all {s.n:,} bodies: median {s.median:.1e}, p99 "
            f"{s.p99:.1e}, max {s.max:.1e}; the sum took {s.cost_ms:.1f} ms over {s.frames} frame"
            f"{'s' if s.frames > 1 else ''}, again every {every:.1f} s",
            DIM_TEXT,
        )
    elif current == "error-ab" and ctl.compare.ab.latest is not None:
        r = ctl.compare.ab.latest
        _text(
            panel,
            "compare:exact",
            f"colours: {r.kernel_a} against {r.kernel_b}, every A/B evaluation",
            DIM_TEXT,
        )


def _legend(panel) -> None:
    """The colour bar as the shader maps an error (the colormap from its low offset up), its powers of ten
    under it."""
    imgui = panel.imgui
    name = panel.viewer.scene.render.colormap
    rgb = colormap(name)
    low = 0.0 if name == "white" else CMAP_LOW
    dl = imgui.get_window_draw_list()
    p = imgui.get_cursor_screen_pos()
    step = LEGEND_W / LEGEND_STEPS
    for i in range(LEGEND_STEPS):
        t = (i + 0.5) / LEGEND_STEPS
        r, g, b = (float(c) for c in rgb[int(round((low + (1.0 - low) * t) * (len(rgb) - 1)))])
        color = imgui.get_color_u32(imgui.ImVec4(r, g, b, 1.0))
        x0 = p.x + i * step
        dl.add_rect_filled(imgui.ImVec2(x0, p.y), imgui.ImVec2(x0 + step + 0.5, p.y + LEGEND_H), color)
    imgui.dummy(imgui.ImVec2(LEGEND_W, LEGEND_H))
    panel._rect("compare:legend")
    panel._tooltip(
        f"relative force error |a - a_ref| / |a_ref| per body, log scale from {ERROR_LO:g} (and below) to "
        f"{ERROR_HI:g} (and above)"
    )
    y = imgui.get_cursor_screen_pos().y
    for t, label in legend_ticks():
        width = imgui.calc_text_size(label).x
        x = min(max(p.x + t * LEGEND_W - width / 2, p.x), p.x + LEGEND_W - width)
        imgui.set_cursor_screen_pos(imgui.ImVec2(x, y))
        imgui.text_disabled(label)
    panel.texts["compare:legend"] = " ".join(label for _, label in legend_ticks())
