"""The pointwise family (last in dispatch order: it claims whatever is left), and pieces.py, which
cuts a kernel at its index masks. A family imports the planner core, the kernel IR, symbolic
sizes at planning; never another family's modules (what two share lives in the core), backend.py or
Inductor's glue."""
