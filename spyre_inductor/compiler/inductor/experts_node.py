"""A grouped matmul in Inductor: planned by the experts family when it is lowered, one program call
when it is emitted (the way attention_node.py does the fused attention).

experts.py's lowerings of ``aten._grouped_mm`` and ``transformers::grouped_mm_fallback`` ask
here first: a and offs are realized (a's rows contiguous), w keeps its layout when its k or n
dim is contiguous (Mixtral's ``weight.transpose(-2, -1)`` is read where it lies, transposed on
chip), the GroupedMatmulKernel is built from their fixed layouts and compiled right away. A
kernel the family does not plan (symbolic sizes) returns None and experts.py lowers it densely
instead (spyre programs either way). The node is an ExternKernelOut whose code is the prepared program's launch.
"""

from __future__ import annotations

from pathlib import Path

import sympy
import torch
from torch._inductor import ir

from ..ir.kernel_ir import DTYPE_NAMES, Buffer, GroupedMatmulKernel

OPS = "grouped_mm"


class SpyreGroupedMatmul(ir.ExternKernelOut):
    def __init__(self, layout, inputs, kernel: GroupedMatmulKernel, artifact: Path):
        super().__init__(layout, inputs, python_kernel_name="spyre_grouped_mm")
        self.kernel, self.artifact = kernel, artifact

    def codegen(self, wrapper) -> None:
        device = self.get_device()
        index = device.index if device.index is not None else torch.spyre.current_device()
        S, K, N, E = self.kernel.dims
        plan = wrapper.define_spyre_kernel(str(self.artifact), index,
                                           f"# {self.kernel.name}: grouped matmul {S}x{K}x{N} over {E} experts",
                                           bucketed=False, exact=None)
        wrapper.call_spyre_kernel(plan, [x.codegen_reference() for x in self.inputs] + [self.get_name()], [])


def _static(values) -> tuple[int, ...] | None:
    out = []
    for v in values:
        v = sympy.sympify(v)
        if not v.is_Integer:
            return None
        out.append(int(v))
    return tuple(out)


def _buffer(name, node) -> Buffer | None:
    layout = node.get_layout()
    size, stride, offset = _static(layout.size), _static(layout.stride), _static([layout.offset])
    if size is None or stride is None or offset is None:
        return None
    return Buffer(name, DTYPE_NAMES[layout.dtype], size, stride, offset[0])


def _realized(x, contiguous_rows: bool):
    x = ir.ExternKernel.realize_input(x)
    if contiguous_rows:
        x = ir.ExternKernel.require_stride1(x)
    if isinstance(x.get_layout(), ir.FlexibleLayout):
        x.freeze_layout()
    return x


def lower_grouped_mm(a, w, offs, out_dtype):
    """The grouped matmul as one experts program (a TensorBox), or None when the family does not
    plan it (the caller lowers it densely)."""
    from ..ir.naming import content_name
    from .scheduling import compile_kernel, record

    a, offs = _realized(a, True), _realized(offs, False)
    w = _realized(w, False)
    stride = _static(w.get_layout().stride)
    if stride is not None and stride[1] != 1 and stride[2] != 1:
        w = _realized(w, True)
    buffers = [_buffer(n, x) for n, x in (("a", a), ("w", w), ("offs", offs))]
    if any(b is None for b in buffers):  # (symbolic sizes: the family plans static shapes)
        return None
    S, N = buffers[0].shape[0], buffers[1].shape[2]
    kernel = content_name(GroupedMatmulKernel("", tuple(buffers) + (Buffer("out", DTYPE_NAMES[out_dtype], (S, N),
                                                                           (N, 1)),)))
    artifact, _ = compile_kernel(kernel)
    if artifact is None:  # (the dense lowering's kernels record themselves)
        return None
    layout = ir.FixedLayout(a.get_device(), out_dtype, [S, N], [N, 1])
    node = SpyreGroupedMatmul(layout, [a, w, offs], kernel, artifact)
    record((node.get_name(),), OPS, kernel, artifact, None)
    return ir.TensorBox.create(node)


__all__ = ["SpyreGroupedMatmul", "lower_grouped_mm"]
