"""The conv family's plan: the matmul family's grids and tilings (matmul/plan.py), k chunks of
whole runs, the A tile as wide as its runs' sticks, each candidate timed by one core's program
on the timing model (core/search.py), the kept program validated and verified once.

The plain PE plans, and where every plain grid would re-read an operand, that operand
all-gathered over the ring (A: each core gathers its slice of a tile's rows from the image, then
the slices travel core to core; B: the weight, when it is moved as it lies). No split k (a
conv's rows are many: the image's pixels).
"""

from __future__ import annotations

import dataclasses

from spyre_runtime.hardware import HARDWARE
from spyre_runtime.program.operands import ITEMSIZE, sticks

from ...core import search
from ...core.allocate import Need, allocate, check_needs, check_placement
from ...core.division import candidate_counts, representative_ns, simulated_ns
from ...core.keep import kept
from ...core.layout import buffers_of, symbols_of
from ...core.minimum import Traffic
from ...core.plans import Division, Plans
from ...ir.errors import Unsupported
from ...ir.kernel_ir import ConvKernel
from ..matmul.codegen import build_matmul_program, ring_ready
from ..matmul.plan import best_grid, grid_for, shared_variants, span_problem, tile_needs, tiling_for, variants
from ..matmul.planner import REFETCH_WORTH_SHARING, refetch
from .codegen import patch_core
from .lowering import PatchRuns, ShiftedWindow, analyse


def needs(tk, tiling, gather: PatchRuns | ShiftedWindow) -> list[Need]:
    """The matmul's needs at this tiling, the A tile's rows as wide as its runs' sticks (gathered
    runs), or as many as its band's (a shifted window: the row tile and the halo)."""
    out = []
    for need in tile_needs(tk, tiling):
        if need.tile == "a":
            if isinstance(gather, ShiftedWindow):
                row = sticks(gather.C * ITEMSIZE[gather.dtype])
                need = dataclasses.replace(need, nbytes=(tiling.tm + gather.halo) * row, row_stride=row)
            else:
                row = sticks(gather.columns(tiling.tk) * ITEMSIZE[gather.dtype])
                need = dataclasses.replace(need, nbytes=tiling.tm * row, row_stride=row)
        out.append(need)
    return out


# A shifted window's band is the row tile plus its halo (two image rows for a 3x3): taller row
# tiles read the halo fewer times, so they are tried too.
WINDOW_TARGETS = ((512, 128, 256), (256, 128, 256), (256, 64, 576))


def minimum(kernel: ConvKernel) -> Traffic:
    """The image elements some tap reads, the weight, the bias, once; the output written once."""
    N, C, H, W = kernel.image.shape
    _, _, KH, KW = kernel.weight.shape
    _, OC, OH, OW = kernel.out.shape
    (sh, sw), (dh, dw) = kernel.stride, kernel.dilation
    rows = len({oh * sh + kh * dh for oh in range(OH) for kh in range(KH)})
    cols = len({ow * sw + kw * dw for ow in range(OW) for kw in range(KW)})
    size = lambda b, n: n * ITEMSIZE[b.dtype]  # noqa: E731
    read = size(kernel.image, N * C * rows * cols) + size(kernel.weight, OC * C * KH * KW)
    if kernel.bias is not None:
        read += size(kernel.bias, OC)
    return Traffic(read, size(kernel.out, N * OC * OH * OW))


