"""Spyre-only lowerings: ops Inductor would otherwise hand to an extern ATen kernel.

Matmuls (issue 15): ``mm``, ``bmm``, ``addmm`` and ``baddbmm`` of floating
spyre tensors are lowered to Inductor's own native-matmul form (what it
builds for Triton under ``config.triton.native_matmul``): the operands
unsqueezed and broadcast against each other, ``ops.dot`` of the two (a
pointwise product) and a ``"dot"`` reduction over k. That is an ordinary
reduction node, so the scheduler fuses prologues (casts, scaling, a
transpose view) and epilogues (bias, activation, residual, cast) around it
and capture hands the whole group to the matmul family as one MatmulKernel,
instead of an ``extern_kernels.mm`` call that runs outside any program.
``linear``, ``matmul`` and ``einsum`` reach these four through their ATen
decompositions. Integer matmuls keep Inductor's lowering (a visible CPU
fallback: the PE arrays accumulate floats).

Inductor lowers ``integer ** integer tensor`` (``aten.pow.Tensor_Tensor`` and
``aten.pow.Scalar`` on integers) to a FallbackKernel calling ATen, because
its C++ and Triton backends have no integer ``ops.pow``. On spyre that
would run the op outside any program (the eager device's CPU fallback). The
ISA's pow computes integer powers with ATen's own semantics (wrapping on
overflow; a negative exponent gives 0, or +-1 for a base of +-1), so on
spyre the op stays an ordinary pointwise ``ops.pow`` that captures and fuses.

Embedding lookups, cats and constant pads (issue 16) are realized on spyre
(``_realized``, ``_with_loaded_indices``): nodes of their own, fused into
pointwise consumers by the scheduler, never inlined into a reduction (which
neither gathers nor is cut at index masks). A gather's (an embedding's, an
index's) indices are realized too unless capture makes them a direct index.

Each lowering here is device-conditional (TORCH_NOTES: "a device-conditional
lowering"): on any other device it calls Inductor's own lowering, so CPU
and GPU graphs are lowered exactly as before. They are installed once, by
registration.register(), before the first spyre graph is lowered.
"""

from __future__ import annotations

import threading

import torch
from torch._inductor import ir
from torch._inductor import lowering as L
from torch._inductor.virtualized import V, ops

from . import index_probe
from .operand_dtypes import mixed_dtypes_error

aten = torch.ops.aten
_lock = threading.Lock()
_installed = False


def _on_spyre(*args) -> bool:
    for a in args:
        if isinstance(a, ir.IRNode):
            device = a.get_device()
            return device is not None and device.type == "spyre"
    return False


def _integer(*args) -> bool:
    return any(isinstance(a, ir.IRNode) and not a.get_dtype().is_floating_point for a in args)


def _spyre_pow(inductor_pow):
    def lowering(a, b):
        # Only a tensor exponent reaches ATen for integers: constant exponents are unrolled
        # into multiplications by Inductor itself (and negative ones are an error in ATen).
        if isinstance(b, ir.IRNode) and _integer(a, b) and _on_spyre(a, b):
            a, b = L.promote_constants([a, b])
            return L.pow_native(a, b)
        return inductor_pow(a, b)

    return lowering


def _floating_on_spyre(*mats) -> bool:
    return _on_spyre(*mats) and all(isinstance(m, ir.IRNode) and m.get_dtype().is_floating_point for m in mats)


def native_matmul(mat1, mat2, k_dim: int, dtype: torch.dtype | None = None):
    """sum over k of mat1[..., m, k, 1] * mat2[..., 1, k, n]: Inductor's native-matmul form, in
    `dtype` (default the operands'; the PE accumulates in fp32 either way, this is the type the
    sum is rounded to).

    The operands are realized first: a pointwise producer (an activation, a cast) would otherwise
    be inlined into the product, a prologue the matmul family does not fuse yet, and the kernel
    would fall back to the CPU; realized, it is a kernel of its own. An empty k is a zero matmul
    (a "dot" has no identity in Inductor): zeros of the result's shape.
    """
    for m in (mat1, mat2):
        if isinstance(m, ir.TensorBox):
            m.realize()
            _freeze_reshaped_contiguous(m)
    mat1 = L.lowerings[aten.unsqueeze](mat1, -1)
    mat2 = L.lowerings[aten.unsqueeze](mat2, -3)
    a, b = L.broadcast_tensors(mat1, mat2)
    out_dtype = dtype or a.get_dtype()
    size = list(a.get_size())
    if V.graph.sizevars.statically_known_equals(size[k_dim], 0):
        del size[k_dim]
        return L.full(size, 0, dtype=out_dtype, device=a.get_device())
    product = L.make_pointwise(ops.dot)(a, b)
    return L.make_reduction("dot", override_return_dtype=dtype)(product, k_dim)


