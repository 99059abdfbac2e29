"""Symbolic sizes, by phase: at planning (planning.py, reduce.py: the planner-core layer, on the
kernel IR only) and at capture (capture.py, exact.py: the Inductor-facing layer, which may import
everything below it). The package itself has no layer (docs/compiler_layers.md)."""
