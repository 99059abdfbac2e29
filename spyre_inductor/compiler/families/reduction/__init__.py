"""The reduction and scan family: resident, chunked and ring plans, Welford and arg-reductions.
A family imports the planner core, the kernel IR, symbolic sizes at
planning; never another family's modules (what two share lives in the core), backend.py or Inductor's
glue."""
