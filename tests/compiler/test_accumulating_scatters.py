"""Accumulating scatters in every dtype, and scatter_reduce, in spyre programs (issue 31), eager
and compiled, under SPYRE_STRICT=1 (compiler/inductor/accumulating_scatters.py).

What is pinned:
* fp16/bf16 ``index_add``, ``scatter_add``, ``index_put(accumulate=True)`` add every contribution
  in an fp32 accumulation buffer and round once. Against the same sum taken in fp32 on the CPU and
  rounded once: within one unit in the last place (the fp32 partial sums may be added in another
  order; in practice they are bit-equal). Against the CPU's own answer: ``scatter_add`` rounds once
  there too (same bound); ``index_add`` and ``index_put_`` round after every add, so with k
  contributions to one element the CPU's answer may be up to k half-ulps of the element's running
  magnitude (S = |x| + sum |src|) away from the exact sum, and ours one half-ulp of the result:
  the test checks |spyre - cpu| <= (k + 1) * eps / 2 * S element by element. Where they differ,
  ours is the closer to the exact sum (1000 adds of 0.1 into 0: ours 100.0, the CPU's 105.19).
* int64 accumulation is exact (values past 2**53, where an fp64 detour would round).
* ``scatter_reduce`` sum / mean / amax / amin / prod, include_self either way, against the CPU:
  amax/amin exactly (they pick a value), integer sums/means/prods exactly, float ones at the
  dtype's tolerance (fp32: 1e-5 relative to max|ref|; 16-bit: one ulp, both round the fp32 math
  once except prod, which the CPU rounds per multiply).
* an add into a dim of size 1 (Inductor turns its indirect index into the constant 0) keeps the
  destination's value (it used to be overwritten).
* ``embedding_bag`` sum / mean / max (padding_idx, CSR offsets, per_sample_weights, 2-d ids) against
  the CPU: max exactly, sums and means in one ulp (the CPU sums in fp32 and rounds once too), and
  the bookkeeping outputs (offset2bag, bag_size, max_indices) equal.
* what is not planned is refused by name.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from inductor_helpers import compile_on_spyre

SPYRE = "spyre"
HALVES = [torch.float16, torch.bfloat16]
EPS = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}


@pytest.fixture(autouse=True)
def strict(monkeypatch):
    monkeypatch.setenv("SPYRE_STRICT", "1")


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _on_card(fn, *args):
    """fn eager on spyre copies of args (strict: raises if any of it leaves the card) -> CPU result."""
    return fn(*[a.to(SPYRE) if isinstance(a, torch.Tensor) else a for a in args]).cpu()


def _compiled(fn, *args):
    """fn compiled on spyre: the CPU copy of its first output; every kernel ran as a program."""
    out, _, records, warned, _ = compile_on_spyre(fn, *args)
    assert not warned
    assert records and all(r.artifact is not None for r in records), [r.fallback_reason for r in records]
    return out[0].cpu()


WAYS = {"eager": _on_card, "compiled": _compiled}


def _rows(n=6, m=24, k=40, dtype=torch.float16, seed=0):
    """A destination of n rows, k source rows scattered into them (many duplicates)."""
    g = _gen(seed)
    x = torch.randn(n, m, generator=g).to(dtype)
    idx = torch.randint(0, n, (k,), generator=g)
    src = torch.randn(k, m, generator=g).to(dtype)
    return x, idx, src


def _fp32_reference(op, x, idx, src):
    """The same op with every add in fp32, rounded once to x's dtype."""
    return op(x.float(), idx, src.float()).to(x.dtype)


def _one_ulp(got, want, dtype):
    torch.testing.assert_close(got.float(), want.float(), rtol=EPS[dtype], atol=0)


INDEX_ADD = lambda x, i, s: x.index_add(0, i, s)  # noqa: E731
INDEX_PUT = lambda x, i, s: x.index_put((i,), s, accumulate=True)  # noqa: E731
SCATTER_ADD = lambda x, i, s: x.scatter_add(0, i.view(-1, 1).expand(-1, s.shape[1]).contiguous(), s)  # noqa: E731
ROUNDS_EVERY_ADD = {"index_add": INDEX_ADD, "index_put": INDEX_PUT}


