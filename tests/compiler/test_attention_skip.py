"""Attention skips the key/value chunks a positions mask rules out, counted on chip (issue 31).

A decoder's mask over a KV cache, ``arange(S) <= pos[:, None]``, reaches the attention family as
per-row positions read at run time: the compiler cannot know which chunks a block of query rows
needs. The program reads each unit's positions first, the sfp computes per chunk whether any row
reaches it, and every unit (ls, pe, sfp) wraps its part of that chunk in a loop whose count it
reads from the scratchpad (isa.Loop with a ScratchCount): 0 skips the loads, the products and
the softmax step. A unit's first chunk always runs, so rows that see no position get exactly the
unskipped program's value (NaN from -inf everywhere, as PyTorch's masked_fill softmax gives).

Tolerances as tests/compiler/test_attention.py: fp32 tight, fp16 at 2e-3 against fp32.
"""

from __future__ import annotations

import json

import pytest
import torch

from spyre_inductor.compiler.inductor.scheduling import record_kernels
from spyre_inductor.testing.models import explicit_attention, repeat_kv

FP32 = dict(rtol=1e-5, atol=2e-6)
FP16 = dict(rtol=2e-3, atol=2e-3)


@pytest.fixture
def strict(monkeypatch):
    monkeypatch.setenv("SPYRE_STRICT", "1")


