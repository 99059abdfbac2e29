"""Reductions over a symbolic range (issue 18): what the reduced elements past the size become.

A kernel whose reduced range is symbolic is planned, like every symbolic kernel, at its
bucket's maximum: its loops run the maximum's trip counts at every size. The loads of a buffer
whose symbolic dim the reduced range walks are clipped at launch to the bytes the buffer has
(the rest of each scratchpad row lands as zeros), so no load passes a buffer; what remains is
that the elements past the size must not change a reduction's result:

* a reduction other than a dot reduces ``where(r < size, arg, identity)``: the mask compares
  the reduced index (an iota) with the size, a scalar the program fills from its size words
  (kernel_ir.SizeValue -> isa.Fill of a SizeExpr). ``mask`` inserts it; ``problem`` checks it
  is there (so a rebucketed kernel's own check proves it, not the capture that built it).
* a dot (a matmul's K) is left as it is when each of its operands is zero past the size: a
  clipped load of a buffer whose bytes end where the size does (``zero_past``); a product of
  zeros adds nothing. (The PE plans take loads, not selects: a mask there would lose the plan.)
* a scan needs nothing: the prefix at r < size reads only elements before r; the prefixes past
  the size are stored past the outputs' bytes (clipped), as every symbolic store is checked.
* welford (var, layer_norm) counts its elements: a mask cannot say "not an element", so it is
  refused.

``fill_of`` is how every family fills a SizeValue's tile (the mask's bound here; a size in a
value, such as a mean's divisor, anywhere).
"""

from __future__ import annotations

import dataclasses

from ..ir.errors import NotCapturable
from ..core.reduction_ops import WELFORD, identity
from ..ir.kernel_ir import Cast, Constant, Index, IndexValue, Kernel, Load, Op, Reduction, SizeValue, renumbered



def mask(kernel: Kernel, d: int, name: str, coef: int, const: int) -> Kernel:
    """`kernel` with every reduction other than a dot over symbolic reduced range `d` (an index
    into ranges + reduction_ranges, which is ``coef * name + const``) masked past the size."""
    values = list(kernel.values)
    if not any(isinstance(v, Reduction) and v.op != "dot" for v in values):
        return kernel
    for v in values:
        if isinstance(v, Reduction) and v.op in WELFORD:
            raise NotCapturable(f"{v.op} over symbolic size {name} (a masked element would still be counted)")
    rank = len(kernel.ranges) + len(kernel.reduction_ranges)
    out: list = [IndexValue(Index(tuple(int(j == d) for j in range(rank))), "int64"),
                 SizeValue(name, coef, const), Op("lt", (0, 1), "bool")]
    remap: dict[int, int] = {}
    for i, v in enumerate(values):
        if isinstance(v, Reduction) and v.op != "dot":
            arg_dtype = values[v.arg].dtype
            out.append(Constant(identity(v.op, arg_dtype), arg_dtype))
            out.append(Op("where", (2, remap[v.arg], len(out) - 1), arg_dtype))
            v = dataclasses.replace(v, arg=len(out) - 1)
        else:
            v = renumbered(v, remap.__getitem__)
        remap[i] = len(out)
        out.append(v)
    stores = tuple(renumbered(s, remap.__getitem__) for s in kernel.stores)
    return dataclasses.replace(kernel, values=tuple(out), stores=stores)


def _is_mask(kernel: Kernel, pos: int, d: int, name: str, coef: int, const: int) -> bool:
    """Value `pos` is ``r_d < coef * name + const``."""
    v = kernel.values[pos]
    if not (isinstance(v, Op) and v.name == "lt"):
        return False
    a, b = (kernel.values[p] for p in v.args)
    rank = len(kernel.ranges) + len(kernel.reduction_ranges)
    return (isinstance(a, IndexValue) and a.index == Index(tuple(int(j == d) for j in range(rank)))
            and b == SizeValue(name, coef, const))


def zero_past(kernel: Kernel, pos: int, d: int, span_of, past_of) -> bool:
    """Value `pos` is zero at every iteration whose index along `d` is at least the size: a load
    clipped there (`past_of(buffer, index)`: the lowest element it reads past the size, at least
    `span_of(buffer)`: the elements the buffer has at that size), a cast of one, or a product of
    such values."""
    v = kernel.values[pos]
    if isinstance(v, Load):
        return not v.index.indirect and v.index.strides[d] > 0 and past_of(v.buffer, v.index) >= span_of(v.buffer)
    if isinstance(v, Cast):
        return zero_past(kernel, v.arg, d, span_of, past_of)
    if isinstance(v, Op) and v.name == "mul":
        return all(zero_past(kernel, a, d, span_of, past_of) for a in v.args)
    return False


def problem(kernel: Kernel, d: int, name: str, coef: int, const: int, span_of, past_of) -> str | None:
    """Why the reductions of `kernel` over symbolic reduced range `d` would not compute the result
    of the size zero_past's functions are at (None: every one is masked, or a dot of operands that are zero past it)."""
    for i, v in enumerate(kernel.values):
        if not isinstance(v, Reduction):
            continue
        if v.op in WELFORD:
            return f"value {i} is {v.op} over symbolic size {name} (a masked element would still be counted)"
        if v.op == "dot":
            if not zero_past(kernel, v.arg, d, span_of, past_of):
                return (f"value {i} is a dot over symbolic size {name} whose operands are not all loads that "
                        f"end where the size does (the elements past it would not be zero)")
            continue
        arg = kernel.values[v.arg]
        if not (isinstance(arg, Op) and arg.name == "where" and _is_mask(kernel, arg.args[0], d, name, coef, const)
                and kernel.values[arg.args[2]] == Constant(identity(v.op, arg.dtype), arg.dtype)):
            return f"value {i} ({v.op}) over symbolic size {name} is not masked past the size"
    return None


def fill_of(kernel: Kernel, v: SizeValue):
    """The fill of a SizeValue's scalar tile: the launch's size, clamped to what the bucket admits
    (a size word outside the artifact's bounds never reaches a program: the launch refuses it)."""
    from spyre_runtime.program.operands import SizeExpr

    (hi,) = (h for n, _, h in kernel.symbolic.sizes if n == v.symbol)
    return SizeExpr(v.symbol, hi=v.coef * hi + v.const, coef=v.coef, const=v.const)


__all__ = ["fill_of", "mask", "problem", "zero_past"]
