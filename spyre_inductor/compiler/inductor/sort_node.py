"""A sort of rows in Inductor: one program of the sort family, planned when it is lowered (issue 31).

sorting.py hands this the source with the sorted dim last; it is realized contiguous (a view that
is not becomes a copy, as ATen's reshape does) and seen as [R, n] rows, the SortKernel built from
its fixed layout and compiled right away. The node has two results, values and indices: its
layout is a MultiOutputLayout and each result a MultiOutput (``buf = node[i]``), as Inductor's
multi-output fallbacks are; its code allocates both, launches the program on [R, n] and [R, k]
views of them and binds the pair.
A kernel the family declines (a row too long for the scratchpad, symbolic sizes) is None here, and
sorting.py keeps its rank-counting lowering for it.
"""

from __future__ import annotations

import math

import sympy
import torch
from torch._inductor import ir
from torch._inductor.virtualized import V

from ..ir.kernel_ir import DTYPE_NAMES, Buffer, SortKernel

OPS = "sort"


class SpyreSort(ir.ExternKernel):
    def __init__(self, device, source, kernel: SortKernel, artifact, layouts):
        super().__init__(None, ir.MultiOutputLayout(device=device), self.unwrap_storage([source]),
                         python_kernel_name="spyre_sort")
        self.name = V.graph.register_buffer(self)
        V.graph.register_operation(self)
        self.kernel, self.artifact, self.layouts = kernel, artifact, layouts  # layouts: of values, indices

    def should_allocate(self) -> bool:
        return False  # (its two results are allocated by its own code)

    def codegen(self, wrapper) -> None:
        device = self.get_device()
        index = device.index if device.index is not None else torch.spyre.current_device()
        k = self.kernel
        plan = wrapper.define_spyre_kernel(str(self.artifact), index,
                                           f"# {k.name}: {'descending' if k.descending else 'ascending'} sort of "
                                           f"{k.rows} row(s) of {k.n}, first {k.k}")
        name = self.get_name()
        outs = [f"{name}_values", f"{name}_indices"]
        for out, layout in zip(outs, self.layouts):
            wrapper.writeline(wrapper.make_allocation(out, layout.device, layout.dtype, layout.size, layout.stride))
        # (the program's buffers are [rows, elements]: the launch gets those views of the tensors)
        rows = [f"{self.inputs[0].codegen_reference()}.view({k.rows}, {k.n})"] + [f"{o}.view({k.rows}, {k.k})"
                                                                                  for o in outs]
        wrapper.call_spyre_kernel(plan, rows)
        wrapper.writeline(f"{name} = ({outs[0]}, {outs[1]})")


def _ints(values) -> tuple[int, ...] | None:
    out = []
    for v in values:
        v = sympy.sympify(v)
        if not v.is_Integer:
            return None
        out.append(int(v))
    return tuple(out)


def lower_sort(x, descending: bool, k) -> tuple | None:
    """(values, indices) TensorBoxes of the first k of x's rows (its last dim) sorted in a stable order,
    or None when the sort family does not plan it (sizes not static, an empty dim, a row too long)."""
    from ..ir.naming import content_name
    from .scheduling import compile_kernel, record

    shape = _ints(x.get_size())
    k = _ints([k])
    if shape is None or k is None or not shape or math.prod(shape) == 0 or k[0] == 0:
        return None
    k = k[0]
    *outer, n = shape
    rows = math.prod(outer)
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
                                          Buffer("indices", "int64", (rows, k), (k, 1))), bool(descending)))
    artifact, reason = compile_kernel(kernel)
    if artifact is None:
        return None
    device = x.get_device()
    size = list(outer) + [k]
    stride = ir.FlexibleLayout.contiguous_strides(size)
    layouts = [ir.FixedLayout(device, layout.dtype, size, stride), ir.FixedLayout(device, torch.int64, size, stride)]
    node = SpyreSort(device, source, kernel, artifact, layouts)
    results = [ir.MultiOutput(lay, node, [(tuple, i)]) for i, lay in enumerate(layouts)]
    node.outputs = results
    record(tuple(r.get_name() for r in results), OPS, kernel, artifact, None)
    return tuple(ir.TensorBox.create(r) for r in results)


__all__ = ["SpyreSort", "lower_sort"]
