"""The bottom layer: errors, paths, output files, the backends' table and the CUDA setup step.
(docs/architecture.md, "Layers")."""