# ---------------------------------------------------------------- 16-bit floats: one rounding

@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("name,op", [("index_add", INDEX_ADD), ("index_put", INDEX_PUT),
                                     ("scatter_add", SCATTER_ADD)])
def test_16_bit_accumulating_scatters_round_once(way, dtype, name, op):
    x, idx, src = _rows(dtype=dtype)
    got = WAYS[way](op, x, idx, src)
    assert got.dtype == dtype
    _one_ulp(got, _fp32_reference(op, x, idx, src), dtype)
    cpu = op(x, idx, src)
    if name in ROUNDS_EVERY_ADD:
        # the CPU rounds after each of the k adds into an element: the documented bound
        k = torch.bincount(idx, minlength=x.shape[0]).view(-1, 1).float()
        magnitude = x.float().abs().index_add(0, idx, src.float().abs())
        bound = (k + 1) * EPS[dtype] / 2 * magnitude
        assert ((got.float() - cpu.float()).abs() <= bound).all()
    else:
        _one_ulp(got, cpu, dtype)  # the CPU's scatter_add accumulates in fp32 too


@pytest.mark.parametrize("dtype", HALVES)
def test_many_duplicates_into_one_element_give_the_sum_rounded_once(dtype):
    # 1000 x 0.1 into one element: fp32 sum 99.98 (fp16) / 100.1 (bf16). The CPU's index_add rounds
    # every add: fp16 105.19, bf16 stalls at 32.0. Ours is the fp32 sum rounded once.
    x, idx = torch.zeros(4, dtype=dtype), torch.zeros(1000, dtype=torch.long)
    src = torch.full((1000,), 0.1, dtype=dtype)
    got = _on_card(lambda x, i, s: x.index_add(0, i, s), x, idx, src)
    exact = src.float().sum().to(dtype)
    assert got[0] == exact and (got[1:] == 0).all()
    assert abs(got[0].float() - src.float().sum()) < abs(x.index_add(0, idx, src)[0].float() - src.float().sum())
    # scatter_add (the CPU accumulates in fp32 and rounds once there too): equal to the CPU
    got = _compiled(lambda x, i, s: x.scatter_add(0, i, s), x, idx, src)
    assert torch.equal(got, x.scatter_add(0, idx, src))


@pytest.mark.parametrize("dtype", HALVES)
def test_16_bit_in_place_accumulation_writes_the_rounded_sum_back(dtype):
    x, idx, src = _rows(dtype=dtype, seed=3)

    def fn(x, i, s):
        x.index_add_(0, i, s, alpha=2)
        x.index_put_((i,), s, accumulate=True)
        return x

    out, args, records, warned, _ = compile_on_spyre(fn, x.clone(), idx, src)
    assert not warned and all(r.artifact is not None for r in records)
    # each op rounds its fp32 sum once
    want = x.float().index_add(0, idx, src.float(), alpha=2).to(dtype)
    want = want.float().index_put((idx,), src.float(), accumulate=True).to(dtype)
    _one_ulp(args[0].cpu(), want, dtype)


# ---------------------------------------------------------------- int64: exact

@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("name,op", [("index_add", INDEX_ADD), ("index_put", INDEX_PUT),
                                     ("scatter_add", SCATTER_ADD)])
def test_int64_accumulating_scatters_are_exact(way, name, op):
    g = _gen(5)
    x = torch.randint(-2 ** 60, 2 ** 60, (5, 8), generator=g)
    idx = torch.tensor([0, 3, 3, 1, 3, 0, 4])
    src = torch.randint(-2 ** 55, 2 ** 55, (7, 8), generator=g) | 1  # odd: past 2**53 fp64 would round
    got = WAYS[way](op, x, idx, src)
    assert got.dtype == torch.int64 and torch.equal(got, op(x, idx, src))


def test_int64_scatter_add_wraps_as_the_cpu_does():
    x = torch.full((2,), 2 ** 62, dtype=torch.int64)
    idx, src = torch.tensor([1, 1]), torch.full((2,), 2 ** 62, dtype=torch.int64)
    assert torch.equal(_on_card(lambda x, i, s: x.scatter_add(0, i, s), x, idx, src), x.scatter_add(0, idx, src))


