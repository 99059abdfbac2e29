"""Reduction planning: group and chunk shape, what each tile needs in scratchpad, and their verifier.

A *group* is G consecutive elements of the innermost outer dim; a *chunk*
is Kc elements of the reduced dim (Kc = K when the rows are resident).
Tile bytes by space (space.py): full [G, Kc] rows padded to
whole sticks, per-row [G, 1] one stick per row, along-reduced [1, Kc], a
scalar one stick; by relayout for a STAGING tile: a transposed move's
[Kc, G], a gathered one's [Kc, 1] column (one stick per element), a
per-row value's packed [1, G] row (the column of results is transposed on
chip, so the store moves whole packed sticks, not one stick per element).
A RING_LANDING tile is the size of the accumulator it lands; a
CHUNK_CONSTANT tile has two copies, one for the full chunk's extent and
one for the remainder's. Column tiles (space.py) turn the
shapes round: full [Kc, G] (Kc rows of G outer elements padded to whole
sticks), per-row one packed row [1, G], along-reduced a [Kc, 1] column (one
stick per row); a SCRATCH tile, where a reduction folds a full tile's rows,
is [ceil(Kc / 2), G], pinned for the whole program like the accumulators.

Live ranges (core/allocate.py): tiles moved in a chunk phase (full-space loads
and outputs, chunked along-reduced loads, and in the resident mode the
per-group per-row loads and outputs) and their staging tiles have
``buffers`` copies, live for the whole program: the load/store unit fills
one while the sfp computes on another. Accumulators, carries and every
other per-row tile are pinned for the whole program (a group's results must
survive its passes). Full-space temporaries live from the step that writes
them to the last step that reads them, numbered over the chunk and epilogue
phases (the only ones with full-space work), so a later temporary reuses
the bytes of dead ones (first fit).

``verify_reduction`` recomputes each tile's need from the tile kernel and
the shape (not from the allocator's arithmetic) and checks copies, sizes,
stick alignment, bounds, that every ring accumulator has its landing tile,
and that no two live allocations share a byte.
"""

from __future__ import annotations

from dataclasses import dataclass

from spyre_runtime.hardware import HARDWARE
from spyre_runtime.program.operands import ITEMSIZE, sticks

from ...ir.errors import PlanError
from ...core._dump import Describable, plain
from ...core.allocate import Need, Placement, allocate, check_needs, check_placement, shrink_to_fit
from .lowering import ReductionLowering
from .space import AXES, COLUMN_AXES, FULL, OUTER, REDUCED
from ...core.tiles import ChunkValue, PhaseKind, Role, Tile, tile_geometry

CHUNK_COPIES = ("full", "remainder")  # a CHUNK_CONSTANT's copies, by index


@dataclass(frozen=True)
class ReductionPlan(Describable):
    mode: str                 # resident, chunked, ring
    group: int                # G: outer elements per tile
    chunk: int                # Kc: reduced elements per tile
    buffers: int
    passes: int               # passes over the rows in device memory (1: read once)
    pass_reasons: tuple[str, ...]
    placement: Placement      # reported by the Plans it belongs to

    def describe(self) -> dict:
        return {k: plain(getattr(self, k)) for k in ("mode", "group", "chunk", "buffers", "passes", "pass_reasons")}

    def at(self, tile: str, copy: int | None = None):
        return self.placement.at(tile, copy)


def streamed(low: ReductionLowering, name: str) -> bool:
    return name in low.moved_per_chunk


