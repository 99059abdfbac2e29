"""topk, sort and argsort in spyre programs (issue 31), eager and compiled, under SPYRE_STRICT=1.

Both ways lower as compiler/inductor/sorting.py says: rows of a static length go to the sort
family (one program: a bitonic network over tiles of rows, values and indices together); a row
length known only at launch keeps the rank count (a reduction counts, for every element, the
elements that come before it, and a scatter by rank writes values and indices).
What is pinned against the CPU:
* values exactly (a sort moves elements, it computes nothing), NaNs where the CPU puts them;
* indices exactly against the CPU's *stable* sort: ties in input order. The CPU's unstable sort and
  its topk may order ties otherwise (they do from ~64 elements a row), so for those the indices
  are checked to select the values (``gather(x, indices) == values``) and to be the stable order;
* a bad k raises PyTorch's error.
"""

from __future__ import annotations

import pytest
import torch

from inductor_helpers import compile_on_spyre

NAN = float("nan")


@pytest.fixture(autouse=True)
def strict(monkeypatch):
    monkeypatch.setenv("SPYRE_STRICT", "1")


def _tied(shape, dtype, seed=0):
    """Values from a set of 5, so most rows have ties; a NaN or two in float rows."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-2, 3, shape, generator=g).to(dtype)
    if dtype.is_floating_point:
        x = x + torch.rand(shape, generator=g).to(dtype).round()  # some ties survive, some are broken
        flat = x.view(-1)
        flat[:: max(1, flat.numel() // 3)] = NAN
        flat[1] = -0.0
    return x


def _stable(x, dim, descending):
    return torch.sort(x, dim=dim, descending=descending, stable=True)


def _assert_values(got, want):
    assert got.device.type == "spyre"
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, equal_nan=True)


def _assert_indices(got, want):
    assert got.device.type == "spyre" and got.dtype == torch.int64
    assert torch.equal(got.cpu(), want)


def _all_on_card(records):
    assert records and all(r.artifact is not None for r in records), \
        [(r.ops, r.fallback_reason) for r in records if r.artifact is None]


# ---------------------------------------------------------------- eager (compile-backed ops)

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32])
@pytest.mark.parametrize("shape,dim", [((8,), 0), ((4, 8), -1), ((3, 5, 16), 1)])
def test_eager_sort_and_argsort_match_the_cpu_stable_sort(dtype, shape, dim):
    x = _tied(shape, dtype)
    xs = x.to("spyre")
    for descending in (False, True):
        want = _stable(x, dim, descending)
        values, indices = torch.sort(xs, dim=dim, descending=descending, stable=True)
        _assert_values(values, want.values)
        _assert_indices(indices, want.indices)
        _assert_indices(torch.argsort(xs, dim=dim, descending=descending, stable=True), want.indices)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64])
def test_eager_unstable_sort_gives_the_cpu_values_and_ties_in_input_order(dtype):
    x = _tied((6, 40), dtype, seed=1)
    values, indices = torch.sort(x.to("spyre"), descending=True)
    _assert_values(values, torch.sort(x, descending=True).values)
    _assert_indices(indices, _stable(x, -1, True).indices)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64])
@pytest.mark.parametrize("k", [1, 3, 16])
@pytest.mark.parametrize("largest", [True, False])
def test_eager_topk_along_the_last_dim(dtype, k, largest):
    x = _tied((5, 16), dtype, seed=k)
    values, indices = torch.topk(x.to("spyre"), k, largest=largest)
    want = torch.topk(x, k, largest=largest)
    _assert_values(values, want.values)
    _assert_indices(indices, _stable(x, -1, largest).indices[:, :k])
    torch.testing.assert_close(torch.gather(x, 1, indices.cpu()), want.values, rtol=0, atol=0, equal_nan=True)


def test_eager_topk_along_dim_0_and_into_out_tensors():
    x = _tied((12, 3), torch.float32, seed=4)
    out = (torch.empty(0, device="spyre"), torch.empty(0, dtype=torch.int64, device="spyre"))
    torch.topk(x.to("spyre"), 2, dim=0, out=out)
    _assert_values(out[0], torch.topk(x, 2, dim=0).values)
    _assert_indices(out[1], _stable(x, 0, True).indices[:2])


def test_eager_topk_and_sort_of_a_long_row():
    """Eager ops compile the same lowerings: a topk of rows past a segment (two networks and a
    gather), a sort of rows of 10000 (one network over rows padded to 16384)."""
    x = _tied((2, 10000), torch.float32, seed=9)
    xs = x.to("spyre")
    values, indices = torch.topk(xs, 5, largest=False)
    want = _stable(x, -1, False)
    _assert_values(values, want.values[:, :5])
    _assert_indices(indices, want.indices[:, :5])
    values, indices = torch.sort(xs, descending=True, stable=True)
    want = _stable(x, -1, True)
    _assert_values(values, want.values)
    _assert_indices(indices, want.indices)


def test_nan_comes_first_when_largest_and_last_when_smallest():
    x = torch.tensor([[1.0, NAN, 3.0, NAN, -1.0]])
    xs = x.to("spyre")
    _assert_indices(torch.topk(xs, 3).indices, torch.tensor([[1, 3, 2]]))
    _assert_indices(torch.argsort(xs, stable=True), torch.tensor([[4, 0, 2, 1, 3]]))


def test_a_k_larger_than_the_dim_raises_the_op_error(monkeypatch):
    xs = torch.randn(4, 8).to("spyre")
    with pytest.raises(RuntimeError, match="selected index k out of range"):
        torch.topk(torch.randn(4, 8), 9)  # the CPU's words
    # strict: nothing may run on the CPU, so the error is the op's own check on fake tensors
    # (the one torch.compile raises on the CPU too)
    with pytest.raises(RuntimeError, match="topk.*k not in range for dimension"):
        torch.topk(xs, 9)
    monkeypatch.delenv("SPYRE_STRICT")
    with pytest.raises(RuntimeError, match="selected index k out of range"):
        torch.topk(xs, 9)  # not strict: the CPU kernel runs and raises its own error


# ---------------------------------------------------------------- compiled

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64])
def test_compiled_topk_sort_and_argsort_on_the_card(dtype):
    x = _tied((6, 24), dtype, seed=7)

    def f(a):
        top = torch.topk(a, 4)
        low = torch.topk(a, 1, dim=0, largest=False)
        s = torch.sort(a, dim=-1, stable=True)
        return top.values, top.indices, low.values, low.indices, s.values, torch.argsort(a, descending=True, stable=True)

    out, _, records, warned, _ = compile_on_spyre(f, x)
    assert not warned
    _all_on_card(records)
    _assert_values(out[0], torch.topk(x, 4).values)
    _assert_indices(out[1], _stable(x, -1, True).indices[:, :4])
    _assert_values(out[2], torch.topk(x, 1, dim=0, largest=False).values)
    _assert_indices(out[3], _stable(x, 0, False).indices[:1])
    _assert_values(out[4], _stable(x, -1, False).values)
    _assert_indices(out[5], _stable(x, -1, True).indices)


def test_compiled_sort_is_one_sort_family_program():
    x = torch.randn(8, 32)
    out, _, records, _, _ = compile_on_spyre(lambda a: torch.sort(a, descending=True), x)
    _all_on_card(records)
    kinds = sorted(type(r.kernel).__name__ for r in records)
    assert kinds == ["SortKernel"], kinds  # values and indices from one program
    _assert_values(out[0], torch.sort(x, descending=True).values)
    _assert_indices(out[1], _stable(x, -1, True).indices)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int16, torch.int8, torch.uint8])
@pytest.mark.parametrize("shape", [(3, 1), (5, 7), (2, 64), (3, 100), (2, 1024), (1, 4096)])
def test_compiled_sort_and_topk_of_rows_the_network_pads(dtype, shape):
    x = _tied(shape, dtype, seed=shape[1])
    k = min(5, shape[1])

    def f(a):
        s = torch.sort(a, descending=True, stable=True)
        t = torch.topk(a, k, largest=False, sorted=False)
        return s.values, s.indices, t.values, t.indices

    out, _, records, warned, _ = compile_on_spyre(f, x)
    assert not warned
    _all_on_card(records)
    assert {type(r.kernel).__name__ for r in records} == {"SortKernel"}
    want = _stable(x, -1, True)
    _assert_values(out[0], want.values)
    _assert_indices(out[1], want.indices)
    low = _stable(x, -1, False)
    _assert_values(out[2], low.values[:, :k])  # (sorted=False: sorted is one order the CPU allows)
    _assert_indices(out[3], low.indices[:, :k])


def test_compiled_sort_over_several_row_lengths_sorts_each_length_with_the_network():
    """dynamic=True: one graph for every row length. The network needs the length when it is
    planned, so the graph calls the op (sorting.py: a symbolic length past what the rank count
    takes), whose compile-backed spyre kernel plans one network per length it meets: exact at
    every length, on the card, a sort family program each."""
    from spyre_inductor.compiler.inductor.scheduling import record_kernels

    torch._dynamo.reset()
    f = torch.compile(lambda a: torch.sort(a, descending=True, stable=True), dynamic=True)
    for n in (8, 13, 24, 40):
        x = _tied((4, n), torch.float32, seed=n)
        with record_kernels() as records, torch._inductor.config.patch(force_disable_caches=True):
            values, indices = f(x.to("spyre"))
        _all_on_card(records)
        assert [(type(r.kernel).__name__, r.kernel.source.shape) for r in records] == [("SortKernel", (4, n))]
        want = _stable(x, -1, True)
        _assert_values(values, want.values)
        _assert_indices(indices, want.indices)


def _compiled_over(shapes, fn, dynamic_dims):
    """fn compiled once, called on _tied inputs of each shape with `dynamic_dims` marked dynamic:
    [(input, outputs, the kernels compiled by that call)]."""
    from spyre_inductor.compiler.inductor.scheduling import record_kernels

    torch._dynamo.reset()
    f = torch.compile(fn)
    out = []
    for shape in shapes:
        x = _tied(shape, torch.float32, seed=shape[0])
        xs = x.to("spyre")
        for d in dynamic_dims:
            torch._dynamo.mark_dynamic(xs, d)
        with record_kernels() as records, torch._inductor.config.patch(force_disable_caches=True):
            got = f(xs)
        out.append((x, got, list(records)))
    return out


def test_compiled_topk_over_a_dynamic_count_of_rows_is_one_bucketed_network():
    """A dynamic count of rows (tokens into a router): the network planned at the bucket's maximum,
    its transfers clipped to the rows of the launch; a size in another bucket compiles that
    bucket's kernel from the artifact's kernel.json (the family's rebucket) at run time."""
    calls = _compiled_over([(5, 24), (9, 24), (30, 24), (70, 24)], lambda a: torch.topk(a, 3), [0])
    (_, _, records), *_ = calls
    _all_on_card(records)
    (kernel,) = [r.kernel for r in records]
    assert type(kernel).__name__ == "SortKernel" and kernel.symbolic is not None
    for x, (values, indices), _ in calls:
        _assert_values(values, torch.topk(x, 3).values)
        _assert_indices(indices, _stable(x, -1, True).indices[:, :3])


def test_compiled_topk_of_long_rows_over_a_dynamic_count_of_rows():
    """Segments (sort_segments.py) over a dynamic count of rows: both networks bucketed, the
    candidates' index add and gather symbolic too."""
    calls = _compiled_over([(3, 9000), (5, 9000), (20, 9000)], lambda a: torch.topk(a, 4), [0])
    (_, _, records), *_ = calls
    _all_on_card(records)
    assert [type(r.kernel).__name__ for r in records].count("SortKernel") == 2
    for x, (values, indices), _ in calls:
        want = _stable(x, -1, True)
        _assert_values(values, want.values[:, :4])
        _assert_indices(indices, want.indices[:, :4])


def test_rows_counted_by_two_dynamic_sizes_keep_the_rank_count():
    """Where the network does not apply: rows that are a product of two sizes known only at launch
    (a kernel serves one size symbol): the rank count and its scatters, exact at every size."""
    calls = _compiled_over([(3, 5, 16), (4, 7, 16)], lambda a: torch.sort(a, descending=True), [0, 1])
    (_, _, records), *_ = calls
    _all_on_card(records)
    assert "SortKernel" not in {type(r.kernel).__name__ for r in records}
    for x, (values, indices), _ in calls:
        want = _stable(x, -1, True)
        _assert_values(values, want.values)
        _assert_indices(indices, want.indices)


def test_compiled_topk_of_several_static_row_lengths_is_a_network_each():
    """Without dynamic shapes each row length compiles a graph of its own, each a sort family program."""
    for n in (6, 64, 130):
        x = _tied((3, n), torch.float16, seed=n)
        out, _, records, _, _ = compile_on_spyre(lambda a: torch.topk(a, 4), x, dynamic=False)
        _all_on_card(records)
        assert [type(r.kernel).__name__ for r in records] == ["SortKernel"]
        _assert_values(out[0], torch.topk(x, 4).values)
        _assert_indices(out[1], _stable(x, -1, True).indices[:, :4])


def test_compiled_topk_k_equal_to_n_and_its_bad_k():
    x = _tied((3, 8), torch.float32, seed=3)
    out, _, records, _, _ = compile_on_spyre(lambda a: torch.topk(a, 8, largest=False), x)
    _all_on_card(records)
    _assert_values(out[0], torch.topk(x, 8, largest=False).values)
    _assert_indices(out[1], _stable(x, -1, False).indices)
    with pytest.raises(Exception, match="k not in range for dimension"):
        compile_on_spyre(lambda a: torch.topk(a, 9), x)


def test_a_row_longer_than_the_limit_is_refused_by_name_under_strict(monkeypatch):
    """A sort too long for the network's scratchpad (2**17 padded fp32 keys and their indices) and
    for the rank count's MAX_N: Inductor's fallback, refused under strict."""
    from spyre_inductor.compiler.inductor import sorting

    monkeypatch.setattr(sorting, "MAX_N", 16)
    with pytest.raises(Exception, match="aten.sort"):
        compile_on_spyre(lambda a: torch.sort(a), torch.randn(1, 2 ** 16 + 1))


@pytest.mark.parametrize("shape,k,largest,dtype", [
    ((1, 100000), 50, True, torch.float32),   # top-k sampling over a vocabulary: 25 segments
    ((2, 10000), 5, False, torch.float32),    # the last segment padded with NaN (it sorts last)
    ((3, 9000), 7, True, torch.int32),        # padded with the integer minimum
    ((2, 8192), 1, True, torch.float16),      # no padding
])
def test_compiled_topk_of_a_row_longer_than_a_segment_is_two_networks_and_a_gather(shape, k, largest, dtype):
    x = _tied(shape, dtype, seed=k)
    out, _, records, warned, _ = compile_on_spyre(lambda a: torch.topk(a, k, largest=largest), x)
    assert not warned
    _all_on_card(records)
    assert [type(r.kernel).__name__ for r in records].count("SortKernel") == 2
    want = _stable(x, -1, largest)
    _assert_values(out[0], want.values[:, :k])
    _assert_indices(out[1], want.indices[:, :k])


# ---------------------------------------------------------------- mixture-of-experts routing pieces

def test_compiled_router_top_k_gates_on_the_card():
    """A Mixtral router's top-k gates, renormalized (transformers' MixtralTopKRouter), and the
    count of (token, slot) pairs per expert, on their own graph."""
    torch.manual_seed(0)
    hidden, weight = torch.randn(10, 16), torch.randn(8, 16)

    def route(h, w):
        probs = torch.softmax(torch.nn.functional.linear(h, w).float(), dim=-1)
        top, index = torch.topk(probs, 2, dim=-1)
        top = top / top.sum(dim=-1, keepdim=True)
        per_expert = torch.histc(index.reshape(-1).to(torch.int32), bins=8, min=0, max=7)
        return top, index, per_expert

    out, _, records, warned, _ = compile_on_spyre(route, hidden, weight)
    assert not warned
    _all_on_card(records)
    probs = torch.softmax(torch.nn.functional.linear(hidden, weight), dim=-1)
    top, index = torch.topk(probs, 2, dim=-1)
    torch.testing.assert_close(out[0].cpu(), top / top.sum(dim=-1, keepdim=True), rtol=1e-5, atol=1e-6)
    _assert_indices(out[1], index)
    assert torch.equal(out[2].cpu(), torch.histc(index.reshape(-1).float(), bins=8, min=0, max=7).int())


def test_one_hot_runs_eager_under_strict_and_a_bad_class_is_the_scatters_device_error():
    index = torch.tensor([[0, 2], [1, 3], [2, 0]])
    _assert_indices(torch.nn.functional.one_hot(index.to("spyre"), 5), torch.nn.functional.one_hot(index, 5))
    # ATen's one_hot checks the class range on the CPU only; on CUDA and PrivateUse1 it relies on
    # its scatter's device assert: here the scatter program's index check, raised at the sync
    with pytest.raises(IndexError, match="out of bounds for size 5"):
        torch.nn.functional.one_hot(torch.tensor([7]).to("spyre"), 5)
        torch.spyre.synchronize()
    torch.spyre.clear_errors()


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.int64])
def test_eager_histc_counts_expert_ids(dtype):
    """transformers counts the (token, slot) pairs per expert with histc: float ids on the CPU,
    int ids on every other device (the CPU's histc refuses integers; CUDA's counts them)."""
    ids = torch.tensor([3, 0, 1, 1, 7, 3, 3, 5, 0, 6])
    got = torch.histc(ids.to(dtype).to("spyre"), bins=8, min=0, max=7)
    assert got.dtype == dtype
    _assert_values(got, torch.histc(ids.float(), bins=8, min=0, max=7).to(dtype))


