"""The queue layer: what enqueueing costs on the host, and what overlap buys on the device.

1. Enqueue cost: host time per enqueue (the work itself runs on workers),
   and the same once 1,000 other streams have been used (it must not grow
   with every stream ever created).
2. An alternating transfer/compute workload (load chunk i, compute on chunk i)
   on one stream vs two: the simulated compute-pipeline idle fraction and
   makespan, from the run's timeline. Compute cost is a stated placeholder
   (fixed simulated ns per chunk) until the timing model lands.
"""

from __future__ import annotations

import statistics
import time

import torch

from _bench import print_table
from spyre_inductor.device import queues
from spyre_runtime.queue import Compute, Executor, HostCallback, Timeline, Transfer, TransferKind, HostAddress

CHUNK = 4 << 20          # bytes per chunk: ~168 us of host link at 25 GB/s
COMPUTE_NS = 200_000.0   # simulated cost of the compute on one chunk (placeholder)
CHUNKS = 16


class FixedCost(Executor):
    def run(self, bindings):
        pass

    def cost_ns(self, bindings):
        return COMPUTE_NS


def enqueue_cost_table() -> None:
    q = queues.queue(0)
    s1, s2 = torch.spyre.Stream(), torch.spyre.Stream()
    dev = torch.empty(1 << 20, dtype=torch.uint8, device="spyre")
    host = torch.empty(1 << 20, dtype=torch.uint8).pin_memory()
    rows = []
    n = 5000

    def timed(label, make_op, streams):
        q.synchronize()
        samples = []
        for _ in range(3):
            start = time.perf_counter()
            for i in range(n):
                q.enqueue(streams[i % len(streams)].stream_id, make_op(i))
            samples.append((time.perf_counter() - start) / n * 1e6)
            q.synchronize()
        rows.append([label, statistics.median(samples)])

    timed("host callback, no footprint, 1 stream", lambda i: HostCallback(lambda: None), [s1])
    addr = queues.address(dev)
    timed("h2d transfer 4 KiB, 1 stream",
          lambda i: Transfer(TransferKind.H2D, HostAddress(host.data_ptr()), addr, 4096), [s1])
    timed("h2d transfer 4 KiB, 2 streams (footprints conflict)",
          lambda i: Transfer(TransferKind.H2D, HostAddress(host.data_ptr()), addr, 4096), [s1, s2])
    fp = queues.footprint(reads=(dev,))
    timed("compute, 2 streams (read-only: no conflict)",
          lambda i: Compute(FixedCost(), None, fp), [s1, s2])
    print_table("enqueue cost (host us per operation, median of 3 x %d)" % n, ["operation", "us"], rows)


def many_streams_table(n: int = 3000, others: int = 1000) -> None:
    q = queues.queue(0)
    s1 = torch.spyre.Stream()
    dev = torch.empty(1 << 20, dtype=torch.uint8, device="spyre")
    host = torch.empty(1 << 20, dtype=torch.uint8).pin_memory()
    addr = queues.address(dev)

    def per_enqueue() -> float:
        samples = []
        for _ in range(3):
            q.synchronize()
            start = time.perf_counter()
            for _ in range(n):
                q.enqueue(s1.stream_id, Transfer(TransferKind.H2D, HostAddress(host.data_ptr()), addr, 4096))
            samples.append((time.perf_counter() - start) / n * 1e6)
        q.synchronize()
        return statistics.median(samples)

    before = per_enqueue()
    scratch = torch.empty(others * 128, dtype=torch.uint8, device="spyre")
    for i in range(others):  # each stream writes its own bytes once, then sits idle
        part = scratch[i * 128:(i + 1) * 128]
        q.enqueue(torch.spyre.Stream().stream_id,
                  Transfer(TransferKind.H2D, HostAddress(host.data_ptr()), queues.address(part), 128))
    after = per_enqueue()
    print_table(f"enqueue cost before and after {others} other streams were used (host us, median of 3 x {n})",
                ["h2d 4 KiB on one stream", "us"],
                [["before", before], [f"after {others} streams", after], ["ratio", after / before]])


def alternating(streams: list) -> Timeline:
    q = queues.queue(0)
    host = torch.empty(CHUNK * CHUNKS, dtype=torch.uint8).pin_memory()
    dev = torch.empty(CHUNK * CHUNKS, dtype=torch.uint8, device="spyre")
    q.synchronize()
    with Timeline([q]) as tl:
        for i in range(CHUNKS):
            s = streams[i % len(streams)].stream_id
            chunk = dev[i * CHUNK:(i + 1) * CHUNK]
            q.enqueue(s, Transfer(TransferKind.H2D, HostAddress(host.data_ptr() + i * CHUNK),
                                  queues.address(chunk), CHUNK))
            q.enqueue(s, Compute(FixedCost(), None, queues.footprint(reads=(chunk,)), name=f"compute {i}"))
    return tl


def overlap_table() -> None:
    rows = []
    for label, streams in (("1 stream", [torch.spyre.Stream()]),
                           ("2 streams", [torch.spyre.Stream(), torch.spyre.Stream()])):
        tl = alternating(streams)
        span = tl.makespan_ns()
        busy = tl.busy_ns("compute")
        rows.append([label, span / 1e3, busy / 1e3, 1 - busy / span])
    print_table(
        f"alternating h2d ({CHUNK >> 20} MiB) / compute ({COMPUTE_NS / 1e3:.0f} us placeholder) x {CHUNKS}, simulated",
        ["streams", "makespan us", "compute busy us", "compute idle fraction"],
        rows,
    )


def main() -> None:
    enqueue_cost_table()
    many_streams_table()
    overlap_table()


if __name__ == "__main__":
    main()
