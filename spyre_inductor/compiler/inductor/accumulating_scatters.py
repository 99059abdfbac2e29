"""Accumulating scatters in every dtype, and ``scatter_reduce``, in spyre programs (issue 31).

Inductor lowers ``index_put(accumulate=True)``, ``scatter_add`` and ``index_add`` to an
``ir.Scatter`` in ``atomic_add`` mode only for some dtypes: int64 (and bool) accumulation goes to
an ATen fallback (``needs_fallback_due_to_atomic_add_limitations``, a GPU atomics limit), bf16
``index_add`` is not decomposed at all (pytorch#137425), and every ``scatter_reduce`` other than
``sum`` is an ATen ``ScatterFallback``. On spyre each of those ran outside any program. Here, on
spyre only, they lower to kernels the existing families plan (no family of its own):

* **int32, int64, fp32**: an ``ir.Scatter`` in ``atomic_add`` mode into the destination. The ls
  unit's accumulating scatter adds whole rows in the destination's dtype (int64 exactly, wrapping
  as the CPU does), every contribution counted, all contributions to one element added by one
  core in order (families/indirect/plan.py), so int64 needs no more than lifting Inductor's GPU
  limit. An in-place one scatters into the destination itself (one pass), values read from it
  realized first.
* **fp16, bf16**: the sum is kept in an fp32 accumulation buffer: the destination widened to fp32
  (a pointwise program), the contributions scatter-added into it in fp32 (exact widening), and
  one cast back, **rounding once**. PyTorch's CPU ``scatter_add`` and ``scatter_reduce(sum, mean)``
  round once too (they accumulate in fp32): equal up to the order of fp32 adds. Its CPU
  ``index_add`` and ``index_put_(accumulate=True)`` round after every add instead: with k
  contributions to one element the CPU's answer drifts up to about ``k/2`` units in the last
  place of the running sum away from the exact one (1000 adds of 0.1 into an fp16 zero: CPU
  105.19, fp32 sum rounded once 100.0; in bf16 the CPU stalls at 32.0). Ours is the more accurate
  answer; tests/compiler/test_accumulating_scatters.py pins it tightly against an fp32-accumulated
  reference and against the CPU within that documented bound.
* **scatter_reduce "sum" / "mean"**: the scatter-add above (include_self=False first writes the
  reduction's identity at every scattered position, a plain scatter); "mean" scatter-adds a count
  too (ones; starting at 1 with include_self) and divides in the accumulation dtype (floor
  division for integers, as ATen), rounding once (the CPU rounds a 16-bit sum, then divides:
  one ulp apart at most).
* **scatter_reduce "amax" / "amin" / "prod"**: no ls unit combines by max or product, so these
  are a dense compare-and-reduce, as sorting.py's ranks: ``out[..., j] = max over i of
  (index[..., i] == j ? src[..., i] : identity)``, one reduction program over (m, n) per row, plus
  a count of hits for include_self=False (a position no index reaches keeps its value). The
  timing model charges the m*n compares; ``MAX_PAIRS`` bounds them per row, beyond which the op
  is refused by name. Floats reduce in fp32 (prod of 16-bit floats rounds once: the CPU rounds
  after every multiply).

A 0-d destination is viewed as 1-d. Into a dim of size 1 Inductor drops the indirect index (0 is
the only valid one), which leaves one element written from several iterations, which no scatter
plans: ``index_add``, a one-index ``index_put``, ``scatter_add`` and scatter_reduce "mean" there
sum the source along the dim (a reduction) and add it once (amax/amin/prod are dense anyway).
Left to Inductor's own lowering (its ATen fallback, which
SPYRE_STRICT=1 refuses naming the aten op): destinations of any other dtype (bool, float64, int8),
a 0-d index_put. Refused by name: a dense reduction of more than ``MAX_PAIRS`` compares per row
(``Refused``, a NotImplementedError naming the op), and a multi-index ``index_put`` into dims of
size 1 from several positions (capture: "an accumulating store ... at one index from several
iterations").
"""