def _randn(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def cache_attention(q, k, v, pos):
    """The reference Llama's attention over its cache: causal through the positions tensor."""
    keep = torch.arange(k.shape[2], device=q.device) <= pos[:, None]
    rep = q.shape[1] // k.shape[1]
    return explicit_attention(q, repeat_kv(k, rep), repeat_kv(v, rep), mask=keep)


def _compiled(L, S, dtype=torch.float32, H=8, KVH=2, D=64):
    """(compiled function, q, k, v on spyre, CPU copies, the attention record)."""
    q, k, v = _randn(1, H, L, D, dtype=dtype), _randn(1, KVH, S, D, dtype=dtype, seed=1), \
        _randn(1, KVH, S, D, dtype=dtype, seed=2)
    torch._dynamo.reset()
    fn = torch.compile(cache_attention)
    dev = [t.to("spyre") for t in (q, k, v)]
    with record_kernels() as records, torch._inductor.config.patch(force_disable_caches=True):
        fn(*dev, torch.arange(S - L, S).to("spyre"))
    (attention,) = [r for r in records if r.kernel is not None and r.kernel.name.startswith("spyre_attn")]
    return fn, dev, (q, k, v), attention


def _launch(fn, dev, cpu, pos, tol):
    """Run the compiled attention at positions `pos` against the CPU in fp32; its report."""
    torch.spyre.reset_kernel_reports()
    out = fn(*dev, pos.to("spyre"))
    torch.spyre.synchronize()
    want = cache_attention(*[t.float() for t in cpu], pos)
    torch.testing.assert_close(out.cpu().float(), want, **tol, equal_nan=True)
    reports = [r for r in torch.spyre.kernel_reports() if r.name.startswith("spyre_attn")]
    assert reports, [r.name for r in torch.spyre.kernel_reports()]
    return out, reports[-1]


def _readers(attention, L) -> list[tuple[int, int]]:
    """The query rows [first, last) that read a kv head's K and V chunks together: each unit's
    block of rows, or a ring group's blocks (plan share > 1: neighbouring cores, one reading a
    chunk for all), the groups' sizes as even as their count allows."""
    plan = json.loads((attention.artifact / "plan.json").read_text())
    rows, share = plan["tiling"]["rows"], plan["tiling"]["share"]
    blocks = [(i0, min(i0 + rows, L)) for i0 in range(0, L, rows)]
    n = -(-len(blocks) // share)
    size, extra = divmod(len(blocks), n)
    out, start = [], 0
    for g in range(n):
        step = size + (g < extra)
        out.append((blocks[start][0], blocks[start + step - 1][1]))
        start += step
    return out


def _chunks_run(attention, pos) -> tuple[int, int]:
    """(chunks read, chunks in the plan) for positions `pos`, from the plan: the readers of rows
    [first, last) read chunk c (c * kv first position) when c is 0 or some row's position reaches it."""
    plan = json.loads((attention.artifact / "plan.json").read_text())
    kv = plan["tiling"]["kv"]
    S = attention.kernel.k.shape[2]
    run = total = 0
    for kvh in range(attention.kernel.k.shape[1]):
        for first, last in _readers(attention, len(pos)):
            top = int(pos[first:last].max())
            for j0 in range(0, S, kv):
                total += 1
                run += j0 == 0 or j0 <= top
    return run, total


@pytest.mark.parametrize("L,S,at", [(128, 128, "end"), (70, 200, "end"), (128, 128, "start"), (70, 200, "start")])
def test_a_prefill_into_a_cache_skips_the_chunks_past_every_rows_position(strict, L, S, at):
    # one program, launched at the positions of a prefill (at the end of the cache, or into the
    # start of a longer one, two rows a position) and at the positions of rows that all see the
    # whole cache: the first reads only what its rows reach (a chunk read for a block of rows,
    # or once for a ring group's), and K and V bytes differ by exactly the chunks skipped
    fn, dev, cpu, attention = _compiled(L, S)
    assert attention.kernel.positions is not None and attention.kernel.keep is None
    prefill = torch.arange(S - L, S) if at == "end" else torch.arange(L) // 2
    everything = torch.full((L,), S - 1)
    _, skipping = _launch(fn, dev, cpu, prefill, FP32)
    _, full = _launch(fn, dev, cpu, everything, FP32)
    run, total = _chunks_run(attention, prefill)
    assert _chunks_run(attention, everything) == (total, total)
    plan = json.loads((attention.artifact / "plan.json").read_text())
    kv = plan["tiling"]["kv"]
    if at == "start" or plan["tiling"]["share"] == 1:   # (a ring group's rows see every chunk at the end)
        assert run < total
    # a skipped chunk: its K and V rows (64 features, 4 bytes; the last chunk may be short) are
    # not read (the unit's positions are read once, with the counts)
    per_position = 2 * 64 * 4
    skipped_bytes = 0
    for kvh in range(2):
        for first, last in _readers(attention, L):
            top = int(prefill[first:last].max())
            for j0 in range(kv, S, kv):
                if j0 > top:
                    skipped_bytes += min(kv, S - j0) * per_position
    assert full.bytes_read - skipping.bytes_read == skipped_bytes
    assert skipping.simulated_ns < full.simulated_ns


def test_rows_that_see_no_position_match_pytorch(strict):
    # a unit whose rows all have position -1 runs only its first chunk, fully masked: NaN rows,
    # as the unskipped program and PyTorch's masked_fill softmax give; the others are exact
    fn, dev, cpu, attention = _compiled(40, 200)
    pos = torch.arange(160, 200)
    pos[:20] = -1
    out, _ = _launch(fn, dev, cpu, pos, FP32)
    assert out[:, :, :20].isnan().all() and not out[:, :, 20:].isnan().any()
    # positions in any order: a unit runs the chunks its largest position reaches
    _launch(fn, dev, cpu, torch.randint(-1, 200, (40,), generator=torch.Generator().manual_seed(5)), FP32)


def test_fp16_within_its_documented_tolerance(strict):
    fn, dev, cpu, _ = _compiled(128, 128, torch.float16)
    out, report = _launch(fn, dev, cpu, torch.arange(0, 128), FP16)
    assert out.dtype == torch.float16


# ---- per-row statistics, packed -----------------------------------------------------------

def _kernel(H, KVH, L, S, D=64, dtype="fp16", causal=0):
    from spyre_inductor.compiler.ir.kernel_ir import AttentionKernel, Buffer

    def buf(name, shape):
        strides = [1] * len(shape)
        for i in range(len(shape) - 2, -1, -1):
            strides[i] = strides[i + 1] * shape[i + 1]
        return Buffer(name, dtype, shape, tuple(strides))

    return AttentionKernel("attention_test", (buf("q", (1, H, L, D)), buf("k", (1, KVH, S, D)),
                                              buf("v", (1, KVH, S, D)), buf("out", (1, H, L, D))),
                           D ** -0.5, causal, None, None, "zero", None)


def test_the_per_row_statistics_are_packed_columns():
    # the running max, the sum and their temporaries take 4 bytes per row (each head's rows from
    # a stick), not a stick per row: 256 rows of 4 query heads per unit now fit beside their tiles
    from spyre_inductor.compiler.families.attention.plan import (COLUMN_TILES, AttentionTiling, analyse, needs,
                                                                 variants)

    shape = analyse(_kernel(4, 1, 1024, 1024))
    assert 256 in {t.rows for t in variants(shape)}
    sizes = {n.tile: n.nbytes * n.copies for n in needs(shape, AttentionTiling(256, 64, 2))}
    assert all(sizes[name] == 4 * 256 * 4 for name in COLUMN_TILES + ("empty",))
    assert sizes["q"] == 2 * 4 * 256 * 128   # (for scale: Q's two copies, a stick per row of 64 fp16)


def test_a_causal_chunk_starts_its_rows_on_a_stick_of_the_statistics():
    # the rows a diagonal chunk skips are rounded down to 32 (one stick of fp32 statistics): the
    # rows between see none of the chunk's positions, and the diagonal's mask leaves them as they were
    from spyre_inductor.compiler.families.attention.plan import AttentionTiling, analyse, work_units

    shape = analyse(_kernel(1, 1, 256, 256, causal=5))   # keep j <= i + 5
    first, second = work_units(shape, AttentionTiling(128, 64, 2))
    # rows 0..127: chunk 64..127 is seen from row 59 on, chunk 128..191 from row 123
    assert [c.r0 for c in first.chunks] == [0, 32, 96]
    assert [c.r0 for c in second.chunks] == [0, 0, 0, 32]   # (chunk 192..255 from row 187 = 128 + 59)
    assert [c.masked for c in first.chunks] == [True, True, True]


def test_few_rows_of_several_heads_stay_one_product_on_the_pe():
    # 8 rows of 4 query heads: their statistics sit a stick apart per head (the sfp takes each
    # head's rows on their own), but the pe multiplies the 32 stacked rows as one product: four
    # products of 8 rows would each cost a pass
    from spyre_runtime.program.isa import MatMul

    from spyre_inductor.compiler.backend import plan_kernel

    compiled = plan_kernel(_kernel(4, 1, 8, 256, causal=None), cores=1)
    tiling = compiled.plans.stage("tiling")
    assert tiling.rows == 8 and tiling.kv_split == 1
    (core,) = compiled.program.cores
    products = [i for i in dict(core.units)["pe"] if isinstance(i, MatMul)]
    assert len(products) == 2 * -(-256 // tiling.kv) and all(p.a.rows == 32 for p in products)


def test_the_fast_run_skips_and_times_as_the_interpreter_does(strict, monkeypatch):
    # a program with loops counted on chip runs its precomputed schedule, skipping the steps whose
    # count word holds 0, and is timed by a walk at the counts it read: the same outputs, bytes and
    # time as the general interpreter (which steps and times every instruction as it goes)
    from spyre_runtime.program import run as program_run

    fn, dev, cpu, _ = _compiled(70, 200)
    positions = [torch.arange(130, 200), torch.full((70,), -1), torch.randint(-1, 200, (70,))]
    fast = [_launch(fn, dev, cpu, pos, FP32) for pos in positions]
    monkeypatch.setattr(program_run, "MAX_BOUND_STEPS", 0)   # (the interpreter, timed as it goes)
    slow = [_launch(fn, dev, cpu, pos, FP32) for pos in positions]
    for (out_f, rep_f), (out_s, rep_s) in zip(fast, slow):
        torch.testing.assert_close(out_f.cpu(), out_s.cpu(), rtol=0, atol=0, equal_nan=True)
        assert (rep_f.bytes_read, rep_f.sfp_sticks) == (rep_s.bytes_read, rep_s.sfp_sticks)
        assert rep_f.simulated_ns == pytest.approx(rep_s.simulated_ns, rel=1e-9)
    assert fast[1][1].bytes_read < fast[0][1].bytes_read   # (rows that see nothing: first chunks only)


def test_a_decode_steps_heads_share_each_sfp_instruction():
    # one row of 4 query heads: every block the sfp takes is all the heads' rows, so their packed
    # statistics sit adjacent and each softmax step is one instruction over the 4 rows, not 4 of 1
    # (the simulated time is the same; the host's, per instruction, is not)
    from spyre_runtime.program.isa import Reduce

    from spyre_inductor.compiler.backend import plan_kernel

    compiled = plan_kernel(_kernel(4, 1, 1, 256, causal=None), cores=1)
    (core,) = compiled.program.cores
    maxima = [i for i in dict(core.units)["sfp"] if isinstance(i, Reduce) and i.op == "max"]
    tiling = compiled.plans.stage("tiling")
    assert len(maxima) == -(-256 // tiling.kv) and all(r.src.rows == 4 and r.dst.packed for r in maxima)


def test_a_chunk_every_row_sees_whole_is_not_masked(strict):
    # the mask's compares and selects run on a chunk only if some row of the unit does not see
    # all of it (counted on chip too): every row at the last position masks nothing; one row one
    # short of it masks its unit's last chunk, for each kv head
    fn, dev, cpu, attention = _compiled(70, 256)
    plan = json.loads((attention.artifact / "plan.json").read_text())
    rows, kv = plan["tiling"]["rows"], plan["tiling"]["kv"]
    assert 256 % kv == 0
    everything = torch.full((70,), 255)
    one_short = everything.clone()
    one_short[0] = 254
    _, unmasked = _launch(fn, dev, cpu, everything, FP32)
    _, masked = _launch(fn, dev, cpu, one_short, FP32)
    r, w, G = min(rows, 70), kv * 4 // 128, 4    # (fp32 scores: a stick holds 32 of a row's positions)
    # per kv head: the rows' positions copied, an iota and a compare over the chunk, a select per head
    assert masked.sfp_sticks - unmasked.sfp_sticks == 2 * (r + 2 * r * w + G * r * w)
