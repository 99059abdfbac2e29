"""torch.distributed on spyre: collectives and a tensor-parallel decoder, over 1, 2 and 4 processes.

Tables, each from one run on localhost (every rank its own process and card):

* all_reduce (fp32, sum) of 1 KB to 64 MB over 2 and 4 ranks: the simulated time on the
  card-to-card link (the link model: hardware config card_link_gbps, card_link_latency_us;
  SPYRE_LINK_GBPS / SPYRE_LINK_LATENCY_US override them), the bus bandwidth that implies
  (2(p-1)/p x bytes / time, as nccl-tests reports it), and the host time per call to
  synchronize (gloo over loopback TCP on this machine's cores: what the simulator costs,
  not what a card would);
* the reference Llama (testing/models.py; fp16) split by DTensor's tensor-parallel plan
  (testing/tensor_parallel.py), compiled, one decode step (1 token, cache 256) at 1, 2 and
  4 ranks: simulated compute (the compute pipeline's busy time), simulated communication
  (the link's), the simulated step (first start to last end on rank 0's card) and host ms.

Run: .venv/bin/python benchmarks/distributed.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402

from _bench import print_table  # noqa: E402
from spyre_inductor.testing.distributed import run_ranks  # noqa: E402

SIZES = [1 << 10, 16 << 10, 256 << 10, 4 << 20, 64 << 20]


def _all_reduce(rank, world, sizes, repeats):
    import torch.distributed as dist

    d = torch.device("spyre", rank)
    rows = []
    for nbytes in sizes:
        x = torch.ones(nbytes // 4, device=d)
        dist.all_reduce(x)  # warm
        torch.spyre.synchronize()
        host = []
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            dist.all_reduce(x)
            torch.spyre.synchronize()
            host.append(time.perf_counter() - start)
        with torch.spyre.timeline() as tl:
            dist.all_reduce(x)
        link = [t for _, t in tl.tickets if t.pipeline == "link"]
        rows.append((nbytes, (link[0].sim_end - link[0].sim_start) / 1e3, statistics.median(host) * 1e3))
    return rows


def _decode(rank, world, steps, cache_len):
    from torch.distributed.device_mesh import init_device_mesh

    from spyre_inductor.testing import models
    from spyre_inductor.testing.tensor_parallel import local_caches, parallelize_llama

    mesh = init_device_mesh("spyre", (world,))
    d = torch.device("spyre", rank)
    cfg = models.llama_config(n_kv_heads=4)
    model = parallelize_llama(models.build(cfg, dtype=torch.float16).to(d), mesh)
    k, v = model.new_caches(1, cache_len, seed=1)
    k, v = local_caches(k, rank, world, d), local_caches(v, rank, world, d)
    step = torch.compile(model)
    token = torch.tensor([[1]], device=d)
    with torch.no_grad():
        for i in range(5):  # compile and warm (the first steps after a compile cost more on the host)
            token = step(token, torch.tensor([i], device=d), k, v)[:, -1].argmax(-1, keepdim=True)
            torch.spyre.synchronize()
        host, compute, link, span = [], [], [], []
        for i in range(steps):  # host time: call to synchronize, nothing recorded
            start = time.perf_counter()
            token = step(token, torch.tensor([5 + i], device=d), k, v)[:, -1].argmax(-1, keepdim=True)
            torch.spyre.synchronize()
            host.append(time.perf_counter() - start)
        for i in range(steps):  # simulated time: the step's operations on the card's timeline
            with torch.spyre.timeline() as tl:
                token = step(token, torch.tensor([5 + steps + i], device=d), k, v)[:, -1].argmax(-1, keepdim=True)
            compute.append(tl.busy_ns("compute", rank) / 1e3)
            link.append(tl.busy_ns("link", rank) / 1e3)
            span.append(tl.makespan_ns(rank) / 1e3)
    med = statistics.median
    return med(compute), med(link), med(span), med(host) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes and repeats (for the tests)")
    args = parser.parse_args()
    sizes = SIZES[:2] if args.quick else SIZES
    repeats = 2 if args.quick else 5
    rows = []
    for world in (2, 4):
        for nbytes, sim_us, host_ms in run_ranks(_all_reduce, world, sizes, repeats, timeout=900)[0]:
            busbw = 2 * (world - 1) / world * nbytes / (sim_us * 1e3)  # GB/s
            rows.append([world, f"{nbytes / 1024:g} KB" if nbytes < 1 << 20 else f"{nbytes >> 20} MB",
                         f"{sim_us:.1f}", f"{busbw:.1f}", f"{host_ms:.2f}"])
    print_table("all_reduce fp32 sum: simulated link time and host time per call",
                ["ranks", "size", "simulated us", "bus GB/s (simulated)", "host ms"], rows)
    steps = 2 if args.quick else 6
    rows = []
    for world in ((1, 2) if args.quick else (1, 2, 4)):
        compute, link, span, host = run_ranks(_decode, world, steps, 256, timeout=1200)[0]
        rows.append([world, f"{compute:.1f}", f"{link:.1f}", f"{span:.1f}", f"{host:.1f}"])
    print_table("tensor-parallel Llama decode step (fp16, 2 layers, d 256, cache 256), rank 0",
                ["ranks", "simulated compute us", "simulated communication us", "simulated step us", "host ms"], rows)


if __name__ == "__main__":
    main()