from __future__ import annotations

import torch
from torch._inductor import ir
from torch._inductor import lowering as L
from torch._inductor.virtualized import V, ops

aten = torch.ops.aten

# 16-bit floats: accumulated in an fp32 buffer, rounded once
WIDENED = frozenset({torch.float16, torch.bfloat16})
# destinations whose accumulating scatter runs on the card
DTYPES = frozenset({torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64})
# m * n compares per row of a dense amax/amin/prod (as sorting.MAX_N**2)
MAX_PAIRS = 4096 * 4096
_DENSE = {"amax": aten.amax, "amin": aten.amin, "prod": aten.prod}


class Refused(NotImplementedError):
    """An accumulating scatter this module does not put on the card, naming op and dtype."""


def on_spyre(x) -> bool:
    if not isinstance(x, ir.TensorBox):
        return False
    device = x.get_device()
    return device is not None and device.type == "spyre"


def _taken(op: str, x) -> bool:
    """Whether this module lowers `op` into `x` (on spyre, a dtype the card accumulates)."""
    # any other dtype (bool, float64, int8) keeps Inductor's lowering: under SPYRE_STRICT=1 its
    # fallback is refused naming the aten op
    return on_spyre(x) and x.get_dtype() in DTYPES


def _accumulation_dtype(dtype):
    return torch.float32 if dtype in WIDENED else dtype


def _scatter(dest, ranges, value, indexer, mode) -> None:
    """dest[indexer(i)] (+)= value(i) for every i in ranges: an ir.Scatter mutating `dest`."""
    scatter = ir.Scatter(device=dest.get_device(), dtype=dest.get_dtype(), inner_fn=value, ranges=ranges,
                         output_indexer=indexer, scatter_mode=mode)
    buffer = ir.ComputedBuffer(name=None, layout=ir.MutationLayoutSHOULDREMOVE(dest), data=scatter)
    buffer.name = V.graph.register_buffer(buffer)
    V.graph.register_operation(buffer)


def _fresh(x, dtype):
    """A new buffer holding x as `dtype` (the accumulation buffer: never x's own storage)."""
    out = L.to_dtype(L.clone(x), dtype) if x.get_dtype() == dtype else L.to_dtype(x, dtype)
    out.realize()
    return out


def accumulate(x, ranges, value, indexer, *, include_self=True, counts=False, in_place=False):
    """x with every value(i), i in `ranges`, added at indexer(i), as a new tensor of x's dtype.

    Summed in the accumulation dtype (fp32 for 16-bit floats) and rounded once. Without
    include_self the scattered positions start from 0. With counts: (sum, count) in the
    accumulation dtype, count starting at 1 (include_self) or 0 where scattered. `in_place`: x
    itself is scattered into when it is its own accumulation dtype (one pass, as Inductor's
    index_put_; the caller has realized values that read x)."""
    dtype = x.get_dtype()
    acc_dtype = _accumulation_dtype(dtype)
    if in_place and acc_dtype == dtype and not counts:
        x.realize()
        acc = x
    else:
        acc = _fresh(x, acc_dtype)
    if not include_self:
        _scatter(acc, ranges, lambda i: ops.constant(0, acc_dtype), indexer, None)
    # (the values come in x's dtype, as ATen requires of src: widened exactly, else as they are)
    widened = value if acc_dtype == dtype else (lambda i: ops.to_dtype(value(i), acc_dtype))
    _scatter(acc, ranges, widened, indexer, "atomic_add")
    if not counts:
        return acc if acc_dtype == dtype else L.to_dtype(acc, dtype)
    count = L.full(list(x.get_size()), 1, dtype=acc_dtype, device=x.get_device())
    count.realize()
    if not include_self:
        _scatter(count, ranges, lambda i: ops.constant(0, acc_dtype), indexer, None)
    _scatter(count, ranges, lambda i: ops.constant(1, acc_dtype), indexer, "atomic_add")
    return acc, count


