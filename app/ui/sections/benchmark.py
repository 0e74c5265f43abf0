"""The Benchmark tab: every available kernel timed on a copy of the current state."""

from __future__ import annotations

import numpy as np

from app.ui.style import ACCENT, RED_TEXT


def draw(panel) -> None:
    imgui, implot = panel.imgui, panel.implot
    ctl = panel.controller
    panel._header("Every available kernel on a copy of the current state")
    bench = ctl.bench
    running = bench is not None and bench.running
    imgui.set_next_item_width(80.0)
    changed, steps = imgui.input_int("steps", ctl.bench_steps, 1, 10)
    if changed:
        ctl.bench_steps = min(max(int(steps), 1), 10_000)
    imgui.same_line()
    if running:
        imgui.begin_disabled()
    if imgui.button("Benchmark all kernels"):
        ctl.start_benchmark()
    panel._rect("bench")
    if running:
        imgui.end_disabled()
    panel._tooltip(
        "each available kernel: a fresh backend loaded with a copy of the current state, "
        "1 warm-up step, then the fixed number of steps; interactions/s from the kernel's "
        "own timer"
    )
    if bench is None:
        return
    imgui.progress_bar(
        bench.progress,
        imgui.ImVec2(-1, 0),
        f"{len(bench.results)}/{bench.total} at N = {bench.n:,}, {bench.steps} steps",
    )
    done = [r for r in bench.results if not r.error]
    for r in bench.results:
        if r.error:
            imgui.text_colored(imgui.ImVec4(*RED_TEXT), f"{r.kernel}: {r.error}")
    if not done:
        return
    labels = [r.kernel for r in done]
    vals = np.array([r.interactions_per_s / 1e9 for r in done])
    pos = np.arange(len(done), dtype=np.float64)[::-1].copy()  # the first kernel on top
    height = 70 + 28 * len(done)
    if implot.begin_plot("##bench", imgui.ImVec2(-1, height), implot.Flags_.no_legend):
        implot.setup_axes("G interactions/s", "", implot.AxisFlags_.auto_fit, implot.AxisFlags_.auto_fit)
        implot.setup_axis_ticks(implot.ImAxis_.y1, pos.tolist(), labels)
        spec = implot.Spec()
        spec.flags = implot.BarsFlags_.horizontal
        spec.fill_color = imgui.ImVec4(*ACCENT)
        implot.plot_bars("interactions/s", vals, pos, 0.6, spec)  # horizontal: (lengths, positions)
        for p, v in zip(pos, vals, strict=True):
            implot.plot_text(f"{v:.2f}", float(v), float(p), imgui.ImVec2(24, 0))
        implot.end_plot()
    panel._rect("bench_plot")
    for r in done:  # a kernel that evaluates fewer pairs than N² (a tree): its all-pairs equivalent too
        if not np.isclose(r.pair_equivalent_per_s, r.interactions_per_s):
            eq = r.pair_equivalent_per_s / 1e9
            imgui.text_disabled(f"{r.kernel}: equivalent all-pairs {eq:.2f} G/s")
