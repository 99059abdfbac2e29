"""Every benchmark, and BENCHMARKS.md regenerated from their tables: `make bench`.

    .venv/bin/python benchmarks/run.py [--quick] [--out FILE] [--only NAME ...]

Each benchmark runs in a process of its own (nothing one leaves behind, a cache or a thread,
times another), its printed tables go into the report under its command, with how long it took.
The machine (CPU, cores, torch) and the date head the file: every figure is a ratio or a time
measured in that one run on that machine. --quick runs the few that take seconds (for tests).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# (benchmark, its arguments, what it measures), in the report's order
FULL = [
    ("device_overhead", [], "eager op overhead on the device against the CPU"),
    ("launch_cost", [], "one launch, warm, against the general interpreter"),
    ("launch", [], "launch overhead end to end, streams and threads"),
    ("queue_layer", [], "enqueue cost; compute idle fraction with one and two streams"),
    ("allocator", [], "allocation cost and fragmentation"),
    ("simulator", [], "simulator speed against torch on the CPU"),
    ("calibration", [], "the timing model against the measured Spyre kernels"),
    ("compiled_pointwise", [], "pointwise kernels: efficiency and bytes over the minimum"),
    ("compiled_reductions", [], "reductions: efficiency and bytes over the minimum"),
    ("compiled_matmul", [], "matmul: efficiency against the roofline"),
    ("compiled_matmul", ["--small-m"], "decode-shaped matmuls (M 1..64)"),
    ("attention", [], "fused attention: efficiency and refetch"),
    ("conv", [], "conv2d as an implicit matmul"),
    ("sort", [], "sort and top-k"),
    ("experts", [], "mixture-of-experts grouped matmul"),
    ("data_movement", [], "copies, gathers and scatters"),
    ("models", ["--quick"], "Llama-style prefill/decode per step; compile time against Inductor CPU"),
    ("dynamic_sizes", [], "symbolic sizes: one compile for many shapes"),
    ("distributed", [], "torch.distributed: all_reduce on the card link; tensor-parallel decode at 1, 2, 4 ranks"),
    ("eager", [], "eager ops compiled once and launched"),
    ("eager_cache", [], "the eager program cache"),
]
QUICK = [("queue_layer", [], FULL[3][2]), ("launch_cost", [], FULL[1][2])]


def machine() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    return (f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, torch {torch.__version__}; "
            f"commit {commit.strip() or '?'}; {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}")


def run(name: str, args: list[str], timeout: float) -> tuple[str, float, int]:
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, str(HERE / f"{name}.py"), *args], cwd=ROOT, capture_output=True,
                              text=True, timeout=timeout)
        out, code = done.stdout + (f"\n(stderr, last lines)\n{done.stderr[-2000:]}" if done.returncode else ""), \
            done.returncode
    except subprocess.TimeoutExpired as e:
        out, code = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), -1
        out += f"\n(stopped after {timeout:.0f} s)"
    return out, time.perf_counter() - start, code


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="only the benchmarks that take seconds")
    p.add_argument("--out", default=str(ROOT / "BENCHMARKS.md"), help="the report to write (default BENCHMARKS.md)")
    p.add_argument("--only", nargs="*", help="only these benchmarks (by file name)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per benchmark (default 1800)")
    args = p.parse_args(argv)
    chosen = QUICK if args.quick else FULL
    if args.only:
        chosen = [b for b in FULL if b[0] in args.only]
    parts, failed = [], []
    for k, (name, bargs, what) in enumerate(chosen, 1):
        command = " ".join(["benchmarks/" + name + ".py", *bargs])
        print(f"[{k}/{len(chosen)}] {command}: {what}", flush=True)
        out, seconds, code = run(name, bargs, args.timeout)
        print(out, flush=True)
        if code:
            failed.append(command)
        parts.append(f"## {what}\n\n`.venv/bin/python {command}` ({seconds:.0f} s"
                     f"{'' if code == 0 else f', exit status {code}'})\n\n```\n{out.strip()}\n```\n")
    head = (f"# Benchmarks\n\nRegenerated by `make bench` (benchmarks/run.py{' --quick' if args.quick else ''}) on "
            f"{machine()}.\nEvery figure was measured in this one run; the machine is shared, so compare the ratios "
            f"within a table, not absolute times across runs. Simulated times are the card's (the timing model); "
            f"host times are this machine's.\n\n")
    Path(args.out).write_text(head + "\n".join(parts))
    print(f"wrote {args.out}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
