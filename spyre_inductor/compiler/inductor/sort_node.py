"""A sort of rows in Inductor: one program of the sort family, planned when it is lowered (issue 31).

sorting.py hands this the source with the sorted dim last; it is realized contiguous (a view that
is not becomes a copy, as ATen's reshape does) and seen as [R, n] rows, the SortKernel built from
its fixed layout and compiled right away. The node has two results, values and indices: its
layout is a MultiOutputLayout and each result a MultiOutput (``buf = node[i]``), as Inductor's
multi-output fallbacks are; its code allocates both, launches the program on [R, n] and [R, k]
views of them and binds the pair.
A dynamic count of rows (coef * one size symbol) is one bucketed kernel, planned at its bucket's
maximum (the size passed at launch, the [R, n] views taken with -1 rows). What the family does not
plan (a row too long for the scratchpad, a symbolic row length or k, rows counted by two sizes) is
None here, and sorting.py keeps its rank-counting lowering for it.
"""

from __future__ import annotations

import sympy
import torch
from torch._inductor import ir
from torch._inductor.virtualized import V

from ..ir.kernel_ir import DTYPE_NAMES, Buffer, SortKernel, SymbolicSizes

OPS = "sort"
ROWS = "rows"  # the size symbol of a kernel over a dynamic count of rows
BUFFERS = ("source", "values", "indices")


class SpyreSort(ir.ExternKernel):
    def __init__(self, device, source, kernel: SortKernel, artifact, layouts, size=None):
        super().__init__(None, ir.MultiOutputLayout(device=device), self.unwrap_storage([source]),
                         python_kernel_name="spyre_sort")
        self.name = V.graph.register_buffer(self)
        V.graph.register_operation(self)
        self.kernel, self.artifact, self.layouts = kernel, artifact, layouts  # layouts: of values, indices
        self.size = size  # the symbol of a dynamic count of rows (None: static)

    def should_allocate(self) -> bool:
        return False  # (its two results are allocated by its own code)

    def codegen(self, wrapper) -> None:
        device = self.get_device()
        index = device.index if device.index is not None else torch.spyre.current_device()
        k = self.kernel
        plan = wrapper.define_spyre_kernel(str(self.artifact), index,
                                           f"# {k.name}: {'descending' if k.descending else 'ascending'} sort of "
                                           f"{k.rows} row(s) of {k.n}, first {k.k}", bucketed=self.size is not None)
        name = self.get_name()
        outs = [f"{name}_values", f"{name}_indices"]
        for out, layout in zip(outs, self.layouts):
            wrapper.writeline(wrapper.make_allocation(out, layout.device, layout.dtype, layout.size, layout.stride))
        # (the program's buffers are [rows, elements]: the launch gets those views of the tensors)
        rows = k.rows if self.size is None else -1
        args = [f"{self.inputs[0].codegen_reference()}.view({rows}, {k.n})"] + [f"{o}.view({rows}, {k.k})"
                                                                                 for o in outs]
        if self.size is None:
            wrapper.call_spyre_kernel(plan, args)
        else:
            from ..symbolic.capture import launch_expr

            wrapper.call_spyre_kernel(plan, args, [launch_expr(self.size)])
        wrapper.writeline(f"{name} = ({outs[0]}, {outs[1]})")


def _ints(values) -> tuple[int, ...] | None:
    out = []
    for v in values:
        v = sympy.sympify(v)
        if not v.is_Integer:
            return None
        out.append(int(v))
    return tuple(out)


def _rows(outer) -> tuple[int, object, int] | None:
    """(rows at the bucket's maximum, the size symbol or None, its coefficient) of the outer dims:
    static, or coef * one size symbol (a dynamic count of rows: issue 18's buckets), else None."""
    rows = sympy.expand(sympy.Mul(*[sympy.sympify(d) for d in outer]))
    if rows.is_Integer:
        return int(rows), None, 1
    if len(rows.free_symbols) != 1:
        return None
    sym, = rows.free_symbols
    coef = sympy.simplify(rows / sym)
    if not coef.is_Integer or int(coef) < 1:
        return None
    return int(coef), sym, int(coef)


def lower_sort(x, descending: bool, k) -> tuple | None:
    """(values, indices) TensorBoxes of the first k of x's rows (its last dim) sorted in a stable order,
    or None when the sort family does not plan it (a symbolic row length or k, an empty dim, a row too
    long). A symbolic count of rows is planned at its bucket's maximum: the program's transfers are
    clipped to the rows the launch has."""
    from ..ir.errors import NotCapturable
    from ..ir.naming import content_name
    from ..symbolic.capture import planned_bucket
    from .scheduling import compile_kernel, record

    *outer, n = x.get_size()
    static = _ints([n, k])
    rows = _rows(outer)
    if static is None or rows is None or 0 in static:
        return None
    n, k = static
    rows, size, coef = rows
    symbolic = None
    if size is not None:
        try:
            lo, hi, limits = planned_bucket(size)
        except NotCapturable:
            return None
        rows = coef * hi
        symbolic = SymbolicSizes(((ROWS, lo, hi),), (), tuple((b, 0, ROWS, coef, 0) for b in BUFFERS),
                                 ((ROWS, *limits),))
    if rows == 0:
        return None
    source = ir.ExternKernel.require_contiguous(ir.ExternKernel.realize_input(x))
    if isinstance(source.get_layout(), ir.FlexibleLayout):
        source.freeze_layout()
    layout = source.get_layout()
    offset = _ints([layout.offset])
    if offset is None:
        return None
    dtype = DTYPE_NAMES[layout.dtype]
    kernel = content_name(SortKernel("", (Buffer("source", dtype, (rows, n), (n, 1), offset[0]),
                                          Buffer("values", dtype, (rows, k), (k, 1)),
                                          Buffer("indices", "int64", (rows, k), (k, 1))), bool(descending),
                                     symbolic))
    artifact, reason = compile_kernel(kernel)
    if artifact is None:
        return None
    device = x.get_device()
    out = list(outer) + [k]
    stride = ir.FlexibleLayout.contiguous_strides(out)
    layouts = [ir.FixedLayout(device, layout.dtype, out, stride), ir.FixedLayout(device, torch.int64, out, stride)]
    node = SpyreSort(device, source, kernel, artifact, layouts, size)
    results = [ir.MultiOutput(lay, node, [(tuple, i)]) for i, lay in enumerate(layouts)]
    node.outputs = results
    record(tuple(r.get_name() for r in results), OPS, kernel, artifact, None)
    return tuple(ir.TensorBox.create(r) for r in results)


__all__ = ["SpyreSort", "lower_sort"]
