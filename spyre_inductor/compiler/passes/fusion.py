"""Fusion: the pointwise family's lowering; the whole kernel is one program, only stores leave the chip.

The kernel becomes one tile kernel (tiles.py) on the axes ``rows`` and
``sticks`` of a tile (``rows`` only in the one-element-per-stick layout):
every IR value becomes (at most) one scratchpad tile per tile of the
iteration space, and the straight-line values become one sfp instruction
each (``Step``), in one CHUNK phase with the tile's loads and stores.
Each tile has a role and a space (the axes it varies over; a broadcast
operand varies over fewer). Decisions made here:

* each distinct (buffer, index) is loaded once per tile (an INPUT tile),
  however many values read it; dead values (not reaching a store) are
  dropped;
* a Cast that cannot change the value (to the tile's own dtype, or a float
  widened to fp32: the sfp reads every float in fp32 anyway) is an alias of
  its operand, not an instruction;
* INPUT and OUTPUT tiles are *streamed* (``streamed``): the load/store unit
  fills and drains them while the sfp works on another tile, so they are
  multi-buffered (scratchpad.py); TEMPORARY tiles (intermediates) live only
  while the sfp computes one tile, so one copy suffices and tiles whose
  live ranges do not overlap can share bytes;
* a stored value whose tile is not in the output buffer's dtype (an fp32
  result stored to fp16), does not vary over every axis (a broadcast) or is
  a constant gets a final ``copy`` into an OUTPUT tile of the buffer's
  dtype: that write is the one rounding (Inductor's CPU codegen rounds at
  the store too); a temporary stored as it is becomes the OUTPUT tile;
* constants are filled once per core into one-stick CONSTANT tiles (space:
  no axes), with the value the tile holds (layout.operand_value: 1e39 in
  fp32 is inf);
* a transposed access (layout.py's ``transposed`` relayout: producer and
  consumer disagree on the stick dim) gets a STAGING tile of the tile it
  moves (Relayout.TRANSPOSED, the reductions' and matmuls' role for the
  same thing): the load/store unit moves rows of whole sticks along the
  access's contiguous dim between device memory and the staging tile and
  transposes between it and the tile the sfp computes on (codegen.py);
  views stay free (they are only strides of the accesses).
"""

from __future__ import annotations

from dataclasses import replace

from spyre_runtime.program import isa

from ..errors import Unsupported
from ..kernel_ir import Cast, Constant, IndexValue, Load, Op, PointwiseKernel
from .layout import FLOATS, Access, LayoutPlan, operand_value
from .tiles import Phase, PhaseKind, Relayout, Role, Step, Tile, TileKernel

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


# The tile axes of a pointwise kernel: a tile is [rows, sticks] (tiling.py), or a column of
# [rows] in the one-element-per-stick layout (layout.py: no stick dim).
ROWS, STICKS = "rows", "sticks"


def axes_of(layout: LayoutPlan) -> tuple[str, ...]:
    return (ROWS, STICKS) if layout.stick_dim is not None else (ROWS,)


def streamed(tile: Tile) -> bool:
    """Filled or drained by the load/store unit while the sfp works on another tile: the loaded
    and the stored tiles (stream buffers, scratchpad.py); temporaries and constants are not."""
    return tile.role in (Role.INPUT, Role.OUTPUT)


def access_space(access: Access, layout: LayoutPlan) -> frozenset[str]:
    """The axes a loaded value varies over: those its access walks (a stride of 0 is a broadcast).
    A kernel without a row dim (one row per tile) has no load that varies over the rows."""
    axes = set()
    if layout.row_dim is not None and access.strides[layout.row_dim] != 0:
        axes.add(ROWS)
    if layout.stick_dim is not None and access.strides[layout.stick_dim] != 0:
        axes.add(STICKS)
    return frozenset(axes)


def counting_space(strides: tuple[int, ...], layout: LayoutPlan) -> frozenset[str]:
    """The axes an index value varies over (the dims its strides walk, as access_space)."""
    axes = set()
    if layout.row_dim is not None and strides[layout.row_dim] != 0:
        axes.add(ROWS)
    if layout.stick_dim is not None and strides[layout.stick_dim] != 0:
        axes.add(STICKS)
    return frozenset(axes)


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


