"""topk of long rows in segments: the first k of every segment, then the first k of those (issue 31).

A row longer than SEGMENT elements is cut into S segments of SEGMENT (the last one padded with the
value that comes last in the order: -inf or an integer's minimum for the largest, NaN or its
maximum for the smallest, at positions past n, so a pad never beats an element of the row):

1. the first k of every segment: one sort family program over R * S rows of SEGMENT (every core
   busy even for one row: top-k sampling over a vocabulary), indices within the segment made
   indices within the row (+ segment * SEGMENT);
2. the first k of the S * k candidates of each row: a second program; its positions pick the
   indices among the candidates (a gather).

Exact in the CPU's stable order: the candidates lie in (segment, rank in segment) order, and among
equal values (NaN with NaN, -0.0 with 0.0 included) that is the order of their indices in the row
(a lower segment holds lower indices; within one the network keeps ties in index order), so the
second program's tie-break by position is the tie-break by index. A row too long for one network
(a vocabulary of 128k fp32 logits: 2**17 padded) is thereby within reach too.
"""

from __future__ import annotations

import math

import torch
from torch._inductor import lowering as L

from ..families.sort.network import padded
from .sort_node import _ints, lower_sort

aten = torch.ops.aten

SEGMENT = 4096      # elements per segment of a long row
MOST_K = SEGMENT // 4  # a k beyond this sorts more candidates than the segments save


def _pad_value(dtype: torch.dtype, descending: bool):
    if dtype.is_floating_point:
        return float("-inf") if descending else float("nan")
    info = torch.iinfo(dtype)
    return info.min if descending else info.max


def segmented_topk(x, descending: bool, k) -> tuple | None:
    """(values, indices) of the first k of x's rows (its last dim), or None when the row is not long
    enough to cut (or k too large, or a size not static) or a program is declined."""
    *outer, n = x.get_size()
    static = _ints([n, k])
    if static is None:
        return None
    n, k = static
    if padded(n) <= SEGMENT or not 0 < k <= MOST_K:
        return None
    segments = math.ceil(n / SEGMENT)
    if segments * SEGMENT != n:
        x = L.lowerings[aten.constant_pad_nd](x, [0, segments * SEGMENT - n], _pad_value(x.get_dtype(), descending))
    first = lower_sort(L.view(x, list(outer) + [segments, SEGMENT]), descending, k)
    if first is None:
        return None
    values, local = first  # (..., S, k)
    device = x.get_device()
    start = L.iota(segments, start=0, step=SEGMENT, dtype=torch.int64, device=device, requires_grad=False)
    index = L.lowerings[aten.add](local, L.view(start, [segments, 1]))
    index.realize()  # (a buffer of its own: read as rows of S * k, the add's index would be a modulo)
    candidates = list(outer) + [segments * k]
    second = lower_sort(L.view(values, candidates), descending, k)
    if second is None:
        return None
    top, position = second
    return top, L.lowerings[aten.gather](L.view(index, candidates), -1, position)


__all__ = ["MOST_K", "SEGMENT", "segmented_topk"]
