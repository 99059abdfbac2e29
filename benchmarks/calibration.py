"""The timing model against the measured kernels, the reports of the hand-written programs,
and the hardware config it is built from: `.venv/bin/python benchmarks/calibration.py`.

Every entry of spyre_authoring.calibration.CALIBRATION (a hand-written
program equivalent to one measured kernel of SPYRE_MEASUREMENTS.md) is
estimated with the timing model (timing.estimate: the program's control flow
and costs, without computing values). Columns: simulated device time, its
ratio to the measured one, whether that is within the bound the model must
meet (15% memory-bound, 20% the single-core matmul), the bottleneck, the
device bytes counted (whole sticks), the card's roofline and the efficiency.
"""

from __future__ import annotations

import dataclasses

from _bench import TRAFFIC_HEADER, print_table, traffic_columns
from spyre_runtime.hardware import HARDWARE
from spyre_authoring.calibration import BOUNDS, CALIBRATION
from spyre_authoring.handwritten import cast_round_trip, ring_sum, row_softmax, tiled_matmul, vector_add
from spyre_runtime.program.timing import estimate

HANDWRITTEN = [
    lambda: vector_add(1 << 20, "fp16"),
    lambda: cast_round_trip(1 << 20),
    lambda: tiled_matmul(1024, 1024, 1024, "fp16", cores=32),
    lambda: row_softmax(4096, 4096, "fp16", cores=32),
    lambda: ring_sum(32 * 32, 32),
]


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.2f} MiB"


def calibration_table() -> None:
    rows = []
    for entry in CALIBRATION:
        r = estimate(entry.build())
        ratio = r.simulated_us / entry.measured_us
        bound = BOUNDS[entry.kind]
        rows.append([entry.name, entry.cores, entry.measured_us, r.simulated_us, ratio,
                     f"{'yes' if abs(ratio - 1) <= bound else 'NO'} ({bound:.0%})", r.bottleneck,
                     _mib(r.bytes_read), _mib(r.bytes_written), r.roofline_us, r.efficiency])
    print_table("Calibration kernels: timing model vs measured (SPYRE_MEASUREMENTS.md)",
                ["kernel", "cores", "measured us", "simulated us", "sim/meas", "within bound", "bottleneck",
                 "read", "written", "roofline us", "efficiency"], rows)


def handwritten_table() -> None:
    rows = []
    for build in HANDWRITTEN:
        program = build()
        r = estimate(program)
        # Hand-written programs record no minimum: each input and output placeholder once stands in (*).
        read_once = sum(s.nbytes for s in program.symbols if s.role == "input")
        written_once = sum(s.nbytes for s in program.symbols if s.role == "output")
        rows.append([program.name, r.cores_used, r.simulated_us, r.roofline_us, r.efficiency, r.utilization(),
                     r.bottleneck, *traffic_columns([r], read_once, written_once), f"{r.flops:.3g}"])
    print_table("Hand-written programs: kernel reports (roofline and efficiency against the bytes moved; "
                "* minimum: each input and output placeholder once)",
                ["program", "cores", "simulated us", "roofline us", "efficiency", "utilization", "bottleneck",
                 *TRAFFIC_HEADER, "flops"], rows)


def hardware_table() -> None:
    rows = []
    for f in dataclasses.fields(HARDWARE):
        if f.name == "name":
            continue
        source = f.metadata.get("source", "")
        kind, _, text = source.partition(": ")
        rows.append([f.name, getattr(HARDWARE, f.name), kind, text[:90]])
    print_table("Hardware config (spyre_runtime/hardware.py; M measured, F fitted, E estimate)",
                ["figure", "value", "kind", "source"], rows)


def main() -> None:
    calibration_table()
    handwritten_table()
    hardware_table()


if __name__ == "__main__":
    main()
