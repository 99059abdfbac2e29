"""The gather/scatter family: loads and stores at indices read from memory, lowered onto the
pointwise tile kernel. A family imports the planner core, the kernel IR, symbolic sizes at
planning; never another family's modules (what two share lives in the core), backend.py or
Inductor's glue."""
