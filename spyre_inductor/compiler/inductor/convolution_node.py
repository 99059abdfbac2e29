"""conv2d's implicit GEMM in Inductor: the conv family's ConvKernel, planned when it is lowered,
one program call when it is emitted (issue 31).

convolution_lowering.py hands over a forward conv2d whose image and weight it has laid out for
runs (families/convolution/lowering.py): both realized with fixed layouts (a view stays a view:
a channels-last image is read where it lies), the ConvKernel built from those layouts and
compiled right away. The output is channels-last ((n, oh, ow) rows of OC channels: the PE's
rows). A kernel the family declines (Unsupported) returns None and the caller lowers the conv as
a patch copy and a matmul instead; a planner bug (PlanError) is raised. The node is an
ExternKernelOut whose code is the prepared program's launch, as attention_node.SpyreAttention.
"""

from __future__ import annotations

from pathlib import Path

import sympy
import torch
from torch._inductor import ir

from ..ir.kernel_ir import DTYPE_NAMES, Buffer, ConvKernel

OPS = "convolution"


class SpyreConv(ir.ExternKernelOut):
    def __init__(self, layout, inputs, kernel: ConvKernel, artifact: Path):
        super().__init__(layout, inputs, python_kernel_name="spyre_conv")
        self.kernel, self.artifact = kernel, artifact

    def codegen(self, wrapper) -> None:
        device = self.get_device()
        index = device.index if device.index is not None else torch.spyre.current_device()
        plan = wrapper.define_spyre_kernel(str(self.artifact), index,
                                           f"# {self.kernel.name}: conv2d, implicit GEMM over {self.kernel.ranges}")
        wrapper.call_spyre_kernel(plan, [x.codegen_reference() for x in self.inputs] + [self.get_name()], [])


def _buffer(name, node) -> Buffer | None:
    layout = node.get_layout()
    values = [sympy.sympify(v) for v in (*layout.size, *layout.stride, layout.offset)]
    if not all(v.is_Integer for v in values):
        return None
    n = len(layout.size)
    ints = [int(v) for v in values]
    return Buffer(name, DTYPE_NAMES[layout.dtype], tuple(ints[:n]), tuple(ints[n:2 * n]), ints[-1])


def _realized(x):
    x = ir.ExternKernel.realize_input(x)
    if isinstance(x.get_layout(), ir.FlexibleLayout):
        x.freeze_layout()
    return x


def lower_conv(image, weight, bias, stride, dilation):
    """The TensorBox of the conv family's program over these (already laid out) operands, or None
    when the family declines them."""
    from ..ir.naming import content_name
    from .scheduling import compile_kernel, record

    named = [("image", image), ("weight", weight)] + ([("bias", bias)] if bias is not None else [])
    realized = [_realized(x) for _, x in named]
    buffers = [_buffer(n, x) for (n, _), x in zip(named, realized)]
    if any(b is None for b in buffers):
        return None
    (N, _, H, W), (OC, _, KH, KW) = buffers[0].shape, buffers[1].shape
    (sh, sw), (dh, dw) = stride, dilation
    OH, OW = (H - dh * (KH - 1) - 1) // sh + 1, (W - dw * (KW - 1) - 1) // sw + 1
    strides = (OH * OW * OC, 1, OW * OC, OC)
    out = Buffer("out", buffers[0].dtype, (N, OC, OH, OW), strides, 0)
    kernel = content_name(ConvKernel("", tuple(buffers) + (out,), tuple(stride), tuple(dilation), bias is not None))
    artifact, reason = compile_kernel(kernel)
    if artifact is None:  # (not a fallback: the caller's patch copy and matmul run on spyre)
        return None
    layout = ir.FixedLayout(image.get_device(), image.get_dtype(), [N, OC, OH, OW], list(strides))
    node = SpyreConv(layout, realized, kernel, artifact)
    record((node.get_name(),), OPS, kernel, artifact, None)
    return ir.TensorBox.create(node)


__all__ = ["SpyreConv", "lower_conv"]
