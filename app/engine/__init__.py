"""The engine: the integrator and its Stepper, block time steps, the force seam and its records, the refit
cadence, the live force error, energies and the clocks. (docs/architecture.md, "Layers")."""