def _freeze_reshaped_contiguous(operand) -> None:
    """A matmul operand that reshapes a buffer whose layout is still Inductor's to choose (the
    clone in ``attn.transpose(1, 2).reshape(b, s, h * d) @ W.t()``) gets that buffer contiguous,
    as the graph's clone says it is. Left flexible, Inductor picks the order of the buffer's own
    reads (the clone a plain memcpy in the transposed order), and the reshape then reads k as
    (h, d) with strides (s * d, 1): not one affine dim, so the matmul ran as a looped reduction
    (o_proj of a decoder layer: 481 us, 148x the minimum bytes, instead of a PE program behind
    a permute copy)."""
    node, reshaped = operand.data, False
    while isinstance(node, ir.View):  # reshapes (of reshapes): row-major over what they view
        node, reshaped = node.data, True
    if reshaped and isinstance(node, ir.StorageBox):
        buffer = node.data
        if isinstance(buffer, ir.ComputedBuffer) and isinstance(buffer.layout, ir.FlexibleLayout):
            buffer.freeze_layout()


def _check_dtypes(op, *operands) -> None:
    """The CPU's error for a spyre matmul of operands of different dtypes (fake tensors let
    them through: operand_dtypes.py)."""
    if _on_spyre(*operands) and (error := mixed_dtypes_error(op, operands)) is not None:
        raise error


def _spyre_mm(inductor_mm, batched: bool):
    op = aten.bmm.default if batched else aten.mm.default

    def lowering(mat1, mat2, out_dtype=None, *, layout=None):
        if out_dtype is None:
            _check_dtypes(op, mat1, mat2)
        if out_dtype is None and layout is None and _floating_on_spyre(mat1, mat2):
            return native_matmul(mat1, mat2, 2 if batched else 1)
        return inductor_mm(mat1, mat2, out_dtype, layout=layout)

    return lowering


def _spyre_addmm(inductor_addmm, batched: bool):
    op = aten.baddbmm.default if batched else aten.addmm.default

    def lowering(inp, mat1, mat2, *, beta=1, alpha=1, layout=None):
        _check_dtypes(op, inp, mat1, mat2)
        if layout is None and _floating_on_spyre(inp, mat1, mat2):
            # beta * inp + alpha * (mat1 @ mat2), the matmul's epilogue: computed in fp32 from the
            # unrounded sum and rounded once to the output dtype, as eager does
            out_dtype = mat1.get_dtype()
            product = native_matmul(mat1, mat2, 2 if batched else 1, torch.float32)
            if alpha != 1:
                product = L.lowerings[aten.mul](product, alpha)
            if beta != 0:
                scaled = L.to_dtype(inp, torch.float32)
                if beta != 1:
                    scaled = L.lowerings[aten.mul](scaled, beta)
                product = L.lowerings[aten.add](scaled, product)
            return L.to_dtype(product, out_dtype)
        return inductor_addmm(inp, mat1, mat2, beta=beta, alpha=alpha, layout=layout)

    return lowering


def _realized(inductor_lowering):
    """The lowering, its spyre result realized: a node of its own for the scheduler to fuse.

    An embedding's rows are a gather, a cat's or pad's elements come through index masks; left
    unrealized, Inductor inlines them into each consumer, and a reduction (the RMSNorm every
    decoder starts with, a layer_norm of a cat) neither gathers nor is cut at masks: the whole
    group would run on the CPU. Realized, the scheduler still fuses the node into pointwise
    consumers (a rotary embedding stays one program) and keeps it apart from reductions."""
    def lowering(*args, **kwargs):
        out = inductor_lowering(*args, **kwargs)
        first = args[0][0] if args and isinstance(args[0], (list, tuple)) else args[0]
        if _on_spyre(first) and isinstance(out, ir.TensorBox):
            out.realize()
        return out

    return lowering


