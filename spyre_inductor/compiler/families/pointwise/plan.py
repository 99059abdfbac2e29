"""The pointwise family's planner: a kernel whole, or cut into pieces at its index masks.

Its lowering (layout, fusion: the tile kernel) and its plan variants (tile-size target x stream
buffers x, in the transposed relayout, rows per block: each a tile shape and a placement), then
the core count, all on the planner core (core/); a kernel whose index masks cut it (a cat, a
pad) is planned piece by piece into one program (pieces.py), each uncut piece by its own
family's plan (a gather's rows by the indirect family's).
"""

from __future__ import annotations

import dataclasses
import math

from spyre_runtime.hardware import HARDWARE
from spyre_runtime.program.program import Program

from ...core.bounds import check_bounds
from ...core.codegen import build_program
from ...core.compiled import COMPILER_VERSION, Compiled
from ...core.division import choose_division, chosen_ns, representative, simulated_ns
from ...core.search import TIE
from ...core.family import family
from ...core.fusion import plan_fusion
from ...core.keep import kept
from ...core.layout import TRANSPOSED_MODE, buffers_of, plan_layout, symbols_of
from ...core.minimum import union_traffic
from ...core.plans import Division, Plans
from ...core.scratchpad import plan_scratchpad
from ...core.tiles import PhaseKind
from ...core.tiling import BUFFER_CHOICES, ROW_STICKS, TARGETS, plan_tiling
from ...core.verify import verify
from ...ir.errors import PlanError, Unsupported
from ...ir.kernel_ir import IndirectKernel, Kernel
from ...symbolic.planning import program_with_sizes
from . import pieces


def _build(kernel: Kernel, fixed, division: Division, check: bool = True) -> Program:
    layout, tile_kernel, tiling, placement = fixed
    steps = tile_kernel.phase(PhaseKind.CHUNK).steps
    notes = (f"{COMPILER_VERSION}: {len(steps)} fused step(s), {layout.relayout} relayout, tiles {tiling.tile_rows}x"
             f"{tiling.tile_cols} streamed along dim {tiling.stream_dim}, {division.cores} core(s)")
    program = build_program(kernel.name, layout, tile_kernel, tiling, placement, division, notes)
    if check:  # (kept declares a symbolic kernel's sizes before it validates)
        return kept(kernel, program)
    # a candidate, only timed; the chosen program is built again and validated
    if getattr(kernel, "symbolic", None) is not None:  # (candidates are validated when timed: sizes first)
        program = program_with_sizes(program, kernel)
    return program


def _candidates(kernel, fixed, estimate):
    """(build, estimate) for timing division candidates: by one representative core
    (division.representative) unless the caller brought its own estimate."""
    build = lambda d: _build(kernel, fixed, d, check=False)  # noqa: E731 - timed only, never kept
    if estimate is not None:
        return build, estimate
    return representative(build)


def plan_pointwise(kernel: Kernel, cores, max_cores, estimate) -> Compiled:
    """A pointwise kernel whole, or (when index masks cut it: a cat, a pad) piece by piece into one
    program (pieces.py)."""
    cut = pieces.split(kernel)
    if cut is not None:
        pieces.check_independent(kernel)
    if cut is None:
        if any(pieces.cut_points(kernel)):  # cuttable, but into too many pieces to unroll
            check_bounds(kernel, f"its masks would cut it into more than {pieces.MAX_PIECES} pieces")
        else:
            check_bounds(kernel)
        return _plan_whole(kernel, cores, max_cores, estimate)
    together = _plan_cut(kernel, cut, cores, max_cores, estimate)
    parts = pieces.unmasked_part(kernel)
    if parts is None:
        return together
    # the stores no mask reaches as one piece over the whole space, uncut: fewer bytes when the
    # cut splits sticks (a prefill's v copy), but one more plan in sequence, so it is timed against
    # the cut of everything and kept only when faster (a decode step's few rows are not)
    free, masked = parts
    rest = pieces.split(masked)
    if rest is None:
        raise PlanError(f"kernel {kernel.name!r}: its masked stores no longer cut once the unmasked ones are apart")
    rest += (pieces.Piece((0,) * len(kernel.ranges), tuple(kernel.ranges), free),)
    apart = _plan_cut(kernel, rest, cores, max_cores, estimate)
    return apart if apart.plans.division.ns < together.plans.division.ns * (1 - TIE) else together


