"""``embedding_bag`` (sum, mean, max) in spyre programs (issue 31).

Inductor keeps ``aten._embedding_bag`` and ``_embedding_bag_forward_only`` as ATen fallbacks: on
spyre they ran outside any program. Here, on spyre, they lower to kernels the existing families
plan, over accumulating_scatters.py:

1. ``bag[i] = #{b < B : offsets[b] <= i} - 1``: each index position's bag, an (n, B) compare
   summed over the bags (a reduction, as sorting.py's ranks); offsets are non-decreasing from 0.
2. the rows ``weight[indices]``: a gather (the indirect family);
3. sum / mean: the rows (times ``per_sample_weights``) added into their bags, 16-bit weights in an
   fp32 accumulation buffer rounded once; mean divides by the bag's count (an empty bag is 0, as
   the CPU gives); max: accumulating_scatters.scatter_dense over the bags (an empty bag is 0).

An index equal to ``padding_idx``, and with ``include_last_offset`` a position at or past the last
offset, counts in no bag. The other outputs take the meta shapes of a non-CPU device:
``offset2bag`` (n,) each position's bag, ``bag_size`` (len(offsets),) each bag's count (0 past the
bags), ``max_indices`` (B, D) the weight row of each max (the first in the bag among ties, as the
CPU), or (0,) for sum and mean. ``scale_grad_by_freq`` and ``sparse`` only change the backward,
which stays Inductor's fallback (refused by name under SPYRE_STRICT=1).
"""

from __future__ import annotations

import torch
from torch._inductor import lowering as L

from . import accumulating_scatters as S

aten = torch.ops.aten
MODES = {0: "sum", 1: "mean", 2: "max"}


def _op(overload, *args, **kwargs):
    return L.lowerings[overload](*args, **kwargs)


def _bags(indices, offsets, num_bags, include_last_offset, padding_idx):
    """(bag of each position (int64, realized), whether it counts (bool))."""
    n = indices.get_size()[0]
    device = indices.get_device()
    position = L.iota(n, start=0, step=1, dtype=torch.int64, device=device, requires_grad=False)
    starts = L.to_dtype(L.slice_(offsets, 0, 0, num_bags), torch.int64)
    begun = _op(aten.le.Tensor, L.view(starts, [1, num_bags]), L.view(position, [n, 1]))
    bag = _op(aten.sub.Tensor, L.sum_(begun, [1], dtype=torch.int64), 1)
    bag.realize()  # the scatters load it as their index: a program of its own
    counts = None
    if padding_idx is not None and padding_idx >= 0:
        counts = _op(aten.ne.Scalar, indices, padding_idx)
    if include_last_offset:
        end = L.to_dtype(L.select(offsets, 0, num_bags), torch.int64)
        inside = _op(aten.lt.Tensor, position, end)
        counts = inside if counts is None else _op(aten.logical_and, counts, inside)
    if counts is None:
        counts = L.full([n], True, dtype=torch.bool, device=device)
    return bag, counts


def lower(weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False, per_sample_weights=None,
          include_last_offset=False, padding_idx=-1):
    """(output, offset2bag, bag_size, max_indices) of aten._embedding_bag on spyre."""
    how = MODES[mode]
    n, dim = indices.get_size()[0], weight.get_size()[1]
    num_bags = offsets.get_size()[0] - (1 if include_last_offset else 0)
    dtype, device = weight.get_dtype(), weight.get_device()
    acc = torch.float32 if dtype in S.WIDENED else dtype
    bag, counts = _bags(indices, offsets, num_bags, include_last_offset, padding_idx)
    rows = _op(aten.embedding.default, weight, indices)  # (n, D): a gather, realized
    kept = L.view(counts, [n, 1])
    zeros = L.full([num_bags, dim], 0, dtype=dtype, device=device)
    ones = L.to_dtype(counts, acc)
    size = S.index_add(L.full([num_bags], 0, dtype=acc, device=device), 0, bag, ones)
    if how == "max":
        # a position that counts in no bag names bag -1: it reaches no output row
        named = L.where(counts, bag, -1)
        index = L.expand(L.view(named, [n, 1]), [n, dim])
        index.realize()
        out = S.scatter_dense(zeros, 0, index, rows, "amax", include_self=False)
        out.realize()
        max_indices = _first_max(rows, index, out, indices, num_bags, n)
    else:
        contribution = L.to_dtype(rows, acc)
        if per_sample_weights is not None:
            contribution = _op(aten.mul.Tensor, contribution, L.view(L.to_dtype(per_sample_weights, acc), [n, 1]))
        contribution = L.where(kept, contribution, 0)
        total = S.index_add(L.full([num_bags, dim], 0, dtype=acc, device=device), 0, bag, contribution)
        if how == "mean":
            total = _op(aten.div.Tensor, total, L.view(_op(aten.clamp_min, size, 1), [num_bags, 1]))
        out = L.to_dtype(total, dtype)
        max_indices = L.full([0], 0, dtype=indices.get_dtype(), device=device)
    bag_size = L.to_dtype(size, indices.get_dtype())
    extra = offsets.get_size()[0] - num_bags
    if extra:
        bag_size = _op(aten.constant_pad_nd.default, bag_size, [0, extra], 0)
    return out, L.to_dtype(bag, indices.get_dtype()), bag_size, max_indices


def _first_max(rows, index, out, indices, num_bags, n):
    """max_indices[b, d]: indices[i] of the first position i of bag b whose row holds the max."""
    dim, n = rows.get_size()[1], int(n)  # (static: a scalar operand of where must be a Python int)
    device = rows.get_device()
    # (B, D, n): position i is in bag b and holds its max along d
    bags = L.iota(num_bags, start=0, step=1, dtype=torch.int64, device=device, requires_grad=False)
    in_bag = _op(aten.eq.Tensor, L.view(L.permute(index, [1, 0]), [1, dim, n]), L.view(bags, [num_bags, 1, 1]))
    holds = _op(aten.eq.Tensor, L.view(L.permute(rows, [1, 0]), [1, dim, n]), L.view(out, [num_bags, dim, 1]))
    position = L.iota(n, start=0, step=1, dtype=torch.int64, device=device, requires_grad=False)
    first = L.lowerings[aten.amin](L.where(_op(aten.logical_and, in_bag, holds), L.view(position, [1, 1, n]), n),
                                   [-1])
    first.realize()
    found = _op(aten.ne.Scalar, first, n)  # an empty bag's is 0, as the CPU's
    picked = _op(aten.index.Tensor, L.to_dtype(indices, torch.int64), [_op(aten.clamp_max, first, n - 1)])
    return L.to_dtype(L.where(found, picked, 0), indices.get_dtype())


def _spyre_embedding_bag(inductor_lowering):
    def lowering(weight, indices, offsets, *args, **kwargs):
        if (S.on_spyre(weight) and weight.get_dtype() in S.WIDENED | {torch.float32}
                and len(indices.get_size()) == 1 and indices.get_size()[0] != 0):
            return lower(weight, indices, offsets, *args, **kwargs)
        return inductor_lowering(weight, indices, offsets, *args, **kwargs)

    return lowering


def lowerings():
    """(overload, spyre-conditional lowering) pairs, over Inductor's current lowerings."""
    return [(op, _spyre_embedding_bag(L.lowerings[op]))
            for op in (aten._embedding_bag.default, aten._embedding_bag_forward_only.default)]


__all__ = ["MODES", "lower", "lowerings"]
