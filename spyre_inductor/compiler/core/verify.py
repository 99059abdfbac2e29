"""The independent verifier: every family's kept program, and the pointwise placement before emission.

``verify_program`` is the check every kept program goes through (keep.py), whatever its family:
the finished program replayed (spyre_runtime/program/hazards.py), from its own instructions and
queues and nothing the planner computed, for two tiles that share scratchpad bytes while both
are live (a race between units, a value read after part of it was overwritten, a value
overwritten before anything read it and its bytes read after, a tile read as other elements
than it was written as). Bounds, stick alignment and
queue balance are the validator's, before it (keep.py). A violation is a planner bug: PlanError
naming the kernel, core, unit, instruction and bytes, never a program that would corrupt data.

``verify`` checks a pointwise kernel's placement before emission, from the plan's side.
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
one live at the same time (``check_placement``). What this adds to the program's replay:
two tiles placed on exactly the same bytes (or one inside the other, read alike) within one
unit's order look like one tile updated there, so only the plan's live ranges tell them apart.
"""

from __future__ import annotations

from spyre_runtime.hardware import HARDWARE
from spyre_runtime.program.hazards import ScratchpadHazard, check_scratchpad
from spyre_runtime.program.operands import ITEMSIZE, STICK
from spyre_runtime.program.program import Program

from ..ir.errors import PlanError
from .allocate import Need, Placement, check_needs, check_placement
from .fusion import ROWS, STICKS
from .tiles import Relayout, Role, TileKernel, tile_geometry
from .tiling import TilePlan


def _needs(tile_kernel: TileKernel, tiling: TilePlan) -> list[Need]:
    out = []
    extent = {ROWS: tiling.tile_rows, STICKS: tiling.tile_cols}
    for t in tile_kernel.tiles:
        if t.role is Role.STAGING:
            _check_staging(tile_kernel, t, tiling)
        rows, row = tile_geometry(t, ROWS, STICKS, extent)
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


def verify_program(kernel, program: Program) -> None:
    """PlanError naming the kernel if the replay of `program` finds two live tiles on the same bytes."""
    try:
        check_scratchpad(program)
    except ScratchpadHazard as e:
        raise PlanError(f"kernel {kernel.name!r}: the planned program is wrong: {e}") from e


def verify(tile_kernel: TileKernel, tiling: TilePlan, placement: Placement) -> None:
    tile_kernel.check()
    what = "scratchpad plan"
    check_needs(what, _needs(tile_kernel, tiling), placement)
    names = {t.name for t in tile_kernel.tiles}
    stray = [a.name for a in placement.allocations if a.tile not in names]
    if stray:
        raise PlanError(f"{what}: allocations {stray} are for no tile of the kernel")
    check_placement(what, placement.allocations, min(placement.usable, HARDWARE.scratchpad_usable_bytes))


__all__ = ["verify", "verify_program"]
