"""The card-to-card link's timing model: what a collective, a send or a receive costs on it.

Each card has one link to the others (hardware config: card_link_gbps per direction,
card_link_latency_us per message; both estimates, overridable). A collective is priced
as the algorithm a ring of cards runs, each step one message per card, sent and received
at once (the link is full duplex):

  ring_reduce   all_reduce: reduce-scatter then all-gather, 2(p-1) steps of n/p bytes
  ring_gather   all_gather, reduce_scatter, all_to_all: p-1 steps of n/p bytes
                (n: the whole gathered or scattered tensor)
  pipeline      broadcast, reduce: the root's n bytes in p-1 pipelined chunks down a chain,
                (p-1) latencies plus n over the link once
  root          gather, scatter: the root's link carries the p-1 other pieces of n/p bytes
  p2p           send, receive: one message of n bytes
  barrier       no bytes: a message each way around the ring, 2(p-1) latencies

The reduction arithmetic itself (a few passes over n/p bytes of device memory per step)
is far below the link's time at these bandwidths and is not charged. Each card's clock
is its own: the model does not wait for the slowest card to arrive.
"""

from __future__ import annotations

PATTERNS = ("ring_reduce", "ring_gather", "pipeline", "root", "p2p", "barrier")


class LinkCosts:
    """Simulated duration, in ns, of a link pattern moving `nbytes` among `ranks` cards."""

    __slots__ = ("gbps", "latency_ns")

    def __init__(self, gbps: float, latency_us: float):
        if not gbps > 0 or not latency_us > 0:
            raise ValueError(f"the card link needs a positive bandwidth and latency, got {gbps} GB/s, "
                             f"{latency_us} us")
        self.gbps = gbps  # GB/s = bytes per ns
        self.latency_ns = latency_us * 1e3

    @classmethod
    def of(cls, hardware) -> LinkCosts:
        return cls(hardware.card_link_gbps, hardware.card_link_latency_us)

    def ns(self, pattern: str, nbytes: int, ranks: int) -> float:
        if pattern not in PATTERNS:
            raise ValueError(f"unknown link pattern {pattern!r}; one of {', '.join(PATTERNS)}")
        if nbytes < 0 or ranks < 1:
            raise ValueError(f"link {pattern}: bytes must be >= 0 and ranks >= 1, got {nbytes} B, {ranks} ranks")
        a, bw, p = self.latency_ns, self.gbps, ranks
        if pattern == "p2p":
            return a + nbytes / bw
        if p == 1:
            return 0.0
        if pattern == "ring_reduce":
            return 2 * (p - 1) * (a + nbytes / p / bw)
        if pattern == "ring_gather":
            return (p - 1) * (a + nbytes / p / bw)
        if pattern == "pipeline":
            return (p - 1) * a + nbytes / bw
        if pattern == "root":
            return a + (p - 1) * (nbytes / p) / bw
        return 2 * (p - 1) * a  # barrier
