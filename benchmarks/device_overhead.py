"""What the device costs on the host: `import torch` time and one small eager op.

Each figure is a median over repeated runs, and the comparisons are made
within one run of this script (the machines are shared and noisy).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys

from _bench import per_call_us, print_table

IMPORT_RUNS = 9


def import_seconds(autoload: bool) -> float:
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "1" if autoload else "0"}
    code = "import time; t = time.perf_counter(); import torch; print(time.perf_counter() - t)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def import_table() -> None:
    # Interleave the two kinds of run so drift in machine load hits both alike.
    samples = {True: [], False: []}
    for _ in range(IMPORT_RUNS):
        for autoload in (False, True):
            samples[autoload].append(import_seconds(autoload))
    without, with_ = statistics.median(samples[False]), statistics.median(samples[True])
    print_table(
        "import torch (median of %d fresh interpreters)" % IMPORT_RUNS,
        ["case", "seconds"],
        [
            ["without spyre (TORCH_DEVICE_BACKEND_AUTOLOAD=0)", without],
            ["with spyre autoloaded", with_],
            ["added by spyre (budget 0.5 s)", with_ - without],
        ],
    )


def eager_add_table() -> None:
    import torch

    a_cpu, b_cpu = torch.randn(64, 64), torch.randn(64, 64)
    a, b = a_cpu.to("spyre"), b_cpu.to("spyre")
    torch.add(a, b)  # first call: warning and plan caching
    cpu = per_call_us(lambda: torch.add(a_cpu, b_cpu))
    spyre = per_call_us(lambda: torch.add(a, b))
    h2d = per_call_us(lambda: a_cpu.to("spyre"), repeats=1000)
    print_table(
        "64x64 fp32 eager add (host time per call, median of 5 x 2000)",
        ["device", "us per call", "x CPU"],
        [
            ["cpu", cpu, 1.0],
            ["spyre (CPU fallback)", spyre, spyre / cpu],
            ["spyre: 64x64 host-to-device copy", h2d, h2d / cpu],
        ],
    )


def main() -> None:
    import_table()
    eager_add_table()


if __name__ == "__main__":
    main()
