"""``spyre::attention``: the one op a fused attention becomes in the graph (attention_fusion.py).

Its semantics are kernel_ir.attention_reference (``heads_last`` only chooses the output's
layout): softmax(scale * q k^T + mask) v with
grouped kv heads, a causal diagonal, an additive bias and a boolean keep mask. Inductor
lowers it to one flash-style spyre program (lowerings.py -> attention_node.py); the
default implementation here (composite: any device) is what runs when that program cannot
be planned (a visible CPU fallback) and what the fake tensors' shapes come from.
"""

from __future__ import annotations

import torch

from ..ir.kernel_ir import attention_reference


@torch.library.custom_op("spyre::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
              keep: torch.Tensor | None, positions: torch.Tensor | None, scale: float, causal: int | None,
              empty_zero: bool, p_dtype: torch.dtype, out_dtype: torch.dtype, heads_last: bool,
              masked_score: float) -> torch.Tensor:
    out = attention_reference(q, k, v, bias, keep, scale=scale, causal=causal,
                              empty_rows="zero" if empty_zero else "nan", p_dtype=p_dtype, out_dtype=out_dtype,
                              masked_score=masked_score, positions=positions)
    return _empty(q, v, out_dtype, heads_last).copy_(out)


@attention.register_fake
def _(q, k, v, bias, keep, positions, scale, causal, empty_zero, p_dtype, out_dtype, heads_last, masked_score):
    return _empty(q, v, out_dtype, heads_last)


def _empty(q, v, dtype, heads_last: bool) -> torch.Tensor:
    """[B, H, L, Dv], contiguous or (heads_last) with the heads next to the features: the memory of
    a contiguous [B, L, H, Dv], what ``out.transpose(1, 2).reshape(B, L, H * Dv)`` reads as a view."""
    B, H, L, _ = q.shape
    if heads_last:
        return q.new_empty((B, L, H, v.shape[-1]), dtype=dtype).transpose(1, 2)
    return q.new_empty((B, H, L, v.shape[-1]), dtype=dtype)


OP = torch.ops.spyre.attention.default

__all__ = ["OP", "attention"]