def _axis_indexer(x, dim, index):
    """idx -> idx with its `dim` coordinate read from `index` at idx (scatter_add's addressing)."""
    loader, size = index.make_loader(), x.get_size()[dim]

    def indexer(idx):
        out = list(idx)
        out[dim] = ops.indirect_indexing(loader(idx), size, wrap_neg=False)
        return out

    return indexer


def _src_loader(src, dtype):
    if isinstance(src, ir.TensorBox):
        return src.make_loader()
    return lambda i: ops.constant(src, dtype)


def scatter_add(x, dim, index, src, *, include_self=True, in_place=False):
    """x.scatter_add(dim, index, src) (scatter_reduce "sum"): a new tensor, or x (`in_place`)."""
    dim = L._validate_dim(x, dim)
    if index.get_numel() == 0:
        return L.clone(x)
    if V.graph.sizevars.statically_known_equals(x.get_size()[dim], 1) and isinstance(src, ir.TensorBox):
        return _summed_scatter(x, dim, index, src, include_self)
    if in_place:
        _values_apart(x, src)
    return accumulate(x, index.get_size(), _src_loader(src, x.get_dtype()), _axis_indexer(x, dim, index),
                      include_self=include_self, in_place=in_place)


def _values_apart(x, values) -> None:
    """Values computed from x itself are realized before x is scattered into in place
    (duplicates would otherwise read what an earlier add wrote: pytorch#138908, as Inductor)."""
    if isinstance(values, ir.TensorBox):
        x.realize()
        if ir.try_get_name(x) in values.get_read_names():
            values.realize()


def _off_dim_pad(x, dim, index):
    """constant_pad_nd's pad from index's extent to x's off `dim` (None: no narrower dim)."""
    sizes, isizes = list(x.get_size()), list(index.get_size())
    pad = []
    for d in reversed(range(len(sizes))):
        pad += [0, 0 if d == dim else sizes[d] - isizes[d]]
    return pad if V.graph.sizevars.statically_known_gt(sum(pad), 0) else None


def _reached(x, dim, index, pad):
    """Where an index narrower than x off `dim` reaches (bool, broadcast along dim)."""
    isizes = list(index.get_size())
    covered = L.full([1 if d == dim else isizes[d] for d in range(len(isizes))], True, dtype=torch.bool,
                     device=x.get_device())
    return L.lowerings[aten.constant_pad_nd.default](covered, pad, False)


def _summed_scatter(x, dim, index, src, include_self):
    """scatter_add into a dim of size 1 (every index is 0): the source over the index's extent
    summed along dim (_summed_in), where the index reaches; elsewhere x."""
    isizes = list(index.get_size())
    for d in range(len(isizes)):
        if src.get_size()[d] != isizes[d]:
            src = L.slice_(src, d, 0, isizes[d])
    pad = _off_dim_pad(x, dim, index)
    if pad is not None:  # zeros past the index's extent, where x is kept
        src = L.lowerings[aten.constant_pad_nd.default](src, pad, 0)
    if include_self:
        return _summed_in(x, src, dim)
    total = _summed_in(L.full(list(x.get_size()), 0, dtype=x.get_dtype(), device=x.get_device()), src, dim)
    return total if pad is None else L.where(_reached(x, dim, index, pad), total, x)


