"""Gathers and scatters compile to spyre programs (issue 16), under SPYRE_STRICT=1.

Every kernel here must run as a program (a record with an artifact), exactly
equal to the CPU for moves; an index out of range is an IndexError naming
the op, the value and the bound, raised from the launch's synchronize, and
the device keeps working after it.
"""

from __future__ import annotations

import pytest
import torch

from inductor_helpers import compile_on_spyre
from spyre_inductor.compiler.ir.kernel_ir import IndirectKernel, Indirect, Load


@pytest.fixture(autouse=True)
def strict(monkeypatch):
    monkeypatch.setenv("SPYRE_STRICT", "1")


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _run(fn, *args, indirect=True):
    """fn on spyre vs on CPU copies: outputs and (mutated) inputs exactly equal; the records."""
    cpu = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    out, dev_args, records, warned, _ = compile_on_spyre(fn, *args)
    want = fn(*cpu)
    want = want if isinstance(want, tuple) else (want,)
    for got, ref in zip(out, want, strict=True):
        assert got.device.type == "spyre"
        torch.testing.assert_close(got.cpu(), ref, rtol=0, atol=0)
    for got, ref in zip(dev_args, cpu):
        if isinstance(ref, torch.Tensor):
            torch.testing.assert_close(got.cpu(), ref, rtol=0, atol=0)
    assert not warned
    kernels = [r for r in records if r.kernel is not None]
    assert kernels and all(r.artifact is not None for r in kernels), [r.fallback_reason for r in records]
    if indirect:
        assert any(isinstance(r.kernel, IndirectKernel) for r in kernels)
    return records


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_embedding_int32_and_int64_ids(dtype):
    w = torch.randn(100, 96, generator=_gen(0)).half()
    ids = torch.randint(0, 100, (3, 7), generator=_gen(1), dtype=dtype)
    records = _run(lambda w, i: torch.nn.functional.embedding(i, w), w, ids)
    kernel = next(r.kernel for r in records if isinstance(r.kernel, IndirectKernel))
    (ix,) = [v for v in kernel.values if isinstance(v, Indirect)]
    assert ix.bound == 100 and "embedding" in ix.op


def test_embedding_moves_whole_rows():
    """Each gathered row is one DMA of its sticks, not one element per stick: the gather
    instructions move rows of the table's row bytes."""
    import json

    w = torch.randn(64, 256, generator=_gen(0))
    ids = torch.randint(0, 64, (16,), generator=_gen(1))
    records = _run(lambda w, i: torch.nn.functional.embedding(i, w), w, ids)
    (record,) = [r for r in records if isinstance(r.kernel, IndirectKernel)]
    program = json.loads((record.artifact / "program.json").read_text())
    gathers = [i for c in program["body"]["cores"] for ins in c["units"]["ls"] for i in [ins]
               if i["@"] == "gather"]
    assert gathers and all(g["row_bytes"] == 256 * 4 for g in gathers)


def test_negative_ids_wrap_like_pytorch():
    x = torch.randn(10, 64, generator=_gen(2))
    idx = torch.tensor([-1, 0, -10, 3])
    _run(lambda x, i: x[i], x, idx)


def test_index_select_on_an_inner_dim():
    x = torch.randn(6, 40, 32, generator=_gen(3))
    idx = torch.tensor([39, 0, 7, 7, 12])
    _run(lambda x, i: torch.index_select(x, 1, i), x, idx)


def test_gather_along_the_last_dim():
    """An index that varies along the contiguous dim: one element per stick."""
    x = torch.randn(8, 100, generator=_gen(4))
    idx = torch.randint(0, 100, (8, 5), generator=_gen(5))
    _run(lambda x, i: torch.gather(x, 1, i), x, idx)


def test_take_along_dim_and_a_computed_index_gather_their_indices_from_memory():
    """take_along_dim's decomposition computes its index (``i % n``), ``a[i + 1]`` too; a gather
    takes its row indices from memory, so the computation is realized as a program of its own
    (lowerings.py) and the gather loads its result: two programs, on the card."""
    x = torch.randn(8, 100, generator=_gen(4))
    idx = torch.randint(0, 100, (8, 5), generator=_gen(5))
    records = _run(lambda x, i: torch.take_along_dim(x, i, dim=1), x, idx)
    rows = torch.randint(0, 7, (5,), generator=_gen(6))
    _run(lambda x, i: x[i + 1] * 2, x, rows)


def test_gather_along_dim_0():
    x = torch.randn(50, 64, generator=_gen(6))
    idx = torch.randint(0, 50, (7, 64), generator=_gen(7))
    _run(lambda x, i: torch.gather(x, 0, i), x, idx)


