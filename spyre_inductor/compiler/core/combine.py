"""A tile kernel's ``Combine`` on the ring: partial tiles handed core to core along a chain.

The cores of one chain each hold a partial of the same tiles (a reduction's accumulators over
its slice of the reduced dim, a matmul's fp32 sums over its slice of k). The first core sends
its partials into the next core's RING_LANDING tiles; every later core waits for them, runs the
combine's steps (own = combine(landed, own)) and sends the result on; the last core holds the
whole and finishes (epilogue, stores). Neighbours only: a Send reaches the next core on the
ring, so the chain's cores are consecutive and the combine costs one hop per core. A chain may
run either way round the ring (`step` +1 or -1): two chains meeting at a middle core halve the
hops.

Both halves are the families' to place in their own streams: ``receive`` on the sfp before the
combine's steps, ``send_on`` once the sfp has finished with the partials (its ``ready`` queue
hands them to the load/store unit, which moves them, then signals the next core's sfp).
"""

from __future__ import annotations

from spyre_runtime.program.isa import Pop, Push, Send
from spyre_runtime.program.operands import Addr
from spyre_runtime.program.program import Queue


def ring_queue(core: int, step: int = 1) -> str:
    """The queue on which `core`'s load/store unit tells its neighbour's sfp (core + step) that
    its partials landed."""
    return f"ring{core}" if step == 1 else f"ring{core}L"


def receive(sfp, core: int, step: int = 1) -> None:
    """Wait for the partials of the neighbour before this core in a chain running `step`."""
    sfp.emit(Pop(ring_queue(core - step, step)))


def send_on(ls, sfp, core: int, ready: str, moves, step: int = 1) -> None:
    """Hand this core's partials to the next core of its chain (core + step): `moves` are
    (landing offset there, offset here, bytes) per tile. The next core's ``receive`` pops
    ``ring_queue(core, step)``, which the family declares once (``queue``) however many
    hand-overs it emits (a partial handed on in pieces pipelines the chain: the next core
    adds one piece while this one sends the next)."""
    sfp.emit(Push(ready))
    ls.emit(Pop(ready))
    for dst, src, nbytes in moves:
        ls.emit(Send(core + step, Addr(dst), Addr(src), nbytes))
    ls.emit(Push(ring_queue(core, step)))


def queue(core: int, depth: int = 1, step: int = 1) -> Queue:
    """The queue of `core`'s hand-overs to the next core's sfp."""
    return Queue(ring_queue(core, step), (core, "ls"), (core + step, "sfp"), depth)


__all__ = ["queue", "receive", "ring_queue", "send_on"]
