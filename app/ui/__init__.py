"""The ImGui control panel over the viewer (imgui-bundle; implot for the plots).

    from app.ui import Panel
    panel = Panel(viewer, frame_log=log)     # draws over the viewer each frame; Tab hides it

Modules: `imgui_bridge` (ImGui context, renderer, vispy events -> ImGui), `controller` (the actions:
kernels, parameters, N, reset, benchmark; no ImGui), `panel` (the widgets), `energy` (drift monitor).
"""

from app.ui.controller import Controller
from app.ui.panel import Panel

__all__ = ["Controller", "Panel"]