def test_gather_fused_with_pointwise_work():
    w = torch.randn(30, 64, generator=_gen(8))
    ids = torch.randint(0, 30, (9,), generator=_gen(9))
    scale = torch.randn(64, generator=_gen(10))
    out, _, records, warned, _ = compile_on_spyre(lambda w, i, s: torch.relu(w[i] * s + 1), w, ids, scale)
    torch.testing.assert_close(out[0].cpu(), torch.relu(w[ids] * scale + 1))
    assert not warned and all(r.artifact is not None for r in records if r.kernel is not None)


def test_masked_fill_is_pointwise():
    x = torch.randn(8, 100, generator=_gen(11))
    m = torch.rand(8, 100, generator=_gen(12)) > 0.5
    _run(lambda x, m: x.masked_fill(m, -1.5), x, m, indirect=False)


def test_kv_cache_index_copy_in_place():
    """A serving engine's KV-cache update: one position written in place into the input."""
    cache = torch.randn(1, 8, 1024, 128, generator=_gen(13)).half()
    pos = torch.tensor([517])
    new = torch.randn(1, 8, 1, 128, generator=_gen(14)).half()

    def update(c, p, v):
        c.index_copy_(2, p, v)
        return c.sum()  # something returned; the mutation is what matters

    cpu = cache.clone()
    out, dev_args, records, warned, _ = compile_on_spyre(update, cache, pos, new)
    update(cpu, pos, new)
    assert torch.equal(dev_args[0].cpu(), cpu)
    assert torch.equal(dev_args[0].cpu()[0, :, 517], new[0, :, 0])
    assert any(isinstance(r.kernel, IndirectKernel) and r.artifact is not None for r in records)


def test_kv_cache_index_put_in_place():
    cache = torch.randn(1, 8, 64, 128, generator=_gen(15)).half()
    pos = torch.tensor([3, 60])
    new = torch.randn(1, 8, 2, 128, generator=_gen(16)).half()

    def update(c, p, v):
        c[:, :, p] = v
        return c

    _run(update, cache, pos, new)


def test_index_put_accumulate_with_duplicates_is_exact():
    x = torch.zeros(10, 64)
    idx = torch.tensor([1, 1, 3, 1, 9, 3])
    v = torch.arange(6 * 64, dtype=torch.float32).reshape(6, 64) / 7
    out, dev_args, records, warned, _ = compile_on_spyre(
        lambda x, i, v: x.index_put_((i,), v, accumulate=True), x, idx, v)
    want = torch.zeros(10, 64).index_put_((idx,), v, accumulate=True)
    torch.testing.assert_close(dev_args[0].cpu(), want)
    assert dev_args[0].cpu()[1, 5] == v[0, 5] + v[1, 5] + v[3, 5]
    assert any(isinstance(r.kernel, IndirectKernel) and r.artifact is not None for r in records)


def test_index_add_and_scatter_add_with_duplicates():
    x = torch.randn(4, 16, generator=_gen(17))
    idx = torch.tensor([[0, 0, 5, 5, 5, 15]] * 4)
    src = torch.ones(4, 6) * 0.5
    _run(lambda x, i, s: x.scatter_add(1, i, s), x, idx, src)
    rows = torch.tensor([2, 0, 2])
    _run(lambda x, i, s: x.index_add(0, i, s), x, rows, torch.full((3, 16), 0.25))


def test_scatter_without_accumulate():
    x = torch.randn(4, 16, generator=_gen(18))
    idx = torch.tensor([[3, 1, 7]] * 4)
    src = torch.randn(4, 3, generator=_gen(19))
    _run(lambda x, i, s: x.scatter(1, i, s), x, idx, src)


def test_an_accumulating_scatter_is_never_split_where_cores_could_collide():
    from spyre_inductor.compiler.ir.kernel_ir import Buffer, Index, Kernel, Store
    from spyre_inductor.compiler.families.indirect.lowering import lower
    from spyre_inductor.compiler.families.indirect.plan import plan, safe_dims
    from spyre_inductor.compiler.core.tiling import plan_tiling

    # index_put(accumulate) of 512 rows of 64 into a (10, 64) buffer: the rows may repeat, the
    # columns never meet
    k = Kernel.of("acc", (512, 64), (Buffer("ids", "int64", (512,), (1,)), Buffer("v", "fp32", (512, 64), (64, 1)),
                                     Buffer("x", "fp32", (10, 64), (64, 1))),
                  (Load("ids", Index((1, 0)), "int64"), Indirect(0, 10, True, "aten.index_put"),
                   Load("v", Index((64, 1)), "fp32")),
                  (Store("x", Index((0, 1), 0, ((1, 64),)), 2, "atomic_add"),))
    lowered = lower(k)
    tiling = plan_tiling(lowered.layout, lowered.tile_kernel)
    assert safe_dims(lowered, tiling) == (1,)
    plans, program = plan(k)
    for share in plans.division.shares:
        assert share.counts[0] == 512  # every core sees every contribution to its columns


