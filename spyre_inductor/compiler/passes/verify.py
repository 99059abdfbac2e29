"""An independent check of a pointwise kernel's scratchpad placement, run before emission.

It recomputes what each tile needs from the tile kernel and the tile shape
(its own arithmetic, not scratchpad.py's): a constant one stick, a tile
that varies over the rows axis ``tile_rows`` rows and one that varies over
the sticks axis ``tile_cols`` elements per row, padded to whole sticks;
the streamed tiles (loaded or stored) one copy per stream buffer, the
others one. Then the shared checks (allocate.py): every tile has exactly
its copies, each big enough for its rows (``check_needs``), and every
allocation is stick-aligned, inside the usable scratchpad (the hardware's,
not only the planner's own figure for it) and shares no byte with another
one live at the same time (``check_placement``). A violation is a planner
bug: it raises PlanError naming the buffers, never emits a program that
would corrupt data.
"""

from __future__ import annotations

from spyre_runtime.hardware import HARDWARE
from spyre_runtime.program.operands import ITEMSIZE, STICK

from ..errors import PlanError
from .allocate import Need, Placement, check_needs, check_placement  # noqa: F401 - check_placement: the reductions' import
from .fusion import ROWS, STICKS
from .tiles import Role, TileKernel
from .tiling import TilePlan


def _needs(tile_kernel: TileKernel, tiling: TilePlan) -> list[Need]:
    out = []
    for t in tile_kernel.tiles:
        rows = tiling.tile_rows if ROWS in t.space else 1
        cols = tiling.tile_cols if STICKS in t.space else 1
        row = -(-cols * ITEMSIZE[t.dtype] // STICK) * STICK
        copies = tiling.buffers if t.role in (Role.INPUT, Role.OUTPUT) else 1
        out.append(Need(t.name, rows * row, row, copies))
    return out


def verify(tile_kernel: TileKernel, tiling: TilePlan, placement: Placement) -> None:
    tile_kernel.check()
    what = "scratchpad plan"
    check_needs(what, _needs(tile_kernel, tiling), placement)
    names = {t.name for t in tile_kernel.tiles}
    stray = [a.name for a in placement.allocations if a.tile not in names]
    if stray:
        raise PlanError(f"{what}: allocations {stray} are for no tile of the kernel")
    check_placement(what, placement.allocations, min(placement.usable, HARDWARE.scratchpad_usable_bytes))


__all__ = ["check_placement", "verify"]
