"""Fusion: the whole pointwise kernel is one program; only stores leave the chip.

Every IR value becomes (at most) one scratchpad tile per tile of the
iteration space, and the straight-line values become one sfp instruction
each (``Step``). Decisions made here:

* each distinct (buffer, index) is loaded once per tile, however many
  values read it; dead values (not reaching a store) are dropped;
* a Cast that cannot change the value (to the tile's own dtype, or a float
  widened to fp32: the sfp reads every float in fp32 anyway) is an alias of
  its operand, not an instruction;
* loaded tiles and stored tiles are *streamed*: the load/store unit fills
  and drains them while the sfp works on another tile, so they are double
  buffered (scratchpad.py); work tiles (intermediates) live only while the
  sfp computes one tile, so one copy suffices and tiles whose live ranges
  do not overlap can share bytes;
* a stored value whose tile is not in the output buffer's dtype (an fp32
  result stored to fp16) or is a broadcast tile gets a final ``copy`` into a
  tile of the buffer's dtype: that write is the one rounding (Inductor's
  CPU codegen rounds at the store too);
* constants are filled once per core into one-stick scalar tiles, with the
  value the tile holds (layout.operand_value: 1e39 in fp32 is inf).
"""

from __future__ import annotations

from dataclasses import dataclass

from spyre_runtime.program import isa

from ..errors import Unsupported
from ..kernel_ir import Cast, Constant, Load, Op, PointwiseKernel
from ._dump import Describable
from .layout import FLOATS, Access, LayoutPlan, operand_value

# Inductor op name -> (ISA instruction kind, ISA op). "square" is x * x.
UNARY = {n: n for n in ("neg", "abs", "exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt",
                        "reciprocal", "sigmoid", "tanh", "relu", "erf", "sin", "cos", "floor", "ceil",
                        "trunc", "round", "sign", "isnan", "isinf")}
UNARY["logical_not"] = "not"
BINARY = {"add": "add", "sub": "sub", "mul": "mul", "truediv": "div", "div": "div", "div_rn": "div",
          "floordiv": "floordiv", "truncdiv": "truncdiv", "mod": "fmod", "fmod": "fmod", "remainder": "remainder",
          "pow": "pow", "maximum": "max", "minimum": "min",
          "eq": "eq", "ne": "ne", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge",
          "logical_and": "and", "logical_or": "or", "logical_xor": "xor"}
# Bitwise ops and shifts: integers and bools only (Inductor never asks them of floats).
INTEGER_ONLY = {"bitwise_and": "bitwise_and", "bitwise_or": "bitwise_or", "bitwise_xor": "bitwise_xor",
                "bitwise_not": "bitwise_not", "bitwise_left_shift": "shl", "bitwise_right_shift": "shr"}
FLOAT_ONLY = {"truediv", "div", "div_rn"}  # integer division has its own ops (floordiv, truncdiv, mod)


@dataclass(frozen=True)
class TileValue:
    name: str
    dtype: str
    kind: str        # "load", "const", "work", "out" (written by the sfp, stored by ls)
    broadcast: str   # on the (row, stick) axes of a tile: none, rows, cols, scalar

    @property
    def streamed(self) -> bool:
        """Filled or drained by the load/store unit: double buffered."""
        return self.kind in ("load", "out")


@dataclass(frozen=True)
class Step:
    kind: str              # "unary", "binary", "select"
    op: str                # the ISA operation
    dst: str
    args: tuple[str, ...]


@dataclass(frozen=True)
class FusionPlan(Describable):
    tiles: tuple[TileValue, ...]
    loads: tuple[tuple[str, Access], ...]       # (tile, access): one per distinct input index
    constants: tuple[tuple[str, object], ...]   # (tile, value) filled once
    steps: tuple[Step, ...]                     # the sfp's work per tile, in order
    stores: tuple[tuple[str, Access], ...]      # (tile, access)
    live: tuple[tuple[str, int, int], ...]      # work tiles: (tile, defining step, last reading step)

    def tile(self, name: str) -> TileValue:
        for t in self.tiles:
            if t.name == name:
                return t
        raise KeyError(name)


def _broadcast(access: Access, layout: LayoutPlan) -> str:
    on_rows = layout.row_dim is None or access.strides[layout.row_dim] == 0
    if layout.stick_dim is None:  # one element per stick: a tile is a column
        return "rows" if on_rows else "none"
    on_cols = access.strides[layout.stick_dim] == 0
    return {(False, False): "none", (True, False): "rows", (False, True): "cols", (True, True): "scalar"}[
        (on_rows, on_cols)]


