"""The attention family end to end: lowering, tilings and core counts timed by the timing model.

Candidates (core/search.py): every tiling that fits (plan.variants) at the most cores the
units can use, then the best tiling at fewer cores. A candidate is timed by its busiest core
standing for all of them in step (causal units differ in their work: the busiest core is the
one the others wait for); the chosen placement is checked (allocate.check_placement), and the
kept program is validated and verified once and carries the kernel's minimum traffic (q, k, v,
the masks read once, the output written once).
"""

from __future__ import annotations

import dataclasses

from spyre_runtime.hardware import HARDWARE

from ...ir.errors import Unsupported
from ...ir.kernel_ir import AttentionKernel
from ...core import search
from ...core.allocate import check_placement
from .program import build_attention_program
from .plan import AttentionShape, analyse, divide, placement, variants, work_units
from ...core.division import candidate_counts, representative_ns, simulated_ns
from ...core.keep import kept
from ...core.layout import buffers_of, symbols_of
from ...core.minimum import Traffic
from ...core.plans import Division, Plans
from ...core.tiles import Phase, PhaseKind, Relayout, Role, Step, Tile, TileKernel, space

# Tilings are timed only when they move at most PRUNE times the bytes of the tiling that moves
# fewest (fewer query rows per unit re-read K and V once more per extra block), at most MAX_TIMED.
PRUNE = 1.3
MAX_TIMED = 6
RING_ROWS_TIMED = 1  # ring groups: per chunk length, the fewest rows per unit timed


def minimum(kernel: AttentionKernel, shape: AttentionShape) -> Traffic:
    from spyre_runtime.program.operands import ITEMSIZE

    def distinct(buf, strides, dims):
        n = 1
        for extent, stride in zip(dims, strides):
            if stride and extent > 1:
                n *= extent
        return n * ITEMSIZE[buf.dtype]

    B, H, KVH, L, S, D, Dv = kernel.dims
    S = shape.visible(L - 1)  # (positions no row sees are never needed)
    read = (distinct(kernel.q, kernel.q.strides, (B, H, L, D)) + distinct(kernel.k, kernel.k.strides, (B, KVH, S, D))
            + distinct(kernel.v, kernel.v.strides, (B, KVH, S, Dv)))
    for buf, strides in ((kernel.bias, kernel.bias_strides), (kernel.keep, kernel.keep_strides)):
        if buf is not None:
            read += distinct(buf, strides, (B, H, L, S))
    if kernel.positions is not None:
        read += distinct(kernel.positions, (kernel.positions_stride,), (L,))
    return Traffic(read, distinct(kernel.out, kernel.out.strides, (B, H, L, Dv)))


def traffic(shape: AttentionShape, tiling) -> int:
    """The bytes a tiling moves (Q and the output once, K, V and the masks once per unit that sees them)."""
    from spyre_runtime.program.operands import ITEMSIZE

    q, k, v, o = (ITEMSIZE[a.dtype] for a in (shape.q, shape.k, shape.v, shape.out))
    total = 0
    units = work_units(shape, tiling)
    if tiling.share > 1:  # a ring group reads its longest unit's chunks once
        from .plan import ring_groups

        for members in ring_groups(units, tiling.share):
            longest = max((units[m] for m in members), key=lambda u: len(u.chunks))
            total += sum(c.n * (shape.D * k + shape.Dv * v) for c in longest.chunks)
    for u in units:
        total += shape.G * u.rows * (shape.D * q + shape.Dv * o)
        for c in u.chunks:
            if tiling.share == 1:
                total += c.n * (shape.D * k + shape.Dv * v)
            if shape.positions is not None:
                total += u.rows * ITEMSIZE[shape.positions.dtype]
            for m in (shape.bias, shape.keep):
                if m is not None:
                    total += (u.rows - c.r0 if m.strides[2] else 1) * (shape.G if m.strides[1] else 1) * c.n * \
                             ITEMSIZE[m.dtype]
    return total


