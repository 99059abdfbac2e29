"""Program authoring: dataflow programs written by hand, for tests and benchmarks.

``handwritten`` holds the reference programs for the program format
(vector add, row softmax, tiled matmul, ring sum, cast round trip);
``calibration`` the programs of the measured calibration kernels that the
timing model is calibrated against. They build programs with the shared
emitter (spyre_runtime.program.emitter) and run through the launch layer
(spyre_runtime.direct.run_program) like any other program. Nothing in
spyre_runtime or spyre_inductor imports them: they are users of the
simulator, not part of it.
"""
