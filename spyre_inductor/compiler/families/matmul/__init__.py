"""The matmul family: a dot on the PE arrays with its prologue and epilogue (what it declines is
planned by the reduction family). A family imports the planner core, the kernel IR, symbolic
sizes at planning and other families; never backend.py or Inductor's glue."""
