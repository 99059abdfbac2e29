"""Scratchpad planning (pointwise): what each tile needs, placed by the shared allocator.

One plan serves every core (each core runs the same tile shapes; a core
whose share is smaller uses its buffers partly). What a tile of the
pointwise tile kernel (fusion.py) needs at a tile shape (``needs``):

* CONSTANT tiles: one stick each, filled once, live for the whole program;
* streamed tiles (INPUT and OUTPUT, fusion.streamed): ``tiling.buffers``
  copies, live for the whole program: the load/store unit fills one while
  the sfp computes on another (tiling.py);
* TEMPORARY tiles: one copy, live from the sfp step that writes them to
  the last step that reads them (tiles.live_ranges over the chunk phase's
  steps); a later one reuses the bytes of dead ones;
* STAGING tiles (a transposed access, fusion.py): the tile they serve
  with its axes swapped, ``tile_cols`` rows of ``tile_rows`` elements;
  one copy, live for the whole program: only the load/store unit touches
  it, and it finishes one transpose before it moves the next tile's bytes.

A tile stores one row unless it varies over the rows axis, and one
element per row unless it varies over the sticks axis; each row is padded
to whole sticks. ``allocate.allocate`` places the needs in the usable
scratchpad (2 MiB minus the reserve for program and debug state,
hardware.scratchpad_usable_bytes): pinned needs first in the order given
(constants, then the streamed tiles), then the live-ranged ones, first fit.
If they do not fit, the tile is shrunk (fewer rows, then shorter chunks)
and planned again.
"""

from __future__ import annotations

from spyre_runtime.hardware import HARDWARE

from .allocate import Need, Placement, allocate, shrink_to_fit
from .fusion import ROWS, STICKS, streamed
from .tiles import PhaseKind, Role, Tile, TileKernel, live_ranges, tile_geometry
from .tiling import TilePlan


def needs(tile_kernel: TileKernel, tiling: TilePlan) -> tuple[Need, ...]:
    """Constants, then streamed tiles (``tiling.buffers`` copies each), then temporaries with
    their live ranges in the chunk phase's steps: the order they are placed in."""
    live = live_ranges(tile_kernel.phase(PhaseKind.CHUNK).steps)
    extent = {ROWS: tiling.tile_rows, STICKS: tiling.tile_cols}

    def need(t: Tile, copies: int = 1, span=None) -> Need:
        rows, stride = tile_geometry(t, ROWS, STICKS, extent)
        return Need(t.name, rows * stride, stride, copies, span)

    out = [need(t) for t in tile_kernel.tiles if t.role is Role.CONSTANT]
    out += [need(t, tiling.buffers) for t in tile_kernel.tiles if streamed(t)]
    out += [need(t) for t in tile_kernel.tiles if t.role is Role.STAGING]
    out += [need(t, span=live[t.name]) for t in tile_kernel.tiles if t.role is Role.TEMPORARY and t.name in live]
    return tuple(out)


def plan_scratchpad(tile_kernel: TileKernel, tiling: TilePlan, usable: int | None = None,
                    buffers: int | None = None) -> tuple[Placement, TilePlan]:
    """(placement, the tile shape it is for): `tiling` itself, or shrunk until the tiles fit.
    `buffers` overrides tiling.buffers (the returned tile shape carries it)."""
    usable = HARDWARE.scratchpad_usable_bytes if usable is None else usable
    return shrink_to_fit(lambda current: allocate(needs(tile_kernel, current), usable),
                         tiling if buffers is None else tiling.with_buffers(buffers), TilePlan.shrunk,
                         lambda placement, _: f"the kernel's {len(tile_kernel.tiles)} tiles need "
                                              f"{placement.high_water} B of scratchpad even at one stick per "
                                              f"tile; {usable} B are usable")


__all__ = ["needs", "plan_scratchpad"]