def tile_kernel(shape: AttentionShape) -> TileKernel:
    """What the program does per chunk, for a person (the family's codegen emits it)."""
    t = lambda name, dtype, sp, role, **kw: Tile(name, dtype, space(*sp), role, **kw)  # noqa: E731
    tiles = [t("q", shape.q.dtype, ("rows", "d"), Role.INPUT), t("kt", shape.k.dtype, ("d", "kv"), Role.INPUT),
             t("k_rows", shape.k.dtype, ("d", "kv"), Role.STAGING, of="kt", relayout=Relayout.TRANSPOSED),
             t("v", shape.v.dtype, ("kv", "d"), Role.INPUT), t("s", "fp32", ("rows", "kv"), Role.TEMPORARY),
             t("p", shape.p_dtype, ("rows", "kv"), Role.TEMPORARY), t("m", "fp32", ("rows",), Role.ACCUMULATOR),
             t("l", "fp32", ("rows",), Role.ACCUMULATOR), t("alpha", "fp32", ("rows",), Role.TEMPORARY),
             t("acc", "fp32", ("rows", "d"), Role.ACCUMULATOR), t("o", shape.out.dtype, ("rows", "d"), Role.OUTPUT),
             t("scale", "fp32", (), Role.CONSTANT)]
    loads = [("q", "q"), ("k_rows", "k"), ("v", "v")]
    steps = [Step("matmul", "matmul", "s", ("q", "kt")), Step("binary", "mul", "s", ("s", "scale"))]
    for name in ("bias", "keep"):
        m = getattr(shape, name)
        if m is not None:
            tiles.append(t(name, m.dtype, ("rows", "kv") if m.strides[2] else ("kv",), Role.INPUT))
            loads.append((name, name))
            steps.append(Step("binary", "add", "s", ("s", name)) if name == "bias"
                         else Step("select", "where", "s", (name, "s", "scale")))
    steps += [Step("reduce", "max", "alpha", ("s",)), Step("binary", "max", "m", ("m", "alpha")),
              Step("binary", "sub", "s", ("s", "m")), Step("unary", "exp", "s", ("s",)),
              Step("reduce", "sum", "l", ("s",), accumulate=True), Step("binary", "mul", "acc", ("acc", "alpha")),
              Step("unary", "copy", "p", ("s",)), Step("matmul", "matmul", "acc", ("p", "v"), accumulate=True)]
    notes = [f"out[{shape.B}, {shape.H}, {shape.L}, {shape.Dv}] = softmax({shape.scale:.6g} * q k^T"
             + (f", keep j <= positions[i] + {shape.causal}" if shape.positions is not None
                else f", causal diagonal {shape.causal}" if shape.causal is not None else "")
             + (", + bias" if shape.bias else "") + (", keep mask" if shape.keep else "") + ") v",
             f"{shape.G} query head(s) per kv head share every K and V chunk ({shape.KVH} kv heads)",
             "the scores stay in the scratchpad: an online softmax per chunk of kv positions (flash attention)"]
    return TileKernel("attention", ("rows", "kv", "d"), tuple(tiles), (("scale", shape.scale),),
                      (Phase(PhaseKind.INIT, (Step("fill", "fill", "m", value=float("-inf")),
                                              Step("fill", "fill", "l", value=0.0),
                                              Step("fill", "fill", "acc", value=0.0)), (), (), "per unit"),
                       Phase(PhaseKind.CHUNK, tuple(steps), tuple(loads), (), "one chunk of kv positions"),
                       Phase(PhaseKind.EPILOGUE, (Step("binary", "div", "acc", ("acc", "l")),
                                                  Step("unary", "copy", "o", ("acc",))), (), (("o", "out"),),
                             "once per unit")), None, tuple(notes))


