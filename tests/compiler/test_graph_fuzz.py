"""The graph fuzzer in the default suite: a bounded number of random graphs (graph_fuzz.py).

Derandomized, so the suite is reproducible; a failure prints the graph's
source and its inputs (a reproducer). Longer runs with fresh seeds:
``python benchmarks/fuzz.py --examples N``.
"""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, given, settings

import graph_fuzz

# ~20 graphs, each one compile of several kernels (~0.2-1 s): well under 40 s. Split by dtype so
# the default suite keeps float graphs (the tolerance paths) and integer graphs (exact) both:
# drawn from all four dtypes, a derandomized 20 held 3 float graphs.
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
