"""The graph fuzzer, for longer than the default suite: `python benchmarks/fuzz.py --examples 200`.

Draws random small graphs (tests/compiler/graph_fuzz.py: pointwise ops and
reductions, odd shapes, broadcasting, transposed inputs, fp32/fp16), compiles
each with torch.compile on spyre, compares with the CPU, and prints how many
passed, how many kernels compiled and which allowed CPU fallbacks ran. Each
failure prints the run's seed and the graph's source (inputs included), a
reproducer; `--seed S` repeats a run, `--shrink` lets hypothesis minimise
the first failure (more compiles).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("SPYRE_NUM_DEVICES", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "compiler"))

import torch  # noqa: E402,F401
from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402

import graph_fuzz  # noqa: E402

warnings.filterwarnings("ignore")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", type=int, default=100, help="graphs to draw (default 100)")
    p.add_argument("--seed", type=int, default=None, help="hypothesis seed (default: random, printed)")
    p.add_argument("--shrink", action="store_true", help="minimise the first failure (stops there)")
    args = p.parse_args(argv)
    run_seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    stats = collections.Counter()
    fallbacks = collections.Counter()
    failures = []
    start = time.perf_counter()

    phases = [Phase.generate, Phase.shrink] if args.shrink else [Phase.generate]

    @seed(run_seed)
    @settings(max_examples=args.examples, deadline=None, database=None, phases=phases,
              suppress_health_check=list(HealthCheck))
    @given(graph_fuzz.graphs())
    def run(graph):
        try:
            outcome = graph_fuzz.check(graph)
        except AssertionError as e:
            stats["failed"] += 1
            failures.append(str(e))
            print(f"FAILED (run seed {run_seed}, example {sum(stats.values())}):\n{e}\n", flush=True)
            if args.shrink:
                raise
            return
        stats["passed"] += 1
        stats["kernels"] += outcome.compiled
        fallbacks.update(outcome.fallbacks)

    try:
        run()
    except AssertionError as e:  # --shrink: hypothesis re-raises the minimal failure
        print(f"MINIMAL FAILURE (run seed {run_seed}):\n{e}")
    graphs = stats["passed"] + stats["failed"]
    print(f"run seed {run_seed}: {stats['passed']}/{graphs} graphs passed, {stats['kernels']} spyre kernels, "
          f"{sum(fallbacks.values())} allowed CPU fallbacks {dict(fallbacks) or ''}, "
          f"{time.perf_counter() - start:.0f} s")
    return 1 if stats["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
