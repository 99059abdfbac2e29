"""sort and topk on spyre: `.venv/bin/python benchmarks/sort.py [--quick]`.

Each row compiles `torch.sort(x, descending=True)` or `torch.topk(x, 8)` over rows of fp32 on
spyre, runs it once and checks it against the CPU's stable sort (values and indices exactly).
Columns: the programs of the call and their kinds (the sort family's one SortKernel, or the rank
count's ReductionKernel + IndirectKernel scatters), their simulated time summed, the bytes they
moved, and the compile seconds (cold: dynamo reset, Inductor's caches off).

The same script runs against any checkout: `PYTHONPATH=<checkout>` shows another lowering's row
(the rank count before issue 31's sort family) for the same shapes.
`--quick` runs the rows of 64 only.
The last row is one row of 128256 (top-k sampling over a vocabulary): longer than a segment
(inductor/sort_segments.py), the first 50 of each segment, then of their candidates.
"""

from __future__ import annotations

import sys
import warnings

import torch

from _bench import print_table
from _compiled import _warm_up, compile_seconds, reports_of_one_call

warnings.filterwarnings("ignore")

CASES = [  # (op, rows, row length)
    ("sort", 256, 64), ("topk 8", 256, 64),
    ("sort", 32, 1024), ("topk 8", 32, 1024),
    ("sort", 8, 4096), ("topk 8", 8, 4096),
    ("topk 50", 1, 128256),  # top-k sampling over Llama 3's vocabulary: one row, cut in segments
]


def _fn(op: str):
    if op == "sort":
        return lambda a: torch.sort(a, descending=True)
    k = int(op.split()[1])
    return lambda a: torch.topk(a, k)


def row(op: str, rows: int, n: int) -> list:
    from spyre_inductor.compiler.inductor.scheduling import record_kernels

    x = torch.randn(rows, n, generator=torch.Generator().manual_seed(0))
    fn = _fn(op)
    _warm_up("spyre")  # (its throwaway compile outside the record)
    with record_kernels() as records:
        seconds, compiled = compile_seconds(fn, x.to("spyre"))
    out, reports = reports_of_one_call(compiled, x.to("spyre"))
    values, indices = out
    want = torch.sort(x, dim=-1, descending=True, stable=True)
    k = values.shape[-1]
    exact = torch.equal(values.cpu(), want.values[:, :k]) and torch.equal(indices.cpu(), want.indices[:, :k])
    kinds = sorted({type(r.kernel).__name__ for r in records if r.kernel is not None})
    kinds += ["cpu fallback"] if any(r.artifact is None for r in records) else []
    return [op, f"{rows} x {n}", len(reports), "+".join(k.replace("Kernel", "") for k in kinds) or "-",
            sum(r.simulated_ns for r in reports) / 1e3, sum(r.bytes_moved for r in reports),
            "yes" if exact else "NO", seconds]


def main() -> None:
    quick = "--quick" in sys.argv
    rows = [row(op, r, n) for op, r, n in CASES if not quick or n == 64]
    print_table("sort / topk of fp32 rows on spyre (one call)",
                ["op", "shape", "programs", "kinds", "simulated us", "bytes moved", "exact", "compile s"], rows)


if __name__ == "__main__":
    main()
