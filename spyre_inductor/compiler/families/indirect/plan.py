"""The gather/scatter family's plan (issue 16): variants, core division, the kept program.

The lowering (lowering.py) gives a pointwise tile kernel plus the
moves of its indirect tiles; the variants are the pointwise ones (tile-size
target x stream buffers: core/tiling.py, scratchpad.py, verify.py), emitted by
the pointwise codegen with the moves, and timed by the shared search.

Core division: a gather or a plain scatter may split any dim (duplicate
positions in a plain scatter have PyTorch's unspecified order anyway). An
accumulating scatter must have every contribution to one destination
element added by one core, in order, so it splits only a dim whose shares
can never reach a common element whatever the indices are (``safe_dims``):

* its stride clears everything the other terms can add (the dim of rows
  above an indexed one: scatter_add along the last dim), or
* every other term, index strides included, is a multiple of its stride
  times its extent (the columns under an indexed row: each core owns a slice
  of every row, the division of cores over the non-indexed dim).

No such dim: one core.
"""

from __future__ import annotations

import dataclasses

from spyre_runtime.hardware import HARDWARE
from spyre_runtime.program.operands import ITEMSIZE, STICK

from ...ir.errors import Unsupported
from ...core import search
from ...core.codegen import build_program
from ...core.division import candidate_counts, choose_division, chosen_ns, divide, representative
from ...core.search import TIE
from .lowering import Lowered, lower
from ...core.keep import kept
from ...core.plans import Division, Plans
from ...core.scratchpad import plan_scratchpad
from ...core.tiles import PhaseKind
from ...core.tiling import BUFFER_CHOICES, TARGETS, TilePlan, plan_tiling
from ...core.verify import verify


def safe_dims(lowered: Lowered, tiling: TilePlan) -> tuple[int, ...] | None:
    """The dims an accumulating scatter may be split over (module docstring); None: no accumulation."""
    chunk = lowered.tile_kernel.phase(PhaseKind.CHUNK)
    ranges = tiling.ranges
    safe = None
    for (_, access), move in zip(chunk.stores, lowered.scatters):
        if move is None or not move.accumulate:
            continue
        terms = [(abs(s), r) for s, r in zip(access.strides, ranges)]
        extra = [(abs(t.stride), t.bound) for t in move.terms]
        ok = set()
        isz = ITEMSIZE[access.dtype]
        for d, r in enumerate(ranges):
            stride = terms[d][0]
            if r <= 1 or stride == 0:
                continue
            others = [x for k, x in enumerate(terms) if k != d] + extra
            if not (sum(s * (n - 1) for s, n in others) < stride or all(s % (stride * r) == 0 for s, _ in others)):
                continue
            # disjoint elements are not enough: a row's add reads and writes back whole sticks, so
            # two cores' shares must not share a stick either (every other walk and the share's
            # unit are whole sticks apart)
            unit = stride * (tiling.granule if d == tiling.stick_dim else 1) * isz
            if unit % STICK == 0 and all(s * isz % STICK == 0 for s, n in others if n > 1 and s):
                ok.add(d)
        safe = ok if safe is None else safe & ok
    return None if safe is None else tuple(sorted(safe))


def _choose(lowered, tiling, build, force, estimate, max_cores) -> Division:
    safe = safe_dims(lowered, tiling)
    if safe is None:
        return choose_division(tiling, build, force=force, estimate=estimate, max_cores=max_cores)
    # the dim with the most units among the safe ones; none: one core, all contributions in order
    best = None
    for d in safe:
        granule = tiling.granule if d == tiling.stick_dim else 1
        units = -(-tiling.ranges[d] // granule)
        if best is None or units > best[2]:
            best = (d, granule, units)
    if best is None:
        plan = divide(tiling, 1, None, 1)
        ns = estimate(build(plan)) if plan.shares else 0.0
        return dataclasses.replace(plan, candidates=(("1 core(s)", ns),), ns=ns,
                                   reason="an accumulating scatter with no dim its shares cannot collide on: one core")
    dim, granule, units = best
    limit = min(units, force or max_cores or HARDWARE.cores)
    counts = [force] if force else candidate_counts(limit)

    def evaluate(_variant, n):
        plan = divide(tiling, n, dim, granule)
        return search.Candidate(f"{plan.cores} core(s)", plan.cores, estimate(build(plan)), plan)

    errors: list[str] = []
    results = search.search([None], counts, evaluate, errors)
    if errors:
        raise Unsupported(errors[0])
    chosen = search.choose(results)
    results.sort(key=lambda r: r.cores)
    return dataclasses.replace(chosen.plan, candidates=tuple((r.label, r.ns) for r in results), ns=chosen.ns,
                               reason=f"accumulating scatter split over dim {dim} only (its shares cannot collide); "
                                      + search.reason(chosen, results))


def _program(kernel, lowered: Lowered, tiling, placement, division, check=True):
    notes = (f"indirect: tiles {tiling.tile_rows}x{tiling.tile_cols} streamed along dim {tiling.stream_dim}, "
             f"{division.cores} core(s)")
    program = build_program(kernel.name, lowered.layout, lowered.tile_kernel, tiling, placement, division, notes,
                            lowered.gathers, lowered.scatters)
    if not check:
        return program
    return kept(kernel, program)


def plan(kernel, cores=None, max_cores=None, estimate=None):
    """(Plans, validated program) of a gather/scatter kernel."""
    lowered = lower(kernel)
    tk = lowered.tile_kernel
    widest = cores or max_cores or HARDWARE.cores

    def timed(tiling, placement):
        build = lambda d: _program(kernel, lowered, tiling, placement, d, check=False)  # noqa: E731
        return (build, estimate) if estimate is not None else representative(build)

    best, seen = None, set()
    for target, buffers in ((t, b) for t in TARGETS for b in BUFFER_CHOICES):
        placement, tiling = plan_scratchpad(tk, plan_tiling(lowered.layout, tk, target, buffers))
        if tiling in seen:
            continue
        seen.add(tiling)
        verify(tk, tiling, placement)
        build, est = timed(tiling, placement)
        trial = _choose(lowered, tiling, build, widest if safe_dims(lowered, tiling) is None else None, est,
                        widest)
        ns = chosen_ns(trial)
        if best is None or ns < best[0] * (1 - TIE):
            best = (ns, tiling, placement)
    _, tiling, placement = best
    build, est = timed(tiling, placement)
    division = _choose(lowered, tiling, build, cores, est, max_cores)
    program = _program(kernel, lowered, tiling, placement, division)
    plans = Plans("indirect", lowered.layout.buffers, tk, (("layout", lowered.layout), ("tiling", tiling)),
                  placement, division)
    return plans, program


__all__ = ["plan", "safe_dims"]
