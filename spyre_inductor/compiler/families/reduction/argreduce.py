"""argmax / argmin: (value, index) accumulators combined with compares and selects.

Resident rows reduce in one instruction (the index reduction of the whole
row). Chunked and ring plans keep, per row, the best value and its index
so far: each chunk's best (value, index) is taken when strictly better, or
NaN over a non-NaN best, so the first index wins ties and NaN wins like
PyTorch. A chunk's indices are relative to it: the running index of the
chunk's first element, an accumulator that starts at the first reduced
index of the core's slice (``SLICE_START``: 0, or the slice's k0 on a
ring) and grows by the chunk's extent, is added to them.
"""

from __future__ import annotations

import enum

from ...ir.errors import Unsupported
from ...ir.kernel_ir import Reduction
from ...core.layout import FLOATS
from ...core.reduction_ops import INDEX_OPS, INTEGERS, identity
from .space import PER_ROW, SCALAR
from ...core.tiles import ChunkValue, Role, Step


class SliceValue(str, enum.Enum):
    """A fill value codegen resolves per core (a Step.value)."""

    START = "the first reduced index of the core's slice"

    def __str__(self) -> str:
        return self.value


SLICE_START = SliceValue.START


def accumulate(b, i, v: Reduction, arg: str, level: int) -> None:
    adt = b.tiles[arg].dtype
    if adt == "bool":  # compared as 0/1 (the index instruction, like torch.argmax, takes no bools)
        t = b.new("int32", b.vspace[v.arg], Role.TEMPORARY)
        b.defs.setdefault(v.arg, []).append(Step("unary", "copy", t, (arg,)))
        b.resident_steps.append(b.defs[v.arg][-1])
        arg, adt = t, "int32"
    if adt not in FLOATS + INTEGERS:
        raise Unsupported(f"{b.where}: value {i}: {v.op} of {adt}")
    vdt = "fp32" if adt in FLOATS else adt  # integers are compared in their own width: exact
    vop = INDEX_OPS[v.op]
    idx = b.new("int32", PER_ROW, Role.ACCUMULATOR)
    b.vtile[i] = idx
    b.red.append((level, i))
    b.resident_steps.append(Step("reduce", v.op, idx, (arg,)))
    if b.mode == "resident":
        b.accs.append(idx)
        return
    best = b.new(vdt, PER_ROW, Role.ACCUMULATOR)
    m, li = b.new(vdt, PER_ROW, Role.TEMPORARY), b.new("int32", PER_ROW, Role.TEMPORARY)
    start = b.new("int32", SCALAR, Role.ACCUMULATOR)  # the index of the chunk's first element
    b.red_init[i] = [Step("fill", "fill", best, value=identity(vop, vdt)), Step("fill", "fill", idx, value=0),
                     Step("fill", "fill", start, value=SLICE_START)]
    chunk = [Step("reduce", vop, m, (arg,)), Step("reduce", v.op, li, (arg,)),
             Step("binary", "add", li, (li, start))]
    chunk += take(b, m, li, best, idx, vop)
    chunk.append(Step("binary", "add", start, (start, b.chunk_constant(ChunkValue.EXTENT_INT))))
    b.red_chunk[i] = chunk
    b.accs += [best, idx]
    if b.mode == "ring":  # incoming (earlier indices) vs own (later): own wins only if strictly better or NaN
        b.red_combine += take(b, b.landing(best), b.landing(idx), best, idx, vop, own_wins=True)


def take(b, new_v, new_i, best, idx, vop, own_wins=False) -> list[Step]:
    """(best, idx) <- (new_v, new_i) where new_v is strictly better or NaN over a non-NaN best.

    own_wins=True is the ring combine: `best`/`idx` are the later candidate and the incoming
    ones the earlier, so the roles swap (the earlier wins ties)."""
    w = [b.new("bool", PER_ROW, Role.TEMPORARY) for _ in range(3)]
    if own_wins:  # result = own if own better else incoming; write into own tiles
        early_v, early_i, late_v, late_i = new_v, new_i, best, idx
    else:
        early_v, early_i, late_v, late_i = best, idx, new_v, new_i
    cmp = "gt" if vop == "max" else "lt"
    steps = [Step("binary", cmp, w[0], (late_v, early_v)),       # strictly better
             Step("binary", "ne", w[1], (late_v, late_v)),        # late is NaN
             Step("binary", "eq", w[2], (early_v, early_v)),      # early is not NaN
             Step("binary", "and", w[1], (w[1], w[2])),
             Step("binary", "or", w[0], (w[0], w[1]))]
    steps += [Step("select", "where", best, (w[0], late_v, early_v)),
              Step("select", "where", idx, (w[0], late_i, early_i))]
    return steps


__all__ = ["SLICE_START", "SliceValue", "accumulate", "take"]
