"""The ImGui control panel over the viewer (imgui-bundle; implot for the plots).

    from app.ui import Panel
    panel = Panel(viewer, frame_log=log)     # draws over the viewer each frame; Tab hides it

Modules: `imgui_bridge` (ImGui context, renderer, vispy events -> ImGui), `overlay_panel` (what the live
and the replay panel share: the overlay, Tab, the area they cover, Escape, widget records), `actions`
(what their controllers share: messages, scene keys set live as `--set` would), `controller` (the
actions: kernels, tunables, parameters, N, reset, benchmark, recording; no ImGui), `panel` (the widgets),
`components_panel` (the component list both panels show), `replay` (the replay's panel and controller),
`benchmark` (the "Benchmark all kernels" runs), `energy` (drift monitor). Live recording itself is
app.render.live_recording; the timing rings the plots read are app.engine.timing's.
"""

from app.ui.controller import Controller
from app.ui.panel import Panel

__all__ = ["Controller", "Panel"]
