"""Mixture-of-experts routing in spyre programs: ``histc`` and the grouped matmul (issue 31).

transformers' default experts forward (``grouped_mm_experts_forward``, Mixtral's and gpt-oss's)
sorts the (token, slot) pairs by expert (sorting.py), counts the pairs per expert with ``histc``,
takes offsets with ``cumsum`` and runs one grouped matmul over the expert weights: eager it calls
``aten._grouped_mm``; under torch.compile with non-bf16 weights it calls its own opaque custom op
``transformers::grouped_mm_fallback`` (a host loop over ``offs.tolist()``), which has the same
contract. Inductor falls back to ATen for both and for ``histc``; on spyre they lower here.

``histc(x, bins, lo, hi)`` (lo < hi given): ``hist[b] = #{i : bin(x[i]) == b}``, a (bins, n)
compare summed over n, one reduction program. ``bin(v) = floor((v - lo) * bins / (hi - lo))``
computed in v's dtype, ``bins - 1`` for ``v == hi``, nothing for v outside [lo, hi] or NaN: the
CPU's formula. (The CPU then nudges the bin by one where that formula and its linspace edges
disagree, which only values within an ulp or so of an inner edge can see; exact for the integer
expert ids the routing counts.) ``lo == hi`` (range from the data) keeps Inductor's fallback. Integer input, which
transformers passes on any device but the CPU and MPS (the CPU's histc refuses integers), is
counted as CUDA's histc counts it: ``(v - lo) * bins // (hi - lo)`` in integers, the result in
the input's dtype.

``grouped_mm(a (S, K), w (E, K, N), offs (E,))``: row s belongs to expert
``g(s) = #{e : offs[e] <= s}`` (rows ``offs[e-1] .. offs[e]-1`` to expert e); rows past
``offs[-1]``, which the CPU leaves uninitialized, are zeros here. It is one program of the experts
family (experts_node.py, families/experts/): offs read on chip, each expert's rows only through
its own weights, an expert with no rows skipped. Where that family does not plan it (symbolic
sizes) it is computed densely: every expert's product ``a @ w[e]`` as one batched matmul on the
PE arrays (a native-matmul reduction), then a reduction over e keeps, for each row, its expert's product (``where``, so a
NaN in another expert's product does not leak): E times the work.
"""

from __future__ import annotations

import torch
from torch._inductor import ir
from torch._inductor import lowering as L
from torch._inductor.virtualized import V

aten = torch.ops.aten


def _on_spyre(x) -> bool:
    device = x.get_device() if isinstance(x, ir.IRNode) else None
    return device is not None and device.type == "spyre"


def _op(packet, *args, **kwargs):
    return L.lowerings[packet](*args, **kwargs)


def histogram(x, bins: int, lo, hi):
    """hist[b] = #{x in bin b}, in x's dtype (torch.histc's result)."""
    dtype, device = x.get_dtype(), x.get_device()
    flat = L.view(x, [x.get_numel()])
    if dtype.is_floating_point:
        position = _op(aten.floor, _op(aten.mul, _op(aten.sub, flat, lo), bins / (hi - lo)))
    else:  # in integers, as CUDA's histc (the CPU has none): (v - lo) * bins // (hi - lo)
        wide = L.to_dtype(flat, torch.int64)
        position = _op(aten.div, _op(aten.mul, _op(aten.sub, wide, int(lo)), bins), int(hi - lo),
                       rounding_mode="floor")
    position = _op(aten.where, _op(aten.eq, flat, hi), bins - 1, position)  # hi closes the last bin
    inside = _op(aten.logical_and, _op(aten.ge, flat, lo), _op(aten.le, flat, hi))  # False for NaN
    edges = L.iota(bins, start=0, step=1, dtype=dtype, device=device, requires_grad=False)
    hit = _op(aten.logical_and, L.unsqueeze(inside, 0),
              _op(aten.eq, L.unsqueeze(position, 0), L.view(edges, [bins, 1])))  # (bins, n)
    return L.sum_(hit, [1], dtype=dtype)


def _spyre_histc(inductor_histc):
    def lowering(x, bins=100, min=0, max=0):
        if (_on_spyre(x) and x.get_dtype() != torch.bool and x.get_dtype() != torch.float64 and min < max
                and isinstance(bins, int) and bins > 0):
            return histogram(x, bins, min, max)
        return inductor_histc(x, bins, min, max)

    return lowering


