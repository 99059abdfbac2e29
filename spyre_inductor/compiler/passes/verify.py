"""An independent check of the final scratchpad plan, run before emission.

It recomputes what each tile needs from the fusion plan and the tile shape
(not from the planner's arithmetic) and checks: every tile has its copies
(one per stream buffer for streamed tiles), each is stick-aligned, big enough and inside the
usable scratchpad, and no two allocations that are live at the same time
share a byte. A violation is a planner bug: it raises PlanError naming the
buffers, never emits a program that would corrupt data.
"""

from __future__ import annotations

from spyre_runtime.hardware import HARDWARE
from spyre_runtime.program.operands import ITEMSIZE, STICK, sticks

from ..errors import PlanError
from .fusion import FusionPlan
from .scratchpad import ScratchpadPlan


def _geometry(tile, tiling) -> tuple[int, int]:
    """(stored rows, bytes of one row) a tile needs, from the fusion plan and tile shape alone."""
    bcast = tile.broadcast
    rows = 1 if bcast in ("rows", "scalar") or tile.kind == "const" else tiling.tile_rows
    cols = 1 if bcast in ("cols", "scalar") or tile.kind == "const" else tiling.tile_cols
    return rows, sticks(cols * ITEMSIZE[tile.dtype])


def _overlap_in_time(a, b) -> bool:
    if a.live is None or b.live is None:
        return True
    return not (a.live[1] < b.live[0] or b.live[1] < a.live[0])


def verify(plan: ScratchpadPlan, fusion: FusionPlan) -> None:
    tiling = plan.tiling
    by_tile: dict[str, list] = {}
    for a in plan.allocations:
        by_tile.setdefault(a.tile, []).append(a)
    for t in fusion.tiles:
        copies = by_tile.get(t.name, [])
        want = set(range(plan.buffers)) if t.streamed else {None}
        if {a.buffer for a in copies} != want or len(copies) != len(want):
            raise PlanError(f"scratchpad plan: tile {t.name!r} has copies {[a.buffer for a in copies]}, "
                            f"needs {sorted(want, key=str)}")
        rows, row = _geometry(t, tiling)
        for a in copies:
            if a.row_stride < row and rows > 1:  # its rows would overlap each other
                raise PlanError(f"scratchpad plan: {a.name} has a row stride of {a.row_stride} B, its rows "
                                f"need {row} B")
            if a.nbytes < rows * max(row, a.row_stride if rows > 1 else row):
                raise PlanError(f"scratchpad plan: {a.name} has {a.nbytes} B, its {rows} row(s) of "
                                f"{max(row, a.row_stride)} B need more")
    # The hardware's bound, not only the planner's own figure for it.
    check_placement("scratchpad plan", plan.allocations, min(plan.usable, HARDWARE.scratchpad_usable_bytes))


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
