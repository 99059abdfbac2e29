"""Capture: real torch functions -> the kernel IR Inductor's nodes become, compiled and launched.

Each test compiles one small function on spyre, checks the IR the scheduler
produced (by buffer shape and stride, not Inductor's buffer names), that the
wrapper launches a compiled program, and the result against CPU eager.
"""

import pytest
import torch

from spyre_inductor.compiler.ir.kernel_ir import Cast, Index, PointwiseKernel
from spyre_inductor.compiler.inductor.indexing import affine_index, common_ranges, loop_vars, node_vars
from spyre_inductor.compiler.ir.errors import NotCapturable

from inductor_helpers import assert_close_to_cpu, input_like, compile_on_spyre, constants, loads, op_names


def only_compiled_kernel(records) -> PointwiseKernel:
    assert len(records) == 1, records
    (record,) = records
    assert record.fallback_reason is None, record.fallback_reason
    assert record.artifact is not None and (record.artifact / "launch_spec.json").exists()
    record.kernel.check()
    assert PointwiseKernel.from_json(record.kernel.to_json()) == record.kernel
    return record.kernel


def test_add_with_broadcast_and_python_scalar():
    x, y = torch.randn(4, 8), torch.randn(8)
    fn = lambda a, b: a + b + 2.5  # noqa: E731
    out, _, records, warned, code = compile_on_spyre(fn, x, y)
    assert_close_to_cpu(out, fn(x, y))
    assert not warned
    k = only_compiled_kernel(records)
    assert k.ranges == (4, 8)
    (xb,), (yb,) = input_like(k, x), input_like(k, y)
    assert {l.buffer: l.index for l in loads(k)} == {xb.name: Index((8, 1), 0), yb.name: Index((0, 1), 0)}
    assert op_names(k) == ["add", "add"]
    assert constants(k) == [(2.5, "fp32")]
    (store,) = k.stores
    assert store.index == Index((8, 1), 0)
    assert k.buffer(store.buffer).shape == (4, 8) and k.buffer(store.buffer).dtype == "fp32"
    assert code.count("launch_jobplan(") == 1 and code.count("prepare_kernel(") == 1


def chain(a, b):
    t = a * b + 1.0  # mul, add
    u = t.exp() - t  # exp, sub (t read again)
    return (u.neg() * t).abs() + t.sin() + t.cos()  # neg, mul, abs, sin, cos, add, add


@pytest.mark.parametrize("realize_reads_threshold", [4, 1])
def test_pointwise_chain_is_one_kernel_reading_each_input_once(realize_reads_threshold):
    # With a threshold of 1 Inductor realizes the shared intermediate as its own
    # node, so the single kernel is our vertical fusion: the intermediate stays
    # on chip (never allocated, never stored).
    x, y = torch.randn(16, 64), torch.randn(16, 64)
    with torch._inductor.config.patch(realize_reads_threshold=realize_reads_threshold):
        out, _, records, warned, code = compile_on_spyre(chain, x, y)
    assert_close_to_cpu(out, chain(x, y))
    assert not warned
    k = only_compiled_kernel(records)
    if realize_reads_threshold == 1:
        assert len(records[0].nodes) > 1, "expected several scheduler nodes fused into this kernel"
    assert sorted(l.buffer for l in loads(k)) == sorted({l.buffer for l in loads(k)})  # each input once
    assert len(loads(k)) == 2 and len(k.stores) == 1
    assert len(k.buffers) == 3  # two inputs, one output: no intermediate buffer
    assert len(op_names(k)) >= 9 and len(set(op_names(k))) >= 7
    assert code.count("launch_jobplan(") == 1 and code.count("empty_strided(") == 1


def test_casts_round_on_the_way():
    x = torch.randn(8, 64)
    fn = lambda a: ((a * 3).to(torch.float16), (a > 0).to(torch.float32) + a)  # noqa: E731
    out, _, records, warned, _ = compile_on_spyre(fn, x)
    assert_close_to_cpu(out, fn(x))
    assert not warned
    k = only_compiled_kernel(records)  # both outputs: one horizontally fused kernel
    assert {k.buffer(s.buffer).dtype for s in k.stores} == {"fp16", "fp32"}
    casts = [v.dtype for v in k.values if isinstance(v, Cast)]
    assert "fp16" in casts and "fp32" in casts
    assert "gt" in op_names(k)


def test_where_with_comparison():
    x, y = torch.randn(32, 32), torch.randn(32, 32)
    fn = lambda a, b: torch.where(a > 0, a, b * 2)  # noqa: E731
    out, _, records, warned, _ = compile_on_spyre(fn, x, y)
    assert_close_to_cpu(out, fn(x, y))
    assert not warned
    k = only_compiled_kernel(records)
    assert op_names(k) == ["gt", "mul", "where"] or set(op_names(k)) == {"gt", "mul", "where"}
    assert (0.0, "fp32") in constants(k) and (2.0, "fp32") in constants(k)


def test_in_place_add_on_a_graph_input_stores_into_the_input():
    x, y = torch.randn(4, 8), torch.randn(4, 8)

    def fn(a, b):
        a.add_(b)
        return a * 2

    out, (xs, _), records, warned, code = compile_on_spyre(fn, x, y)
    assert not warned
    torch.testing.assert_close(xs.cpu(), x + y)  # the graph input itself was updated
    torch.testing.assert_close(out[0].cpu(), (x + y) * 2)
    k = only_compiled_kernel(records)  # the update and the product: one kernel
    (xb,) = {l.buffer for l in loads(k)} & {s.buffer for s in k.stores}
    (index,) = {s.index for s in k.stores}  # updated in place: read and written at one index
    assert all(l.index == index for l in loads(k) if l.buffer == xb)
    assert xb in code.split("def call", 1)[1].split("launch_jobplan", 1)[0]  # an input of call()


