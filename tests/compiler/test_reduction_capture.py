"""Capture of reductions and their fusions: the kernel IR Inductor's nodes become.

These hold whether or not the planner compiles reduction kernels yet: the
record keeps the captured IR even when the kernel falls back to the CPU, and
the result is compared with CPU eager either way.
"""

import pytest
import torch

from spyre_inductor.compiler.inductor.capture import CaptureHandler, _Group
from spyre_inductor.compiler.inductor.indexing import reduction_common_ranges
from spyre_inductor.compiler.ir.errors import NotCapturable
from spyre_inductor.compiler.ir.kernel_ir import Cast, Index, Load, PointwiseKernel, Reduction

from inductor_helpers import assert_close_to_cpu, compile_on_spyre, input_like, loads, op_names


def reductions(kernel):
    return [v for v in kernel.values if isinstance(v, Reduction)]


def one_kernel(records) -> PointwiseKernel:
    """The single captured kernel of a graph (compiled or run by the CPU fallback)."""
    assert len(records) == 1, [(r.nodes, r.fallback_reason) for r in records]
    (record,) = records
    k = record.kernel
    assert k is not None, record.fallback_reason
    k.check()
    assert PointwiseKernel.from_json(k.to_json()) == k
    assert k.name.startswith("spyre_red_")
    return k


def test_softmax_is_one_kernel_reading_the_input_once_and_storing_only_the_output():
    x = torch.randn(16, 67)  # a row that does not fill whole fp32 sticks
    fn = lambda a: torch.softmax(a, -1)  # noqa: E731
    out, _, records, _, code = compile_on_spyre(fn, x)
    assert_close_to_cpu(out, fn(x))
    k = one_kernel(records)
    assert len(records[0].nodes) == 3  # amax, sum, the division: fused
    assert k.ranges == (16,) and k.reduction_ranges == (67,)
    (xb,) = input_like(k, x)
    assert [(l.buffer, l.index) for l in loads(k)] == [(xb.name, Index((67, 1), 0))]  # once
    assert [r.op for r in reductions(k)] == ["max", "sum"]
    mx, sm = (k.values.index(r) for r in reductions(k))
    assert k.values[sm].arg > mx  # the sum reduces exp(x - max): it depends on the max
    assert op_names(k) == ["sub", "exp", "truediv"]
    (store,) = k.stores  # the max and the sum stay on chip
    assert store.index == Index((67, 1), 0) and k.buffer(store.buffer).shape == (16, 67)
    assert len(k.buffers) == 2
    outer = k.outer()
    assert outer[mx] and outer[sm] and not outer[store.value]
    assert records[0].artifact is not None, records[0].fallback_reason  # the planner compiles softmax
    assert code.count("empty_strided(") == 1  # only the output is allocated


def test_layer_norm_with_weight_and_bias_is_one_welford_kernel():
    x, w, b = torch.randn(8, 96), torch.randn(96), torch.randn(96)
    fn = lambda a, w, b: torch.nn.functional.layer_norm(a, (96,), w, b)  # noqa: E731
    out, _, records, _, _ = compile_on_spyre(fn, x, w, b)
    assert_close_to_cpu(out, fn(x, w, b))
    k = one_kernel(records)
    assert k.ranges == (8,) and k.reduction_ranges == (96,)
    red = reductions(k)
    assert [r.op for r in red] == ["welford_mean", "welford_m2", "welford_weight"]
    (xb,) = input_like(k, x)
    x_pos = [i for i, v in enumerate(k.values) if isinstance(v, Load) and v.buffer == xb.name]
    assert len(x_pos) == 1 and {r.arg for r in red} == set(x_pos)  # one triple of the loaded row
    weight_like = {l.index for l in loads(k) if l.buffer != xb.name}
    assert weight_like == {Index((0, 1), 0)}  # weight and bias: broadcast over the rows
    assert {"sub", "rsqrt", "mul", "add"} <= set(op_names(k))
    (store,) = k.stores
    assert k.buffer(store.buffer).shape == (8, 96) and store.index == Index((96, 1), 0)


def test_var_and_std_with_correction_are_welford_with_an_outer_epilogue():
    x = torch.randn(12, 40)
    fn = lambda a: (a.var(1, correction=1), a.std(0, keepdim=True, correction=0))  # noqa: E731
    out, _, records, _, _ = compile_on_spyre(fn, x)
    assert_close_to_cpu(out, fn(x))
    by_ranges = {r.kernel.ranges + r.kernel.reduction_ranges: r.kernel for r in records}
    rows, cols = by_ranges[(12, 40)], by_ranges[(40, 12)]  # one kernel per reduced dim
    for k, n, divisor in ((rows, 40, 39.0), (cols, 12, 12.0)):
        k.check()
        m2 = [i for i, v in enumerate(k.values) if isinstance(v, Reduction) and v.op == "welford_m2"]
        assert len(m2) == 1
        (store,) = k.stores
        assert k.outer()[store.value] and not any(store.index.strides[1:])  # per row, after the reduction
        assert ("truediv" in op_names(k)) and any(getattr(v, "value", None) == divisor for v in k.values)
    assert "sqrt" in op_names(cols) and "sqrt" not in op_names(rows)
    (xc,) = input_like(cols, x)
    (load,) = [l for l in loads(cols) if l.buffer == xc.name]
    assert load.index == Index((1, 40), 0)  # reduced over dim 0: the reduced var walks rows


