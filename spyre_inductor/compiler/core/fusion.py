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

from ..ir.errors import Unsupported
from ..ir.kernel_ir import RANDOM_OPS, Cast, Constant, IndexValue, Load, Op, PointwiseKernel, SizeValue, needed
from ..symbolic.reduce import fill_of
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


def aliases(dtype: str, src_dtype: str) -> bool:
    """Whether a Cast of a `src_dtype` tile to `dtype` cannot change the value (the same dtype, or
    a float widened to fp32: the sfp reads every float in fp32 anyway): an alias, not a step."""
    return dtype == src_dtype or (dtype == "fp32" and src_dtype in FLOATS)


class ValueTiles:
    """The tiles and sfp steps of a kernel's computed values, shared by the pointwise lowering
    (plan_fusion), the gather/scatter one (families/indirect/lowering.py) and the matmul's epilogue: the
    family brings its loads, this makes the rest: constants (one tile per value, filled once),
    index values (an iota from the tile's position), casts (an alias where the value cannot
    change), ops, and each store's source tile (module docstring). A computed value varies over
    every one of `axes`; its dtype is the layout's, or `dtype_of`'s (value position -> tile
    dtype) for a family without a pointwise layout (no index values then)."""

    def __init__(self, kernel, layout: LayoutPlan | None, axes: tuple[str, ...], dtype_of=None):
        self.kernel, self.layout, self.where = kernel, layout, f"kernel {kernel.name!r}"
        self.dtype_of = dtype_of if dtype_of is not None else (lambda i: layout.value(i).dtype)
        self.full = frozenset(axes)
        self.tiles: dict[str, Tile] = {}
        self.value_tile: dict[int, str] = {}
        self.steps: list[Step] = []
        self.constants: list[tuple[str, object]] = []
        self._consts: dict[tuple, str] = {}
        self.aliased = self.converted = self.rounded = 0

    # Names are labels for a person (summary, errors); what a tile is for is its role and space.
    def new(self, prefix: str, dtype: str, role: Role, tile_space: frozenset[str] | None = None, **staging) -> str:
        name = f"{prefix}{len(self.tiles)}"
        self.tiles[name] = Tile(name, dtype, self.full if tile_space is None else tile_space, role, **staging)
        return name

    def constant(self, key, prefix: str, dtype: str, value) -> str:
        """The CONSTANT tile of `key` holding `value`: one per key, filled once per core."""
        if key not in self._consts:
            self._consts[key] = self.new(prefix, dtype, Role.CONSTANT, frozenset())
            self.constants.append((self._consts[key], value))
        return self._consts[key]

    def compute(self, i: int, v) -> None:
        """The tile of value `i` (a constant, index value, cast or op), and its step if any."""
        if isinstance(v, Constant):
            dtype = self.dtype_of(i)
            value = operand_value(v.value, dtype)
            self.value_tile[i] = self.constant((repr(value), dtype), "k", dtype, value)
        elif isinstance(v, SizeValue):
            # a size known only at launch (issue 18): a constant tile filled from the size words
            dtype = self.dtype_of(i)
            fill = fill_of(self.kernel, v)
            self.value_tile[i] = self.constant((fill, dtype), "z", dtype, fill)
        elif isinstance(v, IndexValue):
            dtype = self.dtype_of(i)
            # computed on chip from the tile's position, never loaded (Step.value: the counting)
            counting = self.layout.counting(i)
            self.value_tile[i] = self.new("ix", dtype, Role.TEMPORARY, counting_space(counting.strides, self.layout))
            self.steps.append(Step("iota", "iota", self.value_tile[i], (), value=counting))
        elif isinstance(v, Cast):
            src = self.value_tile[v.arg]
            dtype = self.dtype_of(i)
            if aliases(dtype, self.tiles[src].dtype):
                self.value_tile[i] = src  # the value cannot change
                self.aliased += 1
            else:
                self.value_tile[i] = self.new("t", dtype, Role.TEMPORARY)
                self.steps.append(Step("unary", "copy", self.value_tile[i], (src,)))
                self.converted += 1
        elif isinstance(v, Op):
            args = tuple(self.value_tile[a] for a in v.args)
            kind, op, args = isa_op(self.where, i, v, args, [self.tiles[a].dtype for a in args])
            self.value_tile[i] = self.new("t", self.dtype_of(i), Role.TEMPORARY)
            self.steps.append(Step(kind, op, self.value_tile[i], args))
        else:
            raise Unsupported(f"{self.where} value {i}: {type(v).__name__} is not computed by the sfp")

    def stored(self, value: int, access: Access) -> str:
        """The OUTPUT tile a store drains: the value's own tile, or a final copy into the buffer's
        dtype (the one rounding), or a broadcast or constant made whole."""
        src = self.value_tile[value]
        t = self.tiles[src]
        if t.dtype != access.dtype or t.space != self.full or t.role is Role.CONSTANT:
            out = self.new("o", access.dtype, Role.OUTPUT)
            self.steps.append(Step("unary", "copy", out, (src,)))
            self.rounded += 1
            return out
        if t.role is Role.TEMPORARY:
            self.tiles[src] = replace(t, role=Role.OUTPUT)  # the ls unit drains it
        return src


