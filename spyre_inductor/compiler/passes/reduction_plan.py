"""Reduction planning: group and chunk shape, scratchpad allocations with live ranges, and their verifier.

A *group* is G consecutive elements of the innermost outer dim; a *chunk*
is Kc elements of the reduced dim (Kc = K when the rows are resident).
Tile bytes by space (reduction_lowering.py): F [G, Kc] rows padded to
whole sticks, O [G, 1] one stick per row, R [1, Kc], S one stick; a
transposed F access also needs a [Kc, G] staging tile, a gathered one a
[Kc, 1] column (one stick per element), and an O store a
[1, G] row (the column of results is transposed on chip, so the store moves
whole packed sticks, not one stick per element).

Live ranges: streamed tiles (F and chunked R loads, F outputs, and in the
resident mode the per-group O loads and outputs) have ``buffers`` copies,
live for the whole program: the load/store unit fills one while the sfp
computes on another. Accumulators and every other O tile are pinned for
the whole program (a group's reduction results must survive its passes).
F work tiles live from the step that writes them to the last step that
reads them, numbered over all passes, so a later work tile reuses the
bytes of dead ones (first fit).

``verify_reduction`` recomputes each tile's size from the lowering and the
shape (not from the allocator's arithmetic) and checks stick alignment,
bounds, copies and that no two live allocations share a byte.
"""

from __future__ import annotations

from dataclasses import dataclass

from spyre_runtime.hardware import HARDWARE
from spyre_runtime.program.operands import ITEMSIZE, STICK, sticks

from ..errors import PlanError, Unsupported
from ._dump import Describable
from .reduction_lowering import ReductionLowering
from .scratchpad import first_fit
from .verify import check_placement

CHUNK_CONSTS = ("@n", "@inv_n", "@n_i")


@dataclass(frozen=True)
class RAllocation:
    tile: str
    copy: int | None          # stream buffer, None for one copy
    offset: int
    nbytes: int
    row_stride: int
    live: tuple[int, int] | None

    @property
    def name(self) -> str:
        return self.tile if self.copy is None else f"{self.tile}[{self.copy}]"


@dataclass(frozen=True)
class ReductionPlan(Describable):
    mode: str                 # resident, chunked, ring
    group: int                # G: outer elements per tile
    chunk: int                # Kc: reduced elements per tile
    buffers: int
    passes: int               # passes over the rows in device memory (1: read once)
    pass_reasons: tuple[str, ...]
    usable: int
    allocations: tuple[RAllocation, ...]
    high_water: int

    def at(self, tile: str, copy: int | None = None) -> RAllocation:
        for a in self.allocations:
            if a.tile == tile and (a.copy == copy or a.copy is None):
                return a
        raise KeyError(f"no allocation for {tile!r} copy {copy}")


def streamed(low: ReductionLowering, name: str) -> bool:
    t = low.tile(name)
    if t.space in ("F", "R") and t.role in ("load", "out"):
        return not (t.space == "R" and low.mode == "resident")
    if low.mode == "resident" and t.space == "O" and t.role in ("load", "out"):
        return True
    return False


def needs(low: ReductionLowering, G: int, Kc: int) -> list[tuple[str, int, int, bool, bool]]:
    """(name, bytes, row stride, streamed, work-F) for every tile, staging and transposed rows included."""
    out = []
    tr_loads = {t for t, a in low.passes[0].loads if a.transposed}
    for p in low.passes:
        tr_loads |= {t for t, a in p.loads + p.stores if a.transposed}
    gathered = {t for p in low.passes for t, a in p.loads + p.stores if a.gathered} | {
        t for t, a in low.once_loads if a.gathered}
    for t in low.tiles:
        isz = ITEMSIZE[t.dtype]
        s = streamed(low, t.name)
        if t.space == "F":
            row = sticks(Kc * isz)
            out.append((t.name, G * row, row, s, t.role == "work"))
            if t.name in tr_loads:
                srow = sticks(G * isz)
                out.append((f"{t.name}^T", Kc * srow, srow, s, False))
            if t.name in gathered:
                out.append((f"{t.name}^col", Kc * STICK, STICK, s, False))
        elif t.space == "O":
            out.append((t.name, G * STICK, STICK, s, False))
            if t.role == "out" or (t.role == "load" and _o_load_row(low, t.name)):
                out.append((f"{t.name}^row", sticks(G * isz), sticks(G * isz), s, False))
        elif t.space == "R":
            out.append((t.name, sticks(Kc * isz), sticks(Kc * isz), s, False))
            if t.name in gathered:
                out.append((f"{t.name}^col", Kc * STICK, STICK, s, False))
        else:
            out.append((t.name, STICK, STICK, False, False))
    if low.mode == "ring":
        for a in low.accumulators:
            out.append((f"in:{a}", G * STICK if low.tile(a).space == "O" else STICK, STICK, False, False))
    if low.mode != "resident":
        for c in CHUNK_CONSTS:
            for size in ("full", "rem"):
                out.append((f"{c}#{size}", STICK, STICK, False, False))
    return out


