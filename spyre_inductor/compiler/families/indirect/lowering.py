"""The gather/scatter family's lowering (issue 16): an IndirectKernel -> layout + pointwise tile kernel.

A gather or scatter is pointwise work whose load or store addresses have a
data-dependent term: the tile kernel is the pointwise family's (axes
``rows`` and ``sticks``, one CHUNK phase; tiling, scratchpad, verifier and
the elementwise emitter are shared), and what differs is how the ls unit
moves the indirect tiles (``Move``: an isa Gather or Scatter whose row
addresses add each index term's checked value times its stride).

Decisions made here:

* the index must be on chip before the ls needs it, so an Indirect value's
  argument must be a loaded integer (through widening casts): its INPUT tile
  is the gather's or scatter's row-index column. An index computed on chip
  (roll's ``(iota + shift) % n``) is refused by name;
* index values that vary only over the rows of a tile give row moves: each
  row one DMA of whole sticks (an embedding row, a KV-cache row). An index
  that varies along the stick dim (``gather`` along the last dim) lays the
  kernel out one element per stick (core/layout.py's "elements" mode): each
  element is its own DMA of one stick, charged so;
* a gathered tile varies over the axes its affine part walks and those its
  index varies over;
* a scatter that writes one element from iterations neither its affine part
  nor its index tells apart is refused (which iteration wins is not PyTorch's).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...ir.errors import Unsupported
from ...ir.kernel_ir import Cast, Constant, IndexValue, IndirectKernel, Indirect, Load, Op, needed
from ...core.fusion import ROWS, STICKS, ValueTiles
from ...core.layout import (ELEMENTS_MODE, STICKS_MODE, Access, Counting, LayoutPlan, _choose_dims, _value_layout,
    buffers_of, canonical_dims)
from ...core.tiles import Phase, PhaseKind, Role, TileKernel

_INTEGERS = ("int8", "uint8", "int16", "int32", "int64")
_VARIES = 1 << 40  # a stand-in stride for "varies through its index": never 0 or 1, never negative


@dataclass(frozen=True)
class Term:
    """One indirect term of a move: index column `tile`, element stride, bound, wrapping."""

    tile: str
    stride: int
    bound: int
    wrap_neg: bool


@dataclass(frozen=True)
class Move:
    """How the ls moves one tile whose addresses have indirect terms."""

    terms: tuple[Term, ...]
    op: str                 # the aten op, for the out-of-range error
    accumulate: bool = False


@dataclass(frozen=True)
class Lowered:
    layout: LayoutPlan
    tile_kernel: TileKernel
    gathers: tuple[tuple[str, Move], ...]  # loaded tile -> its gather
    scatters: tuple[Move | None, ...]      # per store of the chunk phase: its scatter, or None

    def gather(self, tile: str) -> Move | None:
        return dict(self.gathers).get(tile)


def index_load(kernel: IndirectKernel, pos: int) -> int:
    """The Load an Indirect value's index comes from (through widening integer casts)."""
    v = kernel.values[pos]
    where = f"kernel {kernel.name!r} value {pos} ({v.op})"
    arg = v.arg
    while isinstance(kernel.values[arg], Cast):
        cast = kernel.values[arg]
        src = kernel.values[cast.arg].dtype
        if cast.dtype not in _INTEGERS or src not in _INTEGERS or _INTEGERS.index(cast.dtype) < _INTEGERS.index(src):
            raise Unsupported(f"{where}: an index through a {src} -> {cast.dtype} cast is not planned yet")
        arg = cast.arg
    ld = kernel.values[arg]
    if not isinstance(ld, Load) or ld.index.indirect:
        raise Unsupported(f"{where}: an index computed on chip ({type(ld).__name__}) is not planned yet "
                          f"(gathers and scatters take loaded indices)")
    return arg


def _unsupported_values(kernel: IndirectKernel) -> None:
    indirect = {i for i, v in enumerate(kernel.values) if isinstance(v, Indirect)}
    for i, v in enumerate(kernel.values):
        if not isinstance(v, (Load, Constant, Cast, Op, Indirect, IndexValue)):
            raise Unsupported(f"kernel {kernel.name!r} value {i}: {type(v).__name__} in a gather/scatter kernel")
        uses = set(getattr(v, "args", ())) | ({v.arg} if isinstance(v, Cast) else set())
        if uses & indirect:
            # the tile behind an Indirect is the raw index column (the move checks and wraps it)
            raise Unsupported(f"kernel {kernel.name!r} value {i}: computing with a checked index value")
    if any(s.value in indirect for s in kernel.stores):
        raise Unsupported(f"kernel {kernel.name!r}: storing a checked index value")


