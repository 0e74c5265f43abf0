"""The live section: medians of the last frames (frame, force, draw, ...), the rates, a tree's stage split,
block steps' levels, each device's force time, the live force error and the breakdown bar."""

from __future__ import annotations

from app.backends.base import INTEROP_PATH
from app.ui.style import ACCENT, BREAKDOWN, DIM_TEXT, FADED_TEXT, OK_TEXT, WARN_TEXT, fmt_rate


def draw(panel) -> None:
    imgui = panel.imgui
    ctl = panel.controller
    panel._header("Live (median of the last frames)")
    live = ctl.live()
    host = not panel.viewer.stats.data_path.startswith(INTEROP_PATH)
    cells = [
        ("frame", live["frame_ms"], "time between two drawn frames (wall clock)"),
        ("force", live["force_ms"], "the force kernel(s), the backend's own timer"),
        ("integrate", live["integrate_ms"], "the integrator kernels"),
        ("map/unmap", live["mapunmap_ms"], "mapping the GL buffers for CUDA (interop)"),
        ("draw", live["draw_ms"], f"the particle pass on the GPU ({panel.viewer.stats.draw_timer})"),
        (
            "upload",
            live["upload_ms"],
            "host path: read back + VBO upload" if host else "none: CUDA-GL interop",
        ),
        (
            "record",
            live["record_ms"],
            "live recording: the capture's CPU time per frame (blit "
            "into the recorder, PBO readback, hand-over to the encoder thread); 0 when not recording",
        ),
        (
            "panel",
            live["panel_ms"],
            "this panel: bookkeeping + ImGui (CPU); the drift "
            f"diagnostics' read-back apart: {live['energy_ms']:.2f} ms/frame",
        ),
        ("Python", live["python_ms"], "frame - everything measured above"),
    ]
    T = imgui.TableFlags_
    if imgui.begin_table("live", 4, T.sizing_stretch_prop | T.row_bg | T.borders_inner_v):
        for c, wgt in enumerate((1.0, 1.0, 1.0, 1.0)):
            imgui.table_setup_column(f"c{c}", imgui.TableColumnFlags_.width_stretch, wgt)
        for i, (name, ms, tip) in enumerate(cells):
            if i % 2 == 0:
                imgui.table_next_row()
            imgui.table_next_column()
            imgui.text(name)
            panel._tooltip(tip)
            imgui.table_next_column()
            panel._mono(
                f"{ms:8.2f} ms" if ms < 1000 else f"{ms:8.0f} ms", ACCENT if name == "force" else None
            )
        imgui.end_table()
    bold = panel.bridge.fonts.get("bold")
    if bold is not None:
        imgui.push_font(bold, 0.0)
    imgui.text_colored(imgui.ImVec4(*ACCENT), f"{fmt_rate(live['interactions_per_s'])} interactions/s")
    imgui.same_line()
    g = live["gflops"]
    imgui.text_colored(imgui.ImVec4(*ACCENT), f"  {g:,.0f} GFLOP/s" if g >= 1000 else f"  {g:.1f} GFLOP/s")
    if bold is not None:
        imgui.pop_font()
    imgui.same_line()
    imgui.text_disabled("(20 flops/interaction)")
    _stages_row(panel)
    _block_row(panel)
    _devices_rows(panel)
    _force_error_row(panel)
    _breakdown_bar(panel, live)


def _stages_row(panel) -> None:
    """The force evaluation's split per stage (a tree: keys, sort, build, moments, walk), when the
    kernel reports one (ForceEvaluator.stage_ms -> StepTimings.extra "stage:<name>")."""
    stages = panel.controller.live_stages()
    if not stages:
        return
    panel.imgui.push_text_wrap_pos(0.0)  # five stages and more do not fit one line of the panel
    panel._mono("force: " + " · ".join(f"{name} {ms:.2f}" for name, ms in stages.items()) + " ms")
    panel.imgui.pop_text_wrap_pos()
    panel._rect("stages")
    panel._tooltip(
        "the force time split per stage, ms per frame (median of the last frames), the "
        "backend's own timer: Morton keys, sort and reorder, octree build, moments, walk"
    )


def _block_row(panel) -> None:
    """Block time steps: the active fraction (targets walked / (N x substeps), median of the last
    frames) and the bodies per level."""
    block = panel.controller.live_block()
    if block is None:
        return
    fraction, levels = block
    panel.imgui.push_text_wrap_pos(0.0)
    shown = "-" if fraction != fraction else f"{100 * fraction:.1f}%"
    panel._mono(
        f"block steps: active {shown} · levels "
        + " ".join(f"{lv}:{int(c):,}" for lv, c in enumerate(levels) if c)
    )
    panel.imgui.pop_text_wrap_pos()
    panel._rect("block")
    panel._tooltip(
        "the mean share of bodies walked per substep of the last max steps (1 = shared "
        "steps' cost), and how many bodies step dt / 2^level at each level now"
    )


