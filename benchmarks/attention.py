"""Fused attention on spyre: `.venv/bin/python benchmarks/attention.py [--quick]`.

Each row compiles `F.scaled_dot_product_attention` (or the explicit pattern model code writes)
on spyre, fp16, and runs it once. Columns:

* programs: spyre programs of the call (target: 1, the fused attention);
* simulated us and roofline us: the timing model's time, and the roofline from the kernel's
  FLOPs at the matrix rate and its minimum bytes (q, k, v and the masks read once, the output
  written once; a causal mask's unseen positions not counted) at the pure-stream bandwidth;
* efficiency = roofline / simulated (target >= 0.70);
* bytes moved over the minimum: the score matrix never reaches device memory, so a plan that
  reads each operand once is at 1.00;
* the tiling the planner chose, max |err| against fp32 attention on the CPU, compile seconds.

`--quick` runs the small rows only.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from _bench import TRAFFIC_HEADER, print_table
from _compiled import KERNEL_HEADER, kernel_row, plan_labels

warnings.filterwarnings("ignore", message=".*has no spyre kernel yet")


@dataclass(frozen=True)
class Case:
    name: str
    fn: Callable
    shapes: tuple
    quick: bool = False


def causal(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def gqa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def plain(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)


def explicit_causal(q, k, v):
    L, S = q.shape[-2], k.shape[-2]
    keep = torch.ones(L, S, dtype=torch.bool, device=q.device).tril()
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    return torch.softmax(scores.masked_fill(~keep, float("-inf")).float(), -1).to(q.dtype) @ v


CASES = [
    Case("SDPA prefill (1,32,1024,128) causal", causal, ((1, 32, 1024, 128),) * 3),
    Case("SDPA decode (1,32,1,128), KV 1024, 8 KV heads", gqa, ((1, 32, 1, 128), (1, 8, 1024, 128), (1, 8, 1024, 128)),
         quick=True),
    Case("SDPA encoder (4,12,512,64)", plain, ((4, 12, 512, 64),) * 3),
    Case("SDPA prefill (1,8,256,64) causal", causal, ((1, 8, 256, 64),) * 3, quick=True),
    Case("explicit causal (1,32,1024,128)", explicit_causal, ((1, 32, 1024, 128),) * 3),
]


def tiling(records) -> str:
    def label(plan):
        return plan["tiling"]["label"] if plan["family"] == "attention" else plan["family"]

    return plan_labels([r for r in records if r.kernel is not None], label)


def table(cases) -> None:
    rows = []
    for case in cases:
        g = torch.Generator().manual_seed(0)
        args = [torch.randn(*s, generator=g).half() for s in case.shapes]
        want = case.fn(*[a.float() for a in args])
        rows.append(kernel_row(case.name, case.fn, [a.to("spyre") for a in args], args, want, tiling))
    print_table("Fused attention, fp16 (targets: one program, efficiency >= 0.70 of the roofline from FLOPs and "
                "minimum bytes)",
                [*KERNEL_HEADER, *TRAFFIC_HEADER, "tiling", "max |err| vs fp32", "compile s"], rows)


def main() -> None:
    quick = "--quick" in sys.argv
    table([c for c in CASES if c.quick or not quick])


if __name__ == "__main__":
    main()
