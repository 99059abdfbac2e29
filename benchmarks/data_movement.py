"""Compiled data movement on spyre: `.venv/bin/python benchmarks/data_movement.py [--quick]`.

Kernels that only move bytes, whose producer and consumer disagree on the
layout: `x.t().contiguous()` and attention's head permute. One row per case
(CASES; cat, rotary, embedding and index_copy_ are one entry each when
they come). Columns:

* simulated us and roofline us: the timing model's time of the compiled
  program(s), and the kernels' minimum bytes (each input element read once,
  each output element written once) at the card's pure-stream bandwidth;
* efficiency = roofline / simulated (target for the 4096^2 transpose:
  >= 0.85); bytes moved against the minimum, and the refetch;
* relayout: what the plan chose (the layout stage of plan.json: ``sticks``
  when every access walks one dim contiguously, ``transposed`` when one
  side is staged and transposed on chip, ``elements`` as the last resort),
  or the family of a kernel without a layout stage;
* max |err|: against the same function on the CPU (a copy: exactly 0).

`--quick` runs the small rows only.
"""

from __future__ import annotations

import json
import sys
import warnings
from dataclasses import dataclass
from typing import Callable

import torch

from _bench import TRAFFIC_HEADER, print_table, traffic_columns
from _compiled import _warm_up, compile_seconds, nbytes, reports_of_one_call

warnings.filterwarnings("ignore", message=".*has no spyre kernel yet")


@dataclass(frozen=True)
class Case:
    name: str
    fn: Callable
    inputs: Callable[[], tuple]  # CPU tensors, seeded
    quick: bool = False          # in the --quick run


def _randn(*shape, dtype=torch.float16):
    return lambda: (torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(dtype),)


def transpose(x):
    return x.t().contiguous()


def heads(x):
    return x.permute(0, 2, 1, 3).contiguous()


CASES = [
    Case("x.t().contiguous() 1024x1024 fp16", transpose, _randn(1024, 1024), quick=True),
    Case("x.t().contiguous() 4096x4096 fp16", transpose, _randn(4096, 4096)),
    Case("permute(0,2,1,3) (1,256,32,128) fp16", heads, _randn(1, 256, 32, 128), quick=True),
    Case("permute(0,2,1,3) (1,1024,32,128) fp16", heads, _randn(1, 1024, 32, 128)),
]


def relayouts(records) -> str:
    """What each compiled kernel's plan chose, from its artifact's plan.json."""
    out = []
    for r in records:
        if r.artifact is None:
            out.append("cpu fallback")
            continue
        plan = json.loads((r.artifact / "plan.json").read_text())
        out.append(plan["layout"].get("relayout", "?") if "layout" in plan else plan["family"])
    return ", ".join(out) or "-"


def table(cases) -> None:
    from spyre_inductor.compiler.scheduling import record_kernels

    rows = []
    for case in cases:
        args = case.inputs()
        want = case.fn(*args)
        dev = [a.to("spyre") for a in args]
        _warm_up("spyre")  # its throwaway kernel is not the case's
        with record_kernels() as records:
            spyre_s, compiled = compile_seconds(case.fn, *dev)
        out, reports = reports_of_one_call(compiled, *dev)
        sim = sum(r.simulated_ns for r in reports)
        roof = sum(r.roofline_ns for r in reports)
        err = (out.cpu().float() - want.float()).abs().max().item()
        rows.append([case.name, len(reports), max(r.cores_used for r in reports), sim / 1e3, roof / 1e3,
                     roof / sim if sim else 0.0, *traffic_columns(reports, nbytes(*args), nbytes(want)),
                     relayouts(records), err, spyre_s])
    print_table("Compiled data movement (target: x.t().contiguous() 4096x4096 fp16 at efficiency >= 0.85; "
                "roofline against the minimum bytes at the pure-stream bandwidth)",
                ["kernel", "programs", "cores", "simulated us", "roofline us", "efficiency", *TRAFFIC_HEADER,
                 "relayout", "max |err|", "compile s"], rows)


def main() -> None:
    quick = "--quick" in sys.argv
    table([c for c in CASES if c.quick or not quick])


if __name__ == "__main__":
    main()
