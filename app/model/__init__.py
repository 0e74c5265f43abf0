"""The model: bodies, their components, initial conditions, snapshot formats and series, the physics
(parameters and the float64 reference) and the settings table. (docs/architecture.md, "Layers")."""
