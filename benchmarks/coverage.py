"""Issue 9's pointwise coverage and the reductions, measured: every op x dtype compiled on spyre and
compared with CPU eager.

    .venv/bin/python benchmarks/coverage.py             # ops x dtypes on (3, 67), the casts, and the
                                                        # reductions x dtypes over each dim of (11, 67)
    .venv/bin/python benchmarks/coverage.py --layouts   # also every input layout (0-d ... 6-D), slower

Nothing here is a list of claims: each cell is compiled (one graph per dtype,
all its ops together) and run on the simulated card, and its results are
graded against PyTorch eager on the CPU with the tolerances of
tests/compiler/coverage_ops.py (which the tests share). A cell says
  ok    compiled to spyre programs only, results match;
  cpu   results match but some of it ran on the CPU (a fallback kernel or an
        ATen call left in the graph), with the reason below the table;
  FAIL  wrong result or an error, with the reason below the table;
  n/a   PyTorch eager does not define the op for that dtype.

The reductions (sum ... cumprod, over the last dim and over dim 0: one row
each) are graded the same way, one compiled graph per dtype, with the inputs,
float64 references and rounding bounds of coverage_ops.py's reductions
section. The command exits 1 when any cell of any table is not ok.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "compiler"))
os.environ.pop("SPYRE_STRICT", None)  # a fallback is graded "cpu" here, not raised
warnings.filterwarnings("ignore")

import torch  # noqa: E402

from _bench import print_table  # noqa: E402
from coverage_ops import (  # noqa: E402
    CAST_DTYPES, CASTS, DTYPES, NAMES, OPS, REDUCTION_SHAPE, REDUCTIONS, SHAPES, applies, pool, reduction_applies,
    reduction_pool, run_group,
)
from inductor_helpers import compile_on_spyre  # noqa: E402

MARK = {"pass": "ok", "fallback": "cpu", "fail": "FAIL"}


def _grade(ops, dtypes, inputs_of, applies_to=applies) -> tuple[dict, list[str]]:
    """{(op, dtype name): mark}, and the notes explaining every cell that is not ok."""
    cells, notes = {}, []
    for dtype in dtypes:
        ops_here = [op for op in ops if applies_to(op, dtype)]
        for op in ops:
            cells[op.name, NAMES[dtype]] = "n/a"
        for name, cell in run_group(ops_here, inputs_of(dtype), dtype, compile_on_spyre).items():
            cells[name, NAMES[dtype]] = MARK[cell.status]
            if cell.status != "pass":
                notes.append(f"{name} {NAMES[dtype]} ({MARK[cell.status]}): {cell.detail}")
    return cells, notes


def _table(title, ops, dtypes, cells, first="op"):
    names = [NAMES[d] for d in dtypes]
    rows = [[op.name] + [cells[op.name, n] for n in names] for op in ops]
    totals = ["ok / applicable"] + [
        f"{sum(cells[op.name, n] == 'ok' for op in ops)}/{sum(cells[op.name, n] != 'n/a' for op in ops)}"
        for n in names]
    print_table(title, [first] + names, rows + [totals])


def main(layouts: bool) -> int:
    start = time.perf_counter()
    cells, notes = _grade(OPS, DTYPES, lambda dt: pool((3, 67), dt))
    _table("Pointwise ops x dtypes, compiled on spyre vs CPU eager ((3, 67) inputs with NaN, +-inf, +-0, "
           "halves, integer extremes)", OPS, DTYPES, cells)
    cast_cells, cast_notes = _grade(CASTS, CAST_DTYPES, lambda dt: pool((3, 67), dt))
    names = [NAMES[d] for d in CAST_DTYPES]
    rows = [[f"from {src}"] + [cast_cells[c.name, src] for c in CASTS] for src in names]
    print_table("Casts (rows: source dtype, columns: destination)", ["cast"] + [c.name for c in CASTS], rows)
    notes += cast_notes
    bad = sum(v in ("FAIL", "cpu") for v in list(cells.values()) + list(cast_cells.values()))
    if layouts:
        rows = []
        for shape in SHAPES:
            row = [shape]
            for dtype in DTYPES:
                ops_here = [op for op in OPS if applies(op, dtype)]
                graded = run_group(ops_here, SHAPES[shape](dtype, 2), dtype, compile_on_spyre)
                ok = sum(c.status == "pass" for c in graded.values())
                bad += len(graded) - ok
                notes += [f"{n} {NAMES[dtype]} {shape} ({MARK[c.status]}): {c.detail}"
                          for n, c in graded.items() if c.status != "pass"]
                row.append(f"{ok}/{len(graded)}")
            rows.append(row)
        print_table("Input layouts: ops ok / applicable per dtype", ["layout"] + [NAMES[d] for d in DTYPES], rows)
    red_cells, red_notes = _grade(REDUCTIONS, DTYPES, reduction_pool, reduction_applies)
    _table(f"Reductions x dtypes, compiled on spyre vs CPU eager ({REDUCTION_SHAPE} inputs; (-1): over the "
           f"last dim, (0): over dim 0; float references in float64, rounded once)", REDUCTIONS, DTYPES, red_cells,
           first="reduction")
    print()
    for note in notes:
        print(f"  {note}")
    if red_notes:
        print("\n  Reductions:")
    for note in red_notes:
        print(f"  {note}")
    red_bad = {mark: sum(v == mark for v in red_cells.values()) for mark in ("FAIL", "cpu")}
    print(f"\n  {bad} pointwise/cast cell(s) not ok; reductions: {red_bad['FAIL']} FAIL, {red_bad['cpu']} cpu; "
          f"{time.perf_counter() - start:.0f} s (one compiled graph per dtype and layout; a graph with a "
          f"fallback or an error is recompiled op by op to find which)")
    bad += red_bad["FAIL"] + red_bad["cpu"]
    torch.spyre.synchronize()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main("--layouts" in sys.argv[1:]))