def scatter_mean(x, dim, index, src, *, include_self=True):
    dim = L._validate_dim(x, dim)
    if index.get_numel() == 0:
        return L.clone(x)
    if V.graph.sizevars.statically_known_equals(x.get_size()[dim], 1) and isinstance(src, ir.TensorBox):
        # into a dim of size 1: the sum (_summed_scatter, kept in the accumulation dtype) over
        # the index's extent along dim, plus x itself with include_self
        acc_dtype = _accumulation_dtype(x.get_dtype())
        total = _summed_scatter(L.to_dtype(x, acc_dtype), dim, index, src, include_self)
        n = int(index.get_size()[dim]) + (1 if include_self else 0)
        count = L.full(list(x.get_size()), n, dtype=acc_dtype, device=x.get_device())
        pad = _off_dim_pad(x, dim, index)
        if pad is not None:  # past the index's extent: x over 1
            count = L.where(_reached(x, dim, index, pad), count, 1)
    else:
        total, count = accumulate(x, index.get_size(), _src_loader(src, x.get_dtype()),
                                  _axis_indexer(x, dim, index), include_self=include_self, counts=True)
    # a position no index reaches: its count is 0 only without include_self, and its sum is x's
    count = L.lowerings[aten.clamp_min](count, 1)
    if total.get_dtype().is_floating_point:
        mean = L.lowerings[aten.div.Tensor](total, count)
    else:
        mean = L.lowerings[aten.div.Tensor_mode](total, count, rounding_mode="floor")
    return L.to_dtype(mean, x.get_dtype())


def scatter_dense(x, dim, index, src, reduce, *, include_self=True):
    """x.scatter_reduce(dim, index, src, reduce) for amax/amin/prod: a compare-and-reduce over the
    scattered dim (module docstring)."""
    op = f"scatter_reduce({reduce!r})"
    dim = L._validate_dim(x, dim)
    if index.get_numel() == 0:
        return L.clone(x)
    sizes, isizes = list(x.get_size()), list(index.get_size())
    m, n = sizes[dim], isizes[dim]
    sv = V.graph.sizevars
    if not sv.statically_known_leq(m * n, MAX_PAIRS):
        raise Refused(f"spyre: {op} compares {m} x {n} positions per row, over the {MAX_PAIRS} planned")
    if not isinstance(src, ir.TensorBox):
        src = L.full(isizes, src, dtype=x.get_dtype(), device=x.get_device())
    for d in range(len(isizes)):  # src may be larger than index: only index's extent counts
        if src.get_size()[d] != isizes[d]:
            src = L.slice_(src, d, 0, isizes[d])
    # an index narrower than x off `dim`: padded with -1 (names no position), those rows keep x's
    pad = []
    for d in reversed(range(len(sizes))):
        pad += [0, 0 if d == dim else sizes[d] - isizes[d]]
    if any(sv.statically_known_gt(p, 0) for p in pad):
        index = L.lowerings[aten.constant_pad_nd.default](index, pad, -1)
        src = L.lowerings[aten.constant_pad_nd.default](src, pad, 0)
    acc_dtype = _accumulation_dtype(x.get_dtype())
    last = len(sizes) - 1
    order = list(range(last + 1))
    order[dim], order[last] = last, dim
    # (..., m, n): does index[..., i] name position j?
    idx_t, src_t = L.permute(index, order), L.permute(L.to_dtype(src, acc_dtype), order)
    position = L.iota(m, start=0, step=1, dtype=index.get_dtype(), device=x.get_device(), requires_grad=False)
    hit = L.lowerings[aten.eq.Tensor](L.unsqueeze(idx_t, -2), L.view(position, [m, 1]))
    if reduce == "prod":
        identity = 1
    elif acc_dtype.is_floating_point:
        identity = float("-inf") if reduce == "amax" else float("inf")
    else:
        info = torch.iinfo(acc_dtype)
        identity = info.min if reduce == "amax" else info.max
    picked = L.where(hit, L.unsqueeze(src_t, -2), identity)
    reduced = L.lowerings[_DENSE[reduce]](picked, [-1]) if reduce != "prod" else L.lowerings[aten.prod](picked, -1)
    reduced = L.permute(reduced, order)
    x_acc = L.to_dtype(x, acc_dtype)
    if include_self:
        combine = {"amax": aten.maximum, "amin": aten.minimum, "prod": aten.mul.Tensor}[reduce]
        out = L.lowerings[combine](x_acc, reduced)
    else:
        hits = L.permute(L.sum_(hit, [-1], dtype=torch.int32), order)
        out = L.where(L.lowerings[aten.gt.Scalar](hits, 0), reduced, x_acc)
    return L.to_dtype(out, x.get_dtype())


