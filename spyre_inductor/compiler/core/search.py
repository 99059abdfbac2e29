"""The candidate search against the timing model: one for every family.

A family offers plan *variants* (tile targets, buffer counts, modes) and a
way to time a variant at a core count (``evaluate(variant, cores)``: a
``Candidate`` or None when it does not apply; ``Unsupported`` when it does
not fit). The search times every variant at the most cores, then the best
variant from the most cores down until a count is clearly slower than the
best so far: time against cores falls, flattens, then rises (per-core fill
and drain), so the counts below the turn cannot win. ``choose`` keeps the
fastest, a candidate with fewer cores within TIE (relative) or TIE_NS
(absolute) winning over it: fewer cores leave the others free, and the
timing model has no per-core start-up cost, so a few tens of ns between
tiny plans are below what it can tell apart.

Families time a candidate by one representative core standing for its
identical siblings (timing.estimate's replicas) where the cores' programs
differ only in where they start: building and validating every core's
program is for the one plan kept.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ir.errors import Unsupported

TIE = 0.01      # relative
TIE_NS = 100.0  # absolute, ns


@dataclass(frozen=True)
class Candidate:
    label: str
    cores: int
    ns: float
    plan: object  # the family's plan of this candidate


def close_to(ns: float, fastest: float) -> bool:
    return ns <= max(fastest * (1 + TIE), fastest + TIE_NS)


def search(variants, counts, evaluate, errors: list[str] | None = None) -> list[Candidate]:
    errors = [] if errors is None else errors

    def attempt(variant, n):
        try:
            return evaluate(variant, n)
        except Unsupported as e:
            errors.append(str(e))
            return None

    results: list[Candidate] = []
    if not counts:
        return results
    top = max(counts)
    trials = [(r, v) for v in variants if (r := attempt(v, top)) is not None]
    results += [r for r, _ in trials]
    if not trials:
        return results
    best, variant = min(trials, key=lambda rv: rv[0].ns)
    best_ns = best.ns
    for n in sorted((c for c in counts if c != top), reverse=True):
        r = attempt(variant, n)
        if r is None:
            continue
        results.append(r)
        best_ns = min(best_ns, r.ns)
        if not close_to(r.ns, best_ns):
            break
    return results


def choose(results: list[Candidate]) -> Candidate:
    fastest = min(r.ns for r in results)
    return min((r for r in results if close_to(r.ns, fastest)), key=lambda r: (r.cores, r.ns))


def reason(chosen: Candidate, results: list[Candidate]) -> str:
    return (f"{chosen.label}: {chosen.ns:.0f} ns, the fastest of {len(results)} candidate(s) "
            f"(ties within {TIE:.0%} or {TIE_NS:.0f} ns go to fewer cores)")


__all__ = ["Candidate", "TIE", "TIE_NS", "choose", "close_to", "reason", "search"]