def _o_load_row(low, name) -> bool:
    """An O load along a contiguous o is loaded as a row and transposed to its column."""
    for t, a in low.group_loads:
        if t == name:
            return bool(a.outer_strides) and a.outer_strides[-1] == 1
    return False


def work_live(low: ReductionLowering) -> dict[str, tuple[int, int]]:
    """F work tiles: [first, last] step over the passes' chunk steps (numbered across passes)."""
    first, last, k = {}, {}, 0
    for steps in [p.steps for p in low.passes] + [low.after_ring]:
        for st in steps:
            for a in st.args:
                if a in first:
                    last[a] = k
            first.setdefault(st.dst, k)
            last[st.dst] = max(last.get(st.dst, k), k)
            k += 1
    return {n: (first[n], last[n]) for n in first if low.tile(n).space == "F" and low.tile(n).role == "work"}


def allocate(low: ReductionLowering, G: int, Kc: int, buffers: int, usable: int | None = None) -> ReductionPlan:
    usable = HARDWARE.scratchpad_usable_bytes if usable is None else usable
    allocs, top = [], 0
    tiles = needs(low, G, Kc)
    for name, nbytes, stride, s, work in tiles:
        if work:
            continue
        for c in (range(buffers) if s else (None,)):
            allocs.append(RAllocation(name, c, top, nbytes, stride, None))
            top += nbytes
    live = work_live(low)
    base, high, placed = top, top, []
    for name, nbytes, stride, s, work in tiles:
        if not work:
            continue
        first, last = live.get(name, (0, 0))
        offset = first_fit(placed, base, nbytes, first, last)
        a = RAllocation(name, None, offset, nbytes, stride, (first, last))
        placed.append(a)
        high = max(high, offset + nbytes)
    reasons = tuple(f"pass {p.index}: {p.reason}" for p in low.passes)
    return ReductionPlan(low.mode, G, Kc, buffers, 1 if low.mode == "resident" else len(low.passes), reasons,
                         usable, tuple(allocs + placed), high)


def fit(low: ReductionLowering, G: int, Kc: int, buffers: int, granule: int) -> ReductionPlan:
    """The plan at (G, Kc), G halved (then Kc, for chunked plans) until it fits."""
    while True:
        plan = allocate(low, G, Kc, buffers)
        if plan.high_water <= plan.usable:
            return plan
        if G > 1:
            G = max(1, G // 2) if G <= granule or G // 2 < granule else G // 2 // granule * granule or 1
        elif low.mode != "resident" and Kc > granule:
            Kc = max(granule, (Kc // 2) // granule * granule)
        else:
            raise Unsupported(f"{low.mode} reduction tiles need {plan.high_water} B of scratchpad at G={G}, "
                              f"Kc={Kc}; {plan.usable} B are usable")


def verify_reduction(plan: ReductionPlan, low: ReductionLowering) -> None:
    """Independent check (see the module docstring): raises PlanError naming the allocations."""
    by: dict[str, list] = {}
    for a in plan.allocations:
        by.setdefault(a.tile, []).append(a)
    G, Kc = plan.group, plan.chunk
    for t in low.tiles:
        isz = ITEMSIZE[t.dtype]
        want = {"F": G * sticks(Kc * isz), "O": G * STICK, "R": sticks(Kc * isz), "S": STICK}[t.space]
        copies = by.get(t.name, [])
        expect = set(range(plan.buffers)) if streamed(low, t.name) else {None}
        if {a.copy for a in copies} != expect:
            raise PlanError(f"reduction plan: tile {t.name!r} has copies {[a.copy for a in copies]}, "
                            f"needs {sorted(expect, key=str)}")
        for a in copies:
            if a.nbytes < want:
                raise PlanError(f"reduction plan: {a.name} has {a.nbytes} B, its tile needs {want} B")
    if low.mode == "ring":
        for acc in low.accumulators:
            if f"in:{acc}" not in by:
                raise PlanError(f"reduction plan: accumulator {acc!r} has no ring landing tile")
    check_placement("reduction plan", plan.allocations, min(plan.usable, HARDWARE.scratchpad_usable_bytes))