def lower(kernel: IndirectKernel) -> Lowered:
    kernel.check()
    where = f"kernel {kernel.name!r}"
    if kernel.reduction_ranges:
        raise Unsupported(f"{where}: indirect indexing inside a reduction is not planned")
    _unsupported_values(kernel)
    for st in kernel.stores:
        if st.mode == "atomic_add" and kernel.buffer(st.buffer).dtype in ("fp16", "bf16"):
            # the ISA rounds each contribution into the 16-bit row; spyre's lowerings
            # (inductor/accumulating_scatters.py) scatter-add 16-bit floats into an fp32 buffer and
            # round once, so a kernel that reaches here was built otherwise: refused, never a
            # differently rounded sum
            raise Unsupported(f"{where}: an accumulating scatter into {kernel.buffer(st.buffer).dtype} "
                              f"{st.buffer!r} rounds every contribution; 16-bit sums accumulate in an fp32 "
                              f"buffer (compiler/inductor/accumulating_scatters.py)")
    loads = [(i, v) for i, v in enumerate(kernel.values) if isinstance(v, Load)]
    for i, v in loads:
        if v.dtype != kernel.buffer(v.buffer).dtype:
            raise Unsupported(f"{where}: value {i} loads {v.buffer!r} as {v.dtype}")
    sources = {p: index_load(kernel, p) for p, v in enumerate(kernel.values) if isinstance(v, Indirect)}
    counted = [(i, v) for i, v in enumerate(kernel.values) if isinstance(v, IndexValue)]
    raw = ([v.index.strides for _, v in loads] + [s.index.strides for s in kernel.stores]
           + [v.index.strides for _, v in counted])
    ranges, dim_map, strides = canonical_dims(kernel.ranges, raw)
    first = len(loads) + len(kernel.stores)
    counts = tuple((i, Counting(v.dtype, strides[first + k], v.index.offset)) for k, (i, v) in enumerate(counted))
    accesses = [Access(v.buffer, v.dtype, strides[k], v.index.offset) for k, (_, v) in enumerate(loads)]
    store_accesses = [Access(s.buffer, kernel.buffer(s.buffer).dtype, strides[len(loads) + k], s.index.offset)
                      for k, s in enumerate(kernel.stores)]
    access_of = {i: a for (i, _), a in zip(loads, accesses)}
    # the canonical dims each Indirect value varies over: those its index load walks
    index_dims = {p: frozenset(d for d, s in enumerate(access_of[src].strides) if s) for p, src in sources.items()}
    # The dims a choice of rows sees an access vary over include those its index varies over: a
    # table row gathered per position is not broadcast over the positions (the rows would go
    # along the heads it is broadcast over instead: layout._broadcast_row_dim)
    def walked(access, index) -> Access:
        dims = {d for p, _ in index.indirect for d in index_dims[p]}
        return replace(access, strides=tuple(s if s or d not in dims else _VARIES for d, s in enumerate(access.strides)))

    seen_loads = [walked(a, v.index) for (_, v), a in zip(loads, accesses)]
    seen_stores = [walked(a, s.index) for s, a in zip(kernel.stores, store_accesses)]
    choice = _choose_dims(where, ranges, list(enumerate(seen_loads)), seen_stores)
    stick_dim, row_dim = choice.stick_dim, choice.row_dim
    # (a transposed relayout is not planned with gathers: their operands move one element per stick)
    if stick_dim is not None and (choice.relayout != STICKS_MODE
                                  or any(stick_dim in dims for dims in index_dims.values())):
        # an index along the stick dim: each element is its own move, one element per stick
        stick_dim = None
        row_dim = max(d for d in range(len(ranges)) if all(a.strides[d] >= 0 for a in accesses + store_accesses))
    for s, acc in zip(kernel.stores, store_accesses):
        walked = {d for d, st in enumerate(acc.strides) if st} | {d for p, _ in s.index.indirect for d in index_dims[p]}
        if any(r > 1 and d not in walked for d, r in enumerate(ranges)):
            raise Unsupported(f"{where}: the store to {s.buffer!r} writes one element from several iterations")
    values = tuple(_value_layout(where, i, v, kernel) for i, v in enumerate(kernel.values))
    layout = LayoutPlan(ranges, dim_map, stick_dim, row_dim, buffers_of(kernel), tuple(zip(access_of, accesses)),
                        tuple(store_accesses), values,
                        relayout=STICKS_MODE if stick_dim is not None else ELEMENTS_MODE, counts=counts)
    return _tile_kernel(kernel, layout, sources, index_dims)


