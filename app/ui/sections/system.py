"""The System tab: backend, data path, GL, the device and the panel's own cost."""

from __future__ import annotations

from app.ui.style import PRESET_KEYS_HELP


def draw(panel) -> None:
    imgui = panel.imgui
    ctl = panel.controller
    b = ctl.backend
    rows = [
        ("backend", b.name),
        ("data path", b.data_path),
        ("GL", panel.gl["renderer"]),
        ("GL version", panel.gl["version"]),
        ("window", panel.bridge.backend),
    ]
    try:
        d = b.device_info()
    except Exception:  # noqa: BLE001 - a name is a nicety
        d = None
    if d is not None:
        rows.append(("device", str(d.get("name", d))))
    br = panel.bridge
    gpu = f"{br.gpu_ms:.3f} ms GPU" if br.gpu_timed else "GPU: no timer queries"
    rows.append(("panel cost", f"{panel.cost_ms:.2f} ms CPU · {gpu}"))
    rows.append(
        (
            "UI rebuild",
            f"{br.build_ms:.2f} ms + {br.render_ms:.2f} ms upload/draw; replay {br.replay_ms:.2f} ms",
        )
    )
    for k, v in rows:
        imgui.text_disabled(f"{k:>11}")
        imgui.same_line()
        imgui.text(v)
    imgui.set_next_item_width(150.0)
    changed, hz = imgui.slider_float("UI refresh", float(br.refresh_hz), 0.0, 120.0, "%.0f Hz")
    if changed:
        br.refresh_hz = hz
    panel._tooltip(
        "how often the widgets are rebuilt without input (0: every frame); other frames "
        "redraw the last draw lists. Input always rebuilds at once."
    )
    if imgui.button("Screenshot"):
        panel.request_screenshot()
    panel._rect("screenshot")
    imgui.same_line()
    _, panel.screenshot_with_panel = imgui.checkbox("with panel", panel.screenshot_with_panel)
    if panel.last_screenshot is not None:
        imgui.text_disabled(str(panel.last_screenshot))
    imgui.separator()
    imgui.text_disabled(PRESET_KEYS_HELP)
