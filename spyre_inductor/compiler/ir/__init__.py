"""The kernel IR: what capture hands the planner (kernel_ir.py), its errors, index arithmetic,
scalar conversion and kernel naming. The bottom layer: it imports nothing of the compiler or the
launcher (docs/compiler_layers.md; tests/test_layers.py)."""
