"""``spyre::attention``: the one op a fused attention becomes in the graph (attention_fusion.py).

Its semantics are kernel_ir.attention_reference: softmax(scale * q k^T + mask) v with
grouped kv heads, a causal diagonal, an additive bias and a boolean keep mask. Inductor
lowers it to one flash-style spyre program (lowerings.py -> attention_node.py); the
default implementation here (composite: any device) is what runs when that program cannot
be planned (a visible CPU fallback) and what the fake tensors' shapes come from.
"""

from __future__ import annotations

import torch

from .kernel_ir import attention_reference


@torch.library.custom_op("spyre::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
              keep: torch.Tensor | None, scale: float, causal: int | None, empty_zero: bool,
              p_dtype: torch.dtype, out_dtype: torch.dtype) -> torch.Tensor:
    return attention_reference(q, k, v, bias, keep, scale=scale, causal=causal,
                               empty_rows="zero" if empty_zero else "nan", p_dtype=p_dtype,
                               out_dtype=out_dtype).contiguous()


@attention.register_fake
def _(q, k, v, bias, keep, scale, causal, empty_zero, p_dtype, out_dtype):
    B, H, L, _ = q.shape
    return q.new_empty((B, H, L, v.shape[-1]), dtype=out_dtype)


OP = torch.ops.spyre.attention.default

__all__ = ["OP", "attention"]
