"""Scratchpad allocation with live ranges, and the placement check: one of each for every family.

A family's plan variant says what each tile needs (``Need``: bytes, row
stride, how many copies, and when it is live); ``allocate`` places the
needs in the usable scratchpad and ``check_placement`` is the independent
half of the verifier that every family's plan goes through before
emission. Live ranges are ``(first, last)`` in the family's own step
numbering; ``None`` is the whole program.

A tile shape whose needs do not fit is shrunk and placed again
(``shrink_to_fit``); each family says how its shape gets smaller.

Placement: pinned needs (live for the whole program) first, in the order
given, each copy after the last; then the live-ranged ones, in order, each
at the lowest offset where it fits beside the needs live at an overlapping
step (the bytes of dead ones are reused: first fit).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, TypeVar

from spyre_runtime.program.operands import STICK

from ..ir.errors import PlanError, Unsupported
from ._dump import Describable


@dataclass(frozen=True)
class Need:
    tile: str
    nbytes: int
    row_stride: int
    copies: int = 1                   # >1: stream buffers (allocations numbered 0..copies-1)
    live: tuple[int, int] | None = None


@dataclass(frozen=True)
class Allocation:
    tile: str
    copy: int | None          # stream buffer 0, 1, ...; None for a single copy
    offset: int
    nbytes: int
    row_stride: int
    live: tuple[int, int] | None  # [first, last] step, None: the whole program

    @property
    def name(self) -> str:
        return self.tile if self.copy is None else f"{self.tile}[{self.copy}]"


@dataclass(frozen=True)
class Placement(Describable):
    usable: int
    allocations: tuple[Allocation, ...]
    high_water: int

    @property
    def fits(self) -> bool:
        return self.high_water <= self.usable

    def at(self, tile: str, copy: int | None = None) -> Allocation:
        for a in self.allocations:
            if a.tile == tile and (a.copy == copy or a.copy is None):
                return a
        raise KeyError(f"no allocation for tile {tile!r} copy {copy}")


def first_fit(placed, base: int, nbytes: int, first: int, last: int) -> int:
    """The lowest offset from `base` where `nbytes` fit between the allocations of `placed`
    that are live at some step of [first, last]."""
    busy = sorted((a.offset, a.offset + a.nbytes) for a in placed if not (a.live[1] < first or last < a.live[0]))
    offset = base
    for lo, hi in busy:
        if offset + nbytes <= lo:
            break
        offset = max(offset, hi)
    return offset


def _round(n: int) -> int:
    return -(-n // STICK) * STICK


def allocate(needs, usable: int) -> Placement:
    allocs, top = [], 0
    for n in needs:
        if n.live is None:
            for c in range(n.copies):
                allocs.append(Allocation(n.tile, c if n.copies > 1 else None, top, n.nbytes, n.row_stride, None))
                top += _round(n.nbytes)
    base, high, placed = top, top, []
    for n in needs:
        if n.live is not None:
            if n.copies != 1:
                raise PlanError(f"scratchpad: {n.tile!r} has {n.copies} copies and a live range; stream "
                                f"buffers are live for the whole program")
            offset = first_fit(placed, base, _round(n.nbytes), *n.live)
            a = Allocation(n.tile, None, offset, n.nbytes, n.row_stride, n.live)
            placed.append(a)
            high = max(high, offset + _round(n.nbytes))
    return Placement(usable, tuple(allocs + placed), high)


def _overlap_in_time(a, b) -> bool:
    if a.live is None or b.live is None:
        return True
    return not (a.live[1] < b.live[0] or b.live[1] < a.live[0])


def check_placement(what: str, allocations, usable: int) -> None:
    """Every allocation stick-aligned and inside the usable scratchpad, and no two that are
    live at the same time (live None: the whole program) sharing a byte."""
    for a in allocations:
        if a.offset % STICK or a.row_stride % STICK:
            raise PlanError(f"{what}: {a.name} at {a.offset} (row stride {a.row_stride}) is not on "
                            f"{STICK}-byte stick boundaries")
        if a.offset < 0 or a.offset + a.nbytes > usable:
            raise PlanError(f"{what}: {a.name} at [{a.offset}, {a.offset + a.nbytes}) is outside the "
                            f"usable {usable} B")
    allocs = sorted(allocations, key=lambda a: a.offset)
    for i, a in enumerate(allocs):
        for b in allocs[i + 1:]:
            if b.offset >= a.offset + a.nbytes:
                break
            if _overlap_in_time(a, b):
                raise PlanError(f"{what}: {a.name} [{a.offset}, {a.offset + a.nbytes}) and {b.name} "
                                f"[{b.offset}, {b.offset + b.nbytes}) overlap while both are live")


def check_needs(what: str, needs, placement: Placement) -> None:
    """Each need has exactly its copies, each big enough for its rows at the row stride it was
    given (recomputed by the family from the tile kernel and the tile shape, not from the
    allocator's arithmetic). A need of several rows (nbytes a multiple of row_stride) may not
    have its rows closer together than its row stride."""
    by_tile: dict[str, list] = {}
    for a in placement.allocations:
        by_tile.setdefault(a.tile, []).append(a)
    for n in needs:
        copies = by_tile.get(n.tile, [])
        want = set(range(n.copies)) if n.copies > 1 else {None}
        if {a.copy for a in copies} != want or len(copies) != len(want):
            raise PlanError(f"{what}: tile {n.tile!r} has copies {[a.copy for a in copies]}, needs "
                            f"{sorted(want, key=str)}")
        rows = n.nbytes // n.row_stride if n.row_stride else 1
        for a in copies:
            if rows > 1 and a.row_stride < n.row_stride:  # its rows would overlap each other
                raise PlanError(f"{what}: {a.name} has a row stride of {a.row_stride} B, its rows need "
                                f"{n.row_stride} B")
            # rows further apart than they need reach further: the last one starts (rows - 1) strides in
            reach = n.nbytes + (rows - 1) * (a.row_stride - n.row_stride) if rows > 1 else n.nbytes
            if a.nbytes < reach:
                raise PlanError(f"{what}: {a.name} has {a.nbytes} B, its {max(rows, 1)} row(s) at a stride of "
                                f"{a.row_stride} B need {reach} B")



Shape = TypeVar("Shape")


def shrink_to_fit(place: Callable[[Shape], Placement], shape: Shape, smaller: Callable[[Shape], Shape | None],
                  refusal: Callable[[Placement, Shape], str]) -> tuple[Placement, Shape]:
    """(placement, the shape it is for): `shape` placed, or each `smaller` shape in turn until the
    placement fits; Unsupported(refusal(placement, shape)) when `smaller` has nothing left (None)."""
    while True:
        placement = place(shape)
        if placement.fits:
            return placement, shape
        next_shape = smaller(shape)
        if next_shape is None:
            raise Unsupported(refusal(placement, shape))
        shape = next_shape

__all__ = ["Allocation", "Need", "Placement", "allocate", "check_needs", "check_placement", "first_fit",
           "shrink_to_fit"]