def index_put_accumulate(x, indices, values, check=True, in_place=False):
    """x.index_put(indices, values, accumulate=True) (Inductor's indexing): a new tensor, or x."""
    indices, tensor_indices = L.check_and_broadcast_indices(indices, x.get_device())
    loaders = [i.make_loader() if i is not None else None for i in indices]
    x_size = x.get_size()
    tensor_size = list(indices[tensor_indices[0]].get_size())
    indexed_size = [x_size[i] for i in range(len(indices))]
    expected, indexer = L.index_output_size_and_inner_fn(x_size, indices, tensor_indices, tensor_size, loaders,
                                                         indexed_size, None, check=check)
    values = L.expand(L.to_dtype(values, x.get_dtype()), expected)
    if (len(tensor_indices) == 1 and len(indices[tensor_indices[0]].get_size()) == 1
            and V.graph.sizevars.statically_known_equals(x_size[tensor_indices[0]], 1)):
        # one 1-d index into a dim of size 1 (index_add's decomposition): every value lands on
        # position 0 of it, several iterations on one element: their sum, added once
        return _summed_in(x, values, tensor_indices[0])
    if in_place:
        _values_apart(x, values)
    return accumulate(x, expected, values.make_loader(), indexer, in_place=in_place)


def _summed_in(x, values, dim, alpha=1):
    """x + alpha * values summed along `dim` (kept), in the accumulation dtype, rounded once:
    an accumulating scatter into a dim of size 1, where Inductor drops the indirect index (which
    leaves one element written from several iterations, which no scatter plans)."""
    acc_dtype = _accumulation_dtype(x.get_dtype())
    total = L.sum_(L.to_dtype(values, acc_dtype), [dim], keepdims=True, dtype=acc_dtype)
    if alpha != 1:
        total = L.lowerings[aten.mul.Tensor](total, alpha)
    return L.to_dtype(L.lowerings[aten.add.Tensor](L.to_dtype(x, acc_dtype), total), x.get_dtype())


def index_add(x, dim, index, source, alpha=1):
    """x.index_add(dim, index, source, alpha=alpha) as a new tensor."""
    dim = L._validate_dim(x, dim)
    if V.graph.sizevars.statically_known_equals(x.get_size()[dim], 1):
        return _summed_in(x, source, dim, alpha)  # every index names position 0
    loader, size, src = index.make_loader(), x.get_size()[dim], source.make_loader()

    def indexer(idx):
        out = list(idx)
        out[dim] = ops.indirect_indexing(loader([idx[dim]]), size, wrap_neg=False)
        return out

    def scaled(i):
        return ops.mul(src(i), ops.constant(alpha, source.get_dtype()))

    return accumulate(x, source.get_size(), src if alpha == 1 else scaled, indexer)


def _bool_indices(indices) -> bool:
    return any(i is not None and i.get_dtype() in (torch.bool, torch.uint8) for i in indices)


# -- the lowerings: on spyre ours, elsewhere Inductor's --------------------------------------------

def _in_place(x, out):
    return x if out is x else L.mutate_to(x, out)


def _one(t):
    return L.view(t, [1]) if isinstance(t, ir.TensorBox) and len(t.get_size()) == 0 else t


def _on_vectors(fn, x, dim, index, src, *args, **kwargs):
    """fn over x, index and src, a 0-d one viewed as 1-d (as Inductor's scatter_reduce_ does)."""
    if len(x.get_size()) == 0:
        return L.view(fn(_one(x), 0, _one(index), _one(src), *args, **kwargs), [])
    return fn(x, dim, _one(index), _one(src), *args, **kwargs)


def _index_put(inductor, in_place: bool, check: bool):
    def lowering(x, indices, values, accumulate=False):
        if (accumulate and not _bool_indices(indices) and len(x.get_size()) > 0
                and not torch.are_deterministic_algorithms_enabled()
                and _taken("index_put(accumulate=True)", x)):
            out = index_put_accumulate(x, indices, values, check=check, in_place=in_place)
            return _in_place(x, out) if in_place else out
        return inductor(x, indices, values, accumulate)

    return lowering