def _with_loaded_indices(inductor_lowering, position: int, source: bool = False):
    """The lowering, with the index tensors at argument `position` (one, or a list) realized on
    spyre unless capture makes them a direct index (index_probe.direct): a gather takes its row
    indices from memory, so an index computed on chip -- from data (a take_along_dim's wrap,
    ``a[i + 1]``) or through floats (T5's relative position buckets: a log, a where) -- becomes a
    small program of its own. An index that is integer arithmetic on the loop indices alone (a
    roll's, a replicate pad's, an arange of positions) is left to inline: capture keeps it a direct
    index (no gather at all). The result is realized too, as _realized's are (a gather summed,
    nll_loss: two programs, not one CPU fallback)."""
    def lowering(*args, **kwargs):
        if position < len(args):
            indices = args[position]
            if isinstance(indices, (list, tuple)):
                indices = type(indices)(_in_memory(ix) for ix in indices)
                loaded = any(_read_from_memory(ix) for ix in indices)
            else:
                indices = _in_memory(indices)
                loaded = _read_from_memory(indices)
            args = (*args[:position], indices, *args[position + 1:])
            if loaded and source and isinstance(args[0], ir.TensorBox) and _on_spyre(args[0]):
                # the rows a loaded index picks are read from memory: a source computed on chip
                # (the MoE router's weights, renormalized by their row sum, gathered by the sort's
                # permutation) is a program of its own, else its index arithmetic (row // k) lands
                # on the loaded index, which capture cannot take (non-affine), and each gathered
                # element would recompute it
                args[0].realize()
        out = inductor_lowering(*args, **kwargs)
        if _on_spyre(args[0]) and isinstance(out, ir.TensorBox):
            out.realize()  # a gather's result, like an embedding's (_realized): never inside a reduction
        return out

    return lowering


def _in_memory(ix):
    """`ix` realized when capture would not make it a direct index (index_probe.direct), as a
    view that loads it. Inductor inlines a buffer that reads nothing into its readers
    (ComputedBuffer.make_loader): an index computed from the loop indices through floats (T5's
    bucket) would come back inline; a ReinterpretView of its (now fixed) layout is read with
    ops.load."""
    if not (isinstance(ix, ir.TensorBox) and _on_spyre(ix)) or index_probe.direct(ix):
        return ix
    ix.realize()
    node = ix.data
    storage = node.unwrap_view() if isinstance(node, ir.BaseView) else node
    buffer = storage.data if isinstance(storage, ir.StorageBox) else None
    if not (isinstance(buffer, ir.ComputedBuffer) and buffer.num_reads() == 0):
        return ix  # read from memory already (a load, or a buffer that reads others)
    buffer.freeze_layout()
    if isinstance(node, ir.BaseView):
        return ir.TensorBox(ir.ExternKernel.convert_to_reinterpret_view(node))
    return ir.TensorBox(ir.ReinterpretView(data=node, layout=buffer.get_layout()))


def _read_from_memory(node) -> bool:
    """An index read from a buffer (realized, or a graph input), not computed from loop indices."""
    if not isinstance(node, ir.TensorBox):
        return False
    try:
        if node.get_read_names():
            return True
    except (AttributeError, NotImplementedError):
        pass
    data = node.data
    while isinstance(data, ir.BaseView):
        data = data.data
    return isinstance(data, ir.StorageBox) and isinstance(data.data, ir.Buffer)


