"""Tensor parallelism for the reference Llama (testing/models.py) with PyTorch's own DTensor plan.

``parallelize_llama(model, mesh)`` shards each layer as Megatron does, through
torch.distributed.tensor.parallel.parallelize_module: the q/k/v and gate/up projections by
output column (ColwiseParallel), o_proj and down_proj by input row (RowwiseParallel, whose
partial sums become an all_reduce). Each rank's attention then holds n_heads / tp query heads
and n_kv_heads / tp K/V heads, so its config is narrowed to those (as torchtitan narrows its
attention's head counts), and its KV caches hold only its heads (``local_caches``).
"""

from __future__ import annotations

import dataclasses

import torch
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

PLAN = {
    "attn.q_proj": ColwiseParallel(), "attn.k_proj": ColwiseParallel(), "attn.v_proj": ColwiseParallel(),
    "attn.o_proj": RowwiseParallel(),
    "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(), "mlp.down_proj": RowwiseParallel(),
}


def parallelize_llama(model, mesh):
    """Shard `model` (a testing.models.Llama, already on the mesh's device) over the 1-D `mesh`."""
    tp = mesh.size()
    c = model.config
    if c.n_kv_heads % tp or c.hidden % tp:
        raise ValueError(f"tensor parallelism over {tp} ranks needs n_kv_heads ({c.n_kv_heads}) and hidden "
                         f"({c.hidden}) divisible by {tp}")
    for layer in model.layers:
        parallelize_module(layer, mesh, PLAN)
        layer.attn.c = dataclasses.replace(c, n_heads=c.n_heads // tp, n_kv_heads=c.n_kv_heads // tp)
    return model


def local_caches(caches, rank: int, tp: int, device):
    """This rank's heads of each (batch, n_kv_heads, length, head_dim) cache, on `device`."""
    return [t.chunk(tp, dim=1)[rank].contiguous().to(device) for t in caches]