def plan_attention(kernel: AttentionKernel, *, cores: int | None = None, max_cores: int | None = None):
    from ...core.compiled import COMPILER_VERSION, Compiled

    shape = analyse(kernel)
    tk = tile_kernel(shape)
    if kernel.symbolic is not None:  # (issue 18: each head of a buffer over the sequence is its own placeholder)
        from .sizes import layouts, symbols as head_symbols

        symbols, buffers = head_symbols(kernel), layouts(kernel)
    else:
        symbols, buffers = symbols_of(kernel), buffers_of(kernel)
    limit = min(max_cores or HARDWARE.cores, HARDWARE.cores)
    tilings = variants(shape)

    def skips(tiling) -> bool:
        """Whether the program counts on chip which chunks each unit runs (issue 31): then it is
        timed, pruned and divided as the shape the planner assumes (plan.AttentionShape.assumed)."""
        return shape.bounds_on_chip and tiling.kv_split == 1

    def timed_shape(tiling) -> AttentionShape:
        return shape.assumed() if skips(tiling) else shape

    moved = {t: traffic(timed_shape(t), t) for t in tilings}
    least = min(moved.values())
    # Timed: the tilings that move the fewest bytes, and for every rows-per-unit the best of its
    # tilings (fewer rows re-read K and V, but give more units to the cores: a small prefill
    # needs them), and the kv splits of those (decode: few rows on many cores)
    order = sorted((t for t in tilings if t.kv_split == 1 and t.share == 1),
                   key=lambda t: (moved[t], -(t.rows * t.kv), -t.slots))
    base = [t for t in order if moved[t] <= PRUNE * least][:MAX_TIMED]
    for rows in sorted({t.rows for t in order}):
        best = next(t for t in order if t.rows == rows)
        if best not in base:
            base.append(best)
    bare = {dataclasses.replace(b, label="") for b in base}
    # ring groups (K/V shared over the ring): for every chunk length, the groups that read the
    # fewest bytes at the fewest rows per unit, i.e. on the most cores (sharing takes away what
    # more, smaller units cost in K/V reads; a chunk's length trades its transpose and ring hops,
    # which every core waits for, against the pipelining of several). Each is timed whole (its
    # cores differ), which is why so few are.
    shared = {}
    for t in sorted((t for t in tilings if t.share > 1), key=lambda t: (moved[t], -t.share, -t.slots)):
        shared.setdefault((t.rows, t.kv), t)
    rings = []
    for kv in sorted({kv for _, kv in shared}):
        rings += [shared[r, kv] for r in sorted(r for r, k in shared if k == kv)[:RING_ROWS_TIMED]]
    tilings = base + [t for t in tilings if t.kv_split > 1
                      and dataclasses.replace(t, kv_split=1, label="") in bare] + rings
    errors: list[str] = []

    def divided(tiling, n, timing=False):
        """(units, each core's work, placement, a program of some of the cores' work); `timing`:
        of the shape it is timed as (the same as the program's but where chunks are skipped on chip)."""
        units = work_units(shape, tiling, n)
        one_each = tiling.share > 1
        if one_each and len(units) != n:
            return units, (), None, None  # (a ring group's units go one per core)
        work = divide(units, n, one_each)
        place = placement(shape, tiling)
        skipped = ""
        if skips(tiling):
            guess = work_units(shape.assumed(), tiling, n)
            if timing:
                work, place = divide(guess, n, one_each), placement(shape.assumed(), tiling)
                return guess, work, place, lambda cores: build_attention_program(
                    kernel.name, symbols, shape.assumed(), tk, tiling, place, cores, "")
            # the units of the program (every chunk, each skipped on chip or not) dealt as the
            # assumed ones are (their work differs along the diagonal)
            same = {(u.b, u.kvh, u.i0, u.rows): u for u in units}
            work = tuple(type(w)(w.core, tuple(same[u.b, u.kvh, u.i0, u.rows] for u in w.units))
                         for w in divide(guess, n, one_each))
            most = max((len(w.units) for w in work), default=1)
            place = placement(shape, tiling, most)
            if place is None:
                raise Unsupported(f"{tiling.label}: the chunks' run counts of {most} units per core do not fit")
            skipped = ", chunks past every row's position skipped (counted on chip)"
        notes = (f"{COMPILER_VERSION}: flash attention, {tiling.label}, {len(units)} work unit(s) on "
                 f"{len(work)} core(s){skipped}")
        return units, work, place, lambda cores: build_attention_program(kernel.name, symbols, shape, tk, tiling,
                                                                         place, cores, notes)

    def build(tiling, n):
        """The program of `tiling` on `n` cores."""
        units, work, place, program = divided(tiling, n)
        return (program(work) if work else None), work, place, len(units)

    timed: dict = {}

    def evaluate(tiling, n):
        n = min(n, len(work_units(shape, tiling)))  # (no more cores than units)
        if (tiling, n) not in timed:
            _, work, _, program = divided(tiling, n, timing=True)
            if not work:
                return None  # (split units need a core each)
            if tiling.kv_split == 1 and tiling.share == 1:  # its busiest core standing for all of them in step
                ns = representative_ns(program, work, check=False, load=lambda w: sum(u.work for u in w.units))
            else:  # split units differ (the first part of each block combines and stores, the rest
                # send), and so do ring groups' cores (the loader reads, the others forward)
                ns = simulated_ns(program(work), check=False)
            timed[tiling, n] = search.Candidate(f"{tiling.label} on {len(work)} core(s)", len(work), ns, (tiling, n))
        return timed[tiling, n]

    counts = [cores] if cores else [c for c in candidate_counts(limit)]
    results = search.search(tilings, counts, evaluate, errors)
    if not results:
        raise Unsupported(f"attention kernel {kernel.name!r}: no plan ({'; '.join(errors[:3]) or 'no candidate'})")
    chosen = search.choose(results)
    tiling, n = chosen.plan
    program, work, place, nunits = build(tiling, n)
    # (the placement's own check: two tiles on exactly the same bytes in one unit's order look
    # to the program's replay like one tile updated in place)
    check_placement("attention scratchpad plan", place.allocations,
                    min(place.usable, HARDWARE.scratchpad_usable_bytes))
    program = kept(kernel, program, minimum(kernel, shape))
    division = Division(len(work), f"{nunits} work units (batch, kv head, {tiling.rows} query rows per head)",
                        tuple((r.label, r.ns) for r in results), search.reason(chosen, results),
                        tuple((w.core, len(w.units)) for w in work), chosen.ns)
    plans = Plans("attention", buffers, tk, (("shape", shape), ("tiling", tiling)), place,
                  division)
    return Compiled(plans, program)


__all__ = ["minimum", "plan_attention", "tile_kernel"]
