"""The panel's sections, one module each: the kernel and live sections above the tabs (kernel.draw,
live.draw), and the tabs, listed once here: (tab name, its draw(panel)) in the order they show."""

from __future__ import annotations

from app.ui.sections import benchmark, compare, medians, plots, simulation, system, view

TABS = (
    ("Plots", plots.draw),
    ("Medians", medians.draw),
    ("Simulation", simulation.draw),
    ("Benchmark", benchmark.draw),
    ("Compare", compare.draw),
    ("View", view.draw),
    ("System", system.draw),
)
