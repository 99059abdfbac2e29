"""Whether a gather's index tensor is one capture turns into a direct (affine or piecewise) index.

A gather's row indices reach the program in one of two ways (inductor/capture.py): computed
from the loop indices by integer arithmetic alone (``torch.arange(n) + 1``, ``(i + s) % n``),
capture follows the arithmetic (``_index_from_indices``) and the load is no gather at all; any
other index must be in memory, the gather's index column (families/indirect: "gathers and
scatters take loaded indices"). An index computed on chip in any other way -- T5's relative
position bucket goes through ``log`` of a float and a ``where`` -- would inline into the gather
and be refused, so lowerings.py realizes it: a pointwise program of its own writes it.

``direct`` runs the index's loader once under a probe handler that follows what capture's
``_symbolic`` follows (index values, integer constants, add/sub/mul/neg, integer casts, floor
division and modulo by a constant) plus the Min/Max/Abs bends Inductor folds in; the bends must
each lie along one loop variable, as a load's piecewise index must (indexing.piecewise_affine).
Anything else -- a load, a float, a compare -- says no.
"""

from __future__ import annotations

import sympy
import torch
from torch._inductor import ir
from torch._inductor.ops_handler import DefaultHandler
from torch._inductor.virtualized import V
from torch.utils._sympy.functions import FloorDiv, Max, Min, ModularIndexing

from .index_bends import is_bent

_BEND_TYPES = (Min, Max, sympy.Min, sympy.Max, sympy.Abs)


class _Opaque(Exception):
    """The index is not integer arithmetic on the loop indices."""


def _sym(x) -> sympy.Expr:
    x = getattr(x, "value", x)  # V.ops may wrap values in OpsValue
    if isinstance(x, bool):
        raise _Opaque
    if isinstance(x, int):
        return sympy.Integer(x)
    if isinstance(x, sympy.Expr):
        return x
    raise _Opaque


class _Probe(DefaultHandler):
    def _default(self, name, args, kwargs):
        raise _Opaque

    def index_expr(self, expr, dtype):
        if dtype.is_floating_point or dtype == torch.bool:
            raise _Opaque
        return sympy.sympify(expr)

    def constant(self, value, dtype):
        if dtype.is_floating_point or dtype == torch.bool:
            raise _Opaque
        return sympy.Integer(int(value))

    def to_dtype(self, x, dtype, src_dtype=None, use_compute_types=True):
        if dtype.is_floating_point or dtype == torch.bool:
            raise _Opaque
        return _sym(x)

    def identity(self, x):
        return _sym(x)

    def add(self, a, b):
        return _sym(a) + _sym(b)

    def sub(self, a, b):
        return _sym(a) - _sym(b)

    def mul(self, a, b):
        return _sym(a) * _sym(b)

    def neg(self, a):
        return -_sym(a)

    def minimum(self, a, b):
        return Min(_sym(a), _sym(b))

    def maximum(self, a, b):
        return Max(_sym(a), _sym(b))

    def abs(self, a):
        return sympy.Abs(_sym(a))

    def floordiv(self, a, b):
        return FloorDiv(_sym(a), self._divisor(b))

    def remainder(self, a, b):
        return ModularIndexing(_sym(a), 1, self._divisor(b))

    mod = remainder

    @staticmethod
    def _divisor(b) -> sympy.Integer:
        b = _sym(b)
        if not isinstance(b, sympy.Integer) or b <= 0:
            raise _Opaque
        return b


def direct(index: ir.IRNode) -> bool:
    """Whether `index` (a TensorBox) is integer arithmetic on the loop indices whose bends each
    lie along one loop variable: capture makes such a gather a direct load."""
    try:
        if index.get_read_names():  # it loads: data (and a loader may not index a flexible layout yet)
            return False
    except (AttributeError, NotImplementedError):
        return False
    try:
        loader = index.make_loader()
        variables = [sympy.Symbol(f"probe{d}", integer=True, nonnegative=True) for d in range(len(index.get_size()))]
        with V.set_ops_handler(_Probe()):
            expr = _sym(loader(variables))
    except _Opaque:
        return False
    except (AttributeError, NotImplementedError, TypeError):  # a node the probe cannot follow
        return False
    if not is_bent(expr):
        return True
    return all(len(b.free_symbols) <= 1 for b in expr.atoms(*_BEND_TYPES))
