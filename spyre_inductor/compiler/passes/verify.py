"""An independent check of a pointwise kernel's scratchpad placement, run before emission.

It recomputes what each tile needs from the tile kernel and the tile shape
(its own arithmetic, not scratchpad.py's): a constant one stick, a staging
tile its served tile with rows and columns swapped (and rows that are whole
sticks in device memory), a tile
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
from .tiles import Relayout, Role, TileKernel
from .tiling import TilePlan


def _needs(tile_kernel: TileKernel, tiling: TilePlan) -> list[Need]:
    out = []
    for t in tile_kernel.tiles:
        rows = tiling.tile_rows if ROWS in t.space else 1
        cols = tiling.tile_cols if STICKS in t.space else 1
        if t.role is Role.STAGING:
            _check_staging(tile_kernel, t, tiling)
            rows, cols = cols, rows  # the served tile, its axes swapped
        row = -(-cols * ITEMSIZE[t.dtype] // STICK) * STICK
        copies = tiling.buffers if t.role in (Role.INPUT, Role.OUTPUT) else 1
        out.append(Need(t.name, rows * row, row, copies))
    return out


def _check_staging(tile_kernel: TileKernel, t, tiling: TilePlan) -> None:
    served = tile_kernel.tile(t.of)
    if t.relayout is not Relayout.TRANSPOSED or served.role not in (Role.INPUT, Role.OUTPUT):
        raise PlanError(f"staging tile {t.name!r}: a pointwise kernel stages only transposed moves of a loaded "
                        f"or stored tile, not a {t.relayout} of {served.role} tile {served.name!r}")
    if (t.dtype, t.space) != (served.dtype, served.space) or tiling.stick_dim is None:
        raise PlanError(f"staging tile {t.name!r} is not tile {served.name!r} transposed")
    per_stick = STICK // ITEMSIZE[t.dtype]
    if tiling.tile_rows % per_stick and tiling.tile_rows != tiling.ranges[tiling.row_dim]:
        raise PlanError(f"staging tile {t.name!r}: rows of {tiling.tile_rows} {t.dtype} elements split sticks "
                        f"in device memory (a tile has whole sticks of rows, {per_stick}, or the whole row dim)")


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
