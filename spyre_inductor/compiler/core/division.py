"""Work division: which cores get which part of the iteration space.

Pointwise work is parallel along every dim, so the planner splits ONE dim
into near-equal contiguous shares, one per core: the stream dim or a loop
dim around it (never the columns of a whole-row tile: that would only make
rows narrower). A share of the stick dim is a whole number of sticks of
the narrowest dtype (the granule), so no two cores touch one stick of a
contiguous operand, and a share of the row dim is a whole number of the
tile's row blocks or of the sticks of the accesses moved transposed
(TilePlan.row_unit); only the last share carries the ragged tail.

How many cores: more cores add device-memory streams and sfp throughput but
each core pays its own pipeline fill and drain, and a tiny tensor gains
nothing. So candidate core counts (1, 2, 4, ... up to 32 and the number of
granules), from the most down until one is clearly slower than the best so
far, are each emitted and run through the timing model
(``spyre_runtime.program.timing.estimate``), and the fastest wins; a count
with fewer cores within TIE (relative) or TIE_NS (absolute) of the fastest
wins over it: fewer cores leave the others free, and the timing model has no
per-core start-up cost (distributing a program to one more core is not
free on the card), so differences of a few tens of ns between tiny plans
are below what it can tell apart. This is what makes a (1, 64) add run on
one core. The search and the tie rule are search.py's, shared by every
family; the result is a plans.Division whose shares are ``CoreShare``s.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Sequence

from spyre_runtime.hardware import HARDWARE
from spyre_runtime.program.emitter import split_evenly

from ..ir.errors import Unsupported
from . import search
from .plans import Division
from .tiling import TilePlan


@dataclass(frozen=True)
class CoreShare:
    """One core's box of the iteration space: [starts, starts + counts) per canonical dim (a
    reduction's outer dims, then its reduced dim: a ring plan splits that one)."""

    core: int
    starts: tuple[int, ...]  # per canonical dim
    counts: tuple[int, ...]


def split_dim(tiling: TilePlan) -> tuple[int | None, int]:
    """(dim, granule): the loop or stream dim with the most units, loops first (they keep streams long)."""
    best, best_key = None, None
    for rank, d in enumerate(tiling.loop_dims + (tiling.stream_dim,)):
        granule = tiling.granule if d == tiling.stick_dim else tiling.row_unit if d == tiling.row_dim else 1
        units = -(-tiling.ranges[d] // granule)
        if units <= 1:
            continue
        key = (min(units, HARDWARE.cores), d != tiling.stream_dim, -rank)
        if best_key is None or key > best_key:
            best, best_key = (d, granule), key
    return best if best is not None else (None, 1)


def _split(dim: int | None, granule: int) -> str:
    return "none" if dim is None else f"dim {dim} in units of {granule}"


def divide(tiling: TilePlan, cores: int, dim: int | None = None, granule: int | None = None) -> Division:
    """Split over `cores` cores (fewer if the dim has fewer units)."""
    if dim is None and granule is None:
        dim, granule = split_dim(tiling)
    ranges = tiling.ranges
    if any(r == 0 for r in ranges):
        return Division(0, _split(dim, granule or 1), (), "empty iteration space")
    if dim is None:
        share = CoreShare(0, tuple(0 for _ in ranges), ranges)
        return Division(1, _split(None, 1), (), "nothing to split", (share,))
    units = -(-ranges[dim] // granule)
    shares = []
    for core, (u0, n) in enumerate(split_evenly(units, min(cores, units))):
        start = u0 * granule
        count = min(n * granule, ranges[dim] - start)
        starts = tuple(start if d == dim else 0 for d in range(len(ranges)))
        counts = tuple(count if d == dim else r for d, r in enumerate(ranges))
        shares.append(CoreShare(core, starts, counts))
    return Division(len(shares), _split(dim, granule), (), "", tuple(shares))


def simulated_ns(program, replicas: int = 1, check: bool = True) -> float:
    """The timing model's estimate of one program (the one place division asks it); see
    timing.estimate for `replicas` (one core's program standing for that many in step)."""
    from spyre_runtime.program.timing import estimate

    return estimate(program, HARDWARE, replicas, check=check).simulated_ns


def representative_ns(build: Callable[[tuple], object], shares: Sequence, check: bool = True,
                      load: Callable[[object], float] | None = None) -> float:
    """The timing model's estimate of `shares` run one per core, from one core's program: `build`
    of the representative share alone, standing for len(shares) identical cores in step
    (timing.estimate's replicas). The shares differ only in where they start and how much they
    hold, so the busiest one's time is the candidate's, at a fraction of the cost of timing
    every core. The busiest is the first (an even split puts the largest share first) unless
    `load` says how busy each is."""
    one = shares[0] if load is None else max(shares, key=load)
    return simulated_ns(build((one,)), len(shares), check)


def representative(build: Callable[[Division], object]):
    """(build, estimate) for choose_division that time a candidate by its representative core
    (representative_ns)."""
    return (lambda plan: plan), lambda plan: representative_ns(
        lambda first: build(dataclasses.replace(plan, shares=first)), plan.shares)


def candidate_counts(units: int) -> list[int]:
    limit = min(units, HARDWARE.cores)
    counts = {c for c in (1, 2, 4, 8, 16, 32) if c <= limit} | {limit}
    return sorted(counts)


def _label(cores: int) -> str:
    return f"{cores} core(s)"


def _timed(plan: Division, ns: float, reason: str) -> Division:
    return dataclasses.replace(plan, candidates=((_label(plan.cores), ns),), reason=reason, ns=ns)


def choose_division(tiling: TilePlan, build: Callable[[Division], object], force: int | None = None,
                    estimate: Callable[[object], float] = simulated_ns,
                    max_cores: int | None = None) -> Division:
    """The division the timing model says is fastest (or exactly `force` cores), at most `max_cores`."""
    dim, granule = split_dim(tiling)
    if force is not None:
        if dim is not None and -(-tiling.ranges[dim] // granule) < force:
            granule = 1  # forced: split finer than a stick (correct, and charged for shared sticks)
        plan = divide(tiling, force, dim, granule)
        return _timed(plan, estimate(build(plan)), f"forced to {force} core(s)")
    if dim is None or any(r == 0 for r in tiling.ranges):
        plan = divide(tiling, 1, dim, granule)
        return _timed(plan, estimate(build(plan)), plan.reason) if plan.shares else plan
    units = -(-tiling.ranges[dim] // granule)
    counts = candidate_counts(min(units, max_cores or HARDWARE.cores))

    def evaluate(_variant, n):
        plan = divide(tiling, n, dim, granule)
        return search.Candidate(_label(plan.cores), plan.cores, estimate(build(plan)), plan)

    # One variant (the tile shape and buffers are chosen before, by the family's plan): the
    # search times it from the most cores down until a count is clearly slower than the best so
    # far, and ties go to fewer cores (search.py).
    errors: list[str] = []
    results = search.search([None], counts, evaluate, errors)
    if errors:  # a candidate that cannot be built is the kernel's problem, not a slower candidate
        raise Unsupported(errors[0])
    chosen = search.choose(results)
    results.sort(key=lambda r: r.cores)
    return dataclasses.replace(chosen.plan, candidates=tuple((r.label, r.ns) for r in results), ns=chosen.ns,
                               reason=search.reason(chosen, results))


def chosen_ns(plan: Division) -> float:
    """The estimate of the chosen division (0 for an empty kernel)."""
    return plan.ns
