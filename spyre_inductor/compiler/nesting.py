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


@contextlib.contextmanager
def nested():
    """Mark this thread as compiling or running a graph of its own."""
    outer = busy()
    STATE.busy = True
    try:
        yield
    finally:
        STATE.busy = outer
