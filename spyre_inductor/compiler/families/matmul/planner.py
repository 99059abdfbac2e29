"""The matmul family end to end: lowering, tilings and grids timed by the timing model, the kept program.

Candidates (core/search.py): for each core count the grid that moves the fewest
bytes (plan.best_grid), and at it every tiling that fits
(plan.fitting: tile shapes and operand pools). A candidate is timed
by one core's program standing for all of them in step (timing.estimate's
replicas: the blocks differ only in where they start, the first is the
largest); the program kept is built for every core and validated once.

A matmul with few rows (a decode projection) also tries plans that split k
over consecutive cores (plan.split_k_variants), timed whole like the ring
plans (the cores of a chain wait on each other), next to the plain ones:
the timing model chooses.

A small kernel's ring plans (plan.SMALL_SHARED_TARGETS) take k-steps of 64 and also try A
tiles that span several of them (tiling.a_tk): a fill of a shared A waits for slices from the
far end of the chain, once per A tile. One row against a transposed weight is also planned as
dots on the sfp (family.py), and the faster of the two, timed whole, is kept.
"""

from __future__ import annotations

import dataclasses

from spyre_runtime.hardware import HARDWARE

from ...ir.errors import Unsupported
from ...ir.kernel_ir import MatmulKernel
from ...core import search
from ...core.allocate import check_needs, check_placement
from ...core.division import candidate_counts, representative_ns, simulated_ns
from ...core.layout import buffers_of, symbols_of
from .codegen import build_matmul_program, ring_ready
from .lowering import analyse, with_k_split
from ...core.keep import kept
from ...core.minimum import minimum_traffic
from .plan import (best_grid, fitting, grid_for, shared_variants, span_problem, split_k_variants, tile_needs,
                   variants)
from ...core.plans import Division, Plans


SMALL_BYTES = 16 << 20  # kernels moving at most this try two ring tile shapes per shared operand
REFETCH_WORTH_SHARING = 1.15  # a plain grid moving more than this over the minimum shares over the ring


def refetch(shape, grid) -> float:
    """Bytes a plain grid moves over the minimum (each operand read once, the output written once)."""
    from .plan import grid_bytes, make_grid

    return grid_bytes(shape, grid) / max(1, grid_bytes(shape, make_grid(shape, 1, 1, 1)))