# ---------------------------------------------------------------- scatter_reduce

def _reduce_tol(reduce, dtype, want):
    if not dtype.is_floating_point or reduce in ("amax", "amin"):
        return dict(rtol=0, atol=0)
    if dtype == torch.float32:
        return dict(rtol=0, atol=1e-5 * max(want.abs().max().item(), 1.0))
    if reduce == "prod":  # the CPU rounds after every multiply, we once: one ulp per factor (<= 4 here)
        return dict(rtol=4 * EPS[dtype], atol=0)
    return dict(rtol=EPS[dtype], atol=0)


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32])
@pytest.mark.parametrize("reduce", ["sum", "mean", "amax", "amin", "prod"])
def test_scatter_reduce_matches_the_cpu(way, dtype, reduce):
    g = _gen(7)
    x = (torch.randn(5, 12, generator=g) * 4).to(dtype)
    idx = torch.randint(0, 5, (9, 12), generator=g)
    idx[:, 0] = 2  # a column where most positions get nothing (include_self=False keeps x there)
    src = (torch.randn(9, 12, generator=g) * 4).to(dtype)
    if reduce == "prod":  # keep products in range: factors near 1 (ints: -1, 1, 2)
        src = (torch.randint(-1, 3, (9, 12), generator=g).to(dtype) if not dtype.is_floating_point
               else (1 + torch.rand(9, 12, generator=g) / 4).to(dtype))
        idx = torch.arange(9).remainder(5).view(-1, 1).expand(9, 12).contiguous()  # <= 2 factors each
    for include_self in (True, False):
        def fn(x, i, s):
            return x.scatter_reduce(0, i, s, reduce, include_self=include_self)

        got, want = WAYS[way](fn, x, idx, src), fn(x, idx, src)
        assert got.dtype == dtype
        torch.testing.assert_close(got, want, **_reduce_tol(reduce, dtype, want))


def test_scatter_reduce_along_the_last_dim_with_a_narrower_index():
    # the index covers 3 of x's 6 rows: the other rows keep x's values
    g = _gen(9)
    x, src = torch.randn(6, 10, generator=g), torch.randn(3, 7, generator=g)
    idx = torch.randint(0, 10, (3, 4), generator=g)
    for reduce in ("amax", "mean"):
        for include_self in (True, False):
            fn = lambda x, i, s: x.scatter_reduce(1, i, s, reduce, include_self=include_self)  # noqa: E731
            torch.testing.assert_close(_on_card(fn, x, idx, src), fn(x, idx, src), rtol=0, atol=1e-6)


def test_scatter_reduce_in_place_compiled():
    g = _gen(11)
    x, src = torch.randn(4, 16, generator=g).half(), torch.randn(4, 16, generator=g).half()
    idx = torch.randint(0, 4, (4, 16), generator=g)

    def fn(x, i, s):
        x.scatter_reduce_(0, i, s, "amax", include_self=False)
        return x

    out, args, records, warned, _ = compile_on_spyre(fn, x.clone(), idx, src)
    assert not warned and all(r.artifact is not None for r in records)
    assert torch.equal(args[0].cpu(), fn(x.clone(), idx, src))


def test_a_dense_scatter_reduce_past_its_compare_budget_is_refused_by_name():
    from spyre_inductor.compiler.inductor.accumulating_scatters import MAX_PAIRS

    n = MAX_PAIRS // 4096 + 1
    x, idx, src = torch.zeros(4096), torch.zeros(n, dtype=torch.long), torch.ones(n)
    with pytest.raises(NotImplementedError, match=r"scatter_reduce\('amax'\) compares 4096 x"):
        _on_card(lambda x, i, s: x.scatter_reduce(0, i, s, "amax"), x, idx, src)


# ---------------------------------------------------------------- a dim of size 1

