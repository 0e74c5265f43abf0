"""A panel tab from outside the package, to follow docs/architecture.md's "a panel control" row once: a
module with `draw(panel)` and one entry in `TABS` (tests/test_panel.py adds it). Its control sets a scene
key through the Controller, validated as `--set` would be."""

from __future__ import annotations

NAME = "Toy"
BRIGHTER = 2.5  # what its button sets render.brightness to


def draw(panel) -> None:
    if panel.imgui.button("brighter"):
        panel.controller.set_value("render.brightness", BRIGHTER)
    panel._rect("toy:brighter")
