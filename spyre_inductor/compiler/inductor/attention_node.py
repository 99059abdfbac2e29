"""spyre::attention in Inductor: planned when it is lowered, one program call when it is emitted.

The lowering realizes q, k, v and the masks with their feature dim contiguous (views stay
views: a transposed projection, an expanded mask and a KV cache are read where they lie),
builds the AttentionKernel from their fixed layouts and compiles it right away. A kernel the
attention family cannot plan becomes Inductor's fallback call of the op (the composite
implementation, announced once; an error under SPYRE_STRICT=1) instead of failing the graph.
The node is an ExternKernelOut whose code is the prepared program's launch: the wrapper
allocates its output like any buffer, and the scheduler orders it by its reads and writes.

Over a dynamic sequence length (issue 18) the layouts are symbolic: the kernel is built at the
size's bucket maximum and at one less (inductor/attention_capture.capture), planned for the bucket, and
launched through a launcher.bucketed.BucketedPlan with the size's value (another bucket's artifact is
compiled on first use).
"""

from __future__ import annotations

from pathlib import Path

import sympy
import torch
from torch._inductor import ir
from torch._inductor import lowering as L

from .attention_op import OP
from ...launcher.fallback_policy import announce
from ..ir.kernel_ir import DTYPE_NAMES, AttentionKernel, Buffer

OPS = "scaled_dot_product_attention"


class SpyreAttention(ir.ExternKernelOut):
    def __init__(self, layout, inputs, kernel: AttentionKernel, artifact: Path, size=None, exact=(), template=None):
        super().__init__(layout, inputs, python_kernel_name="spyre_attention")
        self.kernel, self.artifact, self.size = kernel, artifact, size  # size: the sequence length's symbol
        self.exact, self.template = exact, template  # sizes specialized per value (symbolic/exact.py)

    def codegen(self, wrapper) -> None:
        device = self.get_device()
        index = device.index if device.index is not None else torch.spyre.current_device()
        sizes = ([str(self.size)] if self.size is not None else []) + list(self.exact)
        plan = wrapper.define_spyre_kernel(str(self.artifact), index, f"# {self.kernel.name}: fused attention "
                                                                      f"over {self.kernel.ranges}",
                                           bucketed=bool(sizes), exact=self.template)
        args = [x.codegen_reference() for x in self.inputs] + [self.get_name()]
        # (the size symbols are in scope in the generated call: Inductor binds them from the inputs)
        wrapper.call_spyre_kernel(plan, args, sizes)


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


def _kernel(buffers, scale, causal, empty_zero, p_dtype, out_dtype, heads_last, masked_score,
            has_positions) -> AttentionKernel:
    """The AttentionKernel over static `buffers` (q, k, v, the masks), with its output appended."""
    B, H, L_, _ = buffers[0].shape
    Dv = buffers[2].shape[3]
    out_stride = tuple(int(s) for s in _out_strides(B, H, L_, Dv, heads_last))
    buffers = list(buffers) + [Buffer("out", DTYPE_NAMES[out_dtype], (B, H, L_, Dv), out_stride, 0)]
    strides = {b.name: b.strides for b in buffers}
    return AttentionKernel("", tuple(buffers), float(scale), causal, strides.get("bias"), strides.get("keep"),
                           "zero" if empty_zero else "nan", None if p_dtype == out_dtype else DTYPE_NAMES[p_dtype],
                           float(masked_score), strides["positions"][0] if has_positions else None)


def _out_strides(B, H, L_, Dv, heads_last) -> list:
    """The output's (batch, heads, seq, dim) strides, contiguous in that order or, heads_last, in
    (batch, seq, heads, dim) as a projection reads it back (ints or size expressions alike)."""
    if heads_last:
        blhd = ir.FlexibleLayout.contiguous_strides([B, L_, H, Dv])
        return [blhd[0], blhd[2], blhd[1], blhd[3]]
    return list(ir.FlexibleLayout.contiguous_strides([B, H, L_, Dv]))


