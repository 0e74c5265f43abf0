"""The panels' component list (app.model.components), in the live panel's View tab and in the replay panel:
per component a colour swatch (click: a colour picker), a show/hide checkbox with its name and a
brightness slider, then its body count. Every change goes through the panel controller's
`set_value("render.components.NAME.FIELD", value)` (app.ui.actions), the `--set` path, so the scene
keys, `record` and the panel agree. Widgets are recorded in `panel.item_rects` as
`component:NAME:color`, `component:NAME:visible` and `component:NAME:brightness`.
"""

from __future__ import annotations

BRIGHTNESS_RANGE = (0.02, 10.0)  # the slider's ends (the key accepts 0 to 100)


def components_section(panel) -> None:
    imgui = panel.imgui
    ctl = panel.controller
    renderer = panel.viewer.renderer
    panel._header("Components")
    if renderer.components is None:
        imgui.text_disabled(
            "the bodies form one component (no parts named by the file, the generator or "
            "the scene's [[components]])"
        )
        return
    swatch = imgui.ColorEditFlags_.no_inputs | imgui.ColorEditFlags_.no_label
    for d in renderer.drawn:
        key = f"render.components.{d.name}"
        changed, color = imgui.color_edit3(f"##color:{d.name}", list(d.color), swatch)
        panel._rect(f"component:{d.name}:color")
        panel._tooltip(f"{key}.color: the colour of colour by = component (or shaded by speed / mass)")
        if changed:
            ctl.set_value(f"{key}.color", tuple(min(max(float(c), 0.0), 1.0) for c in color))
        imgui.same_line()
        changed, visible = imgui.checkbox(f"{d.name}##visible:{d.name}", d.visible)
        panel._rect(f"component:{d.name}:visible")
        panel._tooltip(f"{key}.visible: hidden bodies are not drawn; they still feel and exert gravity")
        if changed:
            ctl.set_value(f"{key}.visible", bool(visible))
        imgui.same_line(210.0)
        imgui.set_next_item_width(130.0)
        lo, hi = BRIGHTNESS_RANGE
        changed, v = imgui.slider_float(
            f"##brightness:{d.name}", float(d.brightness), lo, hi, "%.2f", imgui.SliderFlags_.logarithmic
        )
        panel._rect(f"component:{d.name}:brightness")
        panel._tooltip(f"{key}.brightness: multiplies render.brightness for these bodies")
        if changed:
            ctl.set_value(f"{key}.brightness", float(f"{min(max(v, lo), hi):.4g}"))  # (no float32 noise)
        imgui.same_line()
        imgui.text_disabled(f"{d.count:,}")