def plan_fusion(kernel: PointwiseKernel, layout: LayoutPlan) -> TileKernel:
    """The kernel as one tile kernel: constants filled once, one chunk phase (per tile of the
    iteration space) with its loads, the sfp's steps and its stores."""
    axes = axes_of(layout)
    b = ValueTiles(kernel, layout, axes)
    need = needed(kernel.values, kernel.stores)
    loads: dict[tuple, str] = {}
    load_list = []
    reads = 0
    staged: dict[str, str] = {}  # tile -> its transposed staging tile (one, whatever moves it)

    def stage(tile: str, access: Access) -> None:
        if access.transposed and tile not in staged:
            t = b.tiles[tile]
            staged[tile] = b.new("st", t.dtype, Role.STAGING, t.space, of=tile, relayout=Relayout.TRANSPOSED)

    for i, v in enumerate(kernel.values):
        if i not in need:
            continue
        if isinstance(v, Load):
            reads += 1
            access = layout.load(i)
            key = (access.buffer, access.strides, access.offset)
            if key not in loads:
                loads[key] = b.new("in", layout.value(i).dtype, Role.INPUT, access_space(access, layout))
                load_list.append((loads[key], access))
                stage(loads[key], access)
            b.value_tile[i] = loads[key]
        else:
            b.compute(i, v)
    store_list = []
    for s, access in zip(kernel.stores, layout.stores):
        src = b.stored(s.value, access)
        store_list.append((src, access))
        stage(src, access)
    notes = (f"{len(load_list)} load(s) for {reads} read(s) of the inputs (one per distinct access)",
             f"casts: {b.aliased} alias their operand (the value cannot change), {b.converted} copy (a conversion)",
             f"{b.rounded} of {len(store_list)} store(s) through a final copy (into the buffer's dtype, or a "
             f"broadcast or constant made whole); the others store their value's tile",
             f"{len(b.constants)} constant(s), filled once per core",
             f"relayout {layout.relayout}: {layout.reason}")
    moved = [f"{'load' if (tile, a) in load_list else 'store'} {tile} {'<-' if (tile, a) in load_list else '->'} "
             f"{a.buffer} via {staged[tile]}" for tile, a in load_list + store_list if a.transposed]
    if moved:
        notes += (f"transposed on chip by the load/store unit (staging tiles): {'; '.join(moved)}",)
    chunk = Phase(PhaseKind.CHUNK, tuple(b.steps), tuple(load_list), tuple(store_list),
                  "per tile of the iteration space: load, compute, store")
    tk = TileKernel("pointwise", axes, tuple(b.tiles.values()), tuple(b.constants), (chunk,), notes=notes)
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
    if name in RANDOM_OPS:  # the ISA's philox instruction (issue 19), its mode the step's op
        if any(d in FLOATS or d == "bool" for d in dtypes):
            raise Unsupported(f"{where} value {i}: {name} of a {'/'.join(dtypes)} key or counter")
        return "random", RANDOM_OPS[name], args
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


__all__ = ["BINARY", "INTEGER_ONLY", "ROWS", "STICKS", "UNARY", "ValueTiles", "access_space", "aliases", "axes_of",
           "isa_op", "plan_fusion", "streamed"]
