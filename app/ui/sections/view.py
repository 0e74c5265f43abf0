"""The View tab: components, sprites and colours, the draw style, the camera."""

from __future__ import annotations

from app.ui.components_panel import components_section
from app.ui.sections import draw_style


def draw(panel) -> None:
    from app.model.config import COLOR_BY, COLORMAPS

    imgui = panel.imgui
    ctl = panel.controller
    r = panel.viewer.scene.render
    components_section(panel)  # first: the list a real model's user comes here for
    panel._header("Sprites and colours")
    splat = panel.viewer.stats.style == "splat"  # a footprint of one pixel: the sprite sizes do not apply
    if splat:
        imgui.begin_disabled()
    imgui.set_next_item_width(150.0)
    changed, v = imgui.slider_float("point size", float(r.point_size), 0.5, 16.0, "%.1f px")
    if changed:
        ctl.set_value("render.point_size", v)
    changed, v = imgui.checkbox("size by mass", bool(r.size_by_mass))
    if changed:
        ctl.set_value("render.size_by_mass", v)
    if splat:
        imgui.end_disabled()
        panel._tooltip("sprites only: a splat frame gives each body a footprint of one pixel", disabled=True)
    imgui.set_next_item_width(150.0)
    changed, v = imgui.slider_float(
        "brightness", float(r.brightness), 0.05, 10.0, "%.2f", imgui.SliderFlags_.logarithmic
    )
    if changed:
        ctl.set_value("render.brightness", v)
    panel._choice("colour by", "render.color_by", COLOR_BY)
    panel._choice("colormap", "render.colormap", COLORMAPS)
    draw_style.draw(panel)
    if imgui.button("Fit (F)"):
        panel.viewer.fit()
    panel._tooltip("F: the drawn bodies fitted into the part of the window the panel leaves free")
    imgui.same_line()
    if imgui.button("Camera (C)"):
        panel.viewer.reset_camera()
