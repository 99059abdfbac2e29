"""The experts family: a grouped matmul (mixture-of-experts routing) whose row ranges are data,
read on chip. A family imports the planner core, the kernel IR, symbolic sizes at planning;
never another family's modules, backend.py or Inductor's glue."""
