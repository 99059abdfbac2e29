"""The least traffic a kernel needs (core/minimum.py), on hand-built kernel IR.

Every distinct input element read once, every stored element written once:
a broadcast operand counts once, not once per use; a reduced operand once,
not once per pass; matmul operands once each, whatever a plan re-reads.
"""

from __future__ import annotations

import itertools

import pytest

from spyre_inductor.compiler.ir import kernel_ir as ir
from spyre_inductor.compiler.core import minimum
from spyre_inductor.compiler.core.minimum import distinct_elements, minimum_bytes, minimum_traffic
from pointwise_ir import contiguous


def buf(name, dtype, shape, strides=None, offset=0):
    return ir.Buffer(name, dtype, tuple(shape), tuple(strides or contiguous(shape)), offset)


def load(name, dtype, strides, offset=0):
    return ir.Load(name, ir.Index(tuple(strides), offset), dtype)


def kernel(name, ranges, buffers, values, stores, reduction_ranges=()):
    """The IR's own constructor for that content (Kernel.of picks the kernel's type)."""
    of = getattr(getattr(ir, "Kernel", None), "of", None)
    args = (name, tuple(ranges), tuple(buffers), tuple(values), tuple(stores), tuple(reduction_ranges))
    k = of(*args) if of else ir.PointwiseKernel(*args)
    k.check()
    return k


def store(name, strides, value, offset=0):
    return ir.Store(name, ir.Index(tuple(strides), offset), value)


def test_pointwise_reads_each_input_once_and_writes_the_output_once():
    shape = (64, 100)
    k = kernel("add", shape, [buf("x", "fp16", shape), buf("y", "fp16", shape), buf("out", "fp16", shape)],
               [load("x", "fp16", (100, 1)), load("y", "fp16", (100, 1)), ir.Op("add", (0, 1), "fp16")],
               [store("out", (100, 1), 2)])
    assert minimum_traffic(k) == (2 * 64 * 100 * 2, 64 * 100 * 2)
    assert minimum_bytes(k) == 3 * 64 * 100 * 2
    assert minimum_traffic(k).total == minimum_bytes(k)


def test_a_broadcast_operand_counts_once_not_once_per_use():
    # out = x * scale + bias: scale a (1, 100) row, bias a (100,) vector, both broadcast over 64 rows;
    # bias is loaded twice (the same index): still read once.
    shape = (64, 100)
    k = kernel("bcast", shape,
               [buf("x", "fp32", shape), buf("scale", "fp32", (1, 100)), buf("bias", "fp32", (100,)),
                buf("out", "fp32", shape)],
               [load("x", "fp32", (100, 1)), load("scale", "fp32", (0, 1)), ir.Op("mul", (0, 1), "fp32"),
                load("bias", "fp32", (0, 1)), ir.Op("add", (2, 3), "fp32"), load("bias", "fp32", (0, 1)),
                ir.Op("add", (4, 5), "fp32")],
               [store("out", (100, 1), 6)])
    assert minimum_traffic(k) == ((64 * 100 + 100 + 100) * 4, 64 * 100 * 4)


def test_a_scalar_operand_and_an_expanded_buffer_count_once():
    # a 0-d scalar and a buffer whose own strides say it is one row expanded to 64
    shape = (64, 100)
    k = kernel("scalar", shape,
               [buf("s", "fp32", ()), buf("row", "fp16", shape, (0, 1)), buf("out", "fp32", shape)],
               [load("s", "fp32", (0, 0)), load("row", "fp16", (0, 1)), ir.Cast(1, "fp32"),
                ir.Op("mul", (0, 2), "fp32")],
               [store("out", (100, 1), 3)])
    assert minimum_traffic(k) == (4 + 100 * 2, 64 * 100 * 4)