def _scatter_add(inductor, in_place: bool):
    def lowering(x, dim, index, src):
        if _taken("scatter_add", x):
            out = (scatter_add(x, dim, index, src, in_place=True) if in_place and len(x.get_size())
                   else _on_vectors(scatter_add, x, dim, index, src))
            return _in_place(x, out) if in_place else out
        return inductor(x, dim, index, src)

    return lowering


def _scatter_reduce(inductor, in_place: bool):
    def lowering(x, dim, index, src, reduce, *, include_self=True):
        if _taken(f"scatter_reduce({reduce!r})", x):
            if reduce == "sum":
                out = _on_vectors(scatter_add, x, dim, index, src, include_self=include_self)
            elif reduce == "mean":
                out = _on_vectors(scatter_mean, x, dim, index, src, include_self=include_self)
            else:
                out = _on_vectors(scatter_dense, x, dim, index, src, reduce, include_self=include_self)
            return _in_place(x, out) if in_place else out
        return inductor(x, dim, index, src, reduce, include_self=include_self)

    return lowering


def _scatter_with_reduce(inductor, in_place: bool):
    """scatter(..., reduce="add" | "multiply"): scatter_reduce's sum or prod, the destination included."""
    def lowering(x, dim, index, src, *, reduce=None):
        if reduce in ("add", "multiply") and _taken(f"scatter(reduce={reduce!r})", x):
            how = "sum" if reduce == "add" else "prod"
            return _scatter_reduce(None, in_place)(x, dim, index, src, how)
        return inductor(x, dim, index, src, reduce=reduce)

    return lowering


def _index_add(inductor):
    def lowering(x, dim, index, source, *, alpha=1):
        if _taken("index_add", x):
            return _on_vectors(index_add, x, dim, index, source, alpha)
        return inductor(x, dim, index, source, alpha=alpha)

    return lowering


def lowerings():
    """(overload, spyre-conditional lowering) pairs, over Inductor's current lowerings."""
    from torch._inductor import inductor_prims

    own = L.lowerings
    pairs = [
        (aten.index_put.default, _index_put(own[aten.index_put.default], False, True)),
        (aten.index_put_.default, _index_put(own[aten.index_put_.default], True, True)),
        (aten._unsafe_index_put.default, _index_put(own[aten._unsafe_index_put.default], False, False)),
        (inductor_prims._unsafe_index_put_, _index_put(own[inductor_prims._unsafe_index_put_], True, False)),
        (aten.scatter_add.default, _scatter_add(own[aten.scatter_add.default], False)),
        (aten.scatter_add_.default, _scatter_add(own[aten.scatter_add_.default], True)),
        (aten.scatter_reduce.two, _scatter_reduce(own[aten.scatter_reduce.two], False)),
        (aten.scatter_reduce_.two, _scatter_reduce(own[aten.scatter_reduce_.two], True)),
    ]
    for packet, in_place in ((aten.scatter, False), (aten.scatter_, True)):
        for overload in (packet.reduce, packet.value_reduce):
            pairs.append((overload, _scatter_with_reduce(own[overload], in_place)))
    # index_add has no Inductor lowering: its decomposition (into index_put) runs first, except
    # for bf16 (pytorch#137425), which reaches the graph and, elsewhere, ATen
    fallback = own.get(aten.index_add.default) or L.fallback_handler(aten.index_add.default,
                                                                     add_to_fallback_set=False)
    pairs.append((aten.index_add.default, _index_add(fallback)))
    return pairs


__all__ = ["DTYPES", "MAX_PAIRS", "Refused", "WIDENED", "accumulate", "index_add", "index_put_accumulate",
           "lowerings", "scatter_add", "scatter_dense", "scatter_mean"]
