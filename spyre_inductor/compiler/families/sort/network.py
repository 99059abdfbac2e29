"""The bitonic networks over rows of a power-of-two length: which compare-exchange steps, in order.

**Sort.** A row of N = 2**m elements is sorted by m(m+1)/2 steps: for every block size b = 2, 4,
..., N (each block of b elements merged from two sorted halves, alternate blocks in reverse order
so the next merge sees a bitonic sequence), the distances b/2, b/4, ..., 1. Every step pairs each
element with the one `distance` away, whatever the data: the program is the same for every row, so
every row of a tile takes the same instructions (isa.CompareExchange: `block` says which pairs go
in reverse). The last block (b = N) puts every pair in the requested order.

**Top k** (the first k of the sort, K = k padded to a power of two, K < N): sort every block of K
(alternate blocks in reverse), then halve until K are left: pair each block with the next, K
apart, keep the first of each pair (a bitonic run of the K that come first of both: ``halve``
packs them into the row's first half) and merge each run (distances K/2, ..., 1, alternate runs
in reverse again, the last one in order). About 2N(1 + log2 K) element-steps instead of the
sort's N log2(N)(log2(N) + 1)/2: for N = 4096, K = 8 about 6x fewer.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NetworkStep:
    """One cmpx over the first `cols` columns of the rows."""

    distance: int
    block: int
    cols: int
    halve: bool = False


def padded(n: int) -> int:
    """The network's row length for rows of n elements: the next power of two (1 for n <= 1)."""
    return 1 << max(n - 1, 0).bit_length()


def steps(N: int) -> tuple[tuple[int, int], ...]:
    """(distance, block) of every step sorting rows of N (a power of two) elements, in order."""
    if N & (N - 1):
        raise ValueError(f"a bitonic network sorts rows of a power of two elements, not {N}")
    out, block = [], 2
    while block <= N:
        distance = block // 2
        while distance:
            out.append((distance, block))
            distance //= 2
        block *= 2
    return tuple(out)


def network(N: int, k: int) -> tuple[NetworkStep, ...]:
    """The steps leaving the first k of the sort of rows of N in their first k columns: the sort,
    or the top-k network when k padded is less than N."""
    K = padded(k)
    if K >= N:
        return tuple(NetworkStep(d, b, N) for d, b in steps(N))
    out = [NetworkStep(d, b, N) for d, b in steps(K)]  # (blocks of K sorted, alternate ones reversed)
    cols = N
    while cols > K:
        out.append(NetworkStep(K, cols, cols, halve=True))  # (block = cols: every pair in order)
        cols //= 2
        d = K // 2
        while d:
            out.append(NetworkStep(d, K, cols))
            d //= 2
    return tuple(out)


__all__ = ["NetworkStep", "network", "padded", "steps"]
