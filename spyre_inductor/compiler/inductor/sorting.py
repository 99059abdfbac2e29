"""``sort``, ``argsort`` and ``topk`` in spyre programs: a sorting network where it applies, else ranks and scatters.

Inductor lowers ``aten.sort`` to ``ir.Sort`` (Triton's bitonic ``ops.sort``, which our capture does
not take) or an ATen fallback, and ``aten.topk`` to an ATen fallback: on spyre both ran outside any
program. Here they lower, on spyre, in one of two ways:

**The sort family** (sort_node.py, families/sort/, issue 31): rows of a static length, sorted by a
bitonic network on chip, one program writing values and indices (topk: the first k of each row,
nothing else stored). It applies to every static row length whose network fits the scratchpad
(a row of N = n padded to a power of two: its keys, int32 indices and the int64 first k, twice;
a full sort up to N = 32768 of 32- and 64-bit keys, 65536 of 8- and 16-bit ones, a small topk
twice that), over a static count of rows or a dynamic one (coef * one size: planned at its
bucket's maximum, the transfers clipped to the launch's rows). A topk of rows longer than a
segment (4096) takes the first k of every segment, then of their candidates (sort_segments.py):
every core busy for one long row, and rows past one network's scratchpad (a vocabulary) within
reach.

**The rank count** where the network does not apply: rows counted by more than one size known
only at launch (a (batch, seq) of router logits both dynamic: a kernel serves one size symbol),
a row length or k known only at launch but statically at most ``MAX_N`` (a longer symbolic one
is Inductor's fallback call of the op, whose compile-backed spyre kernel plans one network per
length it meets), or a static row too long for the network but within ``MAX_N`` (none today).
The same scheme randperm.py uses for its keys:

1. ``rank[..., i] = #{j : x[j] comes before x[i]}``: an (n, n) compare summed over j, one reduction
   program per row block (the compare is inlined into the reduction's body: nothing n x n is
   stored). "Before" is the order the CPU's stable sort produces: for ``descending`` a larger value,
   for ascending a smaller one, and an equal value at a lower index. Ties therefore keep their
   input order, so every row's ranks are exactly 0 .. n-1: a permutation whatever the data.
2. ``values[..., rank[i]] = x[i]`` and ``indices[..., rank[i]] = i``: two scatters by the loaded
   ranks (the indirect family), fused into one program by the scheduler.

``topk(k)`` is the first k of the sort in the requested direction (``largest``): its ranks and
scatters are the sort's, sliced. The timing model charges what these programs do: n**2 compares
per row, so ``MAX_N`` bounds the row length (as for randperm); a longer row the network does not
take keeps Inductor's fallback, which under SPYRE_STRICT=1 is a named refusal.

What both match of PyTorch's CPU kernels (pinned by tests/compiler/test_topk_sort.py):
* NaN compares greater than every number and equal to NaN: it comes first in a descending sort
  and in topk(largest=True), last in an ascending sort and in topk(largest=False); NaNs keep
  their input order among themselves. ``-0.0`` and ``0.0`` compare equal (input order).
* Ties in input order. The CPU's ``stable=False`` sort and its topk guarantee no order among
  ties; ours is the stable one, which is one of the orders the CPU may return (and is the one it
  returns for the rows the tests try).
* ``topk(sorted=False)`` returns the k elements sorted, which the CPU's contract allows.
* Bad ``k`` (negative, larger than the dim) is refused by the op's meta function at trace time,
  with the CPU's own message ("selected index k out of range").
"""

from __future__ import annotations

import torch
from torch._inductor import ir
from torch._inductor import lowering as L

aten = torch.ops.aten

# Longest row sorted on the card: n**2 compares per row (4096: 16.8M, ~0.4 .. 1.4 s host time in the
# simulator, as randperm.MAX_N).
MAX_N = 4096

# Dtypes whose compare the card does; bool and float64 rows keep Inductor's fallback.
DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
                    torch.int8, torch.uint8})


def sortable(x) -> bool:
    """Whether this spyre lowering takes the sort of `x` along a dim of `n` (static) elements."""
    if not isinstance(x, ir.TensorBox) or x.get_dtype() not in DTYPES:
        return False
    device = x.get_device()
    return device is not None and device.type == "spyre" and len(x.get_size()) > 0


def _fits(n) -> bool:
    from torch._inductor.virtualized import V

    return V.graph.sizevars.statically_known_leq(n, MAX_N)


def _op(packet, *args):
    return L.lowerings[packet](*args)


