"""Reduction planning end to end: mode, tile shape, buffers and core division, chosen by the timing model.

Candidates, each emitted and run through ``timing.estimate`` (the fastest
wins; a candidate within division.TIE / TIE_NS of it with fewer cores wins
over it):

* outer split: the outer elements are divided over cores along the outer
  dim with the most units (granule one row, or a stick of elements when
  the loads are transposed, so no two cores move one stick); per core the
  rows are "resident" if a group of them fits with every tile, else
  "chunked" along the reduced dim (multi-pass when a reduction needs
  another's result);
* ring split, when the outer elements are too few to occupy the cores
  (fewer units than cores) and the kernel is one level of reductions with
  no full-size epilogue: the reduced dim is divided over cores and the
  partials meet over the ring.

For each: tile targets tiling.TARGETS bytes per streamed tile, 2 (phased)
or 3 (streaming) buffers, and core counts 1, 2, 4, ... 32.
"""

from __future__ import annotations

from dataclasses import dataclass

from spyre_runtime.hardware import HARDWARE
from spyre_runtime.program.emitter import split_evenly
from spyre_runtime.program.operands import ITEMSIZE, STICK, sticks

from ..errors import Unsupported
from ..kernel_ir import ReductionKernel
from ._dump import Describable
from .division import TIE, TIE_NS, candidate_counts, simulated_ns
from .reduction_codegen import RShare, build_reduction_program
from .reduction_lowering import ReductionLowering, lower
from .reduction_plan import ReductionPlan, fit, verify_reduction
from .tiling import TARGETS


@dataclass(frozen=True)
class ReductionDivision(Describable):
    mode: str
    split: str                       # "outer dim <d>", "reduced dim (ring)" or "none"
    shares: tuple[RShare, ...]
    candidates: tuple[tuple[str, float], ...]   # (description, simulated ns)
    reason: str

    @property
    def cores(self) -> int:
        return len(self.shares)


@dataclass(frozen=True)
class ReductionPlans:
    lowering: ReductionLowering
    plan: ReductionPlan
    division: ReductionDivision
    buffers_layout: tuple  # BufferLayout-like rows for launch_args

    def describe(self) -> dict:
        return {"lowering": self.lowering.describe(), "plan": self.plan.describe(),
                "division": self.division.describe()}

    @property
    def layout(self):
        return self

    @property
    def buffers(self):
        return self.buffers_layout

    def summary_context(self):
        return "reduction_summary.txt.j2", {"low": self.lowering, "plan": self.plan, "division": self.division}


def _widest(low, spaces=("F",)) -> int:
    sizes = [ITEMSIZE[t.dtype] for t in low.tiles if t.space in spaces]
    return max(sizes or [4])


def _granule(low) -> int:
    sizes = [ITEMSIZE[t.dtype] for t in low.tiles if t.space == "F"] or [2]
    return STICK // min(sizes)


def ring_eligible(low: ReductionLowering) -> bool:
    """One pass, at most one outer dim, no per-row loads; and either no F stores (a reduction's
    partials meet over the ring) or scans only (each core's slice stays resident)."""
    return (len(low.passes) == 1 and (not low.passes[0].stores or bool(low.after_ring))
            and len([d for d in low.outer if d > 1]) <= 1 and not low.group_loads and low.K > 1)


def outer_shares(low: ReductionLowering, cores: int, granule: int) -> tuple[str, list[RShare]]:
    outer, odim = low.outer, len(low.outer) - 1
    best = None
    for d in range(len(outer)):
        g = granule if (d == odim and low.transposed) else 1
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
        shares.append(RShare(core, tuple(start if k == d else 0 for k in range(len(outer))),
                             tuple(count if k == d else r for k, r in enumerate(outer)), 0, low.K))
    return f"outer dim {d}", shares


