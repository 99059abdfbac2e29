"""A kernel's names: after what it computes and its content hash, and its buffers' by position."""

from __future__ import annotations

import hashlib
from dataclasses import replace

from .kernel_ir import (AttentionKernel, ConvKernel, GroupedMatmulKernel, Kernel, Load, MatmulKernel, Op, Reduction,
                        Scan, SizeValue, SortKernel)


def content_name(kernel: Kernel) -> Kernel:
    """The kernel, named after what it computes and its content hash, e.g.
    ``spyre_pw_mul_add_sigmoid_sub_relu_3f2a...`` or ``spyre_red_max_sub_exp_sum_truediv_...``
    (reports and listings say what ran; the artifact key ignores the name, so
    identical kernels still share one artifact)."""
    digest = hashlib.sha256(replace(kernel, name="").to_json().encode()).hexdigest()[:12]
    if isinstance(kernel, AttentionKernel):
        return replace(kernel, name=f"spyre_attn_{digest}")
    if isinstance(kernel, SortKernel):
        return replace(kernel, name=f"spyre_sort_{digest}")
    if isinstance(kernel, ConvKernel):
        return replace(kernel, name=f"spyre_conv_{digest}")
    if isinstance(kernel, GroupedMatmulKernel):
        return replace(kernel, name=f"spyre_gmm_{digest}")
    ops = []
    for v in kernel.values:
        name = (v.name if isinstance(v, Op) else v.op if isinstance(v, Reduction)
                else f"cum{v.op}" if isinstance(v, Scan) else None)
        if name is not None and name not in ops:
            ops.append(name)
    label = "_".join(ops[:5]) + ("_etc" if len(ops) > 5 else "") if ops else "copy"
    kind = ("mm" if isinstance(kernel, MatmulKernel) else "scan" if kernel.has_scan else "red" if kernel.reduction_ranges
            else "pw")
    return replace(kernel, name=f"spyre_{kind}_{label}_{digest}")


def positional_names(kernel: Kernel) -> Kernel:
    """The kernel with its buffers named by their position (``b0``, ``b1``, ...), in the same order.

    What a kernel computes does not depend on Inductor's buffer names (``arg3_1``, ``buf12``): the
    wrapper binds its arguments by position. Named by position, the same kernel in every layer of
    a model is ONE kernel: one content name, one artifact, planned, written and prepared once, and
    launched per layer with that layer's buffers (a 2-layer decoder plans 21 kernels, not 38)."""
    names = {b.name: f"b{i}" for i, b in enumerate(kernel.buffers)}
    symbolic = getattr(kernel, "symbolic", None)
    if all(old == new for old, new in names.items()) and (
            symbolic is None or all(n == f"z{i}" for i, (n, _, _) in enumerate(symbolic.sizes))):
        return kernel
    sizes = {}
    if symbolic is not None:
        # Sizes by position too (z0): the launch passes them in order, and the same kernel in
        # another graph (where Dynamo named the size s27, not s77) is the same artifact.
        sizes = {n: f"z{i}" for i, (n, _, _) in enumerate(symbolic.sizes)}
        symbolic = replace(
            symbolic,
            sizes=tuple((sizes[n], lo, hi) for n, lo, hi in symbolic.sizes),
            ranges=tuple((d, sizes[n], c, k) for d, n, c, k in symbolic.ranges),
            buffers=tuple((names[b], d, sizes[n], c, k) for b, d, n, c, k in symbolic.buffers),
            limits=tuple((sizes[n], lo, hi) for n, lo, hi in symbolic.limits),
            strides=tuple((names[b], d, sizes[n], c, k) for b, d, n, c, k in symbolic.strides))
    return replace(
        kernel,
        symbolic=symbolic,
        buffers=tuple(replace(b, name=names[b.name]) for b in kernel.buffers),
        values=tuple(replace(v, buffer=names[v.buffer]) if isinstance(v, Load) else
                     replace(v, symbol=sizes[v.symbol]) if isinstance(v, SizeValue) else v for v in kernel.values),
        stores=tuple(replace(st, buffer=names[st.buffer]) for st in kernel.stores),
    )
