"""Inductor scheduler nodes as capture, symbolic capture and the CPU fallback read them."""

from __future__ import annotations

from torch._inductor import ir
from torch._inductor.virtualized import V


def real_name(name: str) -> str:
    scheduler = V.graph.scheduler
    return scheduler.mutation_real_name.get(name, name) if scheduler is not None else name


def loop_body(node):
    """((sizes, reduction sizes), body) of a scheduler node, as capture and the CPU fallback run it.

    Inductor reorders a node's loops by stride (ir.ComputedBuffer.simplify_and_reorder). For an
    argmax/argmin over several dims that changes the answer: the index it returns counts in loop
    order, and Inductor adds the logical index only for its own Triton and C++ backends
    (lowering.py, ``supports_logical_index_argreduce``). So such a node runs its default body, in
    the logical order of its dims (a transposed input then walks memory with strides, which the
    planner handles as looped reduced dims).
    """
    data = getattr(node.node, "data", None)
    if (isinstance(data, ir.Reduction) and data.reduction_type in ("argmax", "argmin")
            and sum(1 for r in data.reduction_ranges if r != 1) > 1):
        sizes, body, _ = node.node.get_default_sizes_body()
        return sizes, body
    return node.get_ranges(), node._body
