"""Compiled data movement on spyre: `.venv/bin/python benchmarks/data_movement.py [--quick]`.

Kernels that only move bytes: `x.t().contiguous()` and attention's head
permute (producer and consumer disagree on the layout), a cat and a rotary
embedding (index masks cut into pieces), an embedding lookup (a row gather)
and a KV-cache `index_copy_` (a row scatter into an input, in place). One
row per case (CASES). Columns:

* simulated us and roofline us: the timing model's time of the compiled
  program(s), and the kernels' minimum bytes (each input element read once,
  each output element written once; a gather counts the rows it must read)
  at the card's pure-stream bandwidth;
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

import sys
import warnings
from dataclasses import dataclass
from typing import Callable

import torch

from _bench import TRAFFIC_HEADER, print_table
from _compiled import KERNEL_HEADER, _warm_up, kernel_row, plan_labels

warnings.filterwarnings("ignore", message=".*has no spyre kernel yet")


@dataclass(frozen=True)
class Case:
    name: str
    fn: Callable
    inputs: Callable[[], tuple]  # CPU tensors, seeded
    quick: bool = False          # in the --quick run


def _randn(*shape, dtype=torch.float16):
    return lambda: (torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(dtype),)


def _randns(*shapes, dtype=torch.float16):
    def make():
        g = torch.Generator().manual_seed(0)
        return tuple(torch.randn(*shape, generator=g).to(dtype) for shape in shapes)
    return make


def transpose(x):
    return x.t().contiguous()


def cat4(a, b, c, d):
    return torch.cat([a, b, c, d])


def embedding(table, ids):
    return torch.nn.functional.embedding(ids, table)


def kv_update(cache, pos, new):
    # a decode step's KV-cache update, in place (the graph mutates its input)
    cache.index_copy_(2, pos, new)
    return cache


def _lookup(vocab, dim, tokens):
    def make():
        g = torch.Generator().manual_seed(0)
        return torch.randn(vocab, dim, generator=g).half(), torch.randint(0, vocab, (tokens,), generator=g)
    return make


def _cache_and_position():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(1, 8, 1024, 128, generator=g).half(), torch.tensor([517]),
            torch.randn(1, 8, 1, 128, generator=g).half())


def rotary(q, cos, sin):
    half = q.shape[-1] // 2
    return q * cos + torch.cat((-q[..., half:], q[..., :half]), dim=-1) * sin


def heads(x):
    return x.permute(0, 2, 1, 3).contiguous()


CASES = [
    Case("x.t().contiguous() 1024x1024 fp16", transpose, _randn(1024, 1024), quick=True),
    Case("x.t().contiguous() 4096x4096 fp16", transpose, _randn(4096, 4096)),
    Case("permute(0,2,1,3) (1,256,32,128) fp16", heads, _randn(1, 256, 32, 128), quick=True),
    Case("permute(0,2,1,3) (1,1024,32,128) fp16", heads, _randn(1, 1024, 32, 128)),
    Case("cat of four (256,1024) fp16", cat4, _randns(*[(256, 1024)] * 4), quick=True),
    Case("cat of four (1024,4096) fp16", cat4, _randns(*[(1024, 4096)] * 4)),
    Case("rotary (1,32,128,128) fp16", rotary, _randns((1, 32, 128, 128), (128, 128), (128, 128)), quick=True),
    Case("rotary (1,32,1024,128) fp16", rotary, _randns((1, 32, 1024, 128), (1024, 128), (1024, 128))),
    Case("embedding 4096x1024 fp16, 64 int64 ids", embedding, _lookup(4096, 1024, 64), quick=True),
    Case("embedding 32000x4096 fp16, 512 int64 ids", embedding, _lookup(32000, 4096, 512)),
    Case("index_copy_ 1 position into (1,8,1024,128) fp16", kv_update, _cache_and_position, quick=True),
]


def relayouts(records) -> str:
    """What each compiled kernel's plan chose, from its artifact's plan.json."""
    def label(plan):
        chosen = plan["layout"].get("relayout", "?") if "layout" in plan else plan["family"]
        if plan["family"] == "indirect":  # rows gathered or scattered by index (passes/indirect_*.py)
            chosen = f"indirect rows, {chosen}"
        if "pieces" in plan:  # cut at its index masks (passes/pieces.py)
            per_plan = plan["pieces"]["cores"]
            chosen = f"{len(plan['pieces']['boxes'])} pieces in {len(per_plan)} plan(s), {chosen}"
        return chosen

    return plan_labels(records, label)


def table(cases) -> None:
    rows = []
    for case in cases:
        args = case.inputs()
        dev = [a.to("spyre") for a in args]  # (before the CPU call: kv_update mutates its input)
        want = case.fn(*[a.clone() for a in args])
        _warm_up("spyre")  # its throwaway kernel is not the case's
        rows.append(kernel_row(case.name, case.fn, dev, args, want, relayouts))
    print_table("Compiled data movement (target: every row at efficiency >= 0.85; roofline against the "
                "minimum bytes at the pure-stream bandwidth)",
                [*KERNEL_HEADER, *TRAFFIC_HEADER, "relayout", "max |err|", "compile s"], rows)


def main() -> None:
    quick = "--quick" in sys.argv
    table([c for c in CASES if c.quick or not quick])


if __name__ == "__main__":
    main()
