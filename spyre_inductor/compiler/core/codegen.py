"""Instruction selection: the plans become one dataflow Program (per core, per unit).

Per core, over its share of the iteration space:

* sfp: fill the CONSTANT tiles once; then, around the stream, the loops of
  the loop dims; inside, per tile, pop ``full<b>``, run the chunk phase's
  steps on buffer b's tiles (streamed tiles: copy b; the others: their one
  copy), push ``done<b>``;
* ls: the same loops; inside, the multi-buffered stream of
  spyre_runtime.program.emitter.pipeline (load tile t into buffer
  t % B, store it once the sfp is done, load tile t + 2; a smaller
  remainder tile last, through buffer 0).

Device addresses are affine in the loop counters: the byte offset of an
access at tile origin (i_loop..., t) is
itemsize * (offset + sum(stride_d * (share start_d + i_d)) + stride_stream * t * T).
A tile that does not vary over the rows axis loads one row, one that does
not vary over the sticks axis one element per row (a strided column load,
one element per stick), and the sfp reads it as the broadcast tile its
space says (tiles.broadcast_of). Inputs and outputs are placeholder symbols; there are no
temporaries (nothing but the stores leaves the chip).

A transposed access (layout.py) moves its tile through its STAGING tile:
a load brings ``cols`` rows of the tile's ``rows`` elements each (along
the access's contiguous dim, whole sticks) into the staging tile and the
load/store unit transposes it into the tile's buffer before signalling
``full``; a store transposes the tile into the staging tile and stores
that. When the row dim is a loop in blocks of rows (TilePlan.row_block),
the stream runs once per block: a loop over a share's full blocks, then
its shorter last block, if any.

The gather/scatter family (families/indirect/lowering.py) reuses this with `gathers`
(loaded tile -> its move) and `scatters` (per store, its move or None): such a
tile is moved by an isa Gather or Scatter whose row-index columns are tiles
of the same stream buffer, and the gathers come after a fence, once the
index columns loaded before them have landed.
"""

from __future__ import annotations

from contextlib import ExitStack

from spyre_runtime.program.emitter import Aff, Unit, assemble, pipeline, pipeline_queues
from spyre_runtime.program.isa import (Binary, Fence, Fill, Gather, Iota, Load, Philox, Scatter, Select, Store, Transpose,
                                       Unary)
from spyre_runtime.program.operands import ITEMSIZE, STICK, RowIndex
from spyre_runtime.program.program import Program, Symbol

from ..ir.errors import PlanError
from .allocate import Placement
from .division import CoreShare
from .fusion import ROWS, STICKS, streamed
from .layout import Access, LayoutPlan
from .plans import Division
from .tiles import PhaseKind, Role, TileKernel, broadcast_of
from .tiling import TilePlan


def build_program(name: str, layout: LayoutPlan, tile_kernel: TileKernel, tiling: TilePlan,
                  placement: Placement, division: Division, notes: str = "", gathers=None,
                  scatters=None) -> Program:
    symbols = tuple(Symbol(b.name, b.role, b.dtype, b.shape, b.strides) for b in layout.buffers)
    queues, cores = [], {}
    for share in division.shares:
        cores[share.core], qs = _core(tile_kernel, tiling, placement, share, dict(gathers or {}), scatters)
        queues += qs
    return assemble(name, symbols, queues, cores, notes, check=False)


