"""Attention's ring groups (issue 31): the cores of one kv head share its K/V chunks over the ring.

A ring group gives the work units of one (batch, kv head) one each to neighbouring cores; one
core reads each chunk and it travels the ring to the others (families/attention/ring.py). Only
where the data comes from changes, never the arithmetic: a ring plan's output is bit for bit the
unshared plan's of the same tiling on one unit per core, and both match the kernel's definition
on the CPU (fp32 tight, as tests/compiler/test_attention.py). Covered: a causal diagonal skipped
statically (SDPA), positions counted on chip (a prefill at the end or the start of a cache,
positions in any order, rows that see nothing), no mask, grouped and multi-query kv heads,
groups of several sizes on one kv head, a short last chunk (its K rows travel, every core
transposes them) and a short last block of rows.
"""

from __future__ import annotations

import pytest
import torch

from spyre_runtime.direct import run_program
from spyre_inductor.compiler.core.keep import validated
from spyre_inductor.compiler.core.layout import symbols_of
from spyre_inductor.compiler.families.attention.program import build_attention_program
from spyre_inductor.compiler.families.attention.plan import (AttentionTiling, CoreWork, analyse, divide, placement,
                                                             work_units)
from spyre_inductor.compiler.families.attention.planner import tile_kernel
from spyre_inductor.compiler.ir.errors import PlanError
from spyre_inductor.compiler.ir.kernel_ir import AttentionKernel, Buffer, attention_reference

FP32 = dict(rtol=1e-5, atol=2e-6)


def _kernel(B, H, KVH, L, S, D=64, *, causal=None, positions=False, dtype="fp32", empty_rows="zero"):
    def buf(name, shape, dt=dtype):
        strides = [1] * len(shape)
        for i in range(len(shape) - 2, -1, -1):
            strides[i] = strides[i + 1] * shape[i + 1]
        return Buffer(name, dt, shape, tuple(strides))

    buffers = [buf("q", (B, H, L, D)), buf("k", (B, KVH, S, D)), buf("v", (B, KVH, S, D))]
    if positions:
        buffers.append(buf("positions", (L,), "int64"))
    buffers.append(buf("out", (B, H, L, D)))
    return AttentionKernel("attention_ring_test", tuple(buffers), D ** -0.5, causal, None, None, empty_rows, None,
                           positions_stride=1 if positions else None)


def _program(kernel, tiling: AttentionTiling):
    """The validated and verified program of `tiling`, one unit per core."""
    shape = analyse(kernel)
    units = work_units(shape, tiling)
    work = divide(units, len(units), one_each=True)
    place = placement(shape, tiling, 1)
    assert place is not None
    program = build_attention_program(kernel.name, symbols_of(kernel), shape, tile_kernel(shape), tiling, place,
                                      work)
    return validated(kernel, program)


def _run(program, tensors):
    out = torch.empty(tensors["q"].shape[:3] + (tensors["v"].shape[3],), dtype=tensors["q"].dtype, device="spyre")
    got = run_program(program, **{n: t.to("spyre") for n, t in tensors.items()}, out=out)
    return got["out"].cpu()


def _inputs(B, H, KVH, L, S, D=64, positions=None):
    g = lambda *s, seed: torch.randn(*s, generator=torch.Generator().manual_seed(seed))  # noqa: E731
    t = {"q": g(B, H, L, D, seed=0), "k": g(B, KVH, S, D, seed=1), "v": g(B, KVH, S, D, seed=2)}
    if positions is not None:
        t["positions"] = positions
    return t


CASES = {
    # (B, H, KVH, L, S), causal, positions, (rows, kv, share)
    "sdpa causal, GQA, one group a kv head": ((1, 8, 2, 128, 128), 0, None, (8, 64, 16)),
    "sdpa causal, groups of 4, 2 batches": ((2, 4, 2, 64, 128), 0, None, (8, 64, 4)),
    "no mask, multi-query, short last chunk": ((1, 4, 1, 48, 200), None, None, (16, 64, 3)),
    "causal offset, short last block": ((1, 4, 2, 70, 90), 5, None, (16, 64, 8)),
    "positions at the end of the cache": ((1, 8, 2, 128, 128), 0, "end", (8, 64, 16)),
    "positions at the start of a longer cache": ((1, 8, 2, 64, 256), 0, "start", (8, 64, 8)),
    "positions in any order, some rows see nothing": ((1, 8, 2, 40, 200), 0, "random", (8, 64, 5)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_ring_group_computes_exactly_what_the_unshared_plan_does(case):
    (B, H, KVH, L, S), causal, where, (rows, kv, share) = CASES[case]
    positions = None
    if where == "end":
        positions = torch.arange(S - L, S)
    elif where == "start":
        positions = torch.arange(L) // 2
    elif where == "random":
        positions = torch.randint(-1, S, (L,), generator=torch.Generator().manual_seed(7))
        positions[:3] = -1
    kernel = _kernel(B, H, KVH, L, S, causal=causal, positions=positions is not None,
                     empty_rows="nan" if where == "random" else "zero")
    tensors = _inputs(B, H, KVH, L, S, positions=positions)
    ring = AttentionTiling(rows, kv, 3, share=share)
    shared = _run(_program(kernel, ring), tensors)
    alone = _run(_program(kernel, AttentionTiling(rows, kv, 3)), tensors)
    torch.testing.assert_close(shared, alone, rtol=0, atol=0, equal_nan=True)
    want = attention_reference(tensors["q"], tensors["k"], tensors["v"], scale=kernel.scale, causal=causal,
                               empty_rows=kernel.empty_rows, positions=positions)
    torch.testing.assert_close(shared, want, **FP32, equal_nan=True)


def test_a_ring_group_reads_each_chunk_once_and_sends_the_rest():
    # one group of 16 cores per kv head: K and V cross the bus once per kv head (the unshared
    # plan, once per core that sees them), and the ring carries every other core's copy
    kernel = _kernel(1, 8, 2, 128, 128, causal=0)
    program = _program(kernel, AttentionTiling(8, 64, 3, share=16))
    loads = sends = 0
    for core in program.cores:
        for unit, instrs in core.units:
            loads += sum(i.rows * i.row_bytes for i in instrs if type(i).__name__ == "Load"
                         and i.src.symbol in ("k", "v"))
            sends += sum(1 for i in instrs if type(i).__name__ == "Send")
    assert loads == 2 * 2 * 128 * 64 * 4     # K and V of two kv heads, fp32, once
    assert sends > 0


def test_the_planner_shares_k_and_v_on_a_llama_prefill():
    # the prefill of the reference Llama (8 heads over 2 kv heads, 128 rows into a cache of 128,
    # positions read on chip): the timing model prefers every core of a kv head sharing its chunks
    from spyre_inductor.compiler.backend import plan_kernel

    compiled = plan_kernel(_kernel(1, 8, 2, 128, 128, causal=0, positions=True, dtype="fp16"))
    tiling = compiled.plans.stage("tiling")
    assert tiling.share > 1
    assert len(compiled.program.cores) == 32


def test_ring_roles_refuse_a_core_with_two_units():
    from spyre_inductor.compiler.families.attention.ring import roles

    units = work_units(analyse(_kernel(1, 4, 1, 64, 64, causal=0)), AttentionTiling(16, 64, 2))
    with pytest.raises(PlanError, match="one unit per core"):
        roles((CoreWork(0, tuple(units[:2])), CoreWork(1, tuple(units[2:]))), 2)