def _space_of(access: Access, layout: LayoutPlan, dims=frozenset()) -> frozenset[str]:
    axes = set()
    for d in range(len(layout.ranges)):
        if access.strides[d] == 0 and d not in dims:
            continue
        if d == layout.row_dim:
            axes.add(ROWS)
        elif d == layout.stick_dim:
            axes.add(STICKS)
    return frozenset(axes)


def _tile_kernel(kernel, layout, sources, index_dims) -> Lowered:
    axes = (ROWS, STICKS) if layout.stick_dim is not None else (ROWS,)
    b = ValueTiles(kernel, layout, axes)  # constants, index values, casts, ops, stores: as pointwise
    moves: dict[str, Move] = {}  # gathers
    scatters: list[Move | None] = []
    plain_loads, gathered_loads = [], []
    seen: dict[tuple, str] = {}

    def load_tile(i) -> str:
        if i in b.value_tile:
            return b.value_tile[i]
        v, access = kernel.values[i], layout.load(i)
        terms = tuple(Term(load_tile(sources[p]), s, kernel.values[p].bound, kernel.values[p].wrap_neg)
                      for p, s in v.index.indirect)
        dims = frozenset(d for p, _ in v.index.indirect for d in index_dims[p])
        key = (access.buffer, access.strides, access.offset, terms)
        if key not in seen:
            seen[key] = b.new("in", layout.value(i).dtype, Role.INPUT, _space_of(access, layout, dims))
            (gathered_loads if terms else plain_loads).append((seen[key], access))
            if terms:
                moves[seen[key]] = Move(terms, _op_name(kernel, v.index.indirect))
        b.value_tile[i] = seen[key]
        return seen[key]

    need = needed(kernel.values, kernel.stores)
    for i, v in enumerate(kernel.values):
        if i not in need:
            continue
        if isinstance(v, Load):
            load_tile(i)
        elif isinstance(v, Indirect):
            b.value_tile[i] = load_tile(sources[i])  # its value on chip is the index column itself
        else:
            b.compute(i, v)
    for st in kernel.stores:  # indices of scatters are loaded too
        for p, _ in st.index.indirect:
            load_tile(sources[p])
    stores = []
    for s, access in zip(kernel.stores, layout.stores):
        src = b.stored(s.value, access)
        if s.index.indirect or s.mode is not None:
            terms = tuple(Term(b.value_tile[sources[p]], st, kernel.values[p].bound, kernel.values[p].wrap_neg)
                          for p, st in s.index.indirect)
            scatters.append(Move(terms, _op_name(kernel, s.index.indirect), s.mode == "atomic_add"))
        else:
            scatters.append(None)
        stores.append((src, access))
    notes = (f"{len(gathered_loads)} gathered load(s), {sum(1 for s in kernel.stores if s.index.indirect)} "
             f"scatter(s); {'row' if layout.stick_dim is not None else 'element'} moves (one DMA per "
             f"{'row' if layout.stick_dim is not None else 'element'})",
             f"{len(plain_loads)} plain load(s) first, then a fence: the gathers read their index columns")
    chunk = Phase(PhaseKind.CHUNK, tuple(b.steps), tuple(plain_loads + gathered_loads), tuple(stores),
                  "per tile: load the indices and plain operands, gather, compute, store or scatter")
    tk = TileKernel("indirect", axes, tuple(b.tiles.values()), tuple(b.constants), (chunk,), notes=notes)
    tk.check()
    return Lowered(layout, tk, tuple(moves.items()), tuple(scatters))


def _op_name(kernel, terms) -> str:
    ops = {kernel.values[p].op for p, _ in terms}
    return ", ".join(sorted(o for o in ops if o)) or "indexing"


__all__ = ["Lowered", "Move", "Term", "index_load", "lower"]