class HostValueCopy(ir.DeviceCopy):
    """A value the graph computes on the CPU, copied to spyre as computed.

    Inductor's ``DeviceCopy.create`` moves a CPU expression over constants (``torch.arange(10.)
    .to(x.device)``) to the target device and computes it there, intermediate dtypes and all: the
    CPU's arange is in fp64, which spyre programs do not compute (under strict: a refusal). What
    the user wrote is a CPU tensor and a copy, so that is what runs: the expression as a CPU kernel,
    its bytes copied in stream order. (Values made on spyre, ``arange(..., device=x.device)``, are
    spyre programs as before.)"""

    @classmethod
    def create(cls, x, device: torch.device, non_blocking: bool):
        V.graph.add_device_info(device)
        V.graph.add_device_info(x.get_device())
        x = ir.ExternKernel.require_contiguous(x)
        stride = x.get_stride() if x.get_size() else None
        layout = ir.FixedLayout(device, x.get_dtype(), x.get_size(), stride)
        return cls(layout, [cls.realize_input(x)], (non_blocking,))


def _host_value_to_spyre(inductor_device_put):
    def lowering(x, device, non_blocking=False):
        device = torch.device(device) if not isinstance(device, torch.device) else device
        source = x.get_device()
        if device.type == "spyre" and source is not None and source.type == "cpu" and not x.is_extern():
            return ir.TensorBox.create(HostValueCopy.create(x, device, non_blocking))
        return inductor_device_put(x, device, non_blocking)

    return lowering


def install() -> None:
    """Register the spyre-conditional lowerings (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        for overload in (aten.pow.Tensor_Tensor, aten.pow.Scalar):
            inductor_pow = L.lowerings[overload]
            L.register_lowering(overload, broadcast=True)(_spyre_pow(inductor_pow))
        L.register_lowering(torch.ops.prims.device_put.default, type_promotion_kind=None)(
            _host_value_to_spyre(L.lowerings[torch.ops.prims.device_put.default]))
        # Overloads, not packets: Inductor looks lowerings up by the overload in the graph, and
        # registering a packet here would not replace them.
        for op, batched in ((aten.mm.default, False), (aten.bmm.default, True)):
            L.register_lowering(op, type_promotion_kind=None)(_spyre_mm(L.lowerings[op], batched))
        for op, batched in ((aten.addmm.default, False), (aten.baddbmm.default, True)):
            L.register_lowering(op, type_promotion_kind=None)(_spyre_addmm(L.lowerings[op], batched))
        for op in (aten.cat.default, aten.constant_pad_nd.default):
            L.register_lowering(op, type_promotion_kind=None)(_realized(L.lowerings[op]))
        from . import accumulating_scatters

        # accumulating scatters in every dtype and scatter_reduce (issue 31), under the index
        # realization below
        for op, lowering in accumulating_scatters.lowerings():
            L.register_lowering(op, type_promotion_kind=None)(lowering)
        from . import embedding_bag

        for op, lowering in embedding_bag.lowerings():  # sum, mean, max over those scatters
            L.register_lowering(op, type_promotion_kind=None)(lowering)
        for op, position in ((aten.embedding.default, 1), (aten.gather.default, 2), (aten.index.Tensor, 1), (aten._unsafe_index.Tensor, 1),
                             (aten.index_put.default, 1), (aten.index_put_.default, 1),
                             (aten.scatter.src, 2), (aten.scatter_add.default, 2),
                             (aten.scatter_add_.default, 2), (aten.scatter_reduce.two, 2),
                             (aten.scatter_reduce_.two, 2), (aten.index_add.default, 2),
                             (aten.scatter.reduce, 2), (aten.scatter.value_reduce, 2),
                             (aten.scatter_.reduce, 2), (aten.scatter_.value_reduce, 2)):
            gathers = op in (aten.gather.default, aten.index.Tensor, aten._unsafe_index.Tensor)
            L.register_lowering(op, type_promotion_kind=None)(
                _with_loaded_indices(L.lowerings[op], position, source=gathers))
        from .attention_node import lower_attention
        from .attention_op import OP

        L.register_lowering(OP, type_promotion_kind=None)(lower_attention)
        from .random import OP as PHILOX, lower_philox

        L.register_lowering(PHILOX, type_promotion_kind=None)(lower_philox)  # random fills (issue 19)
        from . import sorting

        sorting.install()  # sort, argsort and topk by counting ranks (issue 31)
        from . import experts

        experts.install()  # mixture-of-experts routing: histc, the grouped matmul (issue 31)
        from . import asserts

        asserts.install()  # torch._assert_async: the condition a program, the check in stream order
        _installed = True
