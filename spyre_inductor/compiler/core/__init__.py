"""The planner core: the skeleton every kernel family shares (tile kernel, allocation, tiling,
division, the candidate search, keep/verify, minimum traffic, Plans, codegen, emission) and the
family interface and registry (family.py). It may import the kernel IR, symbolic sizes at
planning and spyre_runtime's program format, never a family (docs/adding_a_kernel_family.md)."""
