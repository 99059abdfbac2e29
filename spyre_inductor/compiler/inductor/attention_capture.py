"""Fused attention over a sequence length known only at launch, at capture (issue 18): the size a
bucket serves, the buffers at a size, and the AttentionKernel with its SymbolicSizes fitted from
captures at the bucket's maximum and one less. What the sizes mean to the plan and the launch:
families/attention/sizes.py."""

from __future__ import annotations

import dataclasses

import sympy

from ..families.attention.sizes import DIMS, SIZE, check
from ..ir.errors import NotCapturable
from ..ir.kernel_ir import AttentionKernel, Buffer, SymbolicSizes
from ..symbolic.planning import fit_affine
from .indexing import EXACT_VALUES, non_affine_term


def sequence_symbol(layouts):
    """The size symbol a bucket serves: k's positions' (dim 2 of the second layout: a decode's
    growing KV length), else q's rows' (dim 2 of the first), or None when both are static; the
    other, if also symbolic, is specialized per value. NotCapturable when one dim is over more
    than one size."""
    for layout in (layouts[1], layouts[0]):
        found = sympy.sympify(layout.size[2]).free_symbols
        if len(found) > 1:
            raise NotCapturable(f"attention whose dim 2 is {layout.size[2]}, over sizes "
                                f"{', '.join(sorted(map(str, found)))}: one size per dim is compiled for spyre")
        if found:
            return found.pop()
    return None


def layout_symbols(layouts) -> set:
    found = set()
    for layout in layouts:
        for e in (*layout.size, *layout.stride, layout.offset):
            found |= sympy.sympify(e).free_symbols
    return found


def buffer_at(name, layout, dtype, sym, value) -> Buffer:
    """An Inductor layout as a kernel Buffer with size `sym` = value (and the sizes specialized per
    value at theirs: indexing.EXACT_VALUES)."""
    values = {**(EXACT_VALUES.get() or {}), **({sym: value} if sym is not None else {})}

    def at(e):
        bend = non_affine_term(e)
        if bend is not None:  # (fitted from two values: only an affine size is determined by them)
            raise NotCapturable(f"buffer {name}'s layout {e} is not affine in size {sym} ({bend})")
        v = sympy.sympify(e).subs(values)
        if not v.is_Integer:
            raise NotCapturable(f"buffer {name}'s layout {e} is not a number at {sym}={value}")
        return int(v)

    return Buffer(name, dtype, tuple(at(n) for n in layout.size), tuple(at(s) for s in layout.stride),
                  at(layout.offset))


def capture(make, sym, lo: int, hi: int, limits) -> AttentionKernel:
    """The AttentionKernel `make(value)` builds at size hi, with the SymbolicSizes its difference
    from `make(hi - 1)` shows (named SIZE), checked (NotCapturable: what cannot be symbolic)."""
    planned, probe = make(hi), make(hi - 1)
    if dataclasses.replace(planned, buffers=()) != dataclasses.replace(probe, buffers=()):
        raise NotCapturable(f"symbolic size {sym} reaches the attention's scale, masks or strides of its masks")
    ranges = []
    for d, (a, b) in enumerate(zip(planned.dims, probe.dims)):
        if a != b:
            ranges.append((d, SIZE, *fit_affine(a, b, hi, f"attention dim {DIMS[d]}")))
    dims, strides = [], []
    for x, y in zip(planned.buffers, probe.buffers):
        if x.offset != y.offset:
            raise NotCapturable(f"buffer {x.name}'s offset depends on size {sym}")
        for d, (a, b) in enumerate(zip(x.shape, y.shape)):
            if a != b:
                dims.append((x.name, d, SIZE, *fit_affine(a, b, hi, f"dim {d} of {x.name}")))
        for d, (a, b) in enumerate(zip(x.strides, y.strides)):
            if a != b and x.shape[d] != 1:  # (an extent-1 dim is never stepped along)
                strides.append((x.name, d, SIZE, *fit_affine(a, b, hi, f"stride {d} of {x.name}")))
    sizes = SymbolicSizes(((SIZE, lo, hi),), tuple(ranges), tuple(dims), ((SIZE, *limits),), tuple(strides))
    kernel = dataclasses.replace(planned, symbolic=sizes)
    check(kernel, NotCapturable)
    return kernel