def _core(tk: TileKernel, tiling: TilePlan, spad: Placement, share: CoreShare, gathers=None, scatters=None):
    chunk = tk.phase(PhaseKind.CHUNK)
    ls, sfp = Unit(), Unit()
    q, queues = pipeline_queues(share.core, tiling.buffers)
    for tile, value in tk.constants:
        a = spad.at(tile)
        sfp.emit(Fill(sfp.tile(a.offset, tk.tile(tile).dtype, 1, 1, STICK), value))
    stick_axis = STICKS if STICKS in tk.axes else None
    # per tile: its dtype, whether it has a copy per stream buffer, the ISA broadcast it is read with
    sfp_view = {t.name: (t.dtype, streamed(t), broadcast_of(t.space, ROWS, stick_axis)) for t in tk.tiles}
    staging = {t.of: t.name for t in tk.with_role(Role.STAGING)}
    stream = tiling.stream_dim
    extent = share.counts[stream]
    step = min(tiling.tile_extent, extent)
    tiles, rem = divmod(extent, step)
    block = tiling.row_block  # > 1: the row dim is a loop in blocks of this many rows
    # the tile's rows walk this dim (streamed, or a block of rows around a streamed stick dim)
    row_axis = tiling.row_dim if stream == tiling.row_dim or block > 1 else None
    counters: dict[int, Aff] = {}
    rows_now = [1]  # rows of the block being emitted (the last block of a share may be shorter)

    def shape(size):
        n = size or step
        if stream == tiling.stick_dim:
            return rows_now[0], n
        cols = share.counts[tiling.stick_dim] if tiling.stick_dim is not None else 1
        if stream != tiling.row_dim:  # a stream along a third dim: each tile is a block of rows
            return rows_now[0], cols
        return n, cols

    def device(u, access: Access, t) -> object:
        isz = ITEMSIZE[access.dtype]
        value = Aff(access.offset) + sum(
            (access.strides[d] * share.starts[d] for d in range(len(tiling.ranges))), 0)
        for d, c in counters.items():
            value = value + c * access.strides[d]
        value = value + t * (access.strides[stream] * step)
        return u.dev(access.buffer, value * isz)

    def row_stride(access: Access) -> int:
        return access.strides[row_axis] * ITEMSIZE[access.dtype] if row_axis is not None else 0

    def row_indices(u, move, b, n_rows, isz):
        out = []
        for term in move.terms:
            dtype, buffered, broadcast = sfp_view[term.tile]
            a = spad.at(term.tile, b if buffered else None)
            column = u.tile(a.offset, dtype, n_rows, 1, a.row_stride, "none" if broadcast == "none" else "scalar"
                            if broadcast in ("scalar", "rows") else broadcast)
            out.append(RowIndex(column, term.stride * isz, term.bound, term.wrap_neg))
        return tuple(out)

    def transposed_rows(access: Access, rows: int, cols: int):
        """(rows, row bytes, device stride) of a transposed move: a row per element of the stick
        dim, each the tile's rows along the row dim, which the access walks contiguously."""
        isz = ITEMSIZE[access.dtype]
        return cols, rows * isz, access.strides[tiling.stick_dim] * isz if cols > 1 else 0

    def load(u, t, b, size):
        rows, cols = shape(size)
        fenced = False
        for tile, access in chunk.loads:
            a, tv, isz = spad.at(tile, b), tk.tile(tile), ITEMSIZE[access.dtype]
            if access.transposed:
                st = spad.at(staging[tile])
                n, nbytes, stride = transposed_rows(access, rows, cols)
                u.emit(Load(u.sp(st.offset), device(u, access, t), n, nbytes, stride, st.row_stride),
                       Transpose(u.tile(a.offset, tv.dtype, rows, cols, a.row_stride),
                                 u.tile(st.offset, tv.dtype, cols, rows, st.row_stride)))
                continue
            n_rows = rows if tv.varies(ROWS) else 1
            n_bytes = cols * isz if tv.varies(STICKS) or stick_axis is None else isz
            move = (gathers or {}).get(tile)
            if move is None:
                u.emit(Load(u.sp(a.offset), device(u, access, t), n_rows, n_bytes,
                            row_stride(access) if n_rows > 1 else 0, a.row_stride))
                continue
            if not fenced:  # the index columns are loads in flight: the gathers read them
                u.emit(Fence())
                fenced = True
            u.emit(Gather(u.sp(a.offset), device(u, access, t), n_rows, n_bytes,
                          row_stride(access) if n_rows > 1 else 0, a.row_stride, row_indices(u, move, b, n_rows, isz),
                          move.op))

    def store(u, t, b, size):
        rows, cols = shape(size)
        for k, (tile, access) in enumerate(chunk.stores):
            a, isz = spad.at(tile, b), ITEMSIZE[access.dtype]
            if access.transposed:
                st = spad.at(staging[tile])
                n, nbytes, stride = transposed_rows(access, rows, cols)
                u.emit(Transpose(u.tile(st.offset, access.dtype, cols, rows, st.row_stride),
                                 u.tile(a.offset, access.dtype, rows, cols, a.row_stride)),
                       Store(device(u, access, t), u.sp(st.offset), n, nbytes, stride, st.row_stride))
                continue
            move = scatters[k] if scatters else None
            if move is None:
                u.emit(Store(device(u, access, t), u.sp(a.offset), rows, cols * isz,
                             row_stride(access) if rows > 1 else 0, a.row_stride))
                continue
            u.emit(Scatter(device(u, access, t), u.sp(a.offset), rows, cols * isz,
                           row_stride(access) if rows > 1 else 0, a.row_stride, row_indices(u, move, b, rows, isz),
                           move.op, move.accumulate, access.dtype))

    def compute(u, t, b, size):
        rows, cols = shape(size)

        def tile(name):
            dtype, buffered, broadcast = sfp_view[name]
            a = spad.at(name, b if buffered else None)
            return u.tile(a.offset, dtype, rows, cols, a.row_stride, broadcast)

        for st in chunk.steps:
            if st.kind == "iota":
                u.emit(iota(u, tile(st.dst), st.value, t))
            else:
                emit_elementwise(u, st, tile)

    def iota(u, dst, counting, t):
        # the value at the tile's origin, as device() finds an access's address (in elements)
        value = Aff(counting.offset) + sum(
            (counting.strides[d] * share.starts[d] for d in range(len(tiling.ranges))), 0)
        for d, c in counters.items():
            value = value + c * counting.strides[d]
        value = value + t * (counting.strides[stream] * step)
        start, steps = u.affine(value)
        row_step = counting.strides[row_axis] if row_axis is not None else 0
        col_step = counting.strides[tiling.stick_dim] if tiling.stick_dim is not None else 0
        return Iota(dst, start, steps, row_step, col_step)

    def stream_tiles() -> None:
        pipeline(ls, sfp, tiles, rem, q, load, compute, store, tiling.buffers, phased=tiling.buffers == 2)

    with ExitStack() as stack:
        for d in tiling.loop_dims:
            n = share.counts[d]
            if n > 1 and not (block > 1 and d == tiling.row_dim):
                counters[d] = stack.enter_context(ls.loop(n))
                stack.enter_context(sfp.loop(n))
        if block > 1:
            _blocks(ls, sfp, share.counts[tiling.row_dim], block, tiling.row_dim, counters, rows_now, stream_tiles)
        else:
            stream_tiles()
    return {"ls": ls.instrs, "sfp": sfp.instrs}, queues


