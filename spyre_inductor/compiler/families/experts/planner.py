"""The experts family end to end: the shape, its tilings and core counts timed by the timing model.

Candidates (core/search.py): every tiling (and row groups, when the column sticks leave cores
idle) that fits at the most cores, then the best one at fewer cores. A candidate is timed by its
first core (the widest column block, the first row group) standing for all of them in step, at
an even routing (even_routing): its program without the row tiles that routing skips, since the
timing walk would take every count read on chip at its maximum (every row in one expert).
The kept program records the kernel's minimum traffic: a, offs and out once, and the weights
of as many experts as there are rows, at most all of them (what the worst case must read; a
step whose rows chose fewer experts reads fewer, and its report can rate above 1).
"""

from __future__ import annotations

import dataclasses

from spyre_runtime.hardware import HARDWARE
from spyre_runtime.program.operands import ITEMSIZE

from ...core import search
from ...core.allocate import check_needs, check_placement
from ...core.division import candidate_counts, representative_ns
from ...core.keep import kept
from ...core.layout import buffers_of, symbols_of
from ...core.minimum import Traffic
from ...core.plans import Division, Plans
from ...core.tiles import Phase, PhaseKind, Relayout, Role, Step, Tile, TileKernel, space
from ...ir.errors import Unsupported
from ...ir.kernel_ir import GroupedMatmulKernel
from .codegen import build_experts_program
from .plan import ROW_GROUPS, ExpertsShape, analyse, core_blocks, needs, place, streamed_variants, variants


def minimum(shape: ExpertsShape) -> Traffic:
    isz, osz = ITEMSIZE[shape.dtype], ITEMSIZE[shape.out_dtype]
    read = (shape.S * shape.K * isz + min(shape.E, shape.S) * shape.K * shape.N * isz
            + shape.E * ITEMSIZE[shape.offs_dtype])
    return Traffic(read, shape.S * shape.N * osz)


def even_routing(shape: ExpertsShape) -> tuple[int, ...]:
    """Rows per expert when the rows are spread evenly (what candidates are timed at): the timing
    walk would run every counted row tile, as if every row went to one expert, and a decode
    step's two rows reach two experts, not all of them."""
    per, extra = divmod(shape.S, shape.E)
    return tuple(per + (e < extra) for e in range(shape.E))


def tile_kernel(shape: ExpertsShape) -> TileKernel:
    """What the program does per row tile, for a person (the family's codegen emits it)."""
    t = lambda name, dtype, sp, role, **kw: Tile(name, dtype, space(*sp), role, **kw)  # noqa: E731
    tiles = [t("a", shape.dtype, ("rows", "k"), Role.INPUT), t("w", shape.dtype, ("k", "n"), Role.INPUT),
             t("index", "int32", ("rows",), Role.TEMPORARY), t("acc", "fp32", ("rows", "n"), Role.ACCUMULATOR),
             t("o", shape.out_dtype, ("rows", "n"), Role.OUTPUT)]
    if shape.transposed:
        tiles.append(t("w_rows", shape.dtype, ("k", "n"), Role.STAGING, of="w", relayout=Relayout.TRANSPOSED))
    notes = (f"out[{shape.S}, {shape.N}] = a[{shape.S}, {shape.K}] @ w[g(s)] over {shape.E} experts, "
             "g(s) = #{e : offs[e] <= s}; rows from offs[-1] on are zeros",
             "offs is read on chip: each expert's row tiles run in loops counted there (an expert with no "
             "rows loads no weights)",
             "the rows are gathered and the outputs scattered by their indices; a tile's rows past its expert's "
             "last repeat that row")
    return TileKernel("experts", ("rows", "n", "k"), tuple(tiles), (),
                      (Phase(PhaseKind.CHUNK, (Step("matmul", "matmul", "acc", ("a", "w")),),
                             (("a", "a"), ("w", "w")), (), "one row tile of one expert"),
                       Phase(PhaseKind.EPILOGUE, (Step("unary", "copy", "o", ("acc",)),), (), (("o", "out"),),
                             "once per row tile")), None, notes)


def plan_experts(kernel: GroupedMatmulKernel, *, cores: int | None = None, max_cores: int | None = None,
                 estimate=None):
    from ...core.compiled import COMPILER_VERSION, Compiled

    shape = analyse(kernel)
    symbols = symbols_of(kernel)
    limit = min(max_cores or HARDWARE.cores, HARDWARE.cores)
    units = -(-shape.N // shape.granule)
    counts = [cores] if cores else candidate_counts(min(limit, units * max(ROW_GROUPS)))
    errors: list[str] = []

    def evaluate(variant, n):
        tiling, groups = variant
        if n % groups or groups > tiling.tiles:
            return None
        blocks = core_blocks(shape, n, groups)
        tiling_n = tiling if tiling.cols <= blocks[0].n else dataclasses.replace(tiling, cols=blocks[0].n)
        placement = place(shape, tiling_n)
        if placement is None:
            return None

        def build(first):  # (timed at an even routing: see even_routing)
            return build_experts_program(kernel.name, symbols, shape, tiling_n, placement, first,
                                         routing=even_routing(shape))

        ns = estimate(build(blocks[:1])) if estimate is not None else representative_ns(build, blocks, check=False)
        label = f"{len(blocks)}c ({len(blocks) // groups} column x {groups} row block(s)), {tiling_n.label}"
        return search.Candidate(label, len(blocks), ns, (tiling_n, placement, blocks))

    top = max(counts)
    widest = core_blocks(shape, top)[0].n
    # row groups when the column sticks leave cores idle (more rows than columns to share)
    tried = [(t, r) for t in variants(shape, widest) for r in ROW_GROUPS if r == 1 or units < top]
    results = search.search(tried, counts, evaluate, errors)
    if not results:  # no [K, cols] weight tile fits beside a row tile: stream the weights in k chunks
        tried = [(t, r) for t in streamed_variants(shape, widest) for r in ROW_GROUPS if r == 1 or units < top]
        results = search.search(tried, counts, evaluate, errors)
    if not results:
        raise Unsupported(f"kernel {kernel.name!r}: no grouped matmul plan: a weight tile of {shape.K} rows does "
                          f"not fit the {HARDWARE.scratchpad_usable_bytes} B of scratchpad with a row tile"
                          + (f" ({'; '.join(dict.fromkeys(errors))})" if errors else ""))
    chosen = search.choose(results)
    tiling, placement, blocks = chosen.plan
    check_needs("grouped matmul scratchpad plan", needs(shape, tiling), placement)
    check_placement("grouped matmul scratchpad plan", placement.allocations,
                    min(placement.usable, HARDWARE.scratchpad_usable_bytes))
    notes = (f"{COMPILER_VERSION}: grouped matmul {shape.S}x{shape.K}x{shape.N} over {shape.E} experts, "
             f"tiles {tiling.label}, {len(blocks)} core(s)")
    program = build_experts_program(kernel.name, symbols, shape, tiling, placement, blocks, notes)
    program = kept(kernel, program, minimum(shape))
    groups = blocks[0].row_groups
    division = Division(len(blocks), f"{len(blocks) // groups} column block(s) of the output, every expert on each, "
                        f"its row tiles dealt over {groups} core(s)",
                        tuple((r.label, r.ns) for r in results), search.reason(chosen, results), blocks, chosen.ns)
    plans = Plans("experts", buffers_of(kernel), tile_kernel(shape), (("shape", shape), ("tiling", tiling)),
                  placement, division)
    return Compiled(plans, program)


__all__ = ["minimum", "plan_experts", "tile_kernel"]
