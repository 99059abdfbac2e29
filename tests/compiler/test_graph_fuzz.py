"""The graph fuzzer in the default suite: a bounded number of random graphs (graph_fuzz.py).

Derandomized, so the suite is reproducible; a failure prints the graph's
source and its inputs (a reproducer). Longer runs with fresh seeds:
``python benchmarks/fuzz.py --examples N``.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, given, settings

import graph_fuzz

# ~20 graphs, each one compile of several kernels (~0.2-1 s): well under 40 s. Split by dtype so
# the default suite keeps float graphs (the tolerance paths) and integer graphs (exact) both:
# drawn from all four dtypes, a derandomized 20 held 3 float graphs. Float graphs draw matmuls
# too (one op in graph_fuzz.MATMUL_ONE_IN): the derandomized 12 hold 5 graphs with matmuls, and
# the suite's time did not change (a matmul compiles like any other kernel, ~0.2-0.5 s).
FLOAT_EXAMPLES = 12
INT_EXAMPLES = 8
SETTINGS = dict(deadline=None, database=None, derandomize=True,
                phases=[Phase.explicit, Phase.generate, Phase.shrink], suppress_health_check=list(HealthCheck))


@settings(max_examples=FLOAT_EXAMPLES, **SETTINGS)
@given(graph_fuzz.graphs(dtypes=graph_fuzz.FLOATS))
def test_random_graphs_match_cpu(graph):
    """fp32/fp16 graphs (with masks, counts and indices of their inputs, compared exactly)."""
    graph_fuzz.check(graph)


@settings(max_examples=INT_EXAMPLES, **SETTINGS)
@given(graph_fuzz.graphs(dtypes=graph_fuzz.INTS))
def test_random_integer_graphs_match_cpu(graph):
    """int32/int64 graphs with bool masks: every result compared exactly, dtype included."""
    graph_fuzz.check(graph)


def test_found_by_the_fuzzer():
    """Graphs the fuzzer once failed on, kept as regressions."""
    # A full reduction and a full-space store in one kernel (a 1-D input): the store's value
    # varies only over the reduced dim; it used to be refused by the planner (CPU fallback).
    graph_fuzz.check(graph_fuzz.Graph.from_source(
        torch_dtype="float32", inputs=[((3,), False)],
        body=["F.gelu(v0) - v0.clamp(-1.5, 2.0)", "F.gelu(v0).amax(0)", "v0.var(0) / (torch.tanh(v0).abs() + 1)"],
        outputs=[1, 2, 3]))
    # An unrolled softmax over a dim of 4 fused into a full mean: reduced dims that do not merge
    # into one (the planner refuses); the scheduler no longer fuses such a group.
    graph_fuzz.check(graph_fuzz.Graph.from_source(
        torch_dtype="float16", inputs=[((4, 67), False)],
        body=["torch.softmax(v0, 0)", "v0 - v0.mean()"], outputs=[1, 2]))
    # A replicate pad (a piecewise index: masked loads) feeding a reduction and a matmul: fused
    # as their prologue, the masked loads could not be cut (only pointwise kernels are) and the
    # whole group ran on the CPU; the scheduler now keeps the pad its own kernel (issue 16).
    graph_fuzz.check(graph_fuzz.Graph.from_source(
        torch_dtype="float32", inputs=[((64, 67), False), ((67, 67), False), ((67,), False), ((1, 67), False)],
        body=["F.pad(v0.movedim(1, -1).reshape(1, -1, v0.shape[1]), (3, 2), mode='replicate')[..., 2:-3]"
              ".reshape(v0.movedim(1, -1).shape).movedim(-1, 1)",
              "torch.maximum(v4, v0).sum(0, keepdim=True)", "v4 @ v3.t()"], outputs=[5, 6]))


G = graph_fuzz.Graph.from_source
# Pinned matmul graphs (the fuzzer's matmul forms, module docstring of graph_fuzz): each matmul
# with its epilogue must become one spyre program (no extern mm), within the derived tolerance.
PINNED_MATMULS = {
    # nn.Linear + bias + GELU + residual (the weight read in its (N, K) layout, transposed on
    # chip), then its result @ an input passed transposed, with a scaled-tanh epilogue
    "linear_bias_gelu_residual_then_transposed_input": G(
        torch_dtype="float32",
        inputs=[((67, 130), False), ((64, 130), False), ((64,), False), ((67, 64), False), ((64, 64), True)],
        body=["F.gelu(F.linear(v0, v1, v2)) + v3", "torch.tanh((v5 @ v4) * 0.05)"], outputs=[5, 6]),
    # attention scores: batched q @ k.transpose(-1, -2), scaled, a broadcast bias and relu;
    # and a softmax over them (its own kernel)
    "fp16_batched_transposed_scores": G(
        torch_dtype="float16", inputs=[((3, 5, 67), False), ((3, 32, 67), False), ((1, 32), False)],
        body=["torch.relu((v0 @ v1.transpose(-1, -2)) * 0.1 + v2)",
              "torch.softmax((v0 @ v1.transpose(-1, -2)) * 0.1, -1)"], outputs=[3, 4]),
    # decode (M = 1) against w.t() with silu; K = 1 (an outer product: a broadcast multiply)
    "decode_m1_transposed_and_k1": G(
        torch_dtype="float32", inputs=[((1, 67), False), ((130, 67), False), ((67, 1), False)],
        body=["F.silu(v0 @ v1.t())", "(v2 @ v0) * 0.5"], outputs=[3, 4]),
}


@pytest.mark.parametrize("name", list(PINNED_MATMULS))
def test_pinned_matmul_graphs(name):
    graph_fuzz.check(PINNED_MATMULS[name])


# Matmul graphs the fuzzer found failing (issue 15), minimized, now regressions: each compiles
# into spyre programs, most on the PE arrays; the ones the PE plans cannot take (a matmul fused with
# another reduction or with a value over (m, n, k), operands walking several row dims, a computed
# operand) are planned as reductions (the dot a sum of products), still on the card.
MATMUL_REGRESSIONS = {
    # an M = 1 matmul and a reduction of its weight over k fused into one kernel: refused
    "m1_matmul_and_weight_reduction": (
        G("float32", [((67,), False), ((67, 67), False)], ["v0 @ v1", "v1.sum(0)"], [2, 3]),
        "was: CPU fallback: a matmul fused with another reduction"),
    # two matmuls of one x with the same (M, N, K) fused into one kernel (Llama's gate/up MLP)
    "two_matmuls_sharing_x": (
        G("float32", [((16, 64), False), ((32, 64), False), ((32, 64), False)],
          ["F.silu(F.linear(v0, v1)) * F.linear(v0, v2)"], [3]),
        "was: CPU fallback: a matmul fused with another reduction"),
    # M = 1 against a weight passed transposed, and a pointwise op of that weight: fused, and the
    # matmul lowering crashes (families/matmul/lowering.analyse: value_tile[x])
    "m1_matmul_and_op_on_transposed_weight": (
        G("float32", [((1, 64), False), ((64, 64), True)], ["v0 @ v1", "v1 * 2"], [2, 3]),
        "was: the compile raised KeyError: 1"),
    "m1_matmul_and_minimum_of_transposed_weight": (
        G("float16", [((1, 64), False), ((64, 64), True), ((64, 64), True)],
          ["v0 @ v1", "torch.minimum(v2, v1)"], [3, 4]),
        "was: CPU fallback: value loads the weight along k outside the product"),
    # N = 1 and a pointwise op of the left operand: fused, the lowering crashes
    "n1_matmul_and_op_on_left_operand": (
        G("float32", [((3, 5), False), ((5, 1), False)], ["v0 @ v1", "torch.log(torch.abs(v0) + 1)"], [2, 3]),
        "was: the compile raised KeyError: 0"),
    # a non-contiguous 3-D left operand (a transposed view) @ a 2-D weight
    "transposed_3d_at_2d": (
        G("float32", [((4, 3, 5), True), ((5, 6), False)], ["v0 @ v1"], [2]),
        "was: CPU fallback: operands walk 2 m dims and 1 n dims"),
    # a 2-D left operand @ a batched 3-D one (the batch broadcast on the left)
    "2d_at_3d": (
        G("float32", [((4, 3), False), ((2, 3, 5), False)], ["v0 @ v1"], [2]),
        "was: CPU fallback: operands walk 1 m dims and 2 n dims"),
    # bmm with M = N = 1 of a computed operand: the producer is inlined as a prologue
    "bmm_m1_n1_computed_operand": (
        G("float32", [((67, 1, 64), False), ((67, 1, 64), False), ((67, 64, 1), False)],
          ["torch.minimum(v0, v1) @ v2"], [3]),
        "was: CPU fallback: a matmul operand computed on chip (Op) is a prologue"),
}


@pytest.mark.parametrize("name", list(MATMUL_REGRESSIONS))
def test_matmul_graphs_the_fuzzer_found(name):
    graph_fuzz.check(MATMUL_REGRESSIONS[name][0])