def plan_fusion(kernel: PointwiseKernel, layout: LayoutPlan) -> TileKernel:
    """The kernel as one tile kernel: constants filled once, one chunk phase (per tile of the
    iteration space) with its loads, the sfp's steps and its stores."""
    where = f"kernel {kernel.name!r}"
    axes = axes_of(layout)
    full = frozenset(axes)
    need = _needed(kernel)
    tiles: dict[str, Tile] = {}
    value_tile: dict[int, str] = {}
    loads: dict[tuple, str] = {}
    load_list, const_list, steps = [], [], []
    consts: dict[tuple, str] = {}
    reads, aliased, converted = 0, 0, 0

    # Names are labels for a person (summary, errors); what a tile is for is its role and space.
    def new(prefix: str, dtype: str, role: Role, tile_space: frozenset[str] = full, **staging) -> str:
        name = f"{prefix}{len(tiles)}"
        tiles[name] = Tile(name, dtype, tile_space, role, **staging)
        return name

    staged: dict[str, str] = {}  # tile -> its transposed staging tile (one, whatever moves it)

    def stage(tile: str, access: Access) -> None:
        if access.transposed and tile not in staged:
            t = tiles[tile]
            staged[tile] = new("st", t.dtype, Role.STAGING, t.space, of=tile, relayout=Relayout.TRANSPOSED)

    for i, v in enumerate(kernel.values):
        if i not in need:
            continue
        dtype = layout.value(i).dtype
        if isinstance(v, Load):
            reads += 1
            access = layout.load(i)
            key = (access.buffer, access.strides, access.offset)
            if key not in loads:
                loads[key] = new("in", dtype, Role.INPUT, access_space(access, layout))
                load_list.append((loads[key], access))
                stage(loads[key], access)
            value_tile[i] = loads[key]
        elif isinstance(v, Constant):
            value = operand_value(v.value, dtype)
            key = (repr(value), dtype)
            if key not in consts:
                consts[key] = new("k", dtype, Role.CONSTANT, frozenset())
                const_list.append((consts[key], value))
            value_tile[i] = consts[key]
        elif isinstance(v, IndexValue):
            # computed on chip from the tile's position, never loaded (Step.value: the counting)
            counting = layout.counting(i)
            value_tile[i] = new("ix", dtype, Role.TEMPORARY, counting_space(counting.strides, layout))
            steps.append(Step("iota", "iota", value_tile[i], (), value=counting))
        elif isinstance(v, Cast):
            src = value_tile[v.arg]
            src_dtype = tiles[src].dtype
            if dtype == src_dtype or (dtype == "fp32" and src_dtype in FLOATS):
                value_tile[i] = src  # the value cannot change
                aliased += 1
            else:
                value_tile[i] = new("t", dtype, Role.TEMPORARY)
                steps.append(Step("unary", "copy", value_tile[i], (src,)))
                converted += 1
        elif isinstance(v, Op):
            args = tuple(value_tile[a] for a in v.args)
            kind, op, args = isa_op(where, i, v, args, [tiles[a].dtype for a in args])
            value_tile[i] = new("t", dtype, Role.TEMPORARY)
            steps.append(Step(kind, op, value_tile[i], args))
    store_list, rounded = [], 0
    for s, access in zip(kernel.stores, layout.stores):
        src = value_tile[s.value]
        t = tiles[src]
        if t.dtype != access.dtype or t.space != full or t.role is Role.CONSTANT:
            out = new("o", access.dtype, Role.OUTPUT)
            steps.append(Step("unary", "copy", out, (src,)))
            src = out
            rounded += 1
        elif t.role is Role.TEMPORARY:
            tiles[src] = replace(t, role=Role.OUTPUT)  # the ls unit drains it
        store_list.append((src, access))
        stage(src, access)
    notes = (f"{len(load_list)} load(s) for {reads} read(s) of the inputs (one per distinct access)",
             f"casts: {aliased} alias their operand (the value cannot change), {converted} copy (a conversion)",
             f"{rounded} of {len(store_list)} store(s) through a final copy (into the buffer's dtype, or a "
             f"broadcast or constant made whole); the others store their value's tile",
             f"{len(const_list)} constant(s), filled once per core",
             f"relayout {layout.relayout}: {layout.reason}")
    moved = [f"{'load' if (tile, a) in load_list else 'store'} {tile} {'<-' if (tile, a) in load_list else '->'} "
             f"{a.buffer} via {staged[tile]}" for tile, a in load_list + store_list if a.transposed]
    if moved:
        notes += (f"transposed on chip by the load/store unit (staging tiles): {'; '.join(moved)}",)
    chunk = Phase(PhaseKind.CHUNK, tuple(steps), tuple(load_list), tuple(store_list),
                  "per tile of the iteration space: load, compute, store")
    tk = TileKernel("pointwise", axes, tuple(tiles.values()), tuple(const_list), (chunk,), notes=notes)
    tk.check()
    return tk


def isa_op(where, i, v: Op, args, dtypes):
    """(ISA instruction kind, ISA op, args) of IR op `v` at value `i` on tiles of `dtypes`."""
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


_isa_op = isa_op  # the reductions' lowering imports the old name (until it is ported onto tiles.py)

__all__ = ["BINARY", "INTEGER_ONLY", "ROWS", "STICKS", "UNARY", "access_space", "axes_of", "isa_op",
           "plan_fusion", "streamed"]
