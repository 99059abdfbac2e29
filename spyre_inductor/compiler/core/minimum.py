"""The least device traffic a kernel needs: what its kernel report is rated against.

Every distinct element of every buffer the kernel loads, read once, and
every distinct element of every buffer it stores, written once, times the
buffer's itemsize. Nothing the plan chooses enters: not whole sticks, not
re-reads (an operand broadcast over a dim, a matmul operand every core
needs, a second pass over rows that did not stay resident), not
temporaries. A program moving exactly this is at the bandwidth roofline's
limit; what it moves beyond it is its refetch.

An access (a Load's or a Store's Index over the kernel's ranges and
reduction ranges) touches offset + sum(strides[d] * i_d) for i_d in
range(extent_d). Dims with stride 0 (broadcasts, a reduced dim an outer
value does not walk) and extent 1 add nothing. For the typical access,
whose dims do not overlap, the distinct elements are the product of the
remaining extents. Accesses of one buffer are deduplicated (the same
operand loaded twice counts once), and a buffer accessed in several
different ways (slices of it, windows that overlap, an index mixing two
dims at one stride) is counted exactly as the union of the intervals its
accesses touch, up to a budget of intervals; past the budget the sum over
its accesses, capped at the buffer's own element count, is used (an upper
bound, so the rating errs towards the generous).

Loads are the IR's ``Load`` values; a buffer both loaded and stored
counts in both parts. A gather or scatter (an index with indirect terms,
issue 16) counts one element per iteration its affine part or its index
tells apart (the rows it must move: duplicates cannot be known before the
data), capped at the buffer's elements; an accumulating scatter also reads
what it adds to. The result is a plain int (bytes); nothing here
depends on a plan, so it is the same for every candidate of a kernel.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

import math

from ..ir.kernel_ir import TORCH_DTYPES, Cast, Indirect, Load, Op

# Intervals (contiguous runs of one access) enumerated to count a union exactly.
UNION_BUDGET = 1 << 21


class Traffic(NamedTuple):
    read_bytes: int
    write_bytes: int

    @property
    def total(self) -> int:
        return self.read_bytes + self.write_bytes


def recorded(kernel, program):
    """`program` carrying the kernel's minimum traffic (Program.minimum_bytes / minimum_read_bytes),
    so its kernel reports rate it against what the kernel needs, not the bytes it chose to move.
    Every family records it on the program it keeps, before that program is validated."""
    import dataclasses

    traffic = minimum_traffic(kernel)
    return dataclasses.replace(program, minimum_bytes=traffic.total, minimum_read_bytes=traffic.read_bytes)


def minimum_bytes(kernel) -> int:
    """Bytes `kernel` must move at least: each distinct input element read once, each output element
    written once. For Program(minimum_bytes=...)."""
    return minimum_traffic(kernel).total


def minimum_traffic(kernel) -> Traffic:
    """(read bytes, write bytes) of minimum_bytes(kernel), for Program(minimum_read_bytes=...)."""
    return union_traffic([kernel])


def _varying(kernel, pos: int) -> set[int]:
    """The iteration dims value `pos` may vary over."""
    v = kernel.values[pos]
    if isinstance(v, Load):
        dims = {d for d, s in enumerate(v.index.strides) if s}
        for p, _ in v.index.indirect:
            dims |= _varying(kernel, p)
        return dims
    if isinstance(v, (Cast, Indirect)):
        return _varying(kernel, v.arg)
    if isinstance(v, Op):
        return set().union(*(_varying(kernel, a) for a in v.args))
    return set()


def _indirect_bytes(kernel, name: str, index, extents) -> int:
    dims = {d for d, s in enumerate(index.strides) if s}
    for p, _ in index.indirect:
        dims |= _varying(kernel, p)
    buffer = kernel.buffer(name)
    points = math.prod(extents[d] for d in dims)
    return min(points, _buffer_elements(buffer)) * TORCH_DTYPES[buffer.dtype].itemsize


def _union_bytes(kernel, accesses: dict[str, list]) -> int:
    total = 0
    for name, walks in accesses.items():
        buffer = kernel.buffer(name)
        total += _distinct(walks, _buffer_elements(buffer)) * TORCH_DTYPES[buffer.dtype].itemsize
    return total


def union_traffic(kernels) -> Traffic:
    """minimum_traffic of several kernels over the same buffers taken together (the pieces of one
    kernel: an element two pieces read is read once at least, not twice). Gathered and
    scattered rows count per piece, as minimum_traffic counts them (their rows depend on data)."""
    reads: dict[str, list] = {}
    writes: dict[str, list] = {}
    moved = [0, 0]
    for kernel in kernels:
        extents = tuple(kernel.ranges) + tuple(getattr(kernel, "reduction_ranges", ()))
        for v in kernel.values:
            if isinstance(v, Load):
                if v.index.indirect:
                    moved[0] += _indirect_bytes(kernel, v.buffer, v.index, extents)
                else:
                    reads.setdefault(v.buffer, []).append((v.index.offset, v.index.strides, extents))
        for st in kernel.stores:
            if st.index.indirect:
                n = _indirect_bytes(kernel, st.buffer, st.index, extents)
                moved[1] += n
                if getattr(st, "mode", None) == "atomic_add":
                    moved[0] += n
            else:
                writes.setdefault(st.buffer, []).append((st.index.offset, st.index.strides, extents))
                if getattr(st, "mode", None) == "atomic_add":
                    reads.setdefault(st.buffer, []).append((st.index.offset, st.index.strides, extents))
    first = kernels[0]
    return Traffic(_union_bytes(first, reads) + moved[0], _union_bytes(first, writes) + moved[1])


def distinct_elements(accesses, extents, cap: int | None = None) -> int:
    """Distinct element indices touched by `accesses` ((offset, strides) over `extents`) together."""
    return _distinct([(offset, strides, extents) for offset, strides in accesses], cap)


def _distinct(walks, cap: int | None = None) -> int:
    """Distinct element indices touched by `walks` ((offset, strides, extents) each) together."""
    canon = []
    for offset, strides, extents in walks:
        access = _canonical(offset, strides, extents)
        if access is not None and access not in canon:
            canon.append(access)
    if not canon:
        return 0
    if len(canon) == 1 and _disjoint_dims(canon[0][1]):
        return _count(canon[0])
    runs = sum(_runs(a) for a in canon)
    if runs <= UNION_BUDGET:
        return _union(canon)
    bound = sum(_count(a) for a in canon)
    return bound if cap is None else min(bound, cap)


def _canonical(offset: int, strides, extents):
    """(lowest offset, ((stride, extent), ...) ascending, contiguous dims merged), None if empty."""
    if len(strides) != len(extents):
        raise ValueError(f"an index with {len(strides)} strides over {len(extents)} ranges")
    if any(n == 0 for n in extents):
        return None
    dims = []
    for s, n in zip(strides, extents):
        if n == 1 or s == 0:
            continue
        if s < 0:  # walked backwards: the same elements from the other end
            offset += (n - 1) * s
            s = -s
        dims.append((s, n))
    dims.sort()
    merged: list[tuple[int, int]] = []
    for s, n in dims:
        if merged and merged[-1][0] * merged[-1][1] == s:
            ps, pn = merged.pop()
            merged.append((ps, pn * n))
        else:
            merged.append((s, n))
    return offset, tuple(merged)


def _disjoint_dims(dims) -> bool:
    """No two index tuples reach one element: each stride clears the span of the smaller dims."""
    span = 0
    for s, n in dims:
        if s <= span:
            return False
        span += (n - 1) * s
    return True


def _count(access) -> int:
    n = 1
    for _, e in access[1]:
        n *= e
    return n


def _run(access) -> tuple[int, tuple]:
    """The access as runs: (run length, the dims whose every combination starts one run)."""
    dims = access[1]
    if dims and dims[0][0] == 1:
        return dims[0][1], dims[1:]
    return 1, dims


def _runs(access) -> int:
    return _count((0, _run(access)[1]))


def _union(accesses) -> int:
    starts, ends = [], []
    for offset, dims in accesses:
        length, outer = _run((offset, dims))
        s = np.array([offset], dtype=np.int64)
        for stride, n in outer:
            s = (s[:, None] + np.arange(n, dtype=np.int64) * stride).ravel()
        starts.append(s)
        ends.append(s + length)
    start, end = np.concatenate(starts), np.concatenate(ends)
    order = np.argsort(start, kind="stable")
    start, end = start[order], end[order]
    reach = np.maximum.accumulate(end)  # the furthest any earlier-starting run reaches
    before = np.concatenate(([np.iinfo(np.int64).min], reach[:-1]))
    return int(np.maximum(end - np.maximum(start, before), 0).sum())


def _buffer_elements(buffer) -> int:
    """Distinct elements of the buffer itself (its stride-0 dims count once)."""
    return distinct_elements([(0, tuple(buffer.strides))], tuple(buffer.shape))