def ranks(x, descending: bool):
    """rank[..., i]: how many elements of x's last-dim row come before x[..., i] in a stable sort
    (int64). A NaN is the greatest value and equal to another NaN."""
    n = x.get_size()[-1]
    xi = L.unsqueeze(x, -1)  # (..., n, 1): the element ranked
    xj = L.unsqueeze(x, -2)  # (..., 1, n): the elements it is counted against
    position = L.iota(n, start=0, step=1, dtype=torch.int64, device=x.get_device(), requires_grad=False)
    pi, pj = L.view(position, [n, 1]), L.view(position, [1, n])
    first = _op(aten.gt, xj, xi) if descending else _op(aten.lt, xj, xi)
    equal = _op(aten.eq, xj, xi)
    if x.get_dtype().is_floating_point:
        nan_i, nan_j = _op(aten.isnan, xi), _op(aten.isnan, xj)
        greater_nan = (_op(aten.logical_and, nan_j, _op(aten.logical_not, nan_i)) if descending
                       else _op(aten.logical_and, nan_i, _op(aten.logical_not, nan_j)))
        first = _op(aten.logical_or, first, greater_nan)
        equal = _op(aten.logical_or, equal, _op(aten.logical_and, nan_i, nan_j))
    tie = _op(aten.logical_and, equal, _op(aten.lt, pj, pi))
    before = _op(aten.logical_or, first, tie)
    rank = L.sum_(before, [-1], dtype=torch.int64)
    rank.realize()  # the scatters load it as their index: a program of its own
    return rank


def _scattered(src, rank):
    """out[..., rank[..., i]] = src[..., i] over a fresh buffer of src's shape and dtype. The ranks
    are a permutation of every row, so the scatter writes every element: the buffer starts empty
    (no fill program)."""
    out = L.empty_strided(list(src.get_size()), None, dtype=src.get_dtype(), device=src.get_device())
    return L.scatter_reduce_(out, -1, rank, src, None)


def sort_last(x, descending: bool):
    """(values, int64 indices) of x sorted along its last dim, ties in input order."""
    rank = ranks(x, descending)
    shape = list(x.get_size())
    n = shape[-1]
    position = L.iota(n, start=0, step=1, dtype=torch.int64, device=x.get_device(), requires_grad=False)
    position = L.expand(L.view(position, [1] * (len(shape) - 1) + [n]), shape)
    return _scattered(x, rank), _scattered(position, rank)


def _first(t, k):
    """t's first k along the last dim, as a buffer of its own. Left a view, a consumer that
    reshapes it (the router's ``top_k_weights.reshape(-1)``) reads rows of k out of rows of n: a
    non-affine index ((i mod k) + n * (i // k)) that capture refuses. The copy is k elements a row."""
    n = t.get_size()[-1]
    from torch._inductor.virtualized import V

    if V.graph.sizevars.statically_known_equals(k, n):
        return t
    first = L.clone(L.slice_(t, -1, 0, k))
    first.realize()
    return first


def _along(x, dim: int, body):
    """body(x with `dim` moved last) -> tensors with that dim last, moved back to `dim` (None if
    body gives None)."""
    last = len(x.get_size()) - 1
    if dim == last:
        return body(x)
    order = list(range(last + 1))
    order[dim], order[last] = last, dim
    got = body(L.permute(x, order))
    return None if got is None else tuple(L.permute(t, order) for t in got)


def segmented_topk(x, descending: bool, k):
    """topk of rows longer than a segment (sort_segments.py), or None."""
    from .sort_segments import segmented_topk as cut

    return cut(x, descending, k)


def _network(x, dim: int, descending: bool, k):
    """(values, indices) of the first k along `dim` from the sort family's program, or None where
    the network does not apply (sort_node.lower_sort)."""
    from .sort_node import lower_sort

    return _along(x, dim, lambda t: lower_sort(t, descending, k))


def _spyre_sort_stable(inductor_sort_stable):
    def lowering(x, *, stable=None, dim=-1, descending=False):
        if sortable(x):
            dim = L.canonicalize_dim(len(x.get_size()), dim)
            got = _network(x, dim, descending, x.get_size()[dim])
            if got is not None:
                return got
            if _fits(x.get_size()[dim]):
                return _along(x, dim, lambda t: sort_last(t, descending))
            return L.sort_fallback(x, stable=stable, dim=dim, descending=descending)
        return inductor_sort_stable(x, stable=stable, dim=dim, descending=descending)

    return lowering


def _spyre_sort(inductor_sort):
    def lowering(x, dim=-1, descending=False):
        if sortable(x):
            return L.lowerings[aten.sort.stable](x, stable=False, dim=dim, descending=descending)
        return inductor_sort(x, dim, descending)

    return lowering


def _spyre_topk(inductor_topk):
    def lowering(x, k, dim=-1, largest=True, sorted=True):
        if sortable(x):
            dim = L.canonicalize_dim(len(x.get_size()), dim)
            got = _along(x, dim, lambda t: segmented_topk(t, largest, k)) or _network(x, dim, largest, k)
            if got is not None:
                return got
            if _fits(x.get_size()[dim]):
                def first_k(t):
                    return tuple(_first(s, k) for s in sort_last(t, largest))

                return _along(x, dim, first_k)
            return L.topk_fallback(x, k, dim, largest, sorted)
        return inductor_topk(x, k, dim, largest, sorted)

    return lowering


def install() -> None:
    """Register the spyre-conditional sort and topk lowerings (called once, by lowerings.install)."""
    L.register_lowering(aten.sort.stable, type_promotion_kind=None)(_spyre_sort_stable(L.lowerings[aten.sort.stable]))
    L.register_lowering(aten.sort.default, type_promotion_kind=None)(_spyre_sort(L.lowerings[aten.sort.default]))
    L.register_lowering(aten.topk.default, type_promotion_kind=None)(_spyre_topk(L.lowerings[aten.topk.default]))