def test_slices_of_one_buffer_count_its_elements_once():
    # rotary-style halves x[:, :64] and x[:, 64:] of x (8, 128), and shifted windows x[1:] - x[:-1]
    halves = kernel("halves", (8, 64), [buf("x", "fp16", (8, 128)), buf("out", "fp16", (8, 64))],
                    [load("x", "fp16", (128, 1)), load("x", "fp16", (128, 1), 64), ir.Op("sub", (0, 1), "fp16")],
                    [store("out", (64, 1), 2)])
    assert minimum_traffic(halves) == (8 * 128 * 2, 8 * 64 * 2)
    diff = kernel("diff", (99,), [buf("x", "fp32", (100,)), buf("out", "fp32", (99,))],
                  [load("x", "fp32", (1,), 1), load("x", "fp32", (1,)), ir.Op("sub", (0, 1), "fp32")],
                  [store("out", (1,), 2)])
    assert minimum_traffic(diff) == (100 * 4, 99 * 4)


def test_a_strided_and_a_transposed_read_count_the_elements_not_the_span():
    # x[:, ::2] of a (16, 64) x reads 16 * 32 elements; x.t() reads all of x once
    every_other = kernel("step", (16, 32), [buf("x", "fp32", (16, 64)), buf("out", "fp32", (16, 32))],
                         [load("x", "fp32", (64, 2))], [store("out", (32, 1), 0)])
    assert minimum_traffic(every_other).read_bytes == 16 * 32 * 4
    transposed = kernel("t", (64, 16), [buf("x", "fp32", (16, 64)), buf("out", "fp32", (64, 16))],
                        [load("x", "fp32", (1, 64))], [store("out", (16, 1), 0)])
    assert minimum_traffic(transposed) == (16 * 64 * 4, 16 * 64 * 4)


def test_reduction_reads_the_operand_once_and_writes_one_element_per_row():
    rows, cols = 48, 1000
    k = kernel("row_sum", (rows,), [buf("x", "fp16", (rows, cols)), buf("out", "fp16", (rows,))],
               [load("x", "fp16", (cols, 1)), ir.Cast(0, "fp32"), ir.Reduction("sum", 1, "fp32"),
                ir.Cast(2, "fp16")],
               [store("out", (1, 0), 3)], reduction_ranges=(cols,))
    assert minimum_traffic(k) == (rows * cols * 2, rows * 2)


def test_softmax_reads_its_rows_once_however_many_passes_use_them():
    rows, cols = 16, 256
    xs = (cols, 1)
    values = [load("x", "fp32", xs), ir.Reduction("max", 0, "fp32"), load("x", "fp32", xs),
              ir.Op("sub", (2, 1), "fp32"), ir.Op("exp", (3,), "fp32"), ir.Reduction("sum", 4, "fp32"),
              ir.Op("truediv", (4, 5), "fp32")]
    k = kernel("softmax", (rows,), [buf("x", "fp32", (rows, cols)), buf("out", "fp32", (rows, cols)),
                                    buf("lse", "fp32", (rows,))],
               values, [store("out", xs, 6), store("lse", (1, 0), 5)], reduction_ranges=(cols,))
    assert minimum_traffic(k) == (rows * cols * 4, (rows * cols + rows) * 4)


def _matmul(m, n, kk, dtype="fp16", b_transposed=False, batch=()):
    """out[..., m, n] = sum_k a[..., m, k] * b[k, n] (b shared by every batch: a broadcast batch dim)."""
    op = "dot" if "dot" in ir.REDUCTION_OPS else "sum"
    nb = len(batch)
    a_shape, out_shape = (*batch, m, kk), (*batch, m, n)
    a_strides = tuple(contiguous(a_shape)[:nb]) + (kk, 0, 1)
    if b_transposed:  # x @ W.t(): W is (n, k)
        b_buf, b_strides = buf("b", dtype, (n, kk)), (0,) * nb + (0, kk, 1)
    else:
        b_buf, b_strides = buf("b", dtype, (kk, n)), (0,) * nb + (0, 1, n)
    values = [load("a", dtype, a_strides), load("b", dtype, b_strides), ir.Cast(0, "fp32"), ir.Cast(1, "fp32"),
              ir.Op("mul", (2, 3), "fp32"), ir.Reduction(op, 4, "fp32"), ir.Cast(5, dtype)]
    out_strides = tuple(contiguous(out_shape)) + (0,)
    return kernel("mm", (*batch, m, n), [buf("a", dtype, a_shape), b_buf, buf("out", dtype, out_shape)],
                  values, [store("out", out_strides, 6)], reduction_ranges=(kk,))


