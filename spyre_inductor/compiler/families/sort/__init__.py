"""The sort family (issue 31): sort, argsort and topk rows as a bitonic network on chip (the
``cmpx`` instruction over tiles of rows, values and indices together). A family imports the planner
core, the kernel IR, symbolic sizes at planning; never another family's modules, backend.py or
Inductor's glue."""
