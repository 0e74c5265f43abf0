"""The View tab's draw style: sprites or splat (render.style), what the last frame was drawn with and why,
and the splat's tone map, exposure, bloom and the body count auto switches at (app/render/splat_style.py)."""

from __future__ import annotations

SLIDER_EXPOSURE = (0.05, 1000.0)  # the manual exposure slider's range (render.exposure takes more)


def draw(panel) -> None:
    from app.model.config import DRAW_STYLES, TONE_MAPS

    imgui = panel.imgui
    ctl = panel.controller
    viewer = panel.viewer
    r = viewer.scene.render
    panel._header("Draw style")
    panel._choice("style", "render.style", DRAW_STYLES)
    panel._tooltip(
        "sprites: GL point sprites; splat: each body's light added into an integer frame on the GPU and "
        "tone-mapped (no burn-out at large N, byte-identical recordings); auto: splat from the body count "
        "below where a GPU fills the GL buffers"
    )
    splat = viewer.splat
    if viewer.stats.style == "splat":
        where = "CUDA" if viewer.backend.gl_buffers is not None else "the CPU twin"
        panel._mono(f"drawn: splat on {where}, {splat.last_ms:.2f} ms")
    else:
        panel._mono("drawn: sprites")
        if splat.why:
            panel._tooltip(splat.why)
    panel._field("splat from N", "render.splat_from", None if r.style == "auto" else "for render.style auto")
    panel._choice("tone map", "render.tone_map", TONE_MAPS)
    auto = float(r.exposure) <= 0.0
    changed, auto_now = imgui.checkbox("auto exposure", auto)
    panel._rect("render.exposure.auto")
    panel._tooltip("the lit pixels' light-weighted median at 86% of white, every frame")
    if changed:
        # from automatic to manual at the exposure automatic was giving: the picture does not jump
        ctl.set_value("render.exposure", 0.0 if auto_now else max(splat.manual_equivalent or 1.0, 1e-6))
    if not auto:
        imgui.set_next_item_width(150.0)
        lo, hi = SLIDER_EXPOSURE
        value = min(max(float(r.exposure), lo), hi)
        moved, v = imgui.slider_float("exposure", value, lo, hi, "%.3g", imgui.SliderFlags_.logarithmic)
        panel._rect("render.exposure")
        if moved:
            ctl.set_value("render.exposure", v)
    panel._field("bloom", "render.bloom")
    glow = None if float(r.bloom) > 0 else "render.bloom is 0: no glow"
    panel._field("bloom above x", "render.bloom_threshold", glow)
    panel._field("bloom radius px", "render.bloom_radius", glow)
