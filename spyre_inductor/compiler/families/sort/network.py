"""The bitonic sorting network over rows of a power-of-two length: which compare-exchange steps, in order.

A row of N = 2**m elements is sorted by m(m+1)/2 steps: for every block size b = 2, 4, ..., N
(each block of b elements merged from two sorted halves, alternate blocks in reverse order so the
next merge sees a bitonic sequence), the distances b/2, b/4, ..., 1. Every step pairs each element
with the one `distance` away, whatever the data: the program is the same for every row, so every
row of a tile takes the same instructions (isa.CompareExchange: `block` says which pairs go in
reverse). The last block (b = N) puts every pair in the requested order.
"""

from __future__ import annotations


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


__all__ = ["padded", "steps"]