@pytest.mark.parametrize("b_transposed", [False, True])
def test_matmul_minimum_is_each_operand_once_and_the_output_once(b_transposed):
    m, n, kk = 67, 128, 255
    k = _matmul(m, n, kk, b_transposed=b_transposed)
    a, b, out = m * kk * 2, kk * n * 2, m * n * 2
    assert minimum_traffic(k) == (a + b, out)
    assert minimum_bytes(k) == a + b + out


def test_batched_matmul_with_a_broadcast_operand_reads_it_once():
    k = _matmul(32, 64, 128, batch=(3,))
    assert minimum_traffic(k) == ((3 * 32 * 128 + 128 * 64) * 2, 3 * 32 * 64 * 2)


def test_itemsizes_and_a_buffer_both_read_and_written():
    # x += 1 on int64 in place (read and written), and a bool mask read once
    k = kernel("inplace", (10,), [buf("x", "int64", (10,)), buf("mask", "bool", (10,))],
               [load("x", "int64", (1,)), ir.Constant(1, "int64"), ir.Op("add", (0, 1), "int64"),
                load("mask", "bool", (1,)), ir.Op("where", (3, 2, 0), "int64")],
               [store("x", (1,), 4)])
    assert minimum_traffic(k) == (10 * 8 + 10, 10 * 8)


def test_an_empty_range_needs_nothing():
    k = kernel("empty", (0, 8), [buf("x", "fp32", (0, 8)), buf("out", "fp32", (0, 8))],
               [load("x", "fp32", (8, 1))], [store("out", (8, 1), 0)])
    assert minimum_traffic(k) == (0, 0)


def _brute(accesses, extents):
    seen = set()
    for offset, strides in accesses:
        for idx in itertools.product(*(range(n) for n in extents)):
            seen.add(offset + sum(s * i for s, i in zip(strides, idx)))
    return len(seen)


def test_distinct_elements_is_exact_for_overlapping_and_reversed_accesses():
    cases = [
        ([(0, (1, 1))], (5, 7)),              # i + j: windows that overlap
        ([(0, (3, 2))], (4, 5)),              # strides that interleave
        ([(9, (-1,)), (0, (1,))], (10,)),     # a flip and a forward read of the same elements
        ([(0, (8, 1)), (4, (8, 1))], (6, 6)),  # rows that overlap by two elements
        ([(0, (0, 1)), (3, (0, 1))], (9, 4)),  # broadcast slices
    ]
    for accesses, extents in cases:
        assert distinct_elements(accesses, extents) == _brute(accesses, extents), (accesses, extents)


def test_past_the_union_budget_the_count_is_capped_at_the_buffer(monkeypatch):
    # two overlapping windows of x (100,): exact union 100; past the budget, the sum 2 * 99
    # capped at the buffer's 100 elements: still 100 (an upper bound in general, never below exact)
    k = kernel("diff", (99,), [buf("x", "fp32", (100,)), buf("out", "fp32", (99,))],
               [load("x", "fp32", (1,), 1), load("x", "fp32", (1,)), ir.Op("sub", (0, 1), "fp32")],
               [store("out", (1,), 2)])
    monkeypatch.setattr(minimum, "UNION_BUDGET", 0)
    assert minimum_traffic(k).read_bytes == 100 * 4
    assert distinct_elements([(0, (2,)), (1, (2,))], (3,)) == 6  # no cap given: the sum
