"""Reduction planning end to end: mode, tile shape, buffers and core division, chosen by the timing model.

``plan(kernel)`` returns the kernel's ``Plans`` (family "reduction": the
tile kernel, the stages "lowering" and "plan", the scratchpad placement
and the division with the candidates it compared) and its validated
program. Candidates (core/search.py's search: each variant at the most cores,
then the best from the most cores down; search.choose keeps the fastest,
fewer cores winning ties):

* outer split: the outer elements are divided over cores along the outer
  dim with the most units (granule one row, or a stick of elements when
  the loads are transposed, so no two cores move one stick); per core the
  rows are "resident" if a group of them fits with every tile, else
  "chunked" along the reduced dim (multi-pass when a reduction needs
  another's result); when the reduced dim is not the contiguous one, both
  in row tiles (moved transposed) and in column tiles (moved as they lie,
  reduced by folding tile rows; space.py);
* ring split, when the outer elements are too few to occupy the cores
  (fewer units than cores) and the kernel is one level of reductions with
  no full-size epilogue: the reduced dim is divided over cores and the
  partials meet over the ring.

For each: tile targets tiling.TARGETS bytes per streamed tile, 3
(streaming) or 2 (phased) buffers, and core counts 1, 2, 4, ... 32.

What planning builds: an outer split's cores run one program on their own
rows, so a candidate is timed by its first core (the largest share) as
that many cores in step (timing.estimate's replicas), a one-core program;
ring cores differ (each combines what the one before sent it), so a ring
candidate is built and timed whole. A candidate whose plan is identical to
one already timed (a tile target larger than a core's rows) reuses that
time. No candidate's program is validated: the one kept is built whole
once (or is the whole program its candidate was timed with) and validated
once.
"""

from __future__ import annotations

from dataclasses import dataclass

from spyre_runtime.hardware import HARDWARE
from spyre_runtime.program.emitter import split_evenly
from spyre_runtime.program.operands import ITEMSIZE, STICK, sticks
from spyre_runtime.program.program import Program

from ...ir.errors import Unsupported
from ...ir.kernel_ir import ReductionKernel
from ...core.division import CoreShare, candidate_counts, representative_ns, simulated_ns
from ...core.keep import validated
from ...core.layout import buffers_of
from ...core.plans import Division, Plans
from .codegen import build_reduction_program
from .lowering import ReductionLowering, lower
from .plan import ReductionPlan, fit, verify_reduction
from .space import FULL, PER_ROW
from ...core.search import Candidate, choose, reason, search
from ...core.tiling import TARGETS

FAMILY = "reduction"


@dataclass(frozen=True)
class Trial:
    """What a candidate stands for: its lowering, plan and shares, and the whole program when
    it was built whole to be timed (None: timed by a representative core)."""

    low: ReductionLowering
    plan: ReductionPlan
    split: str                       # "outer dim <d>", "reduced dim (ring)"
    shares: tuple[CoreShare, ...]
    program: Program | None


def plans_of(low: ReductionLowering, plan: ReductionPlan, division: Division, buffers) -> Plans:
    return Plans(FAMILY, tuple(buffers), low.tile_kernel, (("lowering", low), ("plan", plan)), plan.placement,
                 division)


def _widest(low, spaces=(FULL,)) -> int:
    sizes = [ITEMSIZE[t.dtype] for t in low.tile_kernel.tiles if t.space in spaces]
    return max(sizes or [4])


def _granule(low) -> int:
    sizes = [ITEMSIZE[t.dtype] for t in low.tile_kernel.tiles if t.space == FULL] or [2]
    return STICK // min(sizes)


def ring_eligible(low: ReductionLowering) -> bool:
    """One pass, at most one outer dim, no per-row loads; and either no full-space stores (a
    reduction's partials meet over the ring) or scans only (each core's slice stays resident)."""
    passes = low.passes
    per_row_loads = any(low.tile(t).space == PER_ROW for p in low.tile_kernel.phases for t, _ in p.loads)
    return (len(passes) == 1 and (not passes[0].chunk.stores or low.ring_scan)
            and len([d for d in low.outer if d > 1]) <= 1 and not per_row_loads and low.K > 1)


