"""Index values with bends: Min, Max and Abs of affine expressions in the loop variables.

An index VALUE (``ops.index_expr``: an iota, a position, a relative distance) is data the
kernel computes, not an address. Inductor folds integer arithmetic on iotas into the sympy
expression it hands over: T5's relative position bucket, ``-torch.min(j - i, 0)``, arrives as
the one index value ``-Min(0, -i0 + i1)``; a bidirectional bucket's ``abs(j - i)`` as
``Abs(i0 - i1)``; a clamp as ``Max(lo, Min(hi, ...))``. Such a value is affine on each side of
a bend that runs across several loop variables (a diagonal), so neither the IR's affine Index
nor a load's piecewise runs along one variable (indexing.piecewise_affine) can say it.

On the card it is what eager computes: each affine part an iota (IndexValue), each bend one
sfp op over them (minimum, maximum, abs), summed with the integer coefficients of the
expression. ``split`` says which parts an expression is made of; capture builds the values.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy
from torch.utils._sympy.functions import Max, Min

from ..ir.errors import NotCapturable

# sympy function -> the IR op that computes it (torch's own Min/Max and sympy's both occur).
_BENDS = {Min: "minimum", sympy.Min: "minimum", Max: "maximum", sympy.Max: "maximum", sympy.Abs: "abs"}


@dataclass(frozen=True)
class Bend:
    """coef * op(args): one bent term of an index value, each arg an index expression itself."""

    coef: int
    op: str  # "minimum", "maximum" (two or more args, folded pairwise) or "abs" (one)
    args: tuple


def is_bent(expr) -> bool:
    """Whether `expr` contains a Min, Max or Abs (anywhere: as a term or inside another function)."""
    return bool(sympy.sympify(expr).atoms(*_BENDS))  # (torch's Min/Max are no sympy.Function)


def split(expr, what: str) -> tuple[sympy.Expr, tuple[Bend, ...]]:
    """(the affine rest, the bent terms) of `expr`, expanded: expr == rest + sum(coef * op(args)).

    NotCapturable when a term is a bend times something other than an integer (a product of two
    bends, a bend times a loop variable): not a sum of affine pieces, which the sfp ops build."""
    expr = sympy.expand(sympy.sympify(expr))
    rest, bends = [], []
    for term in sympy.Add.make_args(expr):
        if not is_bent(term):
            rest.append(term)
            continue
        coef, body = term.as_coeff_Mul()
        op = _BENDS.get(type(body))
        if op is None or not isinstance(coef, sympy.Integer):
            raise NotCapturable(f"non-affine index {expr} for {what} (its term {term} is not an integer "
                                f"times one Min, Max or Abs)")
        bends.append(Bend(int(coef), op, tuple(body.args)))
    return sympy.Add(*rest), tuple(bends)
