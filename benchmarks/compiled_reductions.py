"""Compiled reductions and their fusions on spyre: `.venv/bin/python benchmarks/compiled_reductions.py`
(`--measured`: table 2 only).

1. softmax (512x1024, 4096x4096), layer_norm (4096x4096, weight and bias),
   rms_norm (4096x4096), sum over the last dim of (2048, 4096) and cumsum, fp16: each
   compiled program's simulated time against its roofline, the bytes it moved
   against the minimum (inputs read once, outputs written once), core
   utilization, and the compile time next to Inductor's CPU backend on the same
   function (cold). Targets: >= 85% of the bandwidth roofline, <= 1.1x the
   minimum bytes.
2. The compiled row sum (2048, 4096) on 32 cores and softmax over dim 0 of
   (512, 1024) on 1 core next to their measured times in SPYRE_MEASUREMENTS.md.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from _bench import TRAFFIC_HEADER, print_table, traffic_columns
from _compiled import compile_seconds, nbytes, reports_of_one_call

warnings.filterwarnings("ignore", message=".*has no spyre kernel yet")


def softmax(x):
    return torch.softmax(x, dim=-1)


def layer_norm(x, w, b):
    return F.layer_norm(x, x.shape[-1:], w, b)


def rms_norm(x, w):
    return F.rms_norm(x, x.shape[-1:], w, eps=1e-6)


def row_sum(x):
    return x.sum(dim=-1)


def cumsum_last(x):
    return torch.cumsum(x, dim=-1)


def cumsum_dim0(x):
    return torch.cumsum(x, dim=0)


def softmax_dim0(x):
    return torch.softmax(x, dim=0)


def _inputs(shapes, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).half() for s in shapes]


CASES = [
    ("softmax 512x1024", softmax, [(512, 1024)]),
    ("softmax 4096x4096", softmax, [(4096, 4096)]),
    ("layer_norm 4096x4096", layer_norm, [(4096, 4096), (4096,), (4096,)]),
    ("rms_norm 4096x4096", rms_norm, [(4096, 4096), (4096,)]),
    ("sum 2048x4096 dim -1", row_sum, [(2048, 4096)]),
    # rows that do not fill whole sticks (1000 and 4097 fp16 elements are not multiples of 64)
    ("softmax 512x1000", softmax, [(512, 1000)]),
    ("softmax 4095x4097", softmax, [(4095, 4097)]),
    ("layer_norm 4095x4097", layer_norm, [(4095, 4097), (4097,), (4097,)]),
    ("rms_norm 4095x4097", rms_norm, [(4095, 4097), (4097,)]),
    ("sum 2047x4097 dim -1", row_sum, [(2047, 4097)]),
    # scans (issue 9): a prefix along resident rows, over dim 0 through transposed tiles, and
    # too few rows for the cores (the scanned dim split over the ring: running prefixes)
    ("cumsum 4096x4096 dim -1", cumsum_last, [(4096, 4096)]),
    ("cumsum 4096x4096 dim 0", cumsum_dim0, [(4096, 4096)]),
    ("cumsum 4095x4097 dim -1", cumsum_last, [(4095, 4097)]),
    ("cumsum 8x262144 dim -1", cumsum_last, [(8, 262144)]),
    ("cumsum 1048576 (1-D)", cumsum_last, [(1 << 20,)]),
]


def fusion_table() -> None:
    rows = []
    for name, fn, shapes in CASES:
        args = _inputs(shapes)
        cpu_s, _ = compile_seconds(fn, *args)
        dev = [a.to("spyre") for a in args]
        spyre_s, compiled = compile_seconds(fn, *dev)
        out, reports = reports_of_one_call(compiled, *dev)
        sim = sum(r.simulated_us for r in reports)
        roof = sum(r.roofline_us for r in reports)
        err = (out.cpu().float() - fn(*(a.float() for a in args))).abs().max().item()
        util = max((r.utilization() for r in reports), default=0.0)
        rows.append([name, len(reports), max((r.cores_used for r in reports), default=0), sim, roof,
                     roof / sim if sim else 0.0, *traffic_columns(reports, nbytes(*args), nbytes(out)), util,
                     ",".join(sorted({r.bottleneck for r in reports})), err, spyre_s, cpu_s])
    print_table("Compiled reductions, fp16 (targets: efficiency >= 0.85, bytes <= 1.1x minimum, compile time <= "
                "Inductor CPU's; roofline against the minimum, * the inputs' and outputs' bytes where the programs "
                "do not record it)",
                ["kernel", "programs", "cores", "simulated us", "roofline us", "efficiency", *TRAFFIC_HEADER,
                 "utilization", "bottleneck", "max |err| vs fp32", "compile s (spyre)", "compile s (Inductor CPU)"],
                rows)


MEASURED = [
    # name, function, shapes, max cores, measured us (SPYRE_MEASUREMENTS.md)
    ("row sum 2048x4096", row_sum, [(2048, 4096)], None, 113.3),
    ("softmax dim0 512x1024", softmax_dim0, [(512, 1024)], 1, 23.67),
]


def measured_table() -> None:
    from spyre_inductor.compiler import config

    rows = []
    for name, fn, shapes, cores, measured in MEASURED:
        dev = [a.to("spyre") for a in _inputs(shapes)]
        with config.patch(max_cores=cores or config.MAX_CORES):
            torch._dynamo.reset()
            compiled = torch.compile(fn)
            compiled(*dev)
            out, reports = reports_of_one_call(compiled, *dev)
        sim = sum(r.simulated_us for r in reports)
        rows.append([name, len(reports), max(r.cores_used for r in reports), measured, sim, sim / measured,
                     "yes" if sim <= measured else "NO", *traffic_columns(reports, nbytes(*dev), nbytes(out))])
    print_table("Compiled reductions vs measured (SPYRE_MEASUREMENTS.md)",
                ["kernel", "programs", "cores", "measured us", "simulated us", "sim/meas", "at or below",
                 *TRAFFIC_HEADER], rows)


def main() -> None:
    import sys

    if "--measured" not in sys.argv[1:]:
        fusion_table()
    measured_table()


if __name__ == "__main__":
    main()
