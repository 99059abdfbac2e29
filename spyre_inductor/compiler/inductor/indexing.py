"""Index arithmetic for capture: static sizes, affine indices, common loop ranges.

Inductor hands a node's loop body sympy index expressions in the iteration
variables we pass in. The kernel IR only has affine indices
(offset + sum stride * var), so anything else -- ModularIndexing and
FloorDiv from reshapes, Min/Max, or a symbol that is not one of our loop
variables (a dynamic size) -- is refused here with a reason, and the node
becomes a CPU fallback (an index VALUE with Min/Max/Abs is computed on chip
instead, index_bends.py; a load's index bent along one variable is cut into
pieces, piecewise_affine). Indirect (data-dependent) variables become the
Index's indirect terms when capture says which value each stands for.

Nodes fused into one kernel may come with differently simplified ranges for
the same iteration space (Inductor merges contiguous dims per node): one add
sees (32,), its broadcasting neighbour (4, 8). ``common_ranges`` finds the
coarsest ranges both factor into, and ``node_vars`` re-expresses each node's
variables in them (for (32,) inside (4, 8): i = 8*j0 + j1), which keeps the
indices affine.
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Sequence

import sympy

from torch._inductor.utils import sympy_index_symbol
from torch.utils._sympy.functions import FloorDiv, Identity, Max, Min, ModularIndexing
from torch._inductor.virtualized import V

from ..ir.errors import NotCapturable
from ..ir.kernel_ir import Index


# Issue 18 (symbolic/capture.py): while a kernel over symbolic sizes is captured, each size symbol
# stands for one value (its bucket's maximum, or a probe); None: sizes must be static. (A
# context variable: compiles on other threads capture at their own values.)
SIZE_VALUES: contextvars.ContextVar[dict | None] = contextvars.ContextVar("spyre_size_values", default=None)
# Issue 29 (symbolic/exact.py): sizes a kernel is specialized to, one artifact per value, made at
# launch from a template: each stands for its value everywhere, indices and values included.
EXACT_VALUES: contextvars.ContextVar[dict | None] = contextvars.ContextVar("spyre_exact_values", default=None)


def static_int(expr, what: str) -> int:
    """`expr` as a Python int, or NotCapturable when it is symbolic (dynamic shapes). While
    symbolic/capture.py captures a kernel at given size values (SIZE_VALUES), the size symbols take them."""
    if isinstance(expr, int):
        return expr
    try:
        expr = V.graph.sizevars.simplify(sympy.sympify(expr))
    except Exception:  # noqa: BLE001 - outside a graph: keep the expression as given
        expr = sympy.sympify(expr)
    if isinstance(expr, sympy.Integer):
        return int(expr)
    values = {**(SIZE_VALUES.get() or {}), **(EXACT_VALUES.get() or {})}
    expr = size_terms_put_in(expr, values)
    if isinstance(expr, sympy.Integer):  # (a size term alone: a stride s**2)
        return int(expr)
    if values and expr.free_symbols and expr.free_symbols <= set(values):
        bend = non_affine_term(expr)
        if bend is not None:
            # (symbolic/capture.py fits each quantity from captures at a few sizes: only one affine in
            # each size is determined by them; n // 2 or Min(n, 50) would be extrapolated wrongly)
            part = "" if sympy.expand(expr) == bend else f" (its term {bend})"
            raise NotCapturable(f"symbolic {what} {expr} is not affine in the sizes{part}: not compiled for spyre yet")
        value = expr.xreplace(_sizes_only(values))
        if isinstance(value, sympy.Integer):
            return int(value)
    raise NotCapturable(f"symbolic {what} {expr} (dynamic shapes are not compiled for spyre yet)")


def non_affine_term(expr, symbols=None) -> sympy.Expr | None:
    """The first term of `expr` (expanded) that is not an integer times distinct symbols, each
    to the first power (a floor division, a Min/Max, a square...): None when `expr` is affine in
    each symbol with the others fixed (s0 * s1, a batch stride, is). With `symbols`, only the
    terms that involve them are looked at (an index may bend in its loop variables)."""
    for term in sympy.Add.make_args(sympy.expand(sympy.sympify(expr))):
        if symbols is not None and not term.free_symbols & symbols:
            continue
        coef, rest = term.as_coeff_Mul()
        if not isinstance(coef, sympy.Integer):
            return term
        factors = sympy.Mul.make_args(rest)
        if rest != 1 and not all(isinstance(f, sympy.Symbol) for f in factors) or len(set(factors)) != len(factors):
            return term
    return None


def size_terms_put_in(expr, values):
    """`expr` with the values of the size terms among `values` put in: a Min/Max of sizes alone
    (a sliding window's kv offset Max(0, n - 7)) is specialized per value as a size of its own,
    its value handed to the launch beside the sizes' (symbolic/capture.size_terms)."""
    terms = {k: sympy.Integer(v) for k, v in values.items() if not isinstance(k, sympy.Symbol)}
    return expr.xreplace(terms) if terms else expr


def _sizes_only(values) -> dict:
    """The size symbols' values (its terms are put in by size_terms_put_in): ``subs`` with a term
    s**2 among its keys would solve for s (s -> sqrt(145) at a corner where s**2 is stepped alone)."""
    return {k: sympy.Integer(v) for k, v in values.items() if isinstance(k, sympy.Symbol)}


def specialized(expr, what: str):
    """`expr` with the sizes a kernel is specialized to (EXACT_VALUES) put in: NotCapturable when
    a term with such a size is not affine in it (the template must be exact: symbolic/exact.py)."""
    values = EXACT_VALUES.get()
    expr = sympy.sympify(expr)
    if not values or not expr.free_symbols & set(values):
        return expr
    expr = size_terms_put_in(expr, values)
    bend = non_affine_term(expr, set(values))
    if bend is not None:
        raise NotCapturable(f"{what}: the term {bend} is not affine in the sizes")
    return sympy.expand(expr.xreplace(_sizes_only(values)))


def loop_vars(count: int, prefix: str = "i") -> list[sympy.Symbol]:
    return [sympy_index_symbol(f"{prefix}{d}") for d in range(count)]


def affine_index(expr, variables: Sequence[sympy.Symbol], what: str, ranges: dict | None = None,
                 indirect=None) -> Index:
    """The IR Index of `expr` over `variables`, or NotCapturable naming `what`. With the
    variables' `ranges`, modular indexing and floor division that the ranges make affine (a
    repeat's i mod n, once the loop is split at n: ``split_dims``) are simplified first.
    `indirect` maps the symbols capture handed out for indirect indexing to their Indirect
    values' positions: each becomes an indirect term (position, its coefficient)."""
    expr = sympy.sympify(expr)
    if expr.has(Identity):  # Inductor's marker that keeps a cat part's index from being simplified
        expr = expr.replace(Identity, lambda x: x)
    expr = specialized(expr, what)
    if expr.free_symbols - set(variables) - set(indirect or ()):
        try:  # a size specialized by a guard (symbolic/capture.py) is a number by now (s0 ** 2 too)
            expr = V.graph.sizevars.simplify(expr)
        except Exception:  # noqa: BLE001 - outside a graph
            pass
    if ranges and (expr.has(ModularIndexing) or expr.has(FloorDiv)):
        expr = V.graph.sizevars.simplify_with_ranges(expr, ranges)
    expr = sympy.expand(expr)
    if expr.atoms(sympy.Function) or expr.atoms(sympy.Mod) or expr.atoms(sympy.Pow):
        raise NotCapturable(f"non-affine index {expr} for {what}")
    terms = []
    for sym, pos in (indirect or {}).items():
        c = expr.coeff(sym, 1)
        if c == 0:
            continue
        if not isinstance(c, sympy.Integer) or sym in c.free_symbols:
            raise NotCapturable(f"non-affine indirect index {expr} for {what}")
        terms.append((pos, int(c)))
        expr = sympy.expand(expr - c * sym)
    unknown = expr.free_symbols - set(variables)
    if unknown:
        names = ", ".join(sorted(str(s) for s in unknown))
        raise NotCapturable(f"index of {what} depends on {names} (indirect or symbolic)")
    strides = []
    rest = expr
    for v in variables:
        c = expr.coeff(v, 1)
        if not isinstance(c, sympy.Integer):
            raise NotCapturable(f"non-affine index {expr} for {what}")
        strides.append(int(c))
        rest = rest - c * v
    rest = sympy.expand(rest)
    if not isinstance(rest, sympy.Integer):
        raise NotCapturable(f"non-affine index {expr} for {what}")
    return Index(tuple(strides), int(rest), tuple(terms))


MAX_RUNS = 8  # more affine runs than this: not worth a piece each


def piecewise_affine(expr, variables: Sequence[sympy.Symbol], ranges: dict, what: str):
    """`expr` (an index) as affine runs along one variable: (its position in `variables`,
    [(start, end, expression)] covering its range, each expression exact on its run and free of
    that variable's bends), or None when `expr` is affine already. A bend in another variable is
    left in the run's expression (call again on it).

    Inductor writes a replicate pad as ``Min(63, Max(0, i1 - 2))``, a reflect pad with ``Abs``, a
    roll as ``ModularIndexing(i1 + 3, 1, 64)``: affine except at a few points of one variable.
    Evaluated at every point of that variable, the runs of constant slope are the pieces;
    capture turns them into a where over index masks, which the planner cuts
    (families/pointwise/pieces.py). NotCapturable when one bend involves several variables, or has more than
    MAX_RUNS runs."""
    expr = sympy.sympify(expr)
    if expr.has(Identity):
        expr = expr.replace(Identity, lambda x: x)
    expr = sympy.expand(specialized(expr, what))

    def curved_term(t) -> bool:
        return bool(t.atoms(sympy.Function) or t.atoms(sympy.Mod) or t.has(sympy.Min, sympy.Max, Min, Max))

    terms = sympy.Add.make_args(expr)
    curved = [t for t in terms if curved_term(t)]
    if not curved:
        return None
    inner = curved[0].free_symbols
    if len(inner) != 1 or not inner <= set(variables):
        raise NotCapturable(f"non-affine index {expr} for {what}")
    (v,) = inner
    mine = [t for t in curved if t.free_symbols == inner]
    n = int(ranges[v])
    g = sympy.Add(*mine)
    if n > 4096:
        raise NotCapturable(f"non-affine index {expr} for {what} (a bend along a dim of {n})")
    f = sympy.lambdify(v, g, modules=[{"ModularIndexing": lambda x, d, m: (x // d) % m,
                                       "FloorDiv": lambda x, d: x // d, "Min": min, "Max": max}, "math"])
    try:
        values = [int(f(k)) for k in range(n)]
    except (TypeError, ValueError, NameError, ZeroDivisionError, OverflowError):
        raise NotCapturable(f"non-affine index {expr} for {what}") from None
    runs, start = [], 0
    while start < n:
        slope = values[start + 1] - values[start] if start + 1 < n else 0
        end = start + 1
        while end < n and values[end] - values[end - 1] == slope:
            end += 1
        runs.append((start, end, slope, values[start] - slope * start))
        start = end
        if len(runs) > MAX_RUNS:
            raise NotCapturable(f"non-affine index {expr} for {what} (more than {MAX_RUNS} affine runs)")
    rest = sympy.Add(*[t for t in terms if t not in mine])
    return list(variables).index(v), [(lo, hi, rest + slope * v + offset) for lo, hi, slope, offset in runs]


def dim_cuts(exprs, variables: Sequence[sympy.Symbol], sizes: Sequence[int]) -> list[tuple[int, ...]]:
    """Per loop dim, where to split it so that the modular indexing and floor divisions of that
    dim's variable in `exprs` become affine: ``ModularIndexing(i, d, m)`` needs cuts at d and
    d * m, ``FloorDiv(i, d)`` at d (a repeat, a reshape of a transposed tensor). Only cuts that
    divide the dim and form a divisibility chain are kept; an index the split cannot make
    affine is refused later, by affine_index."""
    wanted = [set() for _ in sizes]
    position = {v: d for d, v in enumerate(variables)}
    for expr in exprs:
        expr = sympy.sympify(expr)
        for f in expr.atoms(ModularIndexing, FloorDiv):
            base, div = f.args[0], f.args[1]
            if base not in position or not isinstance(div, sympy.Integer):
                continue
            d = position[base]
            points = [int(div)]
            if isinstance(f, ModularIndexing) and isinstance(f.args[2], sympy.Integer):
                points.append(int(div) * int(f.args[2]))
            wanted[d] |= {c for c in points if 1 < c < sizes[d] and sizes[d] % c == 0}
    cuts = []
    for d, found in enumerate(wanted):
        chain = sorted(found)
        if any(b % a for a, b in zip(chain, chain[1:])):
            chain = []
        cuts.append(tuple(chain))
    return cuts


def split_sizes(size: int, cuts: Sequence[int]) -> tuple[int, ...]:
    """A dim of `size` split at `cuts` (a divisibility chain), outermost first."""
    points = (1, *cuts, size)
    return tuple(outer // inner for inner, outer in reversed(list(zip(points, points[1:]))))


def common_ranges(all_ranges: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """The coarsest ranges every one of `all_ranges` factors into (same numel), or NotCapturable.

    Each range tuple cuts the flat iteration space at the suffix products of
    its dims; the common ranges cut at the union of those points, which works
    exactly when the points form a divisibility chain.
    """
    numels = {math.prod(r) for r in all_ranges}
    if len(numels) != 1:
        raise NotCapturable(f"different iteration sizes {sorted(numels)}")
    (numel,) = numels
    if numel <= 1:
        return (numel,)  # one element (or none): a single loop of that size
    cuts = {1, numel}
    for ranges in all_ranges:
        suffix = 1
        for size in reversed(ranges):
            suffix *= size
            cuts.add(suffix)
    cuts = sorted(cuts)
    for inner, outer in zip(cuts, cuts[1:]):
        if outer % inner:
            shapes = " and ".join(str(tuple(r)) for r in all_ranges)
            raise NotCapturable(f"loop ranges {shapes} have no common refinement")
    # cuts are suffix products from the innermost dim outwards.
    return tuple(outer // inner for inner, outer in reversed(list(zip(cuts, cuts[1:]))))


def node_vars(ranges: Sequence[int], common: Sequence[int], variables: Sequence[sympy.Symbol]) -> list:
    """Each of `ranges`' loop variables as an affine expression in the `common` ranges' `variables`."""
    if math.prod(common) == 0:
        return [sympy.Integer(0) for _ in ranges]
    exprs = []
    j = len(common)
    # Walk from the innermost dim: each node dim covers the next few common dims.
    for size in reversed(ranges):
        expr, scale, covered = sympy.Integer(0), 1, 1
        while covered < size:
            j -= 1
            expr += variables[j] * scale
            scale *= common[j]
            covered *= common[j]
        if covered != size:
            raise AssertionError(f"{tuple(ranges)} does not factor into {tuple(common)}")
        exprs.append(expr)
    return list(reversed(exprs))


def _cut_chain(cuts: set[int], what) -> tuple[int, ...]:
    """Ranges (outermost first) from a set of suffix-product cut points, or NotCapturable."""
    cuts = sorted(cuts)
    for inner, outer in zip(cuts, cuts[1:]):
        if outer % inner:
            raise NotCapturable(f"loop ranges {what()} have no common refinement")
    return tuple(outer // inner for inner, outer in reversed(list(zip(cuts, cuts[1:]))))


def _suffix_cuts(ranges: Sequence[int], scale: int = 1) -> set[int]:
    cuts, suffix = set(), scale
    for size in reversed(ranges):
        suffix *= size
        cuts.add(suffix)
    return cuts


def reduction_common_ranges(
    reductions: Sequence[tuple[Sequence[int], Sequence[int]]],
    full: Sequence[Sequence[int]] = (),
    outer: Sequence[Sequence[int]] = (),
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(outer ranges, reduction ranges) that every node of a reduction group factors into.

    `reductions` are the reduction nodes' (ranges, reduction_ranges); they must
    agree on numel and rnumel. `full` are pointwise nodes over the whole
    (outer x reduced) space (prologues, epilogues), `outer` pointwise nodes over
    the outer space only (e.g. mean = sum / n). The reduced dims iterate
    innermost, so the whole space is cut at rnumel and, above it, at the outer
    nodes' cuts times rnumel; a full-space node contributes cuts on both sides.
    """
    numels = {(math.prod(r), math.prod(rr)) for r, rr in reductions}
    if len(numels) != 1:
        raise NotCapturable(f"reductions over different (outer, reduced) sizes {sorted(numels)}")
    ((numel, rnumel),) = numels
    for r in full:
        if math.prod(r) != numel * rnumel:
            raise NotCapturable(f"pointwise ranges {tuple(r)} do not cover the reduction's {numel}x{rnumel}")
    for r in outer:
        if math.prod(r) != numel:
            raise NotCapturable(f"pointwise ranges {tuple(r)} do not cover the reduction's outer {numel}")
    if numel * rnumel == 0:
        raise NotCapturable("a reduction with no elements")

    def what():
        return " and ".join(str(tuple(r)) for r in [*full, *outer, *(r for pair in reductions for r in pair)])

    cuts = {1, rnumel, numel * rnumel}
    for r, rr in reductions:
        cuts |= _suffix_cuts(rr) | _suffix_cuts(r, rnumel)
    for r in outer:
        cuts |= _suffix_cuts(r, rnumel)
    for r in full:
        cuts |= _suffix_cuts(r)
    ranges = _cut_chain(cuts, what)
    # rnumel is a cut, so the chain splits there: the last dims multiply to rnumel.
    split, tail = len(ranges), 1
    while tail < rnumel:
        split -= 1
        tail *= ranges[split]
    return ranges[:split] or (1,), ranges[split:] or (1,)