def outer_shares(low: ReductionLowering, cores: int, granule: int) -> tuple[str, list[CoreShare]]:
    outer, odim = low.outer, len(low.outer) - 1
    best = None
    for d in range(len(outer)):
        g = granule if (d == odim and low.outer_sticks) else 1
        units = -(-outer[d] // g)
        key = (min(units, HARDWARE.cores), d == odim)
        if best is None or key > best[0]:
            best = (key, d, g)
    _, d, g = best
    units = -(-outer[d] // g)
    shares = []
    for core, (u0, n) in enumerate(split_evenly(units, min(cores, units))):
        start = u0 * g
        count = min(n * g, outer[d] - start)
        shares.append(CoreShare(core, tuple(start if k == d else 0 for k in range(len(outer))) + (0,),
                                tuple(count if k == d else r for k, r in enumerate(outer)) + (low.K,)))
    return f"outer dim {d}", shares


def ring_shares(low: ReductionLowering, cores: int, granule: int) -> list[CoreShare]:
    units = -(-low.K // granule)
    out = []
    for core, (u0, n) in enumerate(split_evenly(units, min(cores, units))):
        k0 = u0 * granule
        out.append(CoreShare(core, tuple(0 for _ in low.outer) + (k0,), low.outer + (min(n * granule, low.K - k0),)))
    return out


def _max_units(low, granule) -> int:
    odim = len(low.outer) - 1
    return max(-(-r // (granule if (d == odim and low.outer_sticks) else 1)) for d, r in enumerate(low.outer))


def _build(kernel, low, plan, split, shares) -> Program:
    notes = (f"{plan.mode}: {plan.passes} pass(es) over device memory, groups of {plan.group} x "
             f"{plan.chunk}, {plan.buffers} buffers, {len(shares)} core(s), split {split}")
    return build_reduction_program(kernel, low, plan, tuple(shares), notes=notes)


def _lowerings(kernel, mode, errors) -> list[ReductionLowering]:
    """The kernel's lowerings in `mode`: row tiles, then column tiles where they apply."""
    out = []
    for columns in (False, True):
        try:
            out.append(lower(kernel, mode, columns=columns))
        except Unsupported as e:
            errors.append(str(e))
    return out


def _search(kernel: ReductionKernel, cores, max_cores, estimate) -> tuple[Candidate, list[Candidate]]:
    limit = min(max_cores or HARDWARE.cores, HARDWARE.cores)
    results, errors = [], []
    timed: dict[tuple, tuple[float, Program | None]] = {}
    # reduced dims that do not merge: chunked plans only (the resident lowering refuses them)
    residents = _lowerings(kernel, "resident", errors)
    base = residents[0] if residents else lower(kernel, "chunked")
    granule = _granule(base)
    odim = len(base.outer) - 1
    units = max(_max_units(low, granule) for low in residents or [base])
    counts = [cores] if cores else candidate_counts(min(units, limit))

    def consider(low, plan, split, shares, label, symmetric=True) -> Candidate:
        verify_reduction(plan, low)
        shares = tuple(shares)
        key = (low.mode, low.columns, plan.group, plan.chunk, plan.buffers, shares)
        if key not in timed:
            if estimate is None and symmetric and len(shares) > 1:
                # the cores run one program on their own rows: the first (the largest) as all of them;
                # not validated (search.py: a candidate is not kept)
                timed[key] = (representative_ns(lambda first: _build(kernel, low, plan, split, first), shares,
                                                check=False), None)
            else:
                whole = _build(kernel, low, plan, split, shares)
                timed[key] = (simulated_ns(whole, check=False) if estimate is None else estimate(whole), whole)
        ns, whole = timed[key]
        return Candidate(label, len(shares), ns, Trial(low, plan, split, shares, whole))

    def tiles(low) -> str:
        return " columns" if low.columns else ""

    def resident_at(variant, n):
        resident, target, buffers = variant
        if resident.columns:  # a group's full tile: K rows of G outer elements
            G = max(granule, target // (resident.K * _widest(resident)) // granule * granule)
        else:
            row = sticks(resident.K * _widest(resident))
            G = max(1, target // row)
            if resident.transposed:
                G = max(granule, G // granule * granule)
        split, shares = outer_shares(resident, n, granule)
        g = min(G, max(s.counts[odim] for s in shares))
        plan = fit(resident, g, resident.K, buffers, granule if resident.outer_sticks else 1)
        return consider(resident, plan, split, shares,
                        f"resident{tiles(resident)} {target // 1024}K/{buffers}b/{len(shares)}c")

    if residents:
        results += search([(r, t, b) for r in residents for t in TARGETS for b in (3, 2)], counts, resident_at,
                          errors)
    if not results:  # the rows do not fit: chunks along the reduced dim, multi-pass if needed
        chunkeds = _lowerings(kernel, "chunked", errors)

        def chunked_at(variant, n):
            chunked, target, buffers = variant
            kg = _granule(chunked)
            split, shares = outer_shares(chunked, n, granule)
            if chunked.columns:  # [Kc, g]: Kc rows of a stick of outer elements
                g = min(granule, max(s.counts[odim] for s in shares))
                kc = max(1, target // sticks(g * _widest(chunked)))
                plan = fit(chunked, g, min(kc, chunked.K), buffers, granule)
            else:
                g = min(granule if chunked.transposed else 4, max(s.counts[odim] for s in shares))
                kc = max(kg, target // (g * _widest(chunked)) // kg * kg)
                plan = fit(chunked, g, min(kc, -(-chunked.K // kg) * kg), buffers, kg)
            return consider(chunked, plan, split, shares,
                            f"chunked{tiles(chunked)} {target // 1024}K/{buffers}b/{len(shares)}c")

        results += search([(c, t, b) for c in chunkeds for t in TARGETS for b in (3, 2)], counts, chunked_at,
                          errors)
    try:
        ring = lower(kernel, "ring")
    except Unsupported as e:  # scans next to reductions: their prefix does not split over cores
        ring = None
        errors.append(str(e))
    if (ring is not None and ring_eligible(ring) and units < limit and ring.outer[-1] * STICK <= 256 * 1024
            and (cores or 2) > 1):
        # too few outer elements for the cores: the reduced dim over cores, partials over the ring
        kg = _granule(ring)
        outer_n = ring.outer[-1]
        ring_counts = [cores] if cores else [c for c in (2, 4, 8, 16, 32) if c <= limit]

        def ring_at(variant, n):
            target, buffers = variant
            shares = ring_shares(ring, n, kg)
            if len(shares) < 2:
                return None
            per = max(s.counts[-1] for s in shares)
            kc = max(kg, target // (outer_n * _widest(ring)) // kg * kg)
            if ring.ring_scan:  # a scan's slice stays resident: one tile of the whole slice
                kc, buffers = -(-per // kg) * kg, 1
            plan = fit(ring, outer_n, min(kc, -(-per // kg) * kg), buffers, kg)
            if plan.group < outer_n or (ring.ring_scan and plan.chunk < per):
                return None
            label = "resident slices" if ring.ring_scan else f"{target // 1024}K/{buffers}b"
            return consider(ring, plan, "reduced dim (ring)", shares, f"ring {label}/{len(shares)}c",
                            symmetric=False)

        variants = [(t, b) for t in TARGETS for b in (3, 2)]
        # a scan's ring plan has one shape (the slice resident, one buffer): time it once per count
        results += search(variants[:1] if ring.ring_scan else variants, ring_counts, ring_at, errors)
    if not results:
        raise Unsupported(f"kernel {kernel.name!r}: no reduction plan fits: {'; '.join(errors[:3])}")
    return choose(results), results


def _plan(kernel: ReductionKernel, cores, max_cores, estimate) -> tuple[Trial, Division, Program]:
    """The chosen candidate, its division and its whole program (not validated)."""
    if estimate is simulated_ns:
        estimate = None
    chosen, results = _search(kernel, cores, max_cores, estimate)
    t = chosen.plan
    program = t.program if t.program is not None else _build(kernel, t.low, t.plan, t.split, t.shares)
    division = Division(len(t.shares), t.split, tuple((r.label, r.ns) for r in results), reason(chosen, results),
                        t.shares)
    return t, division, program


def plan(kernel: ReductionKernel, *, cores: int | None = None, max_cores: int | None = None,
         estimate=None) -> tuple[Plans, Program]:
    """The fastest (by the timing model, or by `estimate` of whole programs) verified reduction
    plan of `kernel` and its program, validated once (Unsupported if it does not validate)."""
    t, division, program = _plan(kernel, cores, max_cores, estimate)
    program = validated(kernel, program)  # (a symbolic kernel's program declares its sizes there)
    return plans_of(t.low, t.plan, division, buffers_of(kernel)), program


__all__ = ["FAMILY", "Trial", "outer_shares", "plan", "plans_of",
           "ring_eligible", "ring_shares"]
