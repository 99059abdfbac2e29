"""Whether this thread is inside a spyre compile or a compiled graph's run.

Set while an eager op compiles or launches, and while the random-fill kernels compile their
graphs: an eager op reached then (an extern ATen kernel inside the graph, Inductor evaluating a
constant or setting up its patterns on spyre tensors) is nested, and goes to the composite
kernel or the CPU fallback rather than compiling inside a compile. Kept in the launcher, below
both readers: the eager layer and the compiler's random-fill kernels (compiler/inductor/random.py).
"""

from __future__ import annotations

import contextlib
import threading

STATE = threading.local()


def busy() -> bool:
    return getattr(STATE, "busy", False)


def dynamo_compiling() -> bool:
    """This thread is inside a torch.compile (Dynamo's thread-local CompileContext, which it
    holds for the whole compile, Inductor's included, or a TracingContext). Not
    torch.compiler.is_compiling(): that is the process's flag, true on every thread while any
    one compiles. (Compiled autograd also holds a CompileContext while its backward runs.)"""
    from torch._guards import CompileContext, TracingContext

    return CompileContext.try_get() is not None or TracingContext.try_get() is not None


def eager_op():
    """The aten op (an OpOverload) this thread compiles an eager kernel of, or None: every
    kernel of that graph is the op's decomposition, and its errors and warnings name the op the
    user called, not the decomposition's pieces."""
    return getattr(STATE, "eager_op", None)


def negative_indices_wrap() -> bool:
    """Whether an indirect index of the graph being compiled wraps when negative (Python's and
    aten.index's rule), or is out of range (the CPU kernels of index_select, index_copy_ and
    index_add_, whose decompositions go through aten.index and aten.index_put)."""
    return getattr(STATE, "negative_indices_wrap", True)


@contextlib.contextmanager
def compiling_eager_op(op, *, wrap_negative: bool = True):
    outer = eager_op(), negative_indices_wrap()
    STATE.eager_op, STATE.negative_indices_wrap = op, wrap_negative
    try:
        yield
    finally:
        STATE.eager_op, STATE.negative_indices_wrap = outer


@contextlib.contextmanager
def nested():
    """Mark this thread as compiling or running a graph of its own."""
    outer = busy()
    STATE.busy = True
    try:
        yield
    finally:
        STATE.busy = outer
