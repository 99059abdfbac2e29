"""The Inductor-facing glue: registration, lowerings, scheduling and capture into the kernel IR,
the wrapper, the device interface, the attention graph pass, CPU fallback kernels and the hooks
the run-time launcher is handed (buckets.py). The top layer: it may import every layer below
(backend.py, the families, the core, symbolic sizes, the kernel IR, the launcher)."""
