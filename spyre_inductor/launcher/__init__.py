"""What generated code calls at run time: the bucketed launcher, CPU fallback kernels' helpers,
the fallback policy, nesting and letting go of loaded graphs. Of the compiler it imports only the
kernel IR (compiler/ir); it sits on spyre_runtime's launch layer and the device package, and is
handed the compiler's hooks by generated code (compiler/inductor/buckets.py)."""
