"""The attention family: spyre::attention as one flash-style program, with its own symbolic sizes
(a placeholder per head: sizes.py). A family imports the planner core, the kernel IR, symbolic
sizes at planning; never another family's modules (what two share lives in the core), backend.py or
Inductor's glue."""