def test_rms_norm_x_minus_mean_and_sum_of_squares():
    x, w = torch.randn(6, 80), torch.randn(80)

    def fn(a, w):
        return (torch.nn.functional.rms_norm(a, (80,), w, 1e-6), a - a.mean(-1, keepdim=True),
                (a * a).sum(-1), torch.log_softmax(a, -1))

    out, _, records, _, _ = compile_on_spyre(fn, x, w)
    assert_close_to_cpu(out, fn(x, w))
    # All four reduce the same rows of the same input: Inductor offers them
    # together and they become one kernel reading x once.
    k = one_kernel(records)
    assert k.ranges == (6,) and k.reduction_ranges == (80,)
    (xb,) = input_like(k, x)
    assert [l.buffer for l in loads(k)].count(xb.name) == 1
    assert sorted(r.op for r in reductions(k)) == ["max", "sum", "sum", "sum"]  # sumsq shared by rms/sumsq
    assert len(k.stores) == 4 and len(k.buffers) == 6


def test_reductions_over_several_dims_keepdim_and_indices():
    x = torch.randn(4, 12, 10)  # (Inductor unrolls reductions of up to 8 elements)

    def fn(a):
        values, indices = a.max(1, keepdim=True)
        return a.sum((0, 2)), a.amin((1, 2), keepdim=True), values, indices, a.argmax(), (a > 0).any(-1)

    out, _, records, _, _ = compile_on_spyre(fn, x)
    assert_close_to_cpu(out, fn(x))
    kernels = [r.kernel for r in records if r.kernel is not None]
    assert len(kernels) == len(records)  # every node captured (compiled or not)
    ops = {r.op for k in kernels for r in reductions(k)}
    assert {"sum", "min", "max", "argmax", "any"} <= ops
    whole = [k for k in kernels if k.ranges == (1,)]  # argmax over everything: one element out
    # in the logical order of its dims (nodes.loop_body); the planner merges them again
    assert whole and all(k.reduction_ranges == (4, 12, 10) for k in whole)
    for k in kernels:
        for s in k.stores:
            assert not any(s.index.strides[len(k.ranges):])  # stored once per outer index


def test_a_large_reduction_stays_one_kernel():
    x = torch.randn(512, 1024)  # Inductor would split this in two without REDUCE_TO_SINGLE_ELEMENT
    out, _, records, _, _ = compile_on_spyre(lambda a: a.sum(), x)
    assert_close_to_cpu(out, x.sum(), rtol=1e-4, atol=1e-3)
    k = one_kernel(records)
    assert k.ranges == (1,) and k.reduction_ranges == (512 * 1024,)
    assert [r.op for r in reductions(k)] == ["sum"]


def test_fp16_reduction_results_round_when_read_back_in_the_kernel():
    x = torch.randn(8, 64, dtype=torch.float16)
    fn = lambda a: a - a.sum(1, keepdim=True)  # noqa: E731
    out, _, records, _, _ = compile_on_spyre(fn, x)
    assert_close_to_cpu(out, fn(x), rtol=2e-3, atol=1e-2)
    k = one_kernel(records)
    (s,) = (i for i, v in enumerate(k.values) if isinstance(v, Reduction))
    # The sum buffer is fp16: the epilogue sees the sum rounded, as a round trip through memory.
    assert any(isinstance(v, Cast) and v.arg == s and v.dtype == "fp16" for v in k.values)


# ---- without Inductor ----------------------------------------------------------------------


def test_reduction_common_ranges():
    assert reduction_common_ranges([((16,), (64,))]) == ((16,), (64,))
    assert reduction_common_ranges([((16,), (64,))], full=[(1024,)], outer=[(16,)]) == ((16,), (64,))
    assert reduction_common_ranges([((4, 4), (64,))], full=[(16, 8, 8)]) == ((4, 4), (8, 8))
    assert reduction_common_ranges([((), (64,))], outer=[()]) == ((1,), (64,))
    with pytest.raises(NotCapturable):
        reduction_common_ranges([((16,), (64,)), ((16,), (32,))])  # different reduced sizes
    with pytest.raises(NotCapturable):
        reduction_common_ranges([((16,), (64,))], full=[(512,)])  # not the whole space
    with pytest.raises(NotCapturable):
        reduction_common_ranges([((6,), (4,))], full=[(4, 6)])  # no common refinement


def test_split_reductions_are_not_capturable():
    handler = CaptureHandler(_Group((4,), frozenset(), (8,)))
    x = handler.constant(1.0, torch.float32)
    with pytest.raises(NotCapturable, match="welford_combine"):
        handler.reduction(torch.float32, torch.float32, "welford_combine", (x, x, x))
    with pytest.raises(NotCapturable, match="outside a reduction"):
        CaptureHandler(_Group((4,), frozenset())).reduction(torch.float32, torch.float32, "sum", x)
    mean, m2, weight = handler.reduction(torch.float32, torch.float32, "welford_reduce", x)
    assert [handler.g.values[v.pos].op for v in (mean, m2, weight)] == ["welford_mean", "welford_m2",
                                                                         "welford_weight"]


def test_exact_round_trip_casts_collapse():
    # torch.all reaches Inductor as any(not x) through int64: the IR keeps no int64 detour.
    handler = CaptureHandler(_Group((4,), frozenset(), (8,)))
    b = handler.constant(True, torch.bool)
    wide = handler.to_dtype(b, torch.int64)
    assert handler.to_dtype(wide, torch.bool).pos == b.pos
    h = handler.constant(1.5, torch.float16)
    back = handler.to_dtype(handler.to_dtype(h, torch.float32), torch.float16)
    assert handler.g.values[back.pos] == Cast(h.pos, "fp16")  # a float cast still rounds
