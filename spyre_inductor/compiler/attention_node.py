"""spyre::attention in Inductor: planned when it is lowered, one program call when it is emitted.

The lowering realizes q, k, v and the masks with their feature dim contiguous (views stay
views: a transposed projection, an expanded mask and a KV cache are read where they lie),
builds the AttentionKernel from their fixed layouts and compiles it right away. A kernel the
attention family cannot plan becomes Inductor's fallback call of the op (the composite
implementation, announced once; an error under SPYRE_STRICT=1) instead of failing the graph.
The node is an ExternKernelOut whose code is the prepared program's launch: the wrapper
allocates its output like any buffer, and the scheduler orders it by its reads and writes.
"""

from __future__ import annotations

from pathlib import Path

import sympy
import torch
from torch._inductor import ir
from torch._inductor import lowering as L
from torch._inductor.virtualized import V

from .attention_op import OP
from .fallback_policy import announce
from .kernel_ir import DTYPE_NAMES, AttentionKernel, Buffer

OPS = "scaled_dot_product_attention"


class SpyreAttention(ir.ExternKernelOut):
    def __init__(self, layout, inputs, kernel: AttentionKernel, artifact: Path):
        super().__init__(layout, inputs, python_kernel_name="spyre_attention")
        self.kernel, self.artifact = kernel, artifact

    def codegen(self, wrapper) -> None:
        device = self.get_device()
        index = device.index if device.index is not None else torch.spyre.current_device()
        plan = wrapper.define_spyre_kernel(str(self.artifact), index, f"# {self.kernel.name}: fused attention "
                                                                      f"over {self.kernel.ranges}")
        args = [x.codegen_reference() for x in self.inputs] + [self.get_name()]
        wrapper.call_spyre_kernel(plan, args)


def _static(values, what) -> tuple[int, ...] | None:
    out = []
    for v in values:
        v = sympy.sympify(v)
        if not v.is_Integer:
            return None
        out.append(int(v))
    return tuple(out)


def _buffer(name, node) -> Buffer | None:
    layout = node.get_layout()
    size, stride = _static(layout.size, "size"), _static(layout.stride, "stride")
    offset = _static([layout.offset], "offset")
    if size is None or stride is None or offset is None:
        return None
    return Buffer(name, DTYPE_NAMES[layout.dtype], size, stride, offset[0])


def lower_attention(q, k, v, bias, keep, positions, scale, causal, empty_zero, p_dtype, out_dtype, heads_last,
                    masked_score):
    from .scheduling import compile_kernel, content_name, record

    named = [("q", q), ("k", k), ("v", v), ("bias", bias), ("keep", keep), ("positions", positions)]
    named = [(n, x) for n, x in named if x is not None]
    realized = []
    for _, x in named:
        x = ir.ExternKernel.require_stride1(ir.ExternKernel.realize_input(x))
        if isinstance(x.get_layout(), ir.FlexibleLayout):
            x.freeze_layout()
        realized.append(x)
    device = q.get_device()
    buffers = [_buffer(n, x) for (n, _), x in zip(named, realized)]
    reason = None
    if any(b is None for b in buffers):  # (checked before any size is read as an int)
        reason = "symbolic sizes (issue 18)"
    else:
        B, H, L_, _ = buffers[0].shape
        Dv = buffers[2].shape[3]
        blhd = [int(s) for s in ir.FlexibleLayout.contiguous_strides([B, L_, H, Dv])]
        out_stride = (blhd[0], blhd[2], blhd[1], 1) if heads_last else tuple(
            int(s) for s in ir.FlexibleLayout.contiguous_strides([B, H, L_, Dv]))
        out_layout = ir.FixedLayout(device, out_dtype, [B, H, L_, Dv], list(out_stride))
        buffers.append(Buffer("out", DTYPE_NAMES[out_dtype], (B, H, L_, Dv), out_stride, 0))
        strides = {b.name: b.strides for b in buffers}
        kernel = content_name(AttentionKernel("", tuple(buffers), float(scale), causal, strides.get("bias"),
                                                 strides.get("keep"), "zero" if empty_zero else "nan",
                                                 None if p_dtype == out_dtype else DTYPE_NAMES[p_dtype],
                                                 float(masked_score),
                                                 strides["positions"][0] if positions is not None else None))
        artifact, reason = compile_kernel(kernel)
        if artifact is not None:
            node = SpyreAttention(out_layout, realized, kernel, artifact)
            record((node.get_name(),), OPS, kernel, artifact, None)
            return ir.TensorBox.create(node)
    record((), OPS, None, None, reason)
    announce(OPS, reason)
    return L.fallback_handler(OP, add_to_fallback_set=False)(q, k, v, bias, keep, positions, scale, causal, empty_zero,
                                                              p_dtype, out_dtype, heads_last, masked_score)


__all__ = ["SpyreAttention", "lower_attention"]