def test_transposed_input_keeps_pytorch_strides():
    x, y = torch.randn(16, 8), torch.randn(8, 16)
    fn = lambda a, b: a * b - 1  # noqa: E731
    out, (at, _), records, warned, _ = compile_on_spyre(fn, x.t(), y)  # `a` arrives transposed
    assert_close_to_cpu(out, fn(x.t(), y))
    assert not warned
    assert at.stride() == (1, 8)
    k = only_compiled_kernel(records)
    assert sorted(k.ranges) == [8, 16]
    (ab,) = input_like(k, at)  # the input as PyTorch laid it out: (8, 16) with strides (1, 8)
    (yb,) = input_like(k, y)
    index = {l.buffer: l.index for l in loads(k)}
    (store,) = k.stores
    # The two inputs are laid out differently, so one of them is walked against its layout.
    assert index[ab.name] != index[yb.name]
    assert k.buffer(store.buffer).strides == tuple(out[0].stride())  # the output's layout, as allocated


def test_non_contiguous_view_argument():
    base = torch.randn(8, 32)
    fn = lambda a: a.exp()  # noqa: E731
    out, (arg,), records, warned, _ = compile_on_spyre(fn, base.to("spyre")[:, ::2])
    assert arg.stride() == (32, 2)
    assert_close_to_cpu(out, fn(base[:, ::2]))
    assert not warned
    k = only_compiled_kernel(records)
    (b,) = input_like(k, arg)
    assert b.strides == (32, 2)


# ---- index arithmetic on its own (no Inductor) ---------------------------------------------


def test_common_ranges_refine_or_refuse():
    assert common_ranges([(32,), (4, 8)]) == (4, 8)
    assert common_ranges([(6, 4), (24,)]) == (6, 4)
    assert common_ranges([(2, 12), (6, 4)]) == (2, 3, 4)
    assert common_ranges([(1,), (1, 1)]) == (1,)
    with pytest.raises(NotCapturable):
        common_ranges([(4, 6), (6, 4)])
    with pytest.raises(NotCapturable):
        common_ranges([(4,), (5,)])


def test_node_vars_are_affine_in_common_ranges():
    j = loop_vars(3)
    (i,) = node_vars((24,), (2, 3, 4), j)
    assert affine_index(i, j, "x") == Index((12, 4, 1), 0)
    a, b = node_vars((6, 4), (2, 3, 4), j)
    assert affine_index(a, j, "x") == Index((3, 1, 0), 0)
    assert affine_index(b, j, "x") == Index((0, 0, 1), 0)


def test_affine_index_refuses_modular_and_floor_div():
    from torch.utils._sympy.functions import FloorDiv, ModularIndexing

    (i,) = loop_vars(1)
    assert affine_index(3 * i + 5, [i], "x") == Index((3,), 5)
    for expr in (ModularIndexing(i, 1, 4), FloorDiv(i, 4), i * i):
        with pytest.raises(NotCapturable, match="non-affine"):
            affine_index(expr, [i], "x")


def test_dim_cuts_split_loops_so_modular_indexing_is_affine():
    from torch.utils._sympy.functions import FloorDiv, ModularIndexing

    from spyre_inductor.compiler.inductor.indexing import dim_cuts, split_sizes

    i, j = loop_vars(2)
    # a (16, 192) repeat of an (8, 64) tensor: i mod 8 and j mod 64
    exprs = [64 * ModularIndexing(i, 1, 8) + ModularIndexing(j, 1, 64)]
    assert dim_cuts(exprs, [i, j], (16, 192)) == [(8,), (64,)]
    assert split_sizes(16, (8,)) == (2, 8) and split_sizes(192, (64,)) == (3, 64)
    # FloorDiv(j, 4) and j mod 4 cut at 4; cuts that do not divide the dim are not made
    assert dim_cuts([FloorDiv(j, 4) + ModularIndexing(j, 1, 4), ModularIndexing(i, 1, 5)], [i, j], (12, 8)) == [(), (4,)]


def test_piecewise_affine_finds_the_runs_of_a_clamped_index():
    import sympy

    from spyre_inductor.compiler.inductor.indexing import piecewise_affine

    i, j = loop_vars(2)
    # a replicate pad of 2 on a row of 64: j clamped to [0, 63] after the shift
    d, runs = piecewise_affine(64 * i + sympy.Min(63, sympy.Max(0, j - 2)), [i, j], {i: 8, j: 68}, "x")
    assert d == 1
    assert [(lo, hi, affine_index(e, [i, j], "x")) for lo, hi, e in runs] == [
        (0, 3, Index((64, 0), 0)), (3, 66, Index((64, 1), -2)), (66, 68, Index((64, 0), 63))]
    assert piecewise_affine(3 * i + j, [i, j], {i: 8, j: 68}, "x") is None
    with pytest.raises(NotCapturable, match="non-affine"):  # the bend involves both variables
        piecewise_affine(sympy.Min(i, j), [i, j], {i: 8, j: 8}, "x")
