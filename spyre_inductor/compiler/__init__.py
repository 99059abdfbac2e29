"""The Inductor backend for spyre: FX graph -> kernel IR -> planned, verified dataflow programs."""
