"""The sort family end to end: shape, tilings and core counts timed on the timing model, the kept program.

Rows are independent, so the division is over rows: each core a contiguous share (emitter.
split_evenly), the first share standing for all of them in step when a candidate is timed
(division.representative_ns). Variants: a core's rows in one chunk, or in at least 2 or 4 (the
loads and stores of one chunk then overlap the network of another).
"""

from __future__ import annotations

from spyre_runtime.hardware import HARDWARE
from spyre_runtime.program.emitter import split_evenly
from spyre_runtime.program.operands import ITEMSIZE

from ...core import search
from ...core.allocate import check_placement
from ...core.compiled import COMPILER_VERSION, Compiled
from ...core.division import candidate_counts, representative_ns
from ...core.keep import kept
from ...core.layout import buffers_of, symbols_of
from ...core.minimum import Traffic
from ...core.plans import Division, Plans
from ...core.tiles import Phase, PhaseKind, Role, Step, Tile, TileKernel, space
from ...ir.errors import Unsupported
from ...ir.kernel_ir import SortKernel
from .codegen import Share, build_sort_program
from .plan import INDEX_DTYPE, NETWORK_INDEX, SPLITS, SortShape, analyse, placement, tiling


def minimum(shape: SortShape) -> Traffic:
    """Every source element read once, the first k of every row written once (values and indices)."""
    return Traffic(shape.R * shape.n * ITEMSIZE[shape.dtype],
                   shape.R * shape.k * (ITEMSIZE[shape.dtype] + ITEMSIZE[INDEX_DTYPE]))


def tile_kernel(shape: SortShape) -> TileKernel:
    """What the program does per chunk, for a person (codegen.py emits it)."""
    tiles = [Tile("keys", shape.dtype, space("rows", "n"), Role.INPUT),
             Tile("index", NETWORK_INDEX, space("rows", "n"), Role.TEMPORARY),
             Tile("indices", INDEX_DTYPE, space("rows", "k"), Role.OUTPUT)]
    steps = [Step("iota", "iota", "index")]
    if shape.pad is not None:
        tiles += [Tile("valid", "bool", space("n"), Role.CONSTANT), Tile("pad", shape.dtype, space(), Role.CONSTANT)]
        steps.insert(0, Step("select", "where", "keys", ("valid", "keys", "pad")))
    steps += [Step("cmpx", f"distance {s.distance} block {s.block} over {s.cols}" + (" halving" if s.halve else ""),
                   "keys", ("keys", "index")) for s in shape.steps]
    steps.append(Step("unary", "copy", "indices", ("index",)))
    order = "descending" if shape.descending else "ascending"
    padding = f"; elements past {shape.n} padded with {shape.pad}" if shape.pad is not None else ""
    notes = (f"{shape.R} row(s) of {shape.n} sorted {order} (stable: NaN greatest, ties by index); the first "
             f"{shape.k} of each stored",
             f"a bitonic {'top-k ' if any(s.halve for s in shape.steps) else ''}network over rows of {shape.N}: "
             f"{len(shape.steps)} compare-exchange steps, values and indices together{padding}")
    return TileKernel("sort", ("rows", "n"), tuple(tiles), (), (
        Phase(PhaseKind.CHUNK, tuple(steps), (("keys", "source"),), (("keys", "values"), ("indices", "indices")),
              "one chunk of rows"),), None, notes)


def shares(R: int, cores: int) -> tuple[Share, ...]:
    return tuple(Share(c, first, count) for c, (first, count) in enumerate(split_evenly(R, cores)) if count)


def plan_sort(kernel: SortKernel, *, cores: int | None = None, max_cores: int | None = None) -> Compiled:
    shape = analyse(kernel)
    tk = tile_kernel(shape)
    symbols = symbols_of(kernel)
    limit = min(max_cores or HARDWARE.cores, HARDWARE.cores, shape.R)
    errors: list[str] = []

    def divided(split, n):
        work = shares(shape.R, n)
        t = tiling(shape, work[0].count, split)
        return work, t, placement(shape, t)

    def evaluate(split, n):
        work, t, place = divided(split, n)
        ns = representative_ns(lambda one: build_sort_program(kernel.name, symbols, shape, t, place, one,
                                                              check=False), work)
        return search.Candidate(f"{t.label} ({split} or more per core) on {len(work)} core(s)", len(work), ns,
                                (split, n))

    counts = [min(cores, shape.R)] if cores else candidate_counts(limit)
    results = search.search(SPLITS, counts, evaluate, errors)
    if not results:
        raise Unsupported(f"sort kernel {kernel.name!r}: no plan ({'; '.join(errors[:3]) or 'no candidate'})")
    chosen = search.choose(results)
    split, n = chosen.plan
    work, t, place = divided(split, n)
    check_placement("sort scratchpad plan", place.allocations, HARDWARE.scratchpad_usable_bytes)
    what = f"top-{shape.k} network" if any(s.halve for s in shape.steps) else "sort"
    notes = f"{COMPILER_VERSION}: bitonic {what} of rows of {shape.N}, {t.label}, {len(work)} core(s)"
    program = kept(kernel, build_sort_program(kernel.name, symbols, shape, t, place, work, notes), minimum(shape))
    division = Division(len(work), f"{shape.R} rows", tuple((r.label, r.ns) for r in results),
                        search.reason(chosen, results), tuple((w.core, w.count) for w in work), chosen.ns)
    plans = Plans("sort", buffers_of(kernel), tk, (("shape", shape), ("tiling", t)), place, division)
    return Compiled(plans, program)


__all__ = ["minimum", "plan_sort", "tile_kernel"]
