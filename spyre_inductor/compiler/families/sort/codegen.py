"""The sort family's program: per core, its rows streamed in chunks through the network.

ls: load chunk t's rows into key buffer t % 2 (one load: rows of n elements, each scratchpad row
a whole number of sticks), then, once the sfp is done with it, store the first k columns of the
key and index tiles as the values and indices rows. sfp: set the columns past n to the pad (a
select by a column mask made once per core), write each row's element indices (an iota), then
run every step of the network (network.network) as one ``cmpx`` over the chunk's rows (a top-k
network's steps over fewer columns once it has halved them), then cast the first k indices to int64.
"""

from __future__ import annotations

from dataclasses import dataclass

from spyre_runtime.program.emitter import Unit, assemble, pipeline, pipeline_queues
from spyre_runtime.program.isa import Binary, CompareExchange, Fill, Iota, Load, Select, Store, Unary
from spyre_runtime.program.operands import ITEMSIZE

from .plan import INDEX_DTYPE, NETWORK_INDEX, SortShape, Tiling


@dataclass(frozen=True)
class Share:
    """A core's rows: [first, first + count)."""

    core: int
    first: int
    count: int


def build_sort_program(name: str, symbols, shape: SortShape, tiling: Tiling, place, shares, notes: str = "",
                       check: bool = True):
    queues, cores = [], {}
    for share in shares:
        ls, sfp = Unit(), Unit()
        q, qs = pipeline_queues(share.core)
        queues += qs
        _core(ls, sfp, q, shape, tiling, place, share)
        cores[share.core] = {"ls": ls.instrs, "sfp": sfp.instrs}
    return assemble(name, symbols, queues, cores, notes, check=check)


def _core(ls: Unit, sfp: Unit, q, shape: SortShape, tiling: Tiling, place, share: Share) -> None:
    ks, iz = ITEMSIZE[shape.dtype], ITEMSIZE[INDEX_DTYPE]
    N = shape.N
    keys = [place.at("keys", b).offset for b in range(2)]
    index = [place.at("index", b).offset for b in range(2)]
    out = [place.at("indices", b).offset for b in range(2)]
    padded = shape.pad is not None
    if padded:  # once per core: valid[c] = c < n, and the pad as a scalar
        columns, valid = place.at("columns").offset, place.at("valid").offset
        length, pad = place.at("length").offset, place.at("pad").offset
        sfp.emit(Iota(sfp.tile(columns, "int32", 1, N, place.at("columns").row_stride), 0, (), 0, 1),
                 Fill(sfp.tile(length, "int32", 1, 1, 128), shape.n),
                 Binary("lt", sfp.tile(valid, "bool", 1, N, place.at("valid").row_stride),
                        sfp.tile(columns, "int32", 1, N, place.at("columns").row_stride),
                        sfp.tile(length, "int32", 1, N, 128, "scalar")),
                 Fill(sfp.tile(pad, shape.dtype, 1, 1, 128), shape.pad))

    def rows_of(size):
        return tiling.rows if size is None else size

    def load(unit, t, b, size):
        first = t * tiling.rows + share.first
        unit.emit(Load(unit.sp(keys[b]), unit.dev(shape.source.buffer, shape.source.byte(first)), rows_of(size),
                       shape.n * ks, shape.source.row_bytes_stride, shape.key_stride))

    def compute(unit, t, b, size):
        rows = rows_of(size)
        kt = unit.tile(keys[b], shape.dtype, rows, N, shape.key_stride)
        it = unit.tile(index[b], NETWORK_INDEX, rows, N, shape.index_stride)
        if padded:
            unit.emit(Select(kt, unit.tile(valid, "bool", rows, N, place.at("valid").row_stride, "rows"), kt,
                             unit.tile(pad, shape.dtype, rows, N, 128, "scalar")))
        unit.emit(Iota(it, 0, (), 0, 1))
        for step in shape.steps:
            unit.emit(CompareExchange(unit.tile(keys[b], shape.dtype, rows, step.cols, shape.key_stride),
                                      unit.tile(index[b], NETWORK_INDEX, rows, step.cols, shape.index_stride),
                                      step.distance, step.block, shape.descending, step.halve))
        unit.emit(Unary("copy", unit.tile(out[b], INDEX_DTYPE, rows, shape.k, shape.out_stride),
                        unit.tile(index[b], NETWORK_INDEX, rows, shape.k, shape.index_stride)))

    def store(unit, t, b, size):
        first = t * tiling.rows + share.first
        rows = rows_of(size)
        unit.emit(Store(unit.dev(shape.values.buffer, shape.values.byte(first)), unit.sp(keys[b]), rows,
                        shape.k * ks, shape.values.row_bytes_stride, shape.key_stride),
                  Store(unit.dev(shape.indices.buffer, shape.indices.byte(first)), unit.sp(out[b]), rows,
                        shape.k * iz, shape.indices.row_bytes_stride, shape.out_stride))

    chunks, rem = divmod(share.count, tiling.rows)
    pipeline(ls, sfp, chunks, rem, q, load, compute, store, buffers=2)


__all__ = ["Share", "build_sort_program"]
