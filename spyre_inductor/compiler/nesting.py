"""Whether this thread is inside a spyre compile or a compiled graph's run.

Set while an eager op compiles or launches, and while the random-fill kernels compile their
graphs: an eager op reached then (an extern ATen kernel inside the graph, Inductor evaluating a
constant or setting up its patterns on spyre tensors) is nested, and goes to the composite
kernel or the CPU fallback rather than compiling inside a compile. Kept in the compiler layer,
which both the eager layer (above it) and the random-fill kernels (in it) read.
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


@contextlib.contextmanager
def nested():
    """Mark this thread as compiling or running a graph of its own."""
    outer = busy()
    STATE.busy = True
    try:
        yield
    finally:
        STATE.busy = outer
