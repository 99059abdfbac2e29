"""Compile-backed eager ops (issue 19): one execution path for eager and compiled.

An eager op on spyre tensors runs as the program torch.compile would build
for it: its PrivateUse1 kernel (kernel.py) traces the op's Inductor
decomposition once per key (compile.py), compiles it through Inductor with
our backend, caches it (cache.py, bounded, statistics on torch.spyre), and
later calls only launch the prepared plans (launch.py). Ops and inputs the
compiler does not take keep the CPU fallback (device/fallback.py).

Modules: signature (an op's schema, read once), key (the cache key), cache,
compile (trace + Inductor), launch (the entries and the warm path), kernel
(the PrivateUse1 kernel), ops (the table and registration), coverage (the
OpInfo coverage summary command), decompositions (spyre's own, where Inductor's
would not run on the card: nll_loss_backward, embedding_dense_backward),
fused_adam (torch.optim.Adam/AdamW(fused=True): one program per parameter).
"""

from __future__ import annotations

from .cache import CACHE, EagerCacheStats  # noqa: F401


def set_enabled(on: bool) -> None:
    """Turn compiled eager ops on or off (off: every op runs through the CPU fallback, as before;
    ``SPYRE_EAGER_COMPILE=0`` at start-up)."""
    from .kernel import set_enabled as set_kernels

    set_kernels(on)


def install() -> None:
    from . import ops

    ops.install()