def plan_matmul(kernel: MatmulKernel, *, cores: int | None = None, max_cores: int | None = None,
                estimate=None):
    from ...core.compiled import COMPILER_VERSION, Compiled

    shape, plain_tk = analyse(kernel)
    split_tk = None  # made when a split-k variant is first tried
    symbols = symbols_of(kernel)
    limit = min(max_cores or HARDWARE.cores, HARDWARE.cores)
    counts = [cores] if cores else candidate_counts(limit)
    errors: list[str] = []
    seen: set = set()  # variants that clip to the same tiling of the same grid are timed once

    def evaluate(variant, n):
        nonlocal split_tk
        tk = plain_tk
        if variant[4] > 1:
            split_tk = split_tk or with_k_split(plain_tk)
            tk = split_tk
        grid = grid_for(shape, n, variant)
        if grid is None:
            return None
        problem = span_problem(shape, grid)
        if problem is not None:
            errors.append(problem)
            return None
        fit = fitting(tk, shape, grid, variant)
        if fit is None:
            return None
        tiling, placement = fit
        key = (grid.gb, grid.gm, grid.gn, grid.gk, dataclasses.replace(tiling, label=""))
        if key in seen:
            return None
        seen.add(key)
        if tiling.share or grid.gk > 1:
            # the cores meet on the ring: time them all (their programs differ in who sends where)
            if tiling.share and not ring_ready(shape, tk, tiling, placement, grid):
                return None
            program = build_matmul_program(kernel.name, symbols, shape, tk, tiling, placement, grid,
                                           share=tiling.share)
            ns = estimate(program) if estimate is not None else simulated_ns(program, check=False)
        else:
            def one_core(blocks):
                return build_matmul_program(kernel.name, symbols, shape, tk, tiling, placement, grid, blocks=blocks)

            ns = (estimate(one_core(grid.blocks[:1])) if estimate is not None
                  else representative_ns(one_core, grid.blocks, check=False))
        label = (f"{grid.cores}c grid {grid.gb}x{grid.gm}x{grid.gn}" + (f"x{grid.gk}k" if grid.gk > 1 else "")
                 + f", tiles {tiling.tm}x{tiling.tn}x{tiling.tk} {tiling.label}")
        return search.Candidate(label, grid.cores, ns, (grid, tiling, placement, tk))

    top = max(counts)
    results = []
    if top > 1 and refetch(shape, best_grid(shape, top)) > REFETCH_WORTH_SHARING:
        # Every plain grid would re-read an operand: share the smaller one over the ring instead
        # (timed whole: the cores meet on the ring, so one core cannot stand for the others).
        # each is timed whole, which costs as much as the kernel is big: the first two tile
        # shapes that fit per operand shared, one for big kernels
        small = minimum_traffic(kernel).total <= SMALL_BYTES
        per_share = 2 if small else 1
        for share in ("a", "b"):
            found = 0
            for v in (v for v in shared_variants(shape, small) if v[3] == share):
                try:
                    r = evaluate(v, top)
                except Unsupported as e:  # e.g. too many instructions to unroll: the next shape
                    errors.append(str(e))
                    continue
                if r is not None:
                    results.append(r)
                    found += 1
                    if found == per_share:
                        break
        if results:  # next to the best plain tiling at the same count (one core stands for all)
            results += search.search(variants()[:3], [top], evaluate, errors)
    if not results:
        results = search.search([v for v in variants() if v[3] is None], counts, evaluate, errors)
    # Few rows: k split over chains of cores, next to the plain plans at the most cores, where
    # the plain grid leaves cores idle or re-reads an operand (what a split is for; elsewhere
    # it would only add whole-card timings to the compile).
    plain_grid = best_grid(shape, top)
    split = []
    if plain_grid.cores < top or refetch(shape, plain_grid) > REFETCH_WORTH_SHARING:
        split = search.search(split_k_variants(shape, top), [top], evaluate, errors)
    results += split
    if not results:
        raise Unsupported(f"kernel {kernel.name!r}: no matmul plan: no tiling fits the "
                          f"{HARDWARE.scratchpad_usable_bytes} B of scratchpad" +
                          (f", or {'; '.join(dict.fromkeys(errors))}" if errors else ""))
    chosen = search.choose(results)
    unsplit = [r for r in results if r not in split]
    if chosen in split and unsplit and search.close_to(min(r.ns for r in unsplit), chosen.ns):
        chosen = search.choose(unsplit)  # a tie keeps the plan without the chain
    grid, tiling, placement, tk = chosen.plan
    needs = tile_needs(tk, tiling)
    check_needs("matmul scratchpad plan", needs, placement)
    check_placement("matmul scratchpad plan", placement.allocations,
                    min(placement.usable, HARDWARE.scratchpad_usable_bytes))
    notes = (f"{COMPILER_VERSION}: matmul {shape.M}x{shape.K}x{shape.N}"
             + (f" x{shape.batches}" if shape.batch else "")
             + f", tiles {tiling.tm}x{tiling.tn}x{tiling.tk} ({tiling.label}), {grid.cores} core(s)")
    program = build_matmul_program(kernel.name, symbols, shape, tk, tiling, placement, grid, notes,
                                   share=tiling.share)
    program = kept(kernel, program)
    division = Division(grid.cores, f"grid {grid.gb} batch x {grid.gm} row x {grid.gn} column block(s)"
                        + (f", k split {grid.gk} ways (partials combined on the ring)" if grid.gk > 1 else ""),
                        tuple((r.label, r.ns) for r in results), search.reason(chosen, results), grid.blocks,
                        chosen.ns)
    plans = Plans("matmul", buffers_of(kernel), tk, (("shape", shape), ("tiling", tiling), ("grid", grid)),
                  placement, division)
    return Compiled(plans, program)


__all__ = ["plan_matmul"]