def test_eager_histc_of_floats_outside_the_range_and_nan_like_the_cpu():
    x = torch.tensor([0.0, 0.5, 1.0, 2.99, 3.0, 3.5, -1.0, NAN, 1.5, 2.25])
    _assert_values(torch.histc(x.to("spyre"), bins=4, min=0, max=3), torch.histc(x, bins=4, min=0, max=3))


def _grouped_case():
    g = torch.Generator().manual_seed(2)
    a, w = torch.randn(10, 8, generator=g), torch.randn(4, 8, 16, generator=g)
    offs = torch.tensor([3, 3, 7, 10], dtype=torch.int32)  # expert 1 gets no row
    return a, w, offs


def test_eager_grouped_mm_against_the_cpu():
    a, w, offs = _grouped_case()
    got = torch.nn.functional.grouped_mm(a.to("spyre"), w.to("spyre"), offs=offs.to("spyre"))
    torch.testing.assert_close(got.cpu(), torch.nn.functional.grouped_mm(a, w, offs=offs), rtol=1e-5, atol=1e-5)


def test_compiled_grouped_mm_is_one_experts_program():
    # torch.compile takes _grouped_mm in bf16 only (its meta function's rule off the CPU)
    a, w, offs = (t.to(torch.bfloat16) if t.is_floating_point() else t for t in _grouped_case())
    out, _, records, warned, _ = compile_on_spyre(lambda a, w, o: torch.nn.functional.grouped_mm(a, w, offs=o),
                                                  a, w, offs)
    assert not warned
    _all_on_card(records)
    assert [type(r.kernel).__name__ for r in records] == ["GroupedMatmulKernel"]
    # both accumulate in fp32 and round once to bf16; the sums' order differs
    torch.testing.assert_close(out[0].cpu(), torch.nn.functional.grouped_mm(a, w, offs=offs))