def plan_conv(kernel: ConvKernel, *, cores: int | None = None, max_cores: int | None = None, estimate=None):
    from ...core.compiled import COMPILER_VERSION, Compiled

    gather, shape, tk = analyse(kernel)
    symbols = symbols_of(kernel)
    limit = min(max_cores or HARDWARE.cores, HARDWARE.cores)
    counts = [cores] if cores else candidate_counts(limit)
    errors: list[str] = []
    seen: set = set()
    core = patch_core(gather)

    window = isinstance(gather, ShiftedWindow)

    def evaluate(variant, n):
        (tm, tn, tk_), *rest = variant
        # a k chunk is whole runs, or whole taps: the tile target rounded down to them, at least one
        # (a window's shared-B plans one tap: the ring's fills pipeline finer, 13.0 us for a
        # 64->64 3x3 on 56x56 where 4 taps took 17.2)
        unit = gather.C if window else gather.R
        k_chunk = unit if window and rest[2] else max(unit, tk_ // unit * unit)
        variant = ((tm, tn, k_chunk), *rest)
        share = variant[3]
        grid = grid_for(shape, n, variant)
        if grid is None:
            return None
        problem = span_problem(shape, grid)
        if problem is not None:
            errors.append(problem)
            return None
        tiling = tiling_for(shape, grid, variant)
        placement = allocate(needs(tk, tiling, gather), HARDWARE.scratchpad_usable_bytes)
        if not placement.fits:
            return None
        key = (grid.gb, grid.gm, grid.gn, dataclasses.replace(tiling, label=""))
        if key in seen:
            return None
        seen.add(key)

        if share:
            # the cores meet on the ring: time them all (their programs differ in who sends where)
            if not ring_ready(shape, tk, tiling, placement, grid):
                return None
            program = build_matmul_program(kernel.name, symbols, shape, tk, tiling, placement, grid, share=share,
                                           core=core)
            ns = estimate(program) if estimate is not None else simulated_ns(program, check=False)
        else:
            def one_core(blocks):
                return build_matmul_program(kernel.name, symbols, shape, tk, tiling, placement, grid, blocks=blocks,
                                            core=core)

            ns = (estimate(one_core(grid.blocks[:1])) if estimate is not None
                  else representative_ns(one_core, grid.blocks, check=False))
        label = (f"{grid.cores}c grid {grid.gb}x{grid.gm}x{grid.gn}, tiles {tiling.tm}x{tiling.tn}x{tiling.tk} "
                 f"{tiling.label}")
        return search.Candidate(label, grid.cores, ns, (grid, tiling, placement))

    plain = [v for v in variants() if v[3] is None and v[4] == 1]
    if window:
        plain += [((tm, tn, tk_), "B resident", "output", None, 1) for tm, tn, tk_ in WINDOW_TARGETS]
    results = search.search(plain, counts, evaluate, errors)
    top = max(counts)
    if top > 1 and refetch(shape, best_grid(shape, top)) > REFETCH_WORTH_SHARING:
        # Every plain grid re-reads an operand (A, the patches, once per column block, or B, the
        # weight, once per row block): the cores split the other operand's dim and all-gather
        # this one over the ring instead, A each core gathering a slice of its rows from the
        # image (not a window's band: its halo is not sent), B only when it is moved as it lies
        # (a weight laid out [KH, KW, C, OC]; the matmul shares no operand transposed on chip).
        # Timed whole: the first two tile shapes that fit, per operand.
        for share in ("b",) if window else ("a", "b"):
            found = 0
            for v in (v for v in shared_variants(shape) if v[3] == share):
                r = evaluate(v, top)
                if r is not None:
                    results.append(r)
                    found += 1
                    if found == 2:
                        break
    if not results:
        raise Unsupported(f"kernel {kernel.name!r}: no conv plan: no tiling fits the "
                          f"{HARDWARE.scratchpad_usable_bytes} B of scratchpad"
                          + (f", or {'; '.join(dict.fromkeys(errors))}" if errors else ""))
    chosen = search.choose(results)
    grid, tiling, placement = chosen.plan
    check_needs("conv scratchpad plan", needs(tk, tiling, gather), placement)
    check_placement("conv scratchpad plan", placement.allocations,
                    min(placement.usable, HARDWARE.scratchpad_usable_bytes))
    how = f"{len(gather.shifts)} shifted taps" if window else f"{len(gather.runs)} runs of {gather.R}"
    notes = (f"{COMPILER_VERSION}: conv as matmul {shape.M}x{shape.K}x{shape.N} ({how}), "
             f"tiles {tiling.tm}x{tiling.tn}x{tiling.tk} ({tiling.label}), {grid.cores} core(s)")
    program = build_matmul_program(kernel.name, symbols, shape, tk, tiling, placement, grid, notes,
                                   share=tiling.share, core=core)
    program = kept(kernel, program, minimum(kernel))
    division = Division(grid.cores, f"grid {grid.gb} batch x {grid.gm} row x {grid.gn} column block(s)"
                        + (f", {'the patches' if tiling.share == 'a' else 'the weight'} shared over the ring"
                           if tiling.share else ""),
                        tuple((r.label, r.ns) for r in results), search.reason(chosen, results), grid.blocks,
                        chosen.ns)
    plans = Plans("conv", buffers_of(kernel), tk,
                  (("window" if window else "patches", gather), ("shape", shape), ("tiling", tiling), ("grid", grid)),
                  placement, division)
    return Compiled(plans, program)


__all__ = ["minimum", "needs", "plan_conv"]