def _out_layout(device, out_dtype, q_layout, v_layout, heads_last) -> ir.FixedLayout:
    """The output's layout, in the (maybe symbolic) sizes of q and v."""
    B, H, L_, _ = q_layout.size
    Dv = v_layout.size[3]
    stride = _out_strides(B, H, L_, Dv, heads_last)
    plain = lambda e: int(e) if sympy.sympify(e).is_Integer else e  # noqa: E731
    return ir.FixedLayout(device, out_dtype, [plain(n) for n in (B, H, L_, Dv)], [plain(x) for x in stride])


def _symbolic_kernel(named, realized, make):
    """(the kernel, the sequence length's symbol served by a bucket or None, the other sizes it
    is specialized to per value, their template), or NotCapturable."""
    from ..symbolic import capture as symbolic
    from . import attention_capture as sa
    from ..symbolic.exact import capture_exact, exact_values

    layouts = [x.get_layout() for x in realized]
    seq = sa.sequence_symbol(layouts)
    others = sorted(sa.layout_symbols(layouts) - {seq}, key=str)

    def at_bucket():
        if seq is None:
            return make([sa.buffer_at(n, lay, DTYPE_NAMES[lay.dtype], None, None) for (n, _), lay in zip(named, layouts)])
        lo, hi, limits = symbolic.planned_bucket(seq)

        def at(value):
            return make([sa.buffer_at(n, lay, DTYPE_NAMES[lay.dtype], seq, value)
                         for (n, _), lay in zip(named, layouts)])

        return sa.capture(at, seq, lo, hi, limits)

    if not others:
        return at_bucket(), seq, (), None

    def at(values):
        with exact_values(values):
            return _Captured(at_bucket())

    hints = [symbolic.hint_of(x) for x in others]
    limits = [symbolic.dynamo_limits(x) for x in others]
    found, template = capture_exact(at, others, hints, limits, _doc)
    return found.kernel, seq, tuple(str(x) for x in others), template


class _Captured:
    """What symbolic/exact.capture_exact reads of a capture: the kernel, no buffers kept on chip."""

    def __init__(self, kernel):
        self.kernel, self.removed = kernel, frozenset()


def _doc(kernel) -> dict:
    import json

    doc = json.loads(kernel.to_json())
    doc.pop("name", None)
    return doc


def lower_attention(q, k, v, bias, keep, positions, scale, causal, empty_zero, p_dtype, out_dtype, heads_last,
                    masked_score):
    from ..ir.errors import NotCapturable
    from ..ir.naming import content_name
    from .scheduling import compile_kernel, record

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

    def make(bufs):
        return _kernel(bufs, scale, causal, empty_zero, p_dtype, out_dtype, heads_last, masked_score,
                       positions is not None)

    kernel, size, exact, template, reason = None, None, (), None, None
    if any(b is None for b in buffers):  # (checked before any size is read as an int)
        try:
            kernel, size, exact, template = _symbolic_kernel(named, realized, make)
        except NotCapturable as e:
            reason = f"symbolic sizes (issue 18): {e}"
    else:
        kernel = make(buffers)
    if kernel is not None:
        kernel = content_name(kernel)
        artifact, reason = compile_kernel(kernel)
        if artifact is not None:
            out_layout = _out_layout(device, out_dtype, realized[0].get_layout(), realized[2].get_layout(), heads_last)
            node = SpyreAttention(out_layout, realized, kernel, artifact, size, exact, template)
            record((node.get_name(),), OPS, kernel, artifact, None)
            return ir.TensorBox.create(node)
    record((), OPS, None, None, reason)
    announce(OPS, reason)
    return L.fallback_handler(OP, add_to_fallback_set=False)(q, k, v, bias, keep, positions, scale, causal, empty_zero,
                                                              p_dtype, out_dtype, heads_last, masked_score)


__all__ = ["SpyreAttention", "lower_attention"]