def tile_bytes(t: Tile, G: int, Kc: int, columns: bool = False) -> tuple[int, int]:
    """(bytes, row stride) of tile `t` at group G and chunk Kc (module docstring): rows along the
    outer axis and sticks along the reduced one, or the other way round with column tiles."""
    row_axis, stick_axis = COLUMN_AXES if columns else AXES
    if columns and t.role is Role.SCRATCH:  # half a full tile's rows: the fold's first step halves them
        row = sticks(G * ITEMSIZE[t.dtype])
        return max(1, -(-Kc // 2)) * row, row
    rows, row = tile_geometry(t, row_axis, stick_axis, {OUTER: G, REDUCED: Kc})
    return rows * row, row


def work_live(low: ReductionLowering) -> dict[str, tuple[int, int]]:
    """Full-space temporaries: [first, last] step over the chunk and epilogue phases, in order."""
    first, last, k = {}, {}, 0
    for p in low.tile_kernel.phases:
        if p.kind not in (PhaseKind.CHUNK, PhaseKind.EPILOGUE):
            continue
        for st in p.steps:
            for a in st.args:
                if a in first:
                    last[a] = k
            first.setdefault(st.dst, k)
            last[st.dst] = max(last.get(st.dst, k), k)
            k += 1
    return {n: (first[n], last[n]) for n in first if _temporary(low.tile(n))}


def _temporary(t: Tile) -> bool:
    return t.role is Role.TEMPORARY and t.space == FULL


def needs(low: ReductionLowering, G: int, Kc: int, buffers: int) -> list[Need]:
    """What every tile needs, in placement order: each tile of a value with its staging tiles,
    then the ring landing tiles, then the chunk constants."""
    tk = low.tile_kernel
    live = work_live(low)

    def need(t: Tile) -> Need:
        nbytes, row = tile_bytes(t, G, Kc, low.columns)
        if _temporary(t):
            return Need(t.name, nbytes, row, live=live.get(t.name, (0, 0)))
        if t.role is Role.CHUNK_CONSTANT:
            return Need(t.name, nbytes, row, copies=len(CHUNK_COPIES))
        return Need(t.name, nbytes, row, copies=buffers if streamed(low, t.name) else 1)

    out = []
    for t in tk.tiles:
        if t.role not in (Role.STAGING, Role.RING_LANDING, Role.CHUNK_CONSTANT):
            out.append(need(t))
            out += [need(s) for s in tk.serving(t.name, Role.STAGING)]
    for acc in (tk.combine.tiles if tk.combine else ()):
        out += [need(s) for s in tk.serving(acc, Role.RING_LANDING)]
    by_value = {t.chunk_value: t for t in tk.with_role(Role.CHUNK_CONSTANT)}
    out += [need(by_value[v]) for v in ChunkValue if v in by_value]
    return out


def place(low: ReductionLowering, G: int, Kc: int, buffers: int, usable: int | None = None) -> ReductionPlan:
    usable = HARDWARE.scratchpad_usable_bytes if usable is None else usable
    return _plan(low, G, Kc, buffers, allocate(needs(low, G, Kc, buffers), usable))


def _plan(low: ReductionLowering, G: int, Kc: int, buffers: int, placement: Placement) -> ReductionPlan:
    passes = low.passes
    reasons = tuple(f"pass {k}: {p.chunk.reason}" for k, p in enumerate(passes, 1))
    return ReductionPlan(low.mode, G, Kc, buffers, 1 if low.mode == "resident" else len(passes), reasons,
                         placement)


def fit(low: ReductionLowering, G: int, Kc: int, buffers: int, granule: int) -> ReductionPlan:
    """The plan at (G, Kc), G halved (then Kc, for chunked plans) until it fits."""

    def smaller(shape: tuple[int, int]) -> tuple[int, int] | None:
        G, Kc = shape
        if G > 1:
            return (max(1, G // 2) if G <= granule or G // 2 < granule else G // 2 // granule * granule or 1), Kc
        if low.mode != "resident" and Kc > granule:
            return G, max(granule, (Kc // 2) // granule * granule)
        return None

    usable = HARDWARE.scratchpad_usable_bytes
    placement, (G, Kc) = shrink_to_fit(
        lambda shape: allocate(needs(low, *shape, buffers), usable), (G, Kc), smaller,
        lambda placement, shape: f"{low.mode} reduction tiles need {placement.high_water} B of scratchpad at "
                                 f"G={shape[0]}, Kc={shape[1]}; {placement.usable} B are usable")
    return _plan(low, G, Kc, buffers, placement)


def verify_reduction(plan: ReductionPlan, low: ReductionLowering) -> None:
    """Independent check (see the module docstring): raises PlanError naming the tile or allocations."""
    tk = low.tile_kernel
    tk.check()
    for acc in (tk.combine.tiles if tk.combine else ()):
        if not tk.serving(acc, Role.RING_LANDING):
            raise PlanError(f"reduction plan: accumulator {acc!r} has no ring landing tile")
    check_needs("reduction plan", needs(low, plan.group, plan.chunk, plan.buffers), plan.placement)
    check_placement("reduction plan", plan.placement.allocations,
                    min(plan.placement.usable, HARDWARE.scratchpad_usable_bytes))


__all__ = ["CHUNK_COPIES", "ReductionPlan", "fit", "needs", "place", "streamed", "tile_bytes", "verify_reduction",
           "work_live"]
