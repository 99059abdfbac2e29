"""The attention family: spyre::attention as one flash-style program, with its own symbolic sizes
(a placeholder per head: sizes.py). A family imports the planner core, the kernel IR, symbolic
sizes at planning and other families; never backend.py or Inductor's glue."""
