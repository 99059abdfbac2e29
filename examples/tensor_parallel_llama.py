"""A tensor-parallel Llama on spyre cards, one process per card:

    .venv/bin/torchrun --nproc-per-node 2 examples/tensor_parallel_llama.py --tokens 8

Each process takes the card LOCAL_RANK picks (spyre:LOCAL_RANK), joins the default process group
(no backend named: spyre's, for spyre tensors), shards the reference Llama with PyTorch's own
tensor-parallel plan (DTensor, ColwiseParallel / RowwiseParallel), compiles it under
SPYRE_STRICT=1 (every op a spyre program, every collective on the card link), prefills a prompt
and decodes greedily. Rank 0 prints the tokens, checks them against the unsplit model on the
CPU, and prints one decode step's simulated compute and communication.
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from spyre_inductor.device.fallback import strict_mode
from spyre_inductor.testing import models
from spyre_inductor.testing.tensor_parallel import local_caches, parallelize_llama

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--tokens", type=int, default=8, help="tokens to decode")
parser.add_argument("--layers", type=int, default=2)
args = parser.parse_args()

rank, world = int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
device = torch.device("spyre", rank)
torch.spyre.set_device(device)
mesh = init_device_mesh("spyre", (world,))  # calls dist.init_process_group(): the spyre backend

config = models.llama_config(n_layers=args.layers, n_kv_heads=4)
reference = models.build(config)  # the same weights on every rank (a seed), kept whole on the CPU
model = parallelize_llama(models.build(config).to(device), mesh)
prompt, positions, k, v = models.llama_inputs(reference, seq=16, cache_len=64)
k_ref, v_ref = [t.clone() for t in k], [t.clone() for t in v]
k, v = local_caches(k, rank, world, device), local_caches(v, rank, world, device)

tokens, expected = [], []
with strict_mode(True), torch.no_grad():
    step = torch.compile(model)
    logits = step(prompt.to(device), positions.to(device), k, v)
    ref_logits = reference(prompt, positions, k_ref, v_ref)
    token, ref_token = logits[:, -1:].argmax(-1), ref_logits[:, -1:].argmax(-1)
    for i in range(args.tokens):
        tokens.append(token.item())
        expected.append(ref_token.item())
        pos = torch.tensor([16 + i])
        with torch.spyre.timeline() as timeline:
            token = step(token, pos.to(device), k, v)[:, -1:].argmax(-1)
        ref_token = reference(ref_token, pos, k_ref, v_ref)[:, -1:].argmax(-1)

if rank == 0:
    print(f"{world} ranks, tokens {tokens}: {'the same as' if tokens == expected else 'DIFFERENT from'} "
          f"the unsplit model's {expected}")
    print(f"last decode step on spyre:0: simulated compute {timeline.busy_ns('compute', rank) / 1e3:.1f} us, "
          f"communication {timeline.busy_ns('link', rank) / 1e3:.1f} us, "
          f"step {timeline.makespan_ns(rank) / 1e3:.1f} us")
dist.destroy_process_group()