def _blocks(ls: Unit, sfp: Unit, rows: int, block: int, dim: int, counters, rows_now, stream_tiles) -> None:
    """The stream once per block of `block` rows of `dim` (a loop over the full blocks, then the
    shorter last one): counters[dim] is the block's first row, rows_now[0] its rows."""
    full, last = divmod(rows, block)
    for count, n, first in ((full, block, 0), (1 if last else 0, last, full * block)):
        if not count:
            continue
        rows_now[0] = n
        with ExitStack() as stack:
            if count > 1:
                i = stack.enter_context(ls.loop(count))
                stack.enter_context(sfp.loop(count))
                counters[dim] = i * block + first
            else:
                counters[dim] = Aff(first)
            stream_tiles()
        del counters[dim]


def emit_elementwise(unit, step, tile) -> None:
    """One unary, binary, select or random step on the sfp, its tiles resolved by `tile(name)` (every
    family's elementwise steps are emitted here)."""
    dst, args = tile(step.dst), [tile(x) for x in step.args]
    if step.kind == "unary":
        unit.emit(Unary(step.op, dst, args[0]))
    elif step.kind == "binary":
        unit.emit(Binary(step.op, dst, args[0], args[1]))
    elif step.kind == "select":
        unit.emit(Select(dst, args[0], args[1], args[2]))
    elif step.kind == "random":  # args: key, counter; the op is the philox mode (fusion.isa_op)
        unit.emit(Philox(step.op, dst, args[0], args[1]))
    else:
        raise PlanError(f"step {step.kind} {step.op} is not an elementwise step")
