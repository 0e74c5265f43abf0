"""Several devices: the multi-device driver (shares, drivers, exchanges) and the decompositions.
(docs/architecture.md, "Layers")."""