def test_compiled_transformers_grouped_mm_fallback_op_on_the_card():
    """Under torch.compile with fp32 weights transformers calls its own opaque custom op (a host loop
    over offs.tolist()); on spyre it lowers as _grouped_mm does."""
    pytest.importorskip("transformers")
    from transformers.integrations import moe  # noqa: F401  (registers torch.ops.transformers)

    a, w, offs = _grouped_case()
    out, _, records, warned, _ = compile_on_spyre(
        lambda a, w, o: torch.ops.transformers.grouped_mm_fallback(a, w, offs=o), a, w, offs)
    assert not warned
    _all_on_card(records)
    torch.testing.assert_close(out[0].cpu(), torch.nn.functional.grouped_mm(a, w, offs=offs), rtol=1e-5, atol=1e-5)


def test_compiled_scatter_back_gathers_a_computed_source_by_a_sorted_permutation():
    """transformers' grouped experts forward: ids sorted, the renormalized top-k weights gathered
    by the permutation, and the weighted rows put back in token order and summed over the slots."""
    T, K, H = 8, 2, 16
    g = torch.Generator().manual_seed(3)
    top, ids, rows = torch.rand(T, K, generator=g), torch.randint(0, 4, (T, K), generator=g), torch.randn(T * K, H)

    def scatter_back(top, ids, rows):
        weights = (top / top.sum(dim=-1, keepdim=True)).reshape(-1)
        _, perm = torch.sort(ids.reshape(-1))
        weighted = rows * weights[perm].unsqueeze(-1)
        inverse = torch.empty_like(perm)
        inverse[perm] = torch.arange(perm.size(0), device=perm.device)
        return weighted[inverse].view(T, K, H).sum(dim=1)

    out, _, records, warned, _ = compile_on_spyre(scatter_back, top, ids, rows)
    assert not warned
    _all_on_card(records)
    # the CPU's unstable sort may order tied ids otherwise, which changes which row meets which weight:
    # the reference is the same function with the CPU's stable order
    torch.testing.assert_close(out[0].cpu(), scatter_back(top, ids, rows), rtol=1e-5, atol=1e-6)


def _moe_block(name):
    from spyre_inductor.testing import hf_models

    torch.manual_seed(0)
    model, _ = hf_models.build(name)
    block = model.model.layers[0].mlp.eval()
    return block, torch.randn(1, 6, model.config.hidden_size)


@pytest.mark.parametrize("name", ["mixtral", "gpt_oss"])
def test_transformers_moe_block_eager_and_compiled_on_the_card(name):
    pytest.importorskip("transformers")
    block, x = _moe_block(name)
    with torch.no_grad():
        want = block(x)
        want = want[0] if isinstance(want, tuple) else want
        block.to("spyre")
        eager = block(x.to("spyre"))
        eager = eager[0] if isinstance(eager, tuple) else eager
        out, _, records, warned, _ = compile_on_spyre(lambda h: block(h), x)
    scale = want.abs().max().item()
    torch.testing.assert_close(eager.cpu(), want, rtol=0, atol=1e-5 * scale)
    assert not warned
    _all_on_card(records)
    torch.testing.assert_close(out[0].cpu(), want, rtol=0, atol=1e-5 * scale)