@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.int64, torch.float16])
def test_an_add_into_a_dim_of_size_one_keeps_the_destination(dtype):
    # Inductor makes the indirect index into a size-1 dim the constant 0: the accumulating store
    # has no index term left, and was planned as a plain store (x.index_add(0, [0], s) gave s)
    x = torch.tensor([[5, 6]], dtype=dtype)
    idx, src = torch.tensor([0]), torch.tensor([[3, 4]], dtype=dtype)
    assert torch.equal(_compiled(INDEX_ADD, x, idx, src), INDEX_ADD(x, idx, src))
    scalar, one = torch.tensor(2, dtype=dtype), torch.tensor(3, dtype=dtype)
    fn = lambda x, i, s: x.index_add(0, i, s, alpha=-1)  # noqa: E731
    assert torch.equal(_on_card(fn, scalar, idx, one), fn(scalar, idx, one))


# ---------------------------------------------------------------- the family's guard; strict off

def test_the_indirect_family_refuses_a_16_bit_accumulating_scatter_kernel(monkeypatch):
    # the lowering never builds one (it accumulates in fp32); a kernel that does is refused by
    # name rather than planned as one rounding per contribution
    from spyre_inductor.compiler import backend
    from spyre_inductor.compiler.ir.errors import Unsupported
    from spyre_inductor.compiler.ir.kernel_ir import IndirectKernel, Kernel

    x, idx, src = torch.zeros(8, 64), torch.tensor([1, 1, 3]), torch.ones(3, 64)
    _, _, records, _, _ = compile_on_spyre(INDEX_ADD, x, idx, src)
    kernel = next(r.kernel for r in records if isinstance(r.kernel, IndirectKernel))
    halved = Kernel.from_json(kernel.to_json().replace('"fp32"', '"fp16"'))
    with pytest.raises(Unsupported, match="rounds every contribution"):
        backend.plan_kernel(halved)


def test_without_strict_nothing_falls_back_either(monkeypatch):
    monkeypatch.delenv("SPYRE_STRICT")
    x, idx, src = _rows(dtype=torch.bfloat16, seed=13)
    out, _, records, warned, _ = compile_on_spyre(INDEX_ADD, x, idx, src)
    assert not warned and all(r.artifact is not None for r in records)
    _one_ulp(out[0].cpu(), _fp32_reference(INDEX_ADD, x, idx, src), torch.bfloat16)
    plans = [json.loads((r.artifact / "plan.json").read_text())["family"] for r in records]
    assert "indirect" in plans


# ---------------------------------------------------------------- embedding_bag

def _bags(dtype, seed=21):
    """A table, 1-d ids in 4 bags by offsets (CSR: the third bag empty), weights per id."""
    g = _gen(seed)
    w = torch.randn(20, 16, generator=g).to(dtype)
    ids = torch.randint(0, 20, (11,), generator=g)
    ids[3] = 7  # padding_idx below
    offsets = torch.tensor([0, 4, 9, 9])
    psw = torch.rand(11, generator=g).to(dtype)
    return w, ids, offsets, psw


def _bag_tol(dtype, mode):
    if mode == "max":
        return dict(rtol=0, atol=0)  # picks a value
    if dtype == torch.float32:
        return dict(rtol=1e-5, atol=1e-6)
    return dict(rtol=EPS[dtype], atol=0)  # the CPU sums in fp32 and rounds once too


