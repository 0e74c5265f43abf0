"""What the live panel (app.ui.panel) and the replay panel (app.ui.replay) share as ImGui windows over the
viewer: the overlay and its Tab key, the part of the window they cover (`viewer.view_covers`, so the
scene is drawn in the free part), Escape closing an open popup or leaving a text field before it quits,
and the widget helpers whose records (`item_rects`: logical pixels, the coordinates of vispy's mouse
events) let tests click widgets with synthesised events.

    class MyPanel(OverlayPanel):
        def build(self):                       # one ImGui frame's widgets
            self._begin_window("Title###id", height)
            ...
            self._end_window()
"""

from __future__ import annotations

from app.ui.imgui_bridge import ImGuiBridge, detach_panel

PANEL_W = 440.0  # the panels' width (logical pixels)
MARGIN = 8.0  # from the window's top-left corner


class OverlayPanel:
    def __init__(self, viewer, controller, visible: bool = True):
        from imgui_bundle import imgui

        self.imgui = imgui
        self.viewer = viewer
        self.controller = controller
        self.bridge = ImGuiBridge(viewer)
        self.visible = visible
        self.bridge.enabled = visible
        self.item_rects: dict[str, tuple[float, float, float, float]] = {}
        self.cost_ms = 0.0
        viewer.overlays.append(self.draw)
        viewer.key_actions["Tab"] = self.toggle
        # While a popup is open (a combo, a colour picker) or a text field is being edited, the keys are
        # the UI's: Escape closes the popup (or leaves the field) instead of quitting, Space types.
        self.modal_input = False
        self._keys_are_ui = lambda: self.visible and self.modal_input
        viewer.capture_keyboard.append(self._keys_are_ui)
        # until the first frame says where the window is: its first-use place and width, full height
        self.window_rect = (MARGIN, MARGIN, MARGIN + PANEL_W, max(float(viewer.size[1]) - MARGIN, 208.0))
        viewer.view_covers.append(self.covered)
        if visible:
            viewer.reset_camera()  # fitted to the free part

    def draw(self, viewer) -> None:
        raise NotImplementedError

    # --- visibility ------------------------------------------------------------------------------
    def covered(self) -> tuple[float, float, float, float] | None:
        """The window rectangle the panel covers (logical pixels), None while hidden."""
        return self.window_rect if self.visible else None

    def toggle(self) -> None:
        self.set_visible(not self.visible)

    def set_visible(self, visible: bool) -> None:
        self.visible = bool(visible)
        self.bridge.enabled = self.visible

    def close(self) -> None:
        detach_panel(self.viewer, self.draw, self.toggle, self._keys_are_ui)
        if self.covered in self.viewer.view_covers:
            self.viewer.view_covers.remove(self.covered)
        self.bridge.close()
        self.controller.close()

    # --- the window ------------------------------------------------------------------------------
    def _begin_window(self, title: str, height: float) -> bool:
        """Start the frame's window (first use: top left, PANEL_W wide, `height` tall; 0 fits the content);
        True when it is expanded. `item_rects` start empty: they are this frame's layout."""
        imgui = self.imgui
        self.item_rects = {}
        if self.modal_input and imgui.is_key_pressed(imgui.Key.escape, False):
            # Dear ImGui closes popups on Escape only with keyboard navigation on (which would also take
            # the arrow keys): close them here. A text field handles its own Escape.
            imgui.internal.close_popups_except_modals()
        imgui.set_next_window_pos(imgui.ImVec2(MARGIN, MARGIN), imgui.Cond_.first_use_ever)
        imgui.set_next_window_size(imgui.ImVec2(PANEL_W, height), imgui.Cond_.first_use_ever)
        expanded, _ = imgui.begin(title, None, imgui.WindowFlags_.no_collapse)
        return expanded

    def _end_window(self) -> None:
        """End the window, recording where it is (`item_rects["window"]`, what it covers) and whether the
        keys belong to the UI next frame."""
        imgui = self.imgui
        pos, size = imgui.get_window_pos(), imgui.get_window_size()
        self.item_rects["window"] = self.window_rect = (pos.x, pos.y, pos.x + size.x, pos.y + size.y)
        imgui.end()
        any_popup = imgui.PopupFlags_.any_popup_id | imgui.PopupFlags_.any_popup_level
        self.modal_input = imgui.is_popup_open("", any_popup) or imgui.get_io().want_text_input

    # --- widget helpers --------------------------------------------------------------------------
    def _rect(self, name: str) -> None:
        """Record where the last widget was drawn, under `name`."""
        a, b = self.imgui.get_item_rect_min(), self.imgui.get_item_rect_max()
        self.item_rects[name] = (a.x, a.y, b.x, b.y)

    def _tooltip(self, text: str, disabled: bool = False) -> None:
        imgui = self.imgui
        flags = imgui.HoveredFlags_.allow_when_disabled if disabled else imgui.HoveredFlags_.for_tooltip
        if text and imgui.is_item_hovered(flags):
            imgui.set_tooltip(text)

    def _header(self, label: str) -> bool:
        self.imgui.separator_text(label)
        return True
