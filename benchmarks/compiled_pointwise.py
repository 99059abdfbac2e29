"""Compiled pointwise kernels on spyre: `.venv/bin/python benchmarks/compiled_pointwise.py`.

1. A 5-op chain on (4096, 4096) fp16: the compiled program's simulated time
   against its roofline, the bytes it moved against the minimum (each input
   read once, the output written once), core utilization, and the compile
   time next to Inductor's CPU backend compiling the same function (both
   cold: dynamo reset, FX graph cache off). Targets: >= 85% of the bandwidth
   roofline, <= 1.1x the minimum bytes.
2. The compiled versions of the pointwise calibration kernels of
   SPYRE_MEASUREMENTS.md next to their measured device time: ours should be
   at or below it.
"""

from __future__ import annotations

import warnings

import torch

from _bench import TRAFFIC_HEADER, print_table, traffic_columns
from _compiled import compile_seconds, nbytes, reports_of_one_call

warnings.filterwarnings("ignore", message=".*has no spyre kernel yet")


def chain(x, y):
    return torch.relu(torch.sigmoid(x * y + 1.0) - 0.5) * 2.0


# (4096, 4096) is the shape; the others do not fill whole sticks (4101 and 4099 fp16
# elements per row are not multiples of 64).
CHAIN_SHAPES = [(4096, 4096), (4093, 4101), (1000, 4099)]


def chain_table() -> None:
    rows = []
    for shape in CHAIN_SHAPES:
        g = torch.Generator().manual_seed(0)
        x, y = (torch.randn(shape, generator=g).half() for _ in range(2))
        cpu_s, _ = compile_seconds(chain, x, y)
        xs, ys = x.to("spyre"), y.to("spyre")
        spyre_s, compiled = compile_seconds(chain, xs, ys)
        out, reports = reports_of_one_call(compiled, xs, ys)
        if len(reports) != 1:
            raise SystemExit(f"expected the chain to be one program, got {len(reports)}: {[r.name for r in reports]}")
        (r,) = reports
        err = (out.cpu().float() - chain(x.float(), y.float())).abs().max().item()
        rows.append([f"{shape[0]}x{shape[1]}", r.name, r.cores_used, r.simulated_us, r.roofline_us, r.efficiency,
                     *traffic_columns(reports, nbytes(x, y), nbytes(out)), r.utilization(), r.bottleneck, err,
                     spyre_s, cpu_s])
    print_table(
        "Compiled 5-op chain relu(sigmoid(x*y + 1) - 0.5) * 2, fp16 (targets: efficiency >= 0.85, "
        "bytes <= 1.1x minimum, compile time <= Inductor CPU's; roofline against the minimum, "
        "* the inputs' and output's bytes where the program does not record it)",
        ["shape", "kernel", "cores", "simulated us", "roofline us", "efficiency", *TRAFFIC_HEADER,
         "utilization", "bottleneck", "max |err| vs fp32", "compile s (spyre)", "compile s (Inductor CPU)"], rows)


CALIBRATION = [
    # name, function, input shapes, max cores (None: the compiler decides), its CALIBRATION entry
    ("neg 2048x2048", lambda x: -x, [(2048, 2048)], None, 0),
    ("x*2+x*3 8MiB", lambda x: x * 2 + x * 3, [(4 * 1024 * 1024,)], None, 1),
    ("add 4096x4096", lambda x, y: x + y, [(4096, 4096)] * 2, 1, 3),
    ("add 4096x4096", lambda x, y: x + y, [(4096, 4096)] * 2, None, 4),
]


def calibration_table() -> None:
    from spyre_inductor.compiler import config
    from spyre_authoring import calibration
    from spyre_runtime.program.timing import estimate

    rows = []
    for name, fn, shapes, cores, entry in CALIBRATION:
        measured_plan = calibration.CALIBRATION[entry]
        assert measured_plan.name == name
        measured = measured_plan.measured_us
        handwritten = estimate(measured_plan.build()).simulated_us
        args = [torch.randn(s).half().to("spyre") for s in shapes]
        with config.patch(max_cores=cores or config.MAX_CORES):
            torch._dynamo.reset()
            compiled = torch.compile(fn)
            compiled(*args)
            out, reports = reports_of_one_call(compiled, *args)
        (r,) = reports
        rows.append([name, r.cores_used, measured, handwritten, r.simulated_us, r.simulated_us / measured,
                     "yes" if r.simulated_us <= measured else "NO", r.simulated_us / handwritten,
                     r.efficiency, *traffic_columns(reports, nbytes(*args), nbytes(out)), r.bottleneck])
    print_table("Compiled pointwise calibration kernels vs measured (SPYRE_MEASUREMENTS.md); 'measured plan' is "
                "the model's time for the hand-written program of the plan the measurement ran",
                ["kernel", "cores", "measured us", "measured plan, simulated us", "compiled, simulated us",
                 "compiled/measured", "at or below", "compiled/measured plan", "efficiency", *TRAFFIC_HEADER,
                 "bottleneck"], rows)


def main() -> None:
    chain_table()
    calibration_table()


if __name__ == "__main__":
    main()