def _devices_rows(panel) -> None:
    """Several devices (--gpus): one bar per device, its force time against the slowest one's (a
    balanced run has bars of one length), and the time the position exchange took."""
    devices, exchange_ms = panel.controller.live_devices()
    if not devices:
        return
    imgui = panel.imgui
    slowest = max(max(devices.values()), 1e-9)
    for name, ms in devices.items():
        imgui.progress_bar(ms / slowest, imgui.ImVec2(-1, 0), f"{name}  {ms:.2f} ms")
        panel._rect(f"device:{name.split()[0]}")
        panel._tooltip(
            "this device's own clock for its share of the force, ms per frame (median of "
            "the last frames); the shares follow each device's speed (re-balanced)"
        )
    panel._mono(f"exchange {exchange_ms:.3f} ms per frame ({len(devices)} devices)")
    panel._rect("exchange")
    panel._tooltip(
        "copying each device's new positions to every other device (peer copies, NCCL or "
        "host memory: --exchange), ms per frame"
    )


def _force_error_row(panel) -> None:
    """An approximate kernel's live force error (app/engine/force_error.py): median and 99th percentile of
    the relative error on a random sample, and the interactions per body."""
    probe = panel.controller.force_error
    if probe.note:
        panel._mono(probe.note, WARN_TEXT)
        panel._rect("force_error")
        return
    e = probe.latest
    if e is None:
        return
    ok = e.within_budget
    per_body = probe.interactions_per_body
    panel._mono(
        f"error: median {e.median:.1e}  p99 {e.p99:.1e}  ·  "
        + (f"{per_body:,.0f} inter./body" if per_body else "- inter./body"),
        OK_TEXT if ok else WARN_TEXT if ok is False else None,
    )
    panel._rect("force_error")
    budget = f"budget p99 <= {e.budget_p99:g}" if e.budget_p99 is not None else "no p99 budget"
    panel._tooltip(
        f"relative acceleration error |a - a_exact| / |a_exact| on {e.k:,} random bodies "
        f"against an all-pairs sum over all {e.n:,} (resampled every {probe.interval_s:g} s "
        f"while running; {e.ms:.1f} ms per sample); {budget}. Interactions per body: "
        "body-body plus body-cell of the last step, per force evaluation"
    )


def _breakdown_bar(panel, live: dict) -> None:
    """One horizontal bar: how the frame time splits between force, integrate, ..., Python."""
    imgui = panel.imgui
    total = max(live["frame_ms"], sum(live[f] for f, _, _ in BREAKDOWN), 1e-9)
    width = imgui.get_content_region_avail().x
    height = 14.0
    p = imgui.get_cursor_screen_pos()
    dl = imgui.get_window_draw_list()
    x = p.x
    dl.add_rect_filled(
        imgui.ImVec2(p.x, p.y),
        imgui.ImVec2(p.x + width, p.y + height),
        imgui.get_color_u32(imgui.ImVec4(0.15, 0.16, 0.19, 1.0)),
        3.0,
    )
    for f, _, col in BREAKDOWN:
        w = width * live[f] / total
        if w >= 0.5:
            dl.add_rect_filled(
                imgui.ImVec2(x, p.y),
                imgui.ImVec2(x + w, p.y + height),
                imgui.get_color_u32(imgui.ImVec4(*col)),
            )
        x += w
    imgui.dummy(imgui.ImVec2(width, height))
    panel._rect("breakdown")
    if imgui.is_item_hovered():
        imgui.set_tooltip(
            "\n".join(
                f"{label:>10}: {live[f]:7.2f} ms ({100 * live[f] / total:4.1f} %)"
                for f, label, _ in BREAKDOWN
            )
        )
    x0 = imgui.get_cursor_screen_pos().x
    right = x0 + width
    # Every part has its place in the legend, always: whether a part shows up in the median flickers
    # with timing noise (the drift read-back every few frames), and a legend that gained or lost a
    # line would move every widget below it - the tabs, the fields - under the user's pointer.
    # The parts this path has now are drawn in their colour, the others faded.
    for i, (f, label, col) in enumerate(BREAKDOWN):
        need = imgui.calc_text_size(label).x + 16
        if i:
            imgui.same_line()
            if imgui.get_cursor_screen_pos().x + need > right:
                imgui.new_line()
        has = live[f] > 0.005 or f in ("force_ms", "python_ms")
        q = imgui.get_cursor_screen_pos()
        size = imgui.get_text_line_height() * 0.6
        top = q.y + (imgui.get_text_line_height() - size) / 2
        dl.add_rect_filled(
            imgui.ImVec2(q.x, top),
            imgui.ImVec2(q.x + size, top + size),
            imgui.get_color_u32(imgui.ImVec4(*col[:3], 1.0 if has else 0.2)),
            2.0,
        )
        imgui.dummy(imgui.ImVec2(size + 2, imgui.get_text_line_height()))
        imgui.same_line(0, 2)
        imgui.text_colored(imgui.ImVec4(*(DIM_TEXT if has else FADED_TEXT)), label)