@pytest.mark.parametrize("way", WAYS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_matches_the_cpu(way, dtype, mode):
    w, ids, offsets, psw = _bags(dtype)
    cases = [
        (lambda w, i, o: F.embedding_bag(i, w, o, mode=mode), (w, ids, offsets)),
        (lambda w, i, o: F.embedding_bag(i, w, o, mode=mode, padding_idx=7), (w, ids, offsets)),
        # CSR offsets: the last one is the number of ids
        (lambda w, i, o: F.embedding_bag(i, w, o, mode=mode, include_last_offset=True),
         (w, ids, torch.cat([offsets, torch.tensor([11])]))),
        (lambda w, i: F.embedding_bag(i, w, mode=mode), (w, ids[:10].view(2, 5))),  # 2-d ids: bags of 5
    ]
    if mode == "sum":
        cases.append((lambda w, i, o, p: F.embedding_bag(i, w, o, mode="sum", per_sample_weights=p),
                      (w, ids, offsets, psw)))
    for fn, args in cases:
        got, want = WAYS[way](fn, *args), fn(*args)
        assert got.dtype == dtype
        torch.testing.assert_close(got, want, **_bag_tol(dtype, mode))


@pytest.mark.parametrize("mode", [1, 2])  # mean, max: the CPU fills every output then
def test_embedding_bag_bookkeeping_outputs_match_the_cpu(mode):
    w, ids, offsets, _ = _bags(torch.float32, seed=23)
    ids[5] = ids[6]  # a tie in a max: the first position's row wins

    def fn(w, i, o):
        return torch.ops.aten._embedding_bag_forward_only(w, i, o, False, mode, False, None, False, -1)

    got = fn(w.to(SPYRE), ids.to(SPYRE), offsets.to(SPYRE))
    want = fn(w, ids, offsets)
    torch.testing.assert_close(got[0].cpu(), want[0], rtol=1e-6, atol=1e-6)
    assert torch.equal(got[1].cpu(), want[1]) and torch.equal(got[2].cpu(), want[2])  # offset2bag, bag_size
    if mode == 2:
        assert torch.equal(got[3].cpu(), want[3])  # max_indices
    else:  # the meta of a non-CPU device: none (the CPU repeats bag_size there)
        assert got[3].shape == (0,)


def test_embedding_bag_of_many_duplicates_rounds_once():
    w, offsets = torch.full((4, 8), 0.1, dtype=torch.float16), torch.tensor([0])
    ids = torch.zeros(1000, dtype=torch.long)
    got = _compiled(lambda w, i, o: F.embedding_bag(i, w, o, mode="sum"), w, ids, offsets)
    once = torch.tensor(1000 * 0.0999755859375).half()  # 1000 x fp16(0.1), in fp32, rounded once
    assert got[0, 0] == once == F.embedding_bag(ids, w, offsets, mode="sum")[0, 0]


# ---------------------------------------------------------------- a dim of size 1, many contributions

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64])
def test_many_adds_into_a_dim_of_size_one_are_summed_first(dtype):
    # with the index gone, several iterations would write one element: no scatter plans that, so
    # the lowering sums the contributions along the dim (a reduction) and adds them once
    x, idx, src = torch.ones(1, 4, dtype=dtype), torch.tensor([0, 0, 0]), torch.arange(12).view(3, 4).to(dtype)
    for fn in (lambda x, i, s: x.index_add(0, i, s, alpha=2),
               lambda x, i, s: x.scatter_add(0, i.view(3, 1).expand(3, 4).contiguous(), s)):
        assert torch.equal(_on_card(fn, x, idx, src), fn(x, idx, src))
    x, idx = torch.ones(3, 1, 4, dtype=dtype), torch.zeros(2, 1, 3, dtype=torch.long)
    src = torch.arange(16).view(2, 2, 4).to(dtype)
    for reduce, include_self in (("sum", True), ("sum", False), ("mean", True), ("mean", False)):
        # a narrower index: x kept past it
        fn = lambda x, i, s: x.scatter_reduce(1, i, s, reduce, include_self=include_self)  # noqa: E731
        assert torch.equal(_compiled(fn, x, idx, src), fn(x, idx, src))
    w, ids = torch.randn(6, 8).to(dtype) if dtype.is_floating_point else None, torch.tensor([1, 4, 4])
    if w is not None:  # one bag
        fn = lambda w, i: F.embedding_bag(i, w, torch.tensor([0], device=i.device), mode="mean")  # noqa: E731
        torch.testing.assert_close(_on_card(fn, w, ids), fn(w, ids), **_bag_tol(dtype, "mean"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.float16])
def test_in_place_accumulation_of_values_read_from_the_destination(dtype):
    # fp32/int64 scatter into the destination itself (one pass); values computed from it are
    # realized first, so a duplicate never reads what an earlier add wrote
    x, idx = torch.arange(24).view(6, 4).to(dtype), torch.tensor([1, 1, 3])

    def fn(x, i):
        x.index_put_((i,), x[:3] * 2, accumulate=True)
        x.scatter_add_(0, i.view(3, 1).expand(3, 4).contiguous(), x[2:5].clone())
        return x

    _, args, records, warned, _ = compile_on_spyre(fn, x.clone(), idx)
    assert not warned and all(r.artifact is not None for r in records)
    assert torch.equal(args[0].cpu(), fn(x.clone(), idx))
