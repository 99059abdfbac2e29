"""The gather/scatter family: loads and stores at indices read from memory, lowered onto the
pointwise tile kernel. A family imports the planner core, the kernel IR, symbolic sizes at
planning and other families; never backend.py or Inductor's glue."""