def test_out_of_range_ids_raise_a_named_index_error_and_the_device_still_works():
    # The error is sticky, as every stream error: what is launched behind it is skipped or
    # refused, and a read raises instead of returning stale bytes; clear_errors() and go on.
    w = torch.randn(20, 64, generator=_gen(20))
    good = torch.tensor([1, 2, 3])
    bad = torch.tensor([1, 25, 3])
    with pytest.raises(IndexError):
        w[bad]  # what the CPU does
    fn = torch.compile(lambda w, i: torch.nn.functional.embedding(i, w))
    torch._dynamo.reset()
    wd = w.to("spyre")
    with pytest.raises(IndexError, match=r"embedding.*index 25 is out of bounds for size 20") as info:
        fn(wd, bad.to("spyre")).cpu()
    assert (info.value.op, info.value.value, info.value.bound)[1:] == (25, 20)
    assert "embedding" in info.value.op
    with pytest.raises(IndexError):  # sticky: work behind the failure is refused, never half-run
        fn(wd, good.to("spyre")).cpu()
    with pytest.raises(IndexError):
        torch.spyre.synchronize()
    torch.spyre.clear_errors()
    torch.testing.assert_close(fn(wd, good.to("spyre")).cpu(), w[good], rtol=0, atol=0)
    assert torch.equal(wd.cpu(), w)  # and the device memory is intact
    # embedding does not wrap negative ids (Inductor asks no wrap_neg): an error, as on the CPU
    with pytest.raises(IndexError):
        torch.nn.functional.embedding(torch.tensor([-1]), w)
    with pytest.raises(IndexError, match="index -1 is out of bounds for size 20"):
        fn(wd, torch.tensor([-1]).to("spyre")).cpu()
    torch.spyre.clear_errors()
    torch.testing.assert_close(fn(wd, good.to("spyre")).cpu(), w[good], rtol=0, atol=0)


def test_an_out_of_range_scatter_moves_nothing_of_its_tile():
    # every index of a tile is checked before any of its rows move (a larger scatter may have
    # written earlier tiles, as the CPU writes the rows before the bad one)
    x = torch.zeros(8, 64)
    fn = torch.compile(lambda x, i, v: x.index_copy_(0, i, v))
    torch._dynamo.reset()
    xd = x.to("spyre")
    with pytest.raises(IndexError, match="out of bounds for size 8"):
        fn(xd, torch.tensor([2, 8]).to("spyre"), torch.ones(2, 64).to("spyre"))
        torch.spyre.synchronize()
    torch.spyre.clear_errors()
    assert torch.equal(xd.cpu(), x)


def test_the_validator_bounds_a_gather_by_its_index_bound():
    from spyre_runtime.program import isa
    from spyre_runtime.program.operands import Addr, DevAddr, RowIndex, Tile
    from spyre_runtime.program.program import CoreProgram, Program, Symbol
    from spyre_runtime.program.validate import ProgramError, validate

    def program(bound):
        column = Tile(Addr(0), "int64", 4, 1, 128)
        g = isa.Gather(Addr(1024), DevAddr("w", 0), 4, 256, 0, 256, (RowIndex(column, 256, bound),), "t")
        syms = (Symbol("w", "input", "fp32", (10, 64), (64, 1)),)
        return Program("g", syms, (CoreProgram(0, (("ls", (g,)),)),))

    validate(program(10))
    with pytest.raises(ProgramError, match="indices up to 11"):
        validate(program(11))


def test_slice_and_select_scatter_are_pointwise():
    """slice_scatter/select_scatter reach the backend as pointwise kernels with index values and
    masks (index_expr, masked), not as indirect indexing: plain programs, no gather."""
    x, s = torch.randn(4, 16, generator=_gen(21)), torch.randn(4, 4, generator=_gen(22))
    _run(lambda x, s: torch.slice_scatter(x, s, 1, 2, 6), x, s, indirect=False)
    _run(lambda x, s: torch.select_scatter(x, s[:, 0], 1, 2), x, s, indirect=False)


