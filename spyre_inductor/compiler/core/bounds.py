"""Whether every load and store of a kernel stays inside its buffer over the whole iteration space:
the check every family's kernel passes (a pointwise kernel's masks may first cut it into pieces
that each do: families/pointwise/pieces.py)."""

from __future__ import annotations

import math

from ..ir.errors import Unsupported
from ..ir.kernel_ir import IndexValue, Load, needed


def index_range(v, counts) -> tuple[int, int]:
    """(min, max) of an index value over a box of `counts` at its origin."""
    lo = hi = v.index.offset
    for s, n in zip(v.index.strides, counts):
        lo += min(0, s * (n - 1))
        hi += max(0, s * (n - 1))
    return lo, hi


def extent(buffer) -> int:
    """Elements from the buffer's first to one past its last (PyTorch strides, non-negative)."""
    if any(n == 0 for n in buffer.shape):
        return 0
    return 1 + sum((n - 1) * abs(s) for n, s in zip(buffer.shape, buffer.strides))


def check_bounds(kernel, why: str = "its mask keeps it in bounds, but does not cut the iteration space "
                                     "along one dim") -> None:
    """Every load and store stays inside its buffer over the whole iteration space (any family's
    kernel), or Unsupported naming it and `why` it was not cut: a mask that keeps a load in
    bounds but cannot be cut is not something we run."""
    extents = tuple(kernel.ranges) + tuple(kernel.reduction_ranges)
    live = needed(kernel.values, kernel.stores)
    # (a load no store needs is never moved: an empty reduction's operand; a gather's or scatter's
    # rows are bounded by its checked index instead: the validator's footprint)
    for what, buffer, index in ([("load of", v.buffer, v.index) for k, v in enumerate(kernel.values)
                                 if isinstance(v, Load) and k in live and not v.index.indirect]
                                + [("store to", s.buffer, s.index) for s in kernel.stores if not s.index.indirect]):
        lo, hi = index_range(IndexValue(index, "int64"), extents)
        n = extent(kernel.buffer(buffer))
        if math.prod(extents) and (lo < 0 or hi >= n):
            raise Unsupported(f"kernel {kernel.name!r}: the {what} {buffer!r} reaches elements [{lo}, {hi}] of a "
                              f"buffer of {n}: {why} (masked loads outside a buffer are not run)")
