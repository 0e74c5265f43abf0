"""The Medians tab: each kernel's median frame, force and rates over the frames it ran."""

from __future__ import annotations

from app.engine.timing import FLOPS_PER_INTERACTION
from app.ui.controller import MEDIAN_EVERY_S
from app.ui.style import fmt_rate


def draw(panel) -> None:
    imgui = panel.imgui
    ctl = panel.controller
    panel._header("Per-kernel medians since start")
    ctl.update_medians(MEDIAN_EVERY_S)
    if not ctl.medians:
        imgui.text_disabled("(no frames yet)")
        return
    T = imgui.TableFlags_
    flags = T.row_bg | T.borders_inner_h | T.sizing_fixed_fit
    if imgui.begin_table("medians", 7, flags):
        for h in ("kernel", "N", "frames", "frame ms", "force ms", "inter./s", "GFLOP/s"):
            imgui.table_setup_column(h)
        imgui.table_headers_row()
        cur = (ctl.backend.kernel, ctl.backend.n)
        for key, m in ctl.medians.items():
            if not m:
                continue
            imgui.table_next_row()
            if key == cur:
                imgui.table_set_bg_color(
                    imgui.TableBgTarget_.row_bg1, imgui.get_color_u32(imgui.ImVec4(0.35, 0.22, 0.08, 0.6))
                )
            for v in (
                key[0],
                f"{key[1]:,}",
                f"{m['frames']}",
                f"{m['frame_ms']:.2f}",
                f"{m['force_ms']:.2f}",
                fmt_rate(m["interactions_per_s"]),
                f"{m['interactions_per_s'] * FLOPS_PER_INTERACTION * 1e-9:,.1f}",
            ):
                imgui.table_next_column()
                imgui.text(v)
        imgui.end_table()
    imgui.text_disabled("GFLOP/s = interactions/s x 20 flops/interaction · bench frames excluded")
