"""Benchmarks over any backend and their plots. (docs/architecture.md, "Layers")."""
