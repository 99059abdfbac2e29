"""Scratchpad planning: a stick-aligned byte range and a live range for every tile.

One plan serves every core (each core runs the same tile shapes; a core
whose share is smaller uses its buffers partly). Within the usable
scratchpad (2 MiB minus the reserve for program and debug state,
hardware.scratchpad_usable_bytes):

* constants: one stick each, filled once, live for the whole program;
* streamed tiles (loaded or stored): BUFFERS copies, live for the whole
  program: the load/store unit fills one while the sfp computes on another,
  and with three the store of tile t and the load of tile t + 2 are in
  flight together (reads and writes interleave on the bus: the streaming
  plan of the calibration kernels, spyre_runtime.program.emitter.pipeline);
* work tiles: one copy, live from the sfp step that writes them to the last
  step that reads them; a later work tile reuses the bytes of dead ones
  (first fit, in step order).

Live ranges are in sfp steps of one tile's computation; ``None`` means
the whole program. If the tiles do not fit, the tile is shrunk (fewer rows,
then shorter chunks) and planned again.
"""

from __future__ import annotations

from dataclasses import dataclass

from spyre_runtime.hardware import HARDWARE
from spyre_runtime.program.operands import ITEMSIZE, STICK, sticks

from ..errors import Unsupported
from ._dump import Describable
from .fusion import FusionPlan, TileValue
from .tiling import TilePlan

BUFFERS = 3
# The backend plans both and keeps the faster: three buffers stream (reads and
# writes interleave on the bus, paying the turnaround), two make the load of
# tile t + 2 wait for the store of tile t, so with every core in step the bus
# sees read phases and write phases (the pure-stream rate), at the price of
# less overlap on one core.
BUFFER_CHOICES = (3, 2)


@dataclass(frozen=True)
class Allocation:
    tile: str
    buffer: int | None        # 0, 1, ... for streamed tiles, None for single copies
    offset: int
    nbytes: int
    row_stride: int
    live: tuple[int, int] | None  # [first, last] sfp step, None: the whole program

    @property
    def name(self) -> str:
        return self.tile if self.buffer is None else f"{self.tile}[{self.buffer}]"


@dataclass(frozen=True)
class ScratchpadPlan(Describable):
    usable: int
    tiling: TilePlan          # the tile shape the plan is for (possibly shrunk)
    buffers: int              # copies of each streamed tile
    allocations: tuple[Allocation, ...]
    high_water: int

    def at(self, tile: str, buffer: int | None = None) -> Allocation:
        for a in self.allocations:
            if a.tile == tile and (a.buffer == buffer or a.buffer is None):
                return a
        raise KeyError(f"no allocation for tile {tile!r} buffer {buffer}")


def first_fit(placed, base: int, nbytes: int, first: int, last: int) -> int:
    """The lowest offset from `base` where `nbytes` fit between the allocations of `placed`
    that are live at some step of [first, last] (the bytes of dead ones are reused)."""
    busy = sorted((a.offset, a.offset + a.nbytes) for a in placed if not (a.live[1] < first or last < a.live[0]))
    offset = base
    for lo, hi in busy:
        if offset + nbytes <= lo:
            break
        offset = max(offset, hi)
    return offset


def tile_geometry(t: TileValue, tiling: TilePlan) -> tuple[int, int]:
    """(stored rows, row stride in bytes) of a tile of `t` at the plan's tile shape."""
    rows = 1 if t.broadcast in ("rows", "scalar") else tiling.tile_rows
    cols = 1 if t.broadcast in ("cols", "scalar") else tiling.tile_cols
    return rows, sticks(cols * ITEMSIZE[t.dtype])


def _layout(fusion: FusionPlan, tiling: TilePlan, usable: int, buffers: int) -> ScratchpadPlan:
    allocs, top = [], 0
    for t in fusion.tiles:
        if t.kind == "const":
            allocs.append(Allocation(t.name, None, top, STICK, STICK, None))
            top += STICK
    for t in fusion.tiles:
        if t.streamed:
            rows, stride = tile_geometry(t, tiling)
            for b in range(buffers):
                allocs.append(Allocation(t.name, b, top, rows * stride, stride, None))
                top += rows * stride
    base, high = top, top
    placed: list[Allocation] = []
    for name, first, last in fusion.live:
        rows, stride = tile_geometry(fusion.tile(name), tiling)
        size = rows * stride
        offset = first_fit(placed, base, size, first, last)
        a = Allocation(name, None, offset, size, stride, (first, last))
        placed.append(a)
        high = max(high, offset + size)
    return ScratchpadPlan(usable, tiling, buffers, tuple(allocs + placed), high)


def plan_scratchpad(fusion: FusionPlan, tiling: TilePlan, usable: int | None = None,
                    buffers: int = BUFFERS) -> ScratchpadPlan:
    usable = HARDWARE.scratchpad_usable_bytes if usable is None else usable
    current = tiling
    while True:
        plan = _layout(fusion, current, usable, buffers)
        if plan.high_water <= usable:
            return plan
        smaller = current.shrunk()
        if smaller is None:
            raise Unsupported(f"the kernel's {len(fusion.tiles)} tiles need {plan.high_water} B of scratchpad "
                              f"even at one stick per tile; {usable} B are usable")
        current = smaller
