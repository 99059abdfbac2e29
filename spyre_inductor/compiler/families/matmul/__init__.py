"""The matmul family: a dot on the PE arrays with its prologue and epilogue (what it declines is
planned by the reduction family). A family imports the planner core, the kernel IR, symbolic
sizes at planning; never another family's modules (what two share lives in the core), backend.py or
Inductor's glue."""
