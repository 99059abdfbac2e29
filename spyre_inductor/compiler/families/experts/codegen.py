"""Grouped-matmul code generation: one core's column block as ls, pe and sfp instruction streams.

The experts' row ranges are data (offs), so the program reads them on chip and counts its work
there (isa.Loop over an operands.ScratchCount, issue 31):

* ls loads offs once, one element per stick, and hands it to the sfp, which computes per expert
  e (and once more for the rows past offs[-1]) its first row, its last row and its row count,
  then one word per (expert, row tile t): 1 if the expert has a row at t * rows, else 0. Every
  unit wraps its part of row tile t of expert e in a loop reading that word, so an expert with
  no rows costs nothing: its weights are not even loaded (the load is guarded by its tile 0's
  word), and a decode step reads only the weights of the experts its tokens chose.
* sfp, per row tile: the rows' indices start_e + t * rows + r, clamped to the expert's last row
  (a tile's rows past it repeat that row: the same product, stored to the same place twice),
  then, when the pe is done, the fp32 accumulator rounded once into the output tile.
* ls: the row tile gathered by those indices (isa.Gather: a row per DMA of K elements), the
  next expert's weight tile loaded while this one's rows run (two copies), the output tile
  scattered to its rows (isa.Scatter) one tile behind. The rows past offs[-1] get zeros.
* pe: per row tile one MatMul of [rows, K] x [K, cols] into a fresh accumulator.

Every buffer has a full/free queue pair primed by its consumer; a guarded part pops and pushes
only inside its loop, so each count word's loops enclose matched queue operations (the
validator checks that). The schedule is unrolled (addresses are plain offsets): the row tiles
of every expert up to ceil(S / rows), each guarded.
"""

from __future__ import annotations

from spyre_runtime.program.emitter import Unit, assemble
from spyre_runtime.program.isa import (Binary, Fence, Fill, Gather, Iota, Load, MatMul, Pop, Push, Scatter,
                                      Transpose, Unary)
from spyre_runtime.program.operands import ITEMSIZE, STICK, Addr, RowIndex, ScratchCount, Tile
from spyre_runtime.program.program import Program, Queue, Symbol

from ...core.allocate import Placement
from ...core.transfers import rows_in_pieces
from ...ir.errors import Unsupported
from .plan import CoreBlock, ExpertsShape, ExpertsTiling

MAX_INSTRUCTIONS_PER_CORE = 200_000


def build_experts_program(name: str, symbols: tuple[Symbol, ...], shape: ExpertsShape, tiling: ExpertsTiling,
                          placement: Placement, blocks: tuple[CoreBlock, ...], notes: str = "",
                          routing: tuple[int, ...] | None = None) -> Program:
    """`routing` (rows per expert) leaves out the row tiles that routing skips: a planner's
    estimate at a routing it assumes (the timing walk runs every counted loop at its maximum, all
    rows in one expert); the program launched has every row tile, each counted on chip."""
    cores, queues = {}, []
    for block in blocks:
        cores[block.core], qs = _Core(shape, tiling, placement, block, routing).emit()
        queues += qs
    return assemble(name, symbols, queues, cores, notes, check=False)


def _tile(offset, dtype, rows, cols, row_stride, broadcast="none") -> Tile:
    return Tile(Addr(offset), dtype, rows, cols, row_stride, broadcast)