def _needed(kernel: PointwiseKernel) -> set[int]:
    need = {s.value for s in kernel.stores}
    for i in range(len(kernel.values) - 1, -1, -1):
        if i in need:
            v = kernel.values[i]
            if isinstance(v, Op):
                need.update(v.args)
            elif isinstance(v, Cast):
                need.add(v.arg)
    return need


def plan_fusion(kernel: PointwiseKernel, layout: LayoutPlan) -> FusionPlan:
    where = f"kernel {kernel.name!r}"
    need = _needed(kernel)
    tiles: dict[str, TileValue] = {}
    value_tile: dict[int, str] = {}
    loads: dict[tuple, str] = {}
    load_list, const_list, steps = [], [], []
    consts: dict[tuple, str] = {}

    def new(prefix: str, dtype: str, kind: str, broadcast: str = "none") -> str:
        name = f"{prefix}{len(tiles)}"
        tiles[name] = TileValue(name, dtype, kind, broadcast)
        return name

    for i, v in enumerate(kernel.values):
        if i not in need:
            continue
        dtype = layout.value(i).dtype
        if isinstance(v, Load):
            access = layout.load(i)
            key = (access.buffer, access.strides, access.offset)
            if key not in loads:
                loads[key] = new("in", dtype, "load", _broadcast(access, layout))
                load_list.append((loads[key], access))
            value_tile[i] = loads[key]
        elif isinstance(v, Constant):
            value = operand_value(v.value, dtype)
            key = (repr(value), dtype)
            if key not in consts:
                consts[key] = new("k", dtype, "const", "scalar")
                const_list.append((consts[key], value))
            value_tile[i] = consts[key]
        elif isinstance(v, Cast):
            src = value_tile[v.arg]
            src_dtype = tiles[src].dtype
            if dtype == src_dtype or (dtype == "fp32" and src_dtype in FLOATS):
                value_tile[i] = src  # the value cannot change
            else:
                value_tile[i] = new("t", dtype, "work")
                steps.append(Step("unary", "copy", value_tile[i], (src,)))
        elif isinstance(v, Op):
            args = tuple(value_tile[a] for a in v.args)
            kind, op, args = _isa_op(where, i, v, args, [tiles[a].dtype for a in args])
            value_tile[i] = new("t", dtype, "work")
            steps.append(Step(kind, op, value_tile[i], args))
    store_list = []
    for s, access in zip(kernel.stores, layout.stores):
        src = value_tile[s.value]
        t = tiles[src]
        if t.dtype != access.dtype or t.broadcast != "none" or t.kind == "const":
            out = new("o", access.dtype, "out")
            steps.append(Step("unary", "copy", out, (src,)))
            src = out
        elif t.kind == "work":
            tiles[src] = TileValue(t.name, t.dtype, "out", t.broadcast)  # the ls unit drains it
        store_list.append((src, access))
    live = _live_ranges(tiles, steps)
    return FusionPlan(tuple(tiles.values()), tuple(load_list), tuple(const_list), tuple(steps),
                      tuple(store_list), live)


def _isa_op(where, i, v: Op, args, dtypes):
    floats = all(d in FLOATS for d in dtypes)
    name = v.name
    if name == "square":
        return "binary", "mul", (args[0], args[0])
    if name == "where":
        return "select", "where", args
    if name in INTEGER_ONLY:
        if any(d in FLOATS for d in dtypes):
            raise Unsupported(f"{where} value {i}: {name} on {'/'.join(dtypes)} (integers and bools only)")
        return ("unary" if len(args) == 1 else "binary"), INTEGER_ONLY[name], args
    if name in FLOAT_ONLY and not floats:
        raise Unsupported(f"{where} value {i}: {name} on integers")
    if name in UNARY and len(args) == 1:
        op, table, kind = UNARY[name], isa.UNARY, "unary"
    elif name in BINARY and len(args) == 2:
        op, table, kind = BINARY[name], isa.BINARY, "binary"
    else:
        raise Unsupported(f"{where} value {i}: no spyre instruction for op {name!r}")
    if op not in table:
        raise Unsupported(f"{where} value {i}: the ISA has no {kind} op {op!r} (for {name})")
    return kind, op, args


def _live_ranges(tiles, steps) -> tuple[tuple[str, int, int], ...]:
    first, last = {}, {}
    for k, st in enumerate(steps):
        for a in st.args:
            last[a] = k
        first.setdefault(st.dst, k)
        last.setdefault(st.dst, k)
    return tuple((n, first[n], max(last[n], first[n])) for n, t in tiles.items()
                 if t.kind == "work" and n in first)