def _plan_cut(kernel: Kernel, cut, cores, max_cores, estimate) -> Compiled:
    """The pieces `cut` planned (stacked where they share a shape) into one program."""
    units = []  # (pieces, the kernel planned for them, its plan): a stacked group or one piece
    for group in _shape_groups(cut):
        for piece in group:
            check_bounds(piece.kernel)
        together = pieces.stacked(group)
        if together is not None:
            try:
                units.append((group, together, _plan_whole(together, cores, max_cores, estimate)))
                continue
            except Unsupported:
                pass  # (more tiles per tile than fit: plan them one by one)
        units += [((p,), p.kernel, _plan_whole(p.kernel, cores, max_cores, estimate)) for p in group]
    stacked = sum(len(g) for g, _, _ in units if len(g) > 1)
    notes = (f"{COMPILER_VERSION}: {len(cut)} pieces cut at the index masks ({stacked} stacked into shared "
             f"tiles), {len(units)} plan(s) run one after another")
    program = units[0][2].program if len(units) == 1 else pieces.in_sequence(
        kernel.name, symbols_of(kernel), [c.program for _, _, c in units], notes)
    program = kept(kernel, dataclasses.replace(program, notes=notes), union_traffic([k for _, k, _ in units]))
    ns = simulated_ns(program)
    largest = max(units, key=lambda u: sum(math.prod(p.counts) for p in u[0]))[2].plans
    plan = pieces.PiecesPlan(pieces.cut_points(kernel), tuple(p.starts + p.counts for p in cut),
                             tuple(c.plans.division.cores for _, _, c in units),
                             tuple(c.plans.division.ns for _, _, c in units),
                             f"the index masks are constant on each piece: each is a plain kernel; pieces of "
                             f"one shape are stacked into one plan when none writes what another reads "
                             f"(their loads shared): {[len(g) for g, _, _ in units]} piece(s) per plan")
    division = Division(max(plan.cores), f"{len(cut)} pieces in {len(units)} plan(s), each over its own cores",
                        tuple((f"plan {k}", ns_k) for k, ns_k in enumerate(plan.ns)),
                        "each plan's division chosen alone; the tile kernel shown is the largest plan's",
                        (), ns)
    plans = Plans(largest.family, buffers_of(kernel), largest.tile_kernel, (("pieces", plan),) + largest.stages,
                  largest.placement, division)
    return Compiled(plans, program)


def _shape_groups(cut) -> list[tuple]:
    """The pieces grouped by box shape, in order of their first piece."""
    groups: dict[tuple, list] = {}
    for p in cut:
        groups.setdefault(p.counts, []).append(p)
    return [tuple(g) for g in groups.values()]


def _plan_whole(kernel: Kernel, cores, max_cores, estimate) -> Compiled:
    """One uncut kernel (or piece): a gather/scatter by its family, dense work by the pointwise one."""
    if isinstance(kernel, IndirectKernel):  # a gather's or scatter's rows: the indirect family's plan
        return family("indirect").plan(kernel, cores=cores, max_cores=max_cores, estimate=estimate)
    return _plan_dense(kernel, cores, max_cores, estimate)


def _plan_dense(kernel: Kernel, cores, max_cores, estimate) -> Compiled:
    """The pointwise family: its lowering (layout, fusion: the tile kernel), its plan variants
    (tile-size target x stream buffers x, in the transposed relayout, rows per block: each a tile
    shape and a placement), then the core count."""
    layout = plan_layout(kernel)
    tile_kernel = plan_fusion(kernel, layout)
    # Tile size and buffering are chosen at the most cores the kernel may use, then the core
    # count for the chosen variant: they change the time by a few percent at any count, so
    # timing every variant at every count would multiply the planning time for nothing.
    widest = cores or max_cores or HARDWARE.cores
    best, seen = None, set()
    blocks = ROW_STICKS if layout.relayout == TRANSPOSED_MODE else ROW_STICKS[:1]
    for target, buffers, rows in ((t, b, r) for t in TARGETS for b in BUFFER_CHOICES for r in blocks):
        placement, tiling = plan_scratchpad(tile_kernel, plan_tiling(layout, tile_kernel, target, buffers, rows))
        if tiling in seen:
            continue  # the kernel is smaller than the target: same plan
        seen.add(tiling)
        verify(tile_kernel, tiling, placement)
        fixed = (layout, tile_kernel, tiling, placement)
        build, timed = _candidates(kernel, fixed, estimate)
        trial = choose_division(tiling, build, force=widest, estimate=timed)
        ns = chosen_ns(trial)
        if best is None or ns < best[0] * (1 - TIE):  # ties go to the smaller tile, planned first
            best = (ns, fixed)
    fixed = best[1]
    layout, tile_kernel, tiling, placement = fixed
    build, timed = _candidates(kernel, fixed, estimate)
    division = choose_division(tiling, build, force=cores, estimate=timed, max_cores=max_cores)
    program = _build(kernel, fixed, division)
    plans = Plans("pointwise", layout.buffers, tile_kernel, (("layout", layout), ("tiling", tiling)), placement,
                  division)
    return Compiled(plans, program)