class _Core:
    def __init__(self, shape: ExpertsShape, tiling: ExpertsTiling, placement: Placement, block: CoreBlock,
                 routing: tuple[int, ...] | None = None):
        self.s, self.t, self.p, self.block = shape, tiling, placement, block
        self.core = block.core
        self.queues: list[Queue] = []
        # the column tiles of this core's block, then per (group, row tile) one item: a group is
        # (expert, column tile); expert E is the rows past offs[-1] (zeros, no weights)
        end = block.n0 + block.n
        cols = [(n0, min(tiling.cols, end - n0)) for n0 in range(block.n0, end, tiling.cols)]
        self.groups = [(e, nt) for e in range(shape.E + 1) for nt in cols]
        self.row_tiles = list(range(block.row_group, tiling.tiles, block.row_groups))  # this core's
        if routing is not None:
            rows = list(routing) + [shape.S - sum(routing)]
        self.tiles_of = {g: [t for t in self.row_tiles if routing is None or t * tiling.rows < rows[e]]
                         for g, (e, _) in enumerate(self.groups)}
        self.items = [(g, t) for g in range(len(self.groups)) for t in self.tiles_of[g]]
        self.position = {item: i for i, item in enumerate(self.items)}
        experts = [g for g, (e, _) in enumerate(self.groups) if e < shape.E and self.tiles_of[g]]
        self.experts = experts
        # a K too long for a resident [K, cols] weight tile: [k, cols] chunks streamed per row tile
        k = tiling.k or shape.K
        self.chunks = [(k0, min(k, shape.K - k0)) for k0 in range(0, shape.K, k)]
        self.streamed = len(self.chunks) > 1
        self.w_copy = {g: k % 2 for k, g in enumerate(experts)}  # the weight tile's copy per expert group
        self.next_expert = {g: experts[k + 1] for k, g in enumerate(experts[:-1])}

    def q(self, name, producer, consumer, depth=2) -> str:
        full = f"c{self.core}.{name}"
        self.queues.append(Queue(full, (self.core, producer), (self.core, consumer), depth))
        return full

    # ---- tiles ------------------------------------------------------------------------------

    def column(self, name, row, rows=1, dtype="int32", broadcast="none") -> Tile:
        """Rows of a one-element-per-stick column (the per-expert values, the count words)."""
        a = self.p.at(name)
        return _tile(a.offset + row * STICK, dtype, rows, 1, STICK, broadcast)

    def scalar(self, name, row, rows) -> Tile:
        """Element `row` of a column read as the same value for `rows` rows."""
        return self.column(name, row, rows, broadcast="scalar")

    def word(self, g: int, t: int) -> Tile:
        e = self.groups[g][0]
        return self.column("run", e * self.t.tiles + t)

    def index(self, c) -> Tile:
        return _tile(self.p.at("index", c).offset, "int32", self.t.rows, 1, 4)

    def guard(self, unit: Unit, g: int, t: int):
        return unit.loop(ScratchCount(self.word(g, t), 1))

    def is_expert(self, g: int) -> bool:
        return self.groups[g][0] < self.s.E

    # ---- emission ---------------------------------------------------------------------------

    def emit(self):
        n_items = len(self.items)
        if n_items * 12 > MAX_INSTRUCTIONS_PER_CORE:
            raise Unsupported(f"grouped matmul plan with {n_items} row tiles on core {self.core}: too many to unroll")
        ls, pe, sfp = Unit(), Unit(), Unit()
        self.qs = {
            "offs": self.q("offs_full", "ls", "sfp", 1),
            "words_ls": self.q("words_ls", "sfp", "ls", 1),
            "words_pe": self.q("words_pe", "sfp", "pe", 1),
        }
        for c in (0, 1):
            for what, producer, consumer in (("w", "ls", "pe"), ("idx", "sfp", "ls"), ("a", "ls", "pe"),
                                             ("acc", "pe", "sfp"), ("out", "sfp", "ls")):
                self.qs[f"{what}_full{c}"] = self.q(f"{what}_full{c}", producer, consumer)
                self.qs[f"{what}_free{c}"] = self.q(f"{what}_free{c}", consumer, producer)
        Q = self.qs
        # priming: one free token per copy from the data's consumer
        for c in (0, 1):
            pe.emit(Push(Q[f"w_free{c}"]), Push(Q[f"a_free{c}"]))
            ls.emit(Push(Q[f"idx_free{c}"]), Push(Q[f"out_free{c}"]))
            sfp.emit(Push(Q[f"acc_free{c}"]))
        self.load_offs(ls)
        self.count(sfp)
        ls.emit(Pop(Q["words_ls"]))
        pe.emit(Pop(Q["words_pe"]))
        self.ls_stream(ls)
        self.pe_stream(pe)
        self.sfp_stream(sfp)
        # the final free tokens back to their producers
        for c in (0, 1):
            ls.emit(Pop(Q[f"w_free{c}"]), Pop(Q[f"a_free{c}"]))
            sfp.emit(Pop(Q[f"idx_free{c}"]), Pop(Q[f"out_free{c}"]))
            pe.emit(Pop(Q[f"acc_free{c}"]))
        return {"ls": ls.instrs, "pe": pe.instrs, "sfp": sfp.instrs}, self.queues

    # ---- the experts' row ranges, counted on chip ------------------------------------------------

    def load_offs(self, ls):
        s = self.s
        isz = ITEMSIZE[s.offs_dtype]
        a = self.p.at("offs_in")
        ls.emit(Load(ls.sp(a.offset), ls.dev(s.offs, s.offs_offset * isz), s.E, isz,
                     s.offs_stride * isz if s.E > 1 else 0, STICK),
                Push(self.qs["offs"]))

    def count(self, sfp):
        """ends = (offs, S), starts = (0, offs), rows = ends - starts, last = ends - 1; the words
        run[e, t] = t * rows < rows_e; the zero tile; then the words to the ls and the pe."""
        s, t = self.s, self.t
        E = s.E
        sfp.emit(Pop(self.qs["offs"]),
                 Unary("copy", self.column("ends", 0, E), self.column("offs_in", 0, E, s.offs_dtype)),
                 Fill(self.column("ends", E), s.S),
                 Fill(self.column("starts", 0), 0),
                 Unary("copy", self.column("starts", 1, E), self.column("ends", 0, E)),
                 Binary("sub", self.column("rows_of", 0, E + 1), self.column("ends", 0, E + 1),
                        self.column("starts", 0, E + 1)),
                 Fill(self.column("one", 0), 1),
                 Binary("sub", self.column("last", 0, E + 1), self.column("ends", 0, E + 1),
                        self.scalar("one", 0, E + 1)),
                 Iota(self.column("tile_start", 0, t.tiles), 0, (), t.rows, 0))
        for e in range(E + 1):
            sfp.emit(Binary("lt", self.column("run", e * t.tiles, t.tiles), self.column("tile_start", 0, t.tiles),
                            self.scalar("rows_of", e, t.tiles)))
        z = self.p.at("zero")
        sfp.emit(Fill(_tile(z.offset, s.out_dtype, t.rows, t.cols, z.row_stride), 0.0),
                 Push(self.qs["words_ls"]), Push(self.qs["words_pe"]))

    # ---- ls ---------------------------------------------------------------------------------------

    def ls_stream(self, ls):
        if self.experts and not self.streamed:
            self.load_w(ls, self.experts[0])
        previous = None  # the last expert item whose output is not stored yet
        for i, (g, tt) in enumerate(self.items):
            c = i % 2
            with self.guard(ls, g, tt):
                ls.emit(Pop(self.qs[f"idx_full{c}"]))
                if self.is_expert(g):
                    self.gather(ls, c)
                    if self.streamed:
                        for j in range(len(self.chunks)):
                            self.load_w_chunk(ls, g, i, j)
                else:
                    self.scatter(ls, "zero", None, g, c)
                    ls.emit(Push(self.qs[f"idx_free{c}"]))
            if not self.streamed and tt == self.tiles_of[g][0] and g in self.next_expert:
                self.load_w(ls, self.next_expert[g])  # the next expert's weights while these rows run
            if previous is not None:
                self.store(ls, *previous)
                previous = None
            if self.is_expert(g):
                previous = (i, g, tt)
        if previous is not None:
            self.store(ls, *previous)

    def load_w(self, ls, g):
        s = self.s
        e, (n0, cols) = self.groups[g]
        c = self.w_copy[g]
        isz = ITEMSIZE[s.dtype]
        dst = self.p.at("w", c)
        origin = (s.w_offset + e * s.w_expert + n0 * s.w_n) * isz
        with self.guard(ls, g, self.row_tiles[0]):  # (no row tile of this core: no weights)
            ls.emit(Pop(self.qs[f"w_free{c}"]))
            if not s.transposed:
                rows_in_pieces(ls, dst.offset, s.w, origin, s.K, cols * isz, s.w_k * isz, dst.row_stride)
            else:  # moved as [cols, K] (k contiguous), transposed on chip
                st = self.p.at("w_rows")
                rows_in_pieces(ls, st.offset, s.w, origin, cols, s.K * isz, s.w_n * isz, st.row_stride)
                ls.emit(Fence(),
                        Transpose(_tile(dst.offset, s.dtype, s.K, cols, dst.row_stride),
                                  _tile(st.offset, s.dtype, cols, s.K, st.row_stride)))
            ls.emit(Push(self.qs[f"w_full{c}"]))

    def chunk_copy(self, i: int, j: int) -> int:
        """The weight slot of chunk j of item i (chunks alternate over the whole schedule)."""
        return (self.position[self.items[i]] * len(self.chunks) + j) % 2

    def load_w_chunk(self, ls, g, i, j):
        """Rows [k0, k0 + k) of the expert's [K, cols] weight tile into a slot (inside item i's guard)."""
        s = self.s
        e, (n0, cols) = self.groups[g]
        k0, k = self.chunks[j]
        c = self.chunk_copy(i, j)
        isz = ITEMSIZE[s.dtype]
        dst = self.p.at("w", c)
        origin = (s.w_offset + e * s.w_expert + n0 * s.w_n + k0 * s.w_k) * isz
        ls.emit(Pop(self.qs[f"w_free{c}"]))
        if not s.transposed:
            rows_in_pieces(ls, dst.offset, s.w, origin, k, cols * isz, s.w_k * isz, dst.row_stride)
        else:
            st = self.p.at("w_rows")
            rows_in_pieces(ls, st.offset, s.w, origin, cols, k * isz, s.w_n * isz, st.row_stride)
            ls.emit(Fence(),
                    Transpose(_tile(dst.offset, s.dtype, k, cols, dst.row_stride),
                              _tile(st.offset, s.dtype, cols, k, st.row_stride)))
        ls.emit(Push(self.qs[f"w_full{c}"]))

    def gather(self, ls, c):
        s, t = self.s, self.t
        isz = ITEMSIZE[s.dtype]
        a = self.p.at("a", c)
        ls.emit(Pop(self.qs[f"a_free{c}"]),
                Gather(ls.sp(a.offset), ls.dev(s.a, s.a_offset * isz), t.rows, s.K * isz, 0, a.row_stride,
                       (RowIndex(self.index(c), s.a_row * isz, s.S, False),), "grouped_mm"),
                Push(self.qs[f"a_full{c}"]))

    def scatter(self, ls, tile, copy, g, c):
        """The [rows, cols] tile `tile` (its copy `copy`) to the rows index copy `c` names."""
        s, t = self.s, self.t
        osz = ITEMSIZE[s.out_dtype]
        _, (n0, cols) = self.groups[g]
        src = self.p.at(tile, copy)
        ls.emit(Scatter(ls.dev(s.out, (s.out_offset + n0) * osz), ls.sp(src.offset), t.rows, cols * osz, 0,
                        src.row_stride, (RowIndex(self.index(c), s.out_row * osz, s.S, False),), "grouped_mm"))

    def store(self, ls, i, g, tt):
        c = i % 2
        with self.guard(ls, g, tt):
            ls.emit(Pop(self.qs[f"out_full{c}"]))
            self.scatter(ls, "o", c, g, c)
            ls.emit(Push(self.qs[f"out_free{c}"]), Push(self.qs[f"idx_free{c}"]))

    # ---- pe ---------------------------------------------------------------------------------------

    def pe_stream(self, pe):
        s, t = self.s, self.t
        for g, (e, (n0, cols)) in enumerate(self.groups):
            if e == s.E or not self.tiles_of[g]:
                continue
            cw = None if self.streamed else self.w_copy[g]
            if cw is not None:
                with self.guard(pe, g, self.row_tiles[0]):
                    pe.emit(Pop(self.qs[f"w_full{cw}"]))
            for tt in self.tiles_of[g]:
                i = self.position[(g, tt)]
                c = i % 2
                a, acc = self.p.at("a", c), self.p.at("acc", c)
                isz = ITEMSIZE[s.dtype]
                with self.guard(pe, g, tt):
                    pe.emit(Pop(self.qs[f"a_full{c}"]), Pop(self.qs[f"acc_free{c}"]))
                    for j, (k0, k) in enumerate(self.chunks):
                        wc = cw if cw is not None else self.chunk_copy(i, j)
                        w = self.p.at("w", wc)
                        if cw is None:
                            pe.emit(Pop(self.qs[f"w_full{wc}"]))
                        pe.emit(MatMul(_tile(acc.offset, "fp32", t.rows, cols, acc.row_stride),
                                       _tile(a.offset + k0 * isz, s.dtype, t.rows, k, a.row_stride),
                                       _tile(w.offset, s.dtype, k, cols, w.row_stride), accumulate=j > 0))
                        if cw is None:
                            pe.emit(Push(self.qs[f"w_free{wc}"]))
                    pe.emit(Push(self.qs[f"a_free{c}"]), Push(self.qs[f"acc_full{c}"]))
            if cw is not None:
                with self.guard(pe, g, self.row_tiles[0]):
                    pe.emit(Push(self.qs[f"w_free{cw}"]))

    # ---- sfp --------------------------------------------------------------------------------------

    def sfp_stream(self, sfp):
        if self.items:
            self.indices(sfp, 0)
        for i, (g, tt) in enumerate(self.items):
            if i + 1 < len(self.items):
                self.indices(sfp, i + 1)  # the next tile's rows go to the ls before this one drains
            if self.is_expert(g):
                self.drain(sfp, i, g, tt)

    def indices(self, sfp, i):
        """index[r] = min(start_e + t * rows + r, last_e) for row tile t of expert e."""
        g, tt = self.items[i]
        e = self.groups[g][0]
        c, rows = i % 2, self.t.rows
        idx = self.index(c)
        with self.guard(sfp, g, tt):
            sfp.emit(Pop(self.qs[f"idx_free{c}"]),
                     Iota(idx, tt * rows, (), 1, 0),
                     Binary("add", idx, idx, self.scalar("starts", e, rows)),
                     Binary("min", idx, idx, self.scalar("last", e, rows)),
                     Push(self.qs[f"idx_full{c}"]))

    def drain(self, sfp, i, g, tt):
        s, t = self.s, self.t
        c = i % 2
        cols = self.groups[g][1][1]
        acc, o = self.p.at("acc", c), self.p.at("o", c)
        with self.guard(sfp, g, tt):
            sfp.emit(Pop(self.qs[f"acc_full{c}"]), Pop(self.qs[f"out_free{c}"]),
                     Unary("copy", _tile(o.offset, s.out_dtype, t.rows, cols, o.row_stride),
                           _tile(acc.offset, "fp32", t.rows, cols, acc.row_stride)),
                     Push(self.qs[f"acc_free{c}"]), Push(self.qs[f"out_full{c}"]))


__all__ = ["MAX_INSTRUCTIONS_PER_CORE", "build_experts_program"]
