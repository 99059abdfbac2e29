"""What a launch costs on the host, and what the device does while the host launches.

Tables, all measured in one run (the machines are shared and noisy: compare
rows of one run, not runs):

* host time per call: `launch_jobplan` of a prepared 4-argument kernel
  (`a * b + c`, 64 x 64 fp32), the device idle before each launch; the same
  with the artifact prepared again on every call (set_prepare_each_launch:
  read, decode, validate, allocate, transfer the image: the way a runtime
  that builds its launch graph per call works); CPU eager `torch.add` on
  64 x 64; Inductor's CPU backend's compiled call of `a + b`; and the spyre
  compiled `a + b` from call to `torch.spyre.synchronize()` returning;
* a launch-bound loop: 200 launches of a small kernel without a synchronize,
  with the patch on the compute stream (one stream) and on a preparation
  stream (two): simulated compute-pipeline idle fraction between the first
  launch's start and the last one's end;
* the Llama-style decoder (2 layers, fp16) at decode (1 token, cache 1024):
  prepared plans against preparing every launch, in simulated device time
  per step and host time per step (call to synchronize).

Targets (issue 18): launch_jobplan <= 25 us and <= 1/20 of prepare + launch;
compiled add call-to-synchronize <= 150 us; idle fraction with two streams
< 10%; the decoder at decode <= 10x CPU eager per forward.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings

import torch

from _bench import print_table

warnings.filterwarnings("ignore", message=".*has no spyre kernel yet")
warnings.filterwarnings("ignore", message="dynamo_pgo force disabled")


def _median_us(samples_ns) -> float:
    return statistics.median(samples_ns) / 1e3


def _timed(fn, repeats: int, before=None) -> float:
    """Median host us of `fn()`, with `before()` (untimed) ahead of each call."""
    samples = []
    for _ in range(repeats):
        if before is not None:
            before()
        start = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - start)
    return _median_us(samples)


def _fma_plan():
    """A prepared 4-argument pointwise kernel: out = a * b + c, 64 x 64 fp32."""
    from spyre_inductor.compiler.backend import compile_kernel
    from spyre_inductor.compiler.ir.kernel_ir import Buffer, Index, Load, Op, PointwiseKernel, Store
    from spyre_runtime.prepare import prepare_kernel

    shape, strides = (64, 64), (64, 1)
    buffers = tuple(Buffer(n, "fp32", shape, strides, 0) for n in ("a", "b", "c", "out"))
    values = (Load("a", Index(strides, 0), "fp32"), Load("b", Index(strides, 0), "fp32"),
              Load("c", Index(strides, 0), "fp32"), Op("mul", (0, 1), "fp32"), Op("add", (3, 2), "fp32"))
    kernel = PointwiseKernel("fma", shape, buffers, values, (Store("out", Index(strides, 0), 4),))
    return prepare_kernel(compile_kernel(kernel, tempfile.mkdtemp(prefix="spyre-bench-")))


def host_table(repeats: int) -> dict:
    from spyre_runtime import launch
    from spyre_runtime.launch import launch_jobplan

    plan = _fma_plan()
    args = [torch.randn(64, 64).to("spyre") for _ in range(3)] + [torch.empty(64, 64, device="spyre")]
    sync = torch.spyre.synchronize
    for _ in range(50):
        launch_jobplan(plan, args)
        sync()
    lean = _timed(lambda: launch_jobplan(plan, args), repeats, before=sync)
    back_to_back = []
    for _ in range(5):  # as a model's forward launches: one after another, the device working meanwhile
        start = time.perf_counter_ns()
        for _ in range(200):
            launch_jobplan(plan, args)
        back_to_back.append((time.perf_counter_ns() - start) / 200)
        sync()
    back_to_back = statistics.median(back_to_back) / 1e3
    launch.set_prepare_each_launch(True)
    try:
        launch_jobplan(plan, args)
        prepared_each = _timed(lambda: launch_jobplan(plan, args), max(50, repeats // 10), before=sync)
    finally:
        launch.set_prepare_each_launch(False)
    sync()

    a, b = torch.randn(64, 64), torch.randn(64, 64)
    eager = _timed(lambda: torch.add(a, b), repeats)
    cpu_compiled = torch.compile(lambda x, y: x + y, dynamic=False)
    cpu_compiled(a, b)
    inductor_cpu = _timed(lambda: cpu_compiled(a, b), repeats)
    sa, sb = a.to("spyre"), b.to("spyre")
    spyre_compiled = torch.compile(lambda x, y: x + y, dynamic=False)
    spyre_compiled(sa, sb)
    sync()

    def call_and_sync():
        spyre_compiled(sa, sb)
        sync()

    for _ in range(50):
        call_and_sync()
    call_to_sync = _timed(call_and_sync, repeats)
    report = torch.spyre.kernel_reports()[-1]
    print_table(
        "host time per call (median), 64 x 64 fp32",
        ["what", "us", "target"],
        [
            ["launch_jobplan, 4 arguments (prepared once), device idle", lean, "<= 25"],
            ["  the same, 200 launches back to back (per launch)", back_to_back, ""],
            ["prepare_kernel + launch_jobplan on every call", prepared_each, ""],
            ["  ratio launch / prepare + launch", lean / prepared_each, "<= 0.05"],
            ["CPU eager torch.add", eager, ""],
            ["Inductor CPU, compiled a + b", inductor_cpu, ""],
            ["spyre, compiled a + b, call to synchronize", call_to_sync, "<= 150"],
            [f"  (its simulated device time: {report.simulated_ns / 1e3:.2f} us)", "", ""],
        ],
    )
    return {"launch_us": lean, "back_to_back_us": back_to_back, "prepare_each_us": prepared_each,
            "call_to_sync_us": call_to_sync}


def _timing_event() -> torch.Event:
    return torch.Event(device="spyre", enable_timing=True)


def _idle_fraction(plan, arg_sets, launches: int) -> tuple[float, float]:
    """(compute idle fraction, simulated us) of `launches` back-to-back launches of `plan`, the
    k-th on arg_sets[k % len(arg_sets)]."""
    from spyre_runtime.launch import launch_jobplan
    from spyre_runtime.queue.runtime import current

    queue = current().queue(0)
    torch.spyre.synchronize()
    start, end = _timing_event(), _timing_event()
    busy0 = queue.sim_busy_ns()["compute"]
    start.record()
    for k in range(launches):
        launch_jobplan(plan, arg_sets[k % len(arg_sets)])
    end.record()
    torch.spyre.synchronize()
    span_ns = start.elapsed_time(end) * 1e6
    busy = queue.sim_busy_ns()["compute"] - busy0
    return max(0.0, 1.0 - busy / span_ns), span_ns / 1e3  # (round-off: never below 0)


def idle_table(launches: int = 200) -> dict:
    from spyre_inductor.compiler.backend import compile_kernel
    from spyre_inductor.compiler.ir.kernel_ir import Buffer, Index, Load, Op, PointwiseKernel, Store
    from spyre_runtime import launch
    from spyre_runtime.prepare import prepare_kernel

    rows, out = [], {}
    for shape in ((64, 64), (64, 1024), (256, 1024)):
        strides = (shape[1], 1)
        buffers = tuple(Buffer(n, "fp16", shape, strides, 0) for n in ("a", "b", "out"))
        values = (Load("a", Index(strides, 0), "fp16"), Load("b", Index(strides, 0), "fp16"),
                  Op("add", (0, 1), "fp32"))
        kernel = PointwiseKernel("add", shape, buffers, values, (Store("out", Index(strides, 0), 2),))
        plan = prepare_kernel(compile_kernel(kernel, tempfile.mkdtemp(prefix="spyre-bench-")))
        inputs = [torch.randn(shape, dtype=torch.float16).to("spyre") for _ in range(2)]
        outputs = [torch.empty(shape, dtype=torch.float16, device="spyre") for _ in range(3)]
        # A fresh output per launch (three, rotated: never the words its area holds) patches every
        # launch; the same buffers every time patch each area once, then launch computes alone.
        bindings = (("new output each", [inputs + [o] for o in outputs]), ("same each", [inputs + outputs[:1]]))
        before = launch.preparation_streams()
        try:
            for buffers, arg_sets in bindings:
                for streams, label in ((0, "one stream"), (1, "two streams")):
                    launch.set_preparation_streams(streams)
                    _idle_fraction(plan, arg_sets, 20)
                    idle, span = _idle_fraction(plan, arg_sets, launches)
                    per_kernel = torch.spyre.kernel_reports()[-1].simulated_ns / 1e3
                    rows.append([f"{shape[0]} x {shape[1]} fp16 add ({per_kernel:.2f} us each)", buffers, label,
                                 span, idle])
                    out[(shape, buffers, streams)] = idle
        finally:
            launch.set_preparation_streams(before)
    print_table(f"{launches} launches back to back, no synchronize: simulated compute-pipeline idle",
                ["kernel", "buffers", "patch on", "simulated us", "idle fraction"], rows)
    return out


def decode_table(steps: int) -> dict:
    from spyre_inductor.testing import models
    from spyre_runtime import launch

    dtype = torch.float16
    model = models.build(models.llama_config(n_layers=2), dtype=dtype)
    ids, pos, k, v = models.llama_inputs(model, seq=1, cache_len=1024)
    # The CPU reference runs in fp32: torch's fp16 matmul on the CPU is tens of times slower
    # than its fp32 one (TORCH_NOTES), which would flatter us.
    reference = models.fp32_copy(model)
    ref_args = (ids, pos, [t.float() for t in k], [t.float() for t in v])
    with torch.no_grad():
        reference(*ref_args)
        eager = _timed(lambda: reference(*ref_args), steps)
        spyre_model = models.build(models.llama_config(n_layers=2), dtype=dtype).to("spyre")
        args = (ids.to("spyre"), pos.to("spyre"), [t.to("spyre") for t in k], [t.to("spyre") for t in v])
        compiled = torch.compile(spyre_model, dynamic=False)
        compiled(*args)
        torch.spyre.synchronize()
        rows, out = [], {}
        for each, label in ((False, "prepared once"), (True, "prepared every launch")):
            launch.set_prepare_each_launch(each)
            try:
                compiled(*args)
                torch.spyre.synchronize()
                start, end = _timing_event(), _timing_event()
                samples = []
                start.record()
                for _ in range(steps):
                    t0 = time.perf_counter_ns()
                    compiled(*args)
                    torch.spyre.synchronize()
                    samples.append(time.perf_counter_ns() - t0)
                end.record()
                torch.spyre.synchronize()
            finally:
                launch.set_prepare_each_launch(False)
            host = _median_us(samples)
            device = start.elapsed_time(end) * 1e3 / steps
            out[each] = (host, device)
            rows.append([label, host / 1e3, device, host / eager])
    rows.append(["CPU eager (the same model in fp32)", eager / 1e3, "", 1.0])
    (h0, d0), (h1, d1) = out[False], out[True]
    rows.append(["per-launch preparation / prepared", h1 / h0, d1 / d0, ""])
    print_table("Llama-style decoder, 2 layers fp16, decode 1 token (cache 1024), per step",
                ["launch", "host ms (call to sync)", "simulated device us", "x CPU eager"], rows)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=400)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--skip-decode", action="store_true")
    opts = parser.parse_args()
    import spyre_inductor  # noqa: F401  (the device)

    host_table(opts.repeats)
    idle_table()
    if not opts.skip_decode:
        decode_table(opts.steps)


if __name__ == "__main__":
    main()
