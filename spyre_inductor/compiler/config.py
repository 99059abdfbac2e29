"""Knobs of the spyre compiler, for experiments and benchmarks.

``max_cores`` caps how many cores a kernel may be divided over (the planner
still picks the fastest count up to it by the timing model). The values
are part of the FX graph cache key (registration.VersionPass.uuid), so a
graph compiled under one setting is never served under another.

    from spyre_inductor.compiler import config
    with config.patch(max_cores=1):
        torch.compile(fn)(x)
"""

from __future__ import annotations

import contextlib

from spyre_runtime.hardware import HARDWARE

MAX_CORES = HARDWARE.cores
max_cores: int = MAX_CORES


def key() -> str:
    # Strict mode too: a graph compiled with CPU fallbacks must not be served from the cache
    # (where nothing is generated, so nothing would warn or refuse) once SPYRE_STRICT=1 is set.
    # An eager op's graph too: its kernels' errors name the op, whether its indices wrap
    # follows the op (launcher/nesting.py), and two ops may decompose into the same graph.
    from ..launcher.fallback_policy import strict
    from ..launcher.nesting import eager_op

    return f"max_cores={max_cores} strict={strict()} eager_op={eager_op()}"


@contextlib.contextmanager
def patch(**values):
    unknown = set(values) - {"max_cores"}
    if unknown:
        raise TypeError(f"spyre compiler config has no {', '.join(sorted(unknown))}; it has max_cores")
    n = values.get("max_cores", max_cores)
    if not isinstance(n, int) or not 1 <= n <= MAX_CORES:
        raise ValueError(f"max_cores must be an integer in 1..{MAX_CORES}, got {n!r}")
    g = globals()
    old = {k: g[k] for k in values}
    g.update(values)
    try:
        yield
    finally:
        g.update(old)