def ring_shares(low: ReductionLowering, cores: int, granule: int) -> list[RShare]:
    units = -(-low.K // granule)
    out = []
    for core, (u0, n) in enumerate(split_evenly(units, min(cores, units))):
        k0 = u0 * granule
        out.append(RShare(core, tuple(0 for _ in low.outer), low.outer, k0, min(n * granule, low.K - k0)))
    return out


def _max_units(low, granule) -> int:
    odim = len(low.outer) - 1
    return max(-(-r // (granule if (d == odim and low.transposed) else 1)) for d, r in enumerate(low.outer))


def search(variants, counts, evaluate, errors) -> None:
    """Time the candidates worth timing: each variant (tile target, buffers) at the most cores,
    then the best variant from the most cores down until a count is clearly slower than the best
    so far (time against cores falls, flattens, then rises). evaluate(variant, n) returns a
    result whose [0] is its ns, or None when it does not apply; Unsupported means it does not fit."""
    def attempt(variant, n):
        try:
            return evaluate(variant, n)
        except Unsupported as e:
            errors.append(str(e))
            return None

    top = max(counts)
    trials = [(r, v) for v in variants if (r := attempt(v, top)) is not None]
    if not trials:
        return
    first, variant = min(trials, key=lambda rv: rv[0][0])
    best_ns = first[0]
    for n in sorted((c for c in counts if c != top), reverse=True):
        r = attempt(variant, n)
        if r is None:
            continue
        best_ns = min(best_ns, r[0])
        if r[0] > max(best_ns * (1 + TIE), best_ns + TIE_NS):
            break


def plan_reduction(kernel: ReductionKernel, *, cores: int | None = None, max_cores: int | None = None,
                   estimate=simulated_ns):
    """The fastest (by the timing model) verified reduction program: (ReductionPlans, Program)."""
    limit = min(max_cores or HARDWARE.cores, HARDWARE.cores)
    results, errors = [], []
    try:
        resident = lower(kernel, "resident")
    except Unsupported as e:  # reduced dims that do not merge: chunked plans only
        resident = None
        errors.append(str(e))
    chunked = None if resident is not None else lower(kernel, "chunked")
    base = resident or chunked
    granule = _granule(base)
    odim = len(base.outer) - 1
    units = _max_units(base, granule)
    counts = [cores] if cores else candidate_counts(min(units, limit))

    def build(low, plan, split, shares):
        mode_note = (f"{plan.mode}: {plan.passes} pass(es) over device memory, groups of {plan.group} x "
                     f"{plan.chunk}, {plan.buffers} buffers, {len(shares)} core(s), split {split}")
        return build_reduction_program(kernel, low, plan, tuple(shares), notes=mode_note)

    def consider(low, plan, split, shares, label, symmetric=True):
        verify_reduction(plan, low)
        # Only timed here (the kept program is built whole and validated by the backend). Cores
        # on outer shares run the same program on their own rows: time the first, the largest,
        # as len(shares) cores in step (timing.estimate's replicas). Ring cores differ.
        if symmetric and estimate is simulated_ns and len(shares) > 1:
            ns = simulated_ns(build(low, plan, split, shares[:1]), len(shares))
        else:
            ns = estimate(build(low, plan, split, shares))
        result = (ns, len(shares), label, low, plan, split, tuple(shares))
        results.append(result)
        return result

    def resident_at(variant, n):
        target, buffers = variant
        row = sticks(resident.K * _widest(resident))
        G = max(1, target // row)
        if resident.transposed:
            G = max(granule, G // granule * granule)
        split, shares = outer_shares(resident, n, granule)
        g = min(G, max(s.counts[odim] for s in shares))
        plan = fit(resident, g, resident.K, buffers, granule if resident.transposed else 1)
        return consider(resident, plan, split, shares, f"resident {target // 1024}K/{buffers}b/{len(shares)}c")

    variants = [(t, b) for t in TARGETS for b in (3, 2)]
    if resident is not None:
        search(variants, counts, resident_at, errors)
    if not results:  # the rows do not fit: chunks along the reduced dim, multi-pass if needed
        chunked = chunked or lower(kernel, "chunked")
        kg = _granule(chunked)

        def chunked_at(variant, n):
            target, buffers = variant
            split, shares = outer_shares(chunked, n, granule)
            g = min(granule if chunked.transposed else 4, max(s.counts[odim] for s in shares))
            kc = max(kg, target // (g * _widest(chunked)) // kg * kg)
            plan = fit(chunked, g, min(kc, -(-chunked.K // kg) * kg), buffers, kg)
            return consider(chunked, plan, split, shares, f"chunked {target // 1024}K/{buffers}b/{len(shares)}c")

        search(variants, counts, chunked_at, errors)
    try:
        ring = lower(kernel, "ring")
    except Unsupported as e:  # scans next to reductions: their prefix does not split over cores
        ring = None
        errors.append(str(e))
    if ring is not None and ring_eligible(ring) and units < limit and ring.outer[-1] * STICK <= 256 * 1024 and (cores or 2) > 1:
        # too few outer elements for the cores: the reduced dim over cores, partials over the ring
        kg = _granule(ring)
        outer_n = ring.outer[-1]
        ring_counts = [cores] if cores else [c for c in (2, 4, 8, 16, 32) if c <= limit]

        def ring_at(variant, n):
            target, buffers = variant
            shares = ring_shares(ring, n, kg)
            if len(shares) < 2:
                return None
            per = max(s.kn for s in shares)
            kc = max(kg, target // (outer_n * _widest(ring)) // kg * kg)
            if ring.after_ring:  # a scan's slice stays resident: one tile of the whole slice
                kc, buffers = -(-per // kg) * kg, 1
            plan = fit(ring, outer_n, min(kc, -(-per // kg) * kg), buffers, kg)
            if plan.group < outer_n or (ring.after_ring and plan.chunk < per):
                return None
            label = "resident slices" if ring.after_ring else f"{target // 1024}K/{buffers}b"
            return consider(ring, plan, "reduced dim (ring)", shares, f"ring {label}/{len(shares)}c",
                            symmetric=False)

        # a scan's ring plan has one shape (the slice resident, one buffer): time it once per count
        search(variants[:1] if ring.after_ring else variants, ring_counts, ring_at, errors)
    if not results:
        raise Unsupported(f"kernel {kernel.name!r}: no reduction plan fits: {'; '.join(errors[:3])}")
    fastest = min(r[0] for r in results)
    ok = [r for r in results if r[0] <= max(fastest * (1 + TIE), fastest + TIE_NS)]
    ns, n, label, low, plan, split, shares = min(ok, key=lambda r: (r[1], r[0]))
    program = build(low, plan, split, shares)
    cands = tuple((r[2], r[0]) for r in results)
    division = ReductionDivision(plan.mode, split, shares, cands,
                                 f"{label}: {ns:.0f} ns, the fastest of {len(results)} candidate(s) (ties within "
                                 f"{TIE:.0%} or {TIE_NS:.0f} ns go to fewer cores)")
    return low, plan, division, program