def test_a_gather_and_a_scatter_beside_index_masks():
    # a rotary embedding of k with cos/sin rows gathered at the positions, written into a KV
    # cache at those positions: index masks (pieces), an iota-free gather and a scatter in one
    # kernel, under SPYRE_STRICT=1 (the module's fixture)
    def fn(k, cos, sin, pos, cache):
        c, s = cos[pos], sin[pos]
        rotated = k * c + torch.cat((-k[..., 32:], k[..., :32]), -1) * s
        cache.index_copy_(2, pos, rotated)
        return cache

    g = torch.Generator().manual_seed(0)
    k = torch.randn(1, 4, 8, 64, generator=g)
    cos, sin = torch.randn(128, 64, generator=g), torch.randn(128, 64, generator=g)
    pos, cache = torch.tensor([3, 9, 10, 11, 40, 41, 42, 100]), torch.randn(1, 4, 128, 64, generator=g)
    want = fn(k, cos, sin, pos, cache.clone())
    out, args, records, warned, _ = compile_on_spyre(fn, k, cos, sin, pos, cache)
    assert not warned and all(r.artifact is not None for r in records)
    import json

    plans = [json.loads((r.artifact / "plan.json").read_text()) for r in records]
    assert any("pieces" in p and p["family"] == "indirect" for p in plans)  # the masks cut, the pieces gather
    torch.testing.assert_close(args[4].cpu(), want, rtol=1e-6, atol=1e-6)


def test_an_embedding_feeding_a_norm_is_a_gather_then_a_reduction():
    # every decoder starts so; the lookup is realized (its own program) instead of being inlined
    # into the norm's reduction, which does not gather (the whole group ran on the CPU)
    g = _gen(7)
    w, ids = torch.randn(100, 64, generator=g), torch.randint(0, 100, (2, 9), generator=g)
    fn = lambda w, i: torch.nn.functional.layer_norm(torch.nn.functional.embedding(i, w), (64,))  # noqa: E731
    out, _, records, warned, _ = compile_on_spyre(fn, w, ids)
    assert not warned and len(records) == 2 and all(r.artifact is not None for r in records)
    torch.testing.assert_close(out[0].cpu(), fn(w, ids), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fn", [
    lambda x, t: x[t].sum(-1),
    lambda x, t: torch.nn.functional.cross_entropy(x, t),
    lambda x, t: torch.gather(x, 1, t[:, None]).mean(),
], ids=["gather-summed", "cross_entropy", "gather-mean"])
def test_a_gather_feeding_a_reduction_is_a_program_of_its_own(fn):
    # Inductor would inline the gather into the reduction's node (which does not gather);
    # realized on spyre it is its own program and the reduction reads its result
    g = _gen(9)
    x, t = torch.randn(8, 10, generator=g), torch.randint(0, 8, (8,), generator=g)
    out, _, records, warned, _ = compile_on_spyre(fn, x, t)
    assert not warned and len(records) >= 2 and all(r.artifact is not None for r in records)
    torch.testing.assert_close(out[0].cpu(), fn(x, t), rtol=1e-5, atol=1e-6)


def test_a_kv_cache_copy_fused_with_a_rotary_embedding_moves_its_rows_once():
    # Llama's prefill fuses k's rotary embedding, its cache write and v's cache write into one
    # kernel. rotate_half's mask cuts the head dim (64 fp16: one stick) into two half-stick
    # pieces; v's copy depends on no mask and is planned whole, so its rows move as whole sticks
    # once instead of as two half sticks, each charged a whole stick. Values exact in fp16
    # (quarters times halves, two products summed), so the fused fp32 arithmetic rounds nowhere.
    def fn(k, v, cos, sin, pos, k_cache, v_cache):
        rotated = k * cos + torch.cat((-k[..., 32:], k[..., :32]), -1) * sin
        k_cache.index_copy_(2, pos, rotated)
        v_cache.index_copy_(2, pos, v)
        return k_cache, v_cache

    g = _gen(3)
    # a prefill's 128 rows: with a decode step's few rows the extra plan costs more than it saves
    # and the planner keeps the cut of everything
    k, v = (torch.randint(-8, 8, (1, 2, 128, 64), generator=g).half() / 4 for _ in range(2))
    cos, sin = (torch.randint(-2, 3, (128, 64), generator=g).half() / 2 for _ in range(2))
    pos = torch.randperm(128, generator=g)
    caches = [torch.randn(1, 2, 128, 64, generator=g).half() for _ in range(2)]
    records = _run(fn, k, v, cos, sin, pos, *caches)
    assert len(records) == 1
    args = [a.to("spyre") for a in (k, v, cos, sin, pos, *caches)]
    torch._dynamo.reset()
    compiled = torch.compile(fn)
    compiled(*args)
    torch.spyre.synchronize()
    torch.spyre.reset_kernel_reports()
    compiled(*args)
    torch.spyre.synchronize()
    (report,) = torch.spyre.kernel_reports()
    rows, stick = 2 * 128, 128
    # k's two half-stick stores per row take a stick each, v's one: three sticks, not four
    assert report.bytes_written == 3 * rows * stick
