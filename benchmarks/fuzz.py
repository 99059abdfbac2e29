"""The graph fuzzer, for longer than the default suite: `python benchmarks/fuzz.py --examples 200`.

Draws random small graphs (tests/compiler/graph_fuzz.py: pointwise ops,
reductions and scans, odd shapes, broadcasting, transposed inputs, fp32/fp16
within tolerances derived from rounding, int32/int64 and bool masks exactly),
compiles each with torch.compile on spyre, compares with the CPU, and prints
how many passed (per dtype), how many kernels compiled and which allowed CPU
fallbacks ran. Each failure prints the run's seed and the graph's source
(inputs included), a reproducer; `--seed S` repeats a run, `--dtypes` limits
the graphs' dtypes, `--shrink` lets hypothesis minimise the first failure
(more compiles).
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

import torch  # noqa: E402
from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402

import graph_fuzz  # noqa: E402

warnings.filterwarnings("ignore")

NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.int32: "int32", torch.int64: "int64"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", type=int, default=100, help="graphs to draw (default 100)")
    p.add_argument("--seed", type=int, default=None, help="hypothesis seed (default: random, printed)")
    p.add_argument("--shrink", action="store_true", help="minimise the first failure (stops there)")
    p.add_argument("--dtypes", default=",".join(NAMES[d] for d in graph_fuzz.DTYPES),
                   help="the graphs' dtypes, comma-separated (default: %(default)s)")
    args = p.parse_args(argv)
    by_name = {v: k for k, v in NAMES.items()}
    try:
        dtypes = tuple(by_name[n.strip()] for n in args.dtypes.split(",") if n.strip())
    except KeyError as e:
        p.error(f"unknown dtype {e} (one of {', '.join(by_name)})")
    if not dtypes:
        p.error("--dtypes names no dtype")
    run_seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    stats = collections.Counter()
    fallbacks = collections.Counter()
    per_dtype = collections.defaultdict(collections.Counter)
    failures = []
    start = time.perf_counter()

    phases = [Phase.generate, Phase.shrink] if args.shrink else [Phase.generate]

    @seed(run_seed)
    @settings(max_examples=args.examples, deadline=None, database=None, phases=phases,
              suppress_health_check=list(HealthCheck))
    @given(graph_fuzz.graphs(dtypes=dtypes))
    def run(graph):
        try:
            outcome = graph_fuzz.check(graph)
        except AssertionError as e:
            stats["failed"] += 1
            per_dtype[NAMES[graph.dtype]]["failed"] += 1
            failures.append(str(e))
            print(f"FAILED (run seed {run_seed}, example {stats['passed'] + stats['failed']}):\n{e}\n", flush=True)
            if args.shrink:
                raise
            return
        stats["passed"] += 1
        per_dtype[NAMES[graph.dtype]]["passed"] += 1
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
    print("  by dtype: " + ", ".join(f"{name} {c['passed']}/{c['passed'] + c['failed']}"
                                    for name, c in sorted(per_dtype.items())))
    return 1 if stats["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
