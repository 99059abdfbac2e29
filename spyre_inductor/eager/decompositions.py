"""Spyre's own decompositions of ops the eager path traces, where Inductor's would not run on the card.

The eager compile (compile.py) traces an op through Inductor's decomposition table; for the ops
here it takes these instead, which compute the same values in forms the planner's families
already take. Both are the backward ops a training step calls:

* ``nll_loss_backward`` (cross_entropy's backward): Inductor's decomposition scatters -1 at
  ``where(target != ignore_index, target, 0)``, an index computed on chip, which no family plans
  (gathers and scatters take loaded indices). The gradient is dense anyway (one row per sample,
  one column per class), so here it is pointwise: a column compared with its row's target.
  ``grad_input[n, c] = (c == target[n] and target[n] != ignore_index) ? -g[n] * w[c] : 0``, with
  ``g`` divided by the total weight first for ``reduction='mean'``: the products the scatter
  form computes, in the same order, so the values are the CPU's bit for bit in fp32.
* ``embedding_dense_backward``: Inductor's decomposition clamps the indices into range and masks
  the rows that fall outside (``_unsafe_masked_index_put_accumulate``), an index computed on
  chip again. Indices that reach this backward were in range in the forward (the CPU kernel and
  the gather both refuse others), so here the rows are accumulated at the loaded indices
  themselves (``index_put`` with ``accumulate=True``, the indirect family's scatter-add), the
  ``padding_idx`` rows zeroed first, as the CPU kernel skips them; rows whose ids are broadcast
  (a stride 0) are summed before the scatter. An index outside the table,
  which the CPU kernel skips silently when the op is called by hand, stops the program with an
  error naming the op instead (compile.py: its indices do not wrap).

* ``_index_put_impl_`` (what autograd's backward of ``x[ids]`` calls: a mixture-of-experts
  block's token gather): ``index_put_``, whose ``unsafe`` flag only skips a check the program's
  index check makes anyway.

No device check: the eager path traces spyre tensors only. Compiled graphs (torch.compile)
still take Inductor's table.
"""

from __future__ import annotations

import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

aten = torch.ops.aten

_MEAN = 1  # torch._decomp's Reduction.MEAN


def nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index, total_weight):
    channel_dim = 0 if self.dim() < 2 else 1
    if reduction == _MEAN:
        grad_output = grad_output / total_weight
    if self.dim() == 1 and target.dim() > 0:  # (the CPU kernel reads target[0] only)
        target = target[0]
    target = target.unsqueeze(channel_dim)
    shape = [1] * self.dim()
    shape[channel_dim] = self.shape[channel_dim]
    classes = torch.arange(self.shape[channel_dim], device=self.device).view(shape)
    hit = (classes == target) & (target != ignore_index)
    if self.dim() > grad_output.dim() > 0:
        grad_output = grad_output.unsqueeze(channel_dim)
    grad = -grad_output
    if weight is not None:
        grad = grad * weight.view(shape)
    return torch.where(hit, grad, 0).to(self.dtype)


def embedding_dense_backward(grad_output, indices, num_weights, padding_idx, scale_grad_by_freq):
    computation_dtype, result_dtype = elementwise_dtypes(
        grad_output, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)
    grad = grad_output.to(computation_dtype)
    indices = indices.long()
    # Ids broadcast along a dim (BERT's token_type_ids: one row of zeros expanded over the batch)
    # send every row along it to the same rows: those gradients are summed first, and the
    # scatter-add iterates over distinct positions only (the indirect family plans no store
    # that writes one element from several iterations).
    broadcast = [d for d in range(indices.dim()) if indices.stride(d) == 0 and indices.shape[d] > 1]
    repeats = 1
    if broadcast:
        grad = grad.sum(dim=broadcast, keepdim=True)
        for d in broadcast:
            repeats *= indices.shape[d]
            indices = indices.narrow(d, 0, 1)
    if scale_grad_by_freq:
        # counted in the gradient's computation dtype (fp32: exact to 2**24 occurrences), the
        # dtype it divides in
        counts = grad.new_zeros((num_weights,)).index_put([indices], grad.new_ones(indices.shape), accumulate=True)
        grad = grad / (counts[indices] * repeats).unsqueeze(-1)
    grad = grad.masked_fill((indices == padding_idx).unsqueeze(-1), 0)
    grad_weight = grad.new_zeros((num_weights,) + grad.shape[indices.dim():])
    return grad_weight.index_put([indices], grad, accumulate=True).to(result_dtype)


def index_put_impl(self, indices, values, accumulate=False, unsafe=False):
    return aten.index_put(self, indices, values, accumulate)


TABLE = {
    aten.nll_loss_backward.default: nll_loss_backward,
    aten.embedding_dense_backward.default: embedding_dense_backward,
    aten._index_put_impl.default: index_put_impl,  # the traced _index_put_impl_, functionalized
}
