"""The pointwise family (last in dispatch order: it claims whatever is left), and pieces.py, which
cuts a kernel at its index masks. A family imports the planner core, the kernel IR, symbolic
sizes at planning and other families; never backend.py or Inductor's glue."""