def grouped_mm(a, w, offs, bias=None, out_dtype=None):
    """a (S, K) x w (E, K, N) by offs (E,): row s through expert g(s), as documented above."""
    from .experts_node import lower_grouped_mm

    planned = lower_grouped_mm(a, w, offs, out_dtype or a.get_dtype())
    if planned is not None:
        return planned
    return dense_grouped_mm(a, w, offs, out_dtype)


def dense_grouped_mm(a, w, offs, out_dtype=None):
    """Every expert's product and a select (what the experts family does not plan)."""
    S, K = a.get_size()
    E, _, N = w.get_size()
    dtype = out_dtype or a.get_dtype()
    # spyre's bmm lowering (lowerings.py, registered before us): a PE program, accumulated in fp32
    # and rounded once to a's dtype, as the CPU's grouped matmul rounds each row once
    products = L.lowerings[aten.bmm.default](L.expand(L.unsqueeze(a, 0), [E, S, K]), w)  # (E, S, N)
    rows = L.iota(S, start=0, step=1, dtype=offs.get_dtype(), device=a.get_device(), requires_grad=False)
    # g(s) = #{e : offs[e] <= s}, counted (a small reduction over E) rather than read as
    # offs[e-1] <= s < offs[e]: that shifted read of offs would be a masked load at e = 0
    group = L.sum_(_op(aten.le, L.view(offs, [E, 1]), L.view(rows, [1, S])), [0], dtype=torch.int64)
    group.realize()
    experts = L.iota(E, start=0, step=1, dtype=torch.int64, device=a.get_device(), requires_grad=False)
    mine = _op(aten.eq, L.view(experts, [E, 1]), L.view(group, [1, S]))  # (E, S)
    kept = _op(aten.where, L.unsqueeze(mine, -1), products, 0.0)
    out = L.sum_(kept, [0])  # one product and zeros: exact in any dtype
    return out if dtype == out.get_dtype() else L.to_dtype(out, dtype)


def _grouped_shapes_ok(a, w, offs) -> bool:
    return (all(isinstance(t, ir.IRNode) for t in (a, w, offs)) and len(a.get_size()) == 2
            and len(w.get_size()) == 3 and len(offs.get_size()) == 1
            and a.get_dtype().is_floating_point and a.get_dtype() == w.get_dtype()
            and not offs.get_dtype().is_floating_point
            and V.graph.sizevars.statically_known_equals(a.get_size()[1], w.get_size()[1]))


def _spyre_grouped_mm(inductor_grouped_mm):
    def lowering(a, w, offs=None, bias=None, out_dtype=None):
        if (offs is not None and bias is None and _on_spyre(a) and _grouped_shapes_ok(a, w, offs)
                and out_dtype in (None, a.get_dtype())):
            return grouped_mm(a, w, offs, out_dtype=out_dtype)
        return inductor_grouped_mm(a, w, offs, bias, out_dtype)

    return lowering


def _spyre_transformers_grouped_mm(inductor_lowering):
    def lowering(a, w, offs):
        if _on_spyre(a) and _grouped_shapes_ok(a, w, offs):
            return grouped_mm(a, w, offs)
        return inductor_lowering(a, w, offs)

    return lowering


def install() -> None:
    """Register the spyre-conditional histc and grouped-matmul lowerings (once, by lowerings.install)."""
    L.register_lowering(aten.histc.default, type_promotion_kind=None)(_spyre_histc(L.lowerings[aten.histc.default]))
    op = aten._grouped_mm.default
    L.register_lowering(op, type_promotion_kind=None)(_spyre_grouped_mm(L.lowerings[op]))


def install_transformers_op() -> None:
    """transformers' ``grouped_mm_fallback`` custom op (registered when its moe module is imported),
    lowered like ``_grouped_mm``. Called before each spyre graph is lowered: the op may appear
    after our first compile. Idempotent."""
    packet = getattr(getattr(torch.ops, "transformers", None), "grouped_mm_fallback", None)
    op = getattr(packet, "default", None) if packet is not None else None
    if op is None or op in _transformers_installed:
        return
    inductor_lowering = L.lowerings.get(op)
    if inductor_lowering is None:
        inductor_lowering = L.fallback_handler(op, add_to_fallback_set=False)
    L.register_lowering(op, type_promotion_kind=None)(_spyre_transformers_grouped_mm(inductor_lowering))
    _transformers_installed.add(op)


_transformers_installed: set = set()
