"""The calibration kernels of SPYRE_MEASUREMENTS.md under the timing model: simulated vs measured.

Every entry of spyre_runtime.program.calibration.CALIBRATION (a hand-written
program equivalent to one measured kernel) runs on the functional simulator
with the timing model attached (timing.Timing, HARDWARE constants), over
zero-filled CPU byte buffers (no device needed; the values do not affect
the timing). Columns: simulated device time, its ratio to the measured one,
the model's bottleneck, the device bytes it counted (read + written, whole
sticks), the roofline and whether the row is within the bound the issue asks
for (15% for memory-bound kernels, 20% for the single-core matmul).

The model is not calibrated yet: rows outside their bound are expected and
printed as they are.
"""

from __future__ import annotations

import torch

from _bench import print_table
from spyre_runtime.hardware import HARDWARE
from spyre_runtime.program import Machine
from spyre_runtime.program.calibration import BOUNDS, CALIBRATION
from spyre_runtime.program.timing import Timing


def simulate(program):
    buffers = {s.name: torch.zeros(s.nbytes, dtype=torch.uint8) for s in program.symbols}
    timing = Timing(program, HARDWARE)
    Machine(program, buffers, HARDWARE.scratchpad_bytes, timing).run()
    return timing.finish()


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.2f} MiB"


def main() -> None:
    rows = []
    for entry in CALIBRATION:
        report = simulate(entry.build())
        ratio = report.simulated_us / entry.measured_us
        bound = BOUNDS[entry.kind]
        rows.append([entry.name, entry.cores, entry.measured_us, report.simulated_us, ratio,
                     report.bottleneck, _mib(report.bytes_read), _mib(report.bytes_written),
                     report.roofline_us, f"{'yes' if abs(ratio - 1) <= bound else 'NO'} ({bound:.0%})"])
    print_table("Calibration kernels: timing model (uncalibrated) vs measured (SPYRE_MEASUREMENTS.md)",
                ["kernel", "cores", "measured us", "simulated us", "sim/meas", "bottleneck",
                 "read", "written", "roofline us", "within bound"], rows)


if __name__ == "__main__":
    main()
