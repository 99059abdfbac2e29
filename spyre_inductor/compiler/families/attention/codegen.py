"""Attention code generation: one core's work units as ls, pe and sfp instruction streams.

The core's chunks, all its units' in order, form one stream (t = 0, 1, ...):

* ls: the loads of chunk t + 1 (the unit's Q tiles first when it starts a unit; K rows into a
  staging slot, V, the mask tiles) go out before chunk t's K rows, which landed at the last
  fence, are transposed on chip into K^T: the transpose runs while the next chunk is in flight.
  A unit's output tile is stored two chunks after its last one, when the sfp has had time to
  finish it.
* pe: S_t = Q K_t^T into one of two score buffers, then P_{t-1} V_{t-1} into the unit's fp32
  accumulator: the scores of the next chunk are computed while the sfp works on this one.
* sfp: the online softmax of S_t, row by row: scale, the causal diagonal (an iota compared with
  zero) and the masks, the new row maximum (0 where a row has no finite score yet, so no
  -inf - -inf; only a data mask can make a row's max -inf), alpha = exp(m_old - m_new) rescaling the running sum and the accumulator,
  P = exp(S - m_new) rounded to the probabilities' dtype; after a unit's last chunk
  out = acc / l (acc / 1 where l is 0 when rows with no finite score give zeros).

Every buffer has a full/free queue pair primed by its consumer; the score matrix never leaves
the scratchpad. The schedule is unrolled (addresses are plain offsets).
"""

from __future__ import annotations

from spyre_runtime.program.emitter import Unit
from spyre_runtime.program.isa import (Binary, Fence, Fill, Iota, Load, MatMul, Pop, Push, Reduce, Select, Send,
                                      Store, Transpose, Unary)
from spyre_runtime.program.operands import ITEMSIZE, STICK, ScratchCount
from spyre_runtime.program.program import Queue

from ...ir.errors import Unsupported
from ...core.allocate import Placement
from ...core.tiles import TileKernel
from ...core.transfers import PIECE_BYTES, rows_in_pieces
from ...ir.errors import PlanError
from .plan import AttentionShape, AttentionTiling, Chunk, CoreWork, WorkUnit, column_bytes

MAX_INSTRUCTIONS_PER_CORE = 200_000
NINF = float("-inf")


class _Core:
    def __init__(self, shape: AttentionShape, tk: TileKernel, tiling: AttentionTiling, placement: Placement,
                 work: CoreWork):
        self.s, self.t, self.p = shape, tiling, placement
        # the keep mask is read as bool whatever it is stored as (a select's condition)
        self.dtypes = {t.name: t.dtype for t in tk.tiles if t.name != "keep"}
        self.core = work.core
        self.units = [u for u in work.units if u.chunks]
        self.empty_units = [u for u in work.units if not u.chunks]
        self.items = [(k, u, c) for k, u in enumerate(self.units) for c in range(len(u.chunks))]
        self.queues: list[Queue] = []
        # issue 31: the chunks past every row's position are skipped, counted on chip
        self.on_chip = shape.bounds_on_chip and bool(self.units) and all(u.parts == 1 for u in self.units)
        self.chunks = max((len(u.chunks) for u in self.units), default=0)
        self.waiting: dict[int, str] = {}   # id(unit) -> the queue it pops before its first guarded chunk
        # the heads' packed statistics: adjacent when every block the sfp takes is all the heads'
        # rows (one instruction for all heads: a decode step's 1 row of 4 heads), else each head's
        # from a stick (a block starting at a head's row r0 then starts on one)
        R = tiling.rows
        whole = all(u.rows == R and all(c.r0 == 0 for c in u.chunks) for u in self.units)
        self.column_stride = R * 4 if whole else column_bytes(R)

    def q(self, name, producer, consumer) -> str:
        full = f"c{self.core}.{name}"
        self.queues.append(Queue(full, (self.core, producer), (self.core, consumer), 4))
        return full

    # ---- tiles ------------------------------------------------------------------------------

    def tile(self, name, copy, row, rows, cols, dtype=None, broadcast="none"):
        a = self.p.at(name, copy)
        dtype = dtype or self._dtype(name)
        return _tile(a.offset + row * a.row_stride, dtype, rows, cols, a.row_stride, broadcast)

    def _dtype(self, name):
        """The tile kernel's dtype, or for a tile only the program has (the causal diagonal's, the
        empty rows', the positions') its own."""
        if name in self.dtypes:
            return self.dtypes[name]
        s = self.s
        pos = s.positions.dtype if s.positions else None
        return {"keep": "bool", "diag_index": "int32", "diag_keep": "bool", "empty": "int32", "row_position": "int32",
                "positions": pos, "pos_row": pos, "pos_col": pos, "pos_max": pos, "chunk_start": pos,
                "pos_min": pos, "chunk_last": pos, "mask_count": "int32",
                "chunk_count": "int32"}.get(name, "fp32")

    def const(self, name, rows, cols):
        dtype = "int32" if name == "izero" else "fp32"
        return self.tile(name, None, 0, rows, cols, dtype, "scalar")

    def column(self, name, row, rows, broadcast_cols: int | None = None):
        """Per-row statistics of stacked rows [row, row + rows), as a packed column (issue 31): a
        4-byte element per row, each head's rows adjacent to the last head's or in a region of
        their own starting on a stick (plan.column_bytes; `column_stride`), so a running max over 1024 rows is 4 KiB, not 128 KiB, and the sfp
        streams 32 rows per pass. (A block starts on a stick: at a head's first row, or a
        multiple of 32 rows into it, plan._chunks rounding the rows a chunk skips.)"""
        dtype = "int32" if name == "empty" else "fp32"
        g, r = divmod(row, self.t.rows)
        if rows > self.t.rows - r and self.column_stride != self.t.rows * 4:
            raise PlanError(f"attention column {name}: rows {row}..{row + rows} span heads whose statistics are "
                            f"not adjacent")
        a = self.p.at(name)
        offset = a.offset + g * self.column_stride + r * 4
        if offset % STICK:
            raise PlanError(f"attention column {name}: rows from {row} start off a stick")
        if broadcast_cols is None:
            return _tile(offset, dtype, rows, 1, 4)
        return _tile(offset, dtype, rows, broadcast_cols, 4, "cols")

    # ---- chunks counted on chip (issue 31) ------------------------------------------------------

    def count_tile(self, k: int, c: int, rows: int = 1):
        """Unit k's run counts from chunk c (1: some row's position reaches the chunk), a stick each."""
        return self.tile("chunk_count", None, k * self.chunks + c, rows, 1, "int32")

    def guarded(self, unit, t: int, emit) -> None:
        """`emit()` the part of chunk t that `unit` runs, inside a loop counted on chip when the
        chunk can be skipped: a unit's first chunk always runs (rows that see no position get
        their empty-row value from it, as in the unskipped program), a later one only if some row
        of the unit has a position that reaches it. Every unit wraps its parts of chunk t in
        loops reading the same count, so their queue operations stay matched."""
        k, u, c = self.items[t]
        if not self.on_chip or c == 0:
            emit()
            return
        wait = self.waiting.pop(id(unit), None)
        if wait is not None:
            unit.emit(Pop(wait))
        with unit.loop(ScratchCount(self.count_tile(k, c), 1)):
            emit()

    def load_bounds(self, ls):
        """Each unit's rows' positions, as one row per unit (the positions are contiguous), and
        transposed on chip into a column per unit (one row's position per stick, as the masks
        compare them): every chunk of the unit reads it, none loads it again."""
        p = self.s.positions
        isz = ITEMSIZE[p.dtype]
        a = self.p.at("pos_row")
        for k, u in enumerate(self.units):
            symbol, element = p.buffer, p.at(0, 0, u.i0, 0)
            ls.emit(Load(ls.sp(a.offset + k * a.row_stride), ls.dev(symbol, element * isz), 1, u.rows * isz, 0,
                         a.row_stride))
        ls.emit(Fence())
        for k, u in enumerate(self.units):
            ls.emit(Transpose(self.tile("pos_col", None, k * self.t.rows, u.rows, 1),
                              self.tile("pos_row", None, k, 1, u.rows)))

    def count_chunks(self, sfp):
        """count[k, c] = (first position of chunk c) - causal <= the largest position of unit k's
        rows: the chunk runs; masked[k, c] = (last position of chunk c) - causal > the smallest:
        some row does not see all of it, so its scores are masked (a chunk every row sees whole
        needs no mask). (The last chunk's last position is taken as a whole chunk's: it is masked
        when it might need it.)"""
        s = self.s
        C = self.chunks
        sfp.emit(Iota(self.tile("chunk_start", None, 0, C, 1), -s.causal, (), self.t.kv, 0),
                 Iota(self.tile("chunk_last", None, 0, C, 1), self.t.kv - 1 - s.causal, (), self.t.kv, 0))
        for k, u in enumerate(self.units):
            row = self.tile("pos_row", None, k, 1, u.rows)
            sfp.emit(Reduce("max", self.tile("pos_max", None, k, 1, 1), row),
                     Binary("le", self.count_tile(k, 0, C), self.tile("chunk_start", None, 0, C, 1),
                            self.tile("pos_max", None, k, C, 1, broadcast="scalar")),
                     Reduce("min", self.tile("pos_min", None, k, 1, 1), row),
                     Binary("gt", self.tile("mask_count", None, k * C, C, 1, "int32"),
                            self.tile("chunk_last", None, 0, C, 1),
                            self.tile("pos_min", None, k, C, 1, broadcast="scalar")))

    # ---- the schedule ------------------------------------------------------------------------

    def blocks(self, u: WorkUnit, r0: int) -> list[tuple[int, int]]:
        """(first row, rows) of the stacked tile rows of unit u from row r0 of every head: one
        block when the heads' rows are contiguous."""
        G, R = self.s.G, self.t.rows
        if r0 == 0 and u.rows == R:
            return [(0, G * R)]
        return [(g * R + r0, u.rows - r0) for g in range(G)]

    def sfp_blocks(self, u: WorkUnit, r0: int) -> list[tuple[int, int]]:
        """`blocks` as the sfp's work on the rows and their statistics takes them: one block per
        head when the heads' packed statistics are not adjacent (fewer than 32 rows a head, or
        not a multiple of 32). The same sticks either way; the pe keeps its one block (a product
        of few rows costs a pass of 8)."""
        if self.column_stride == self.t.rows * 4:
            return self.blocks(u, r0)
        return [(g * self.t.rows + r0, u.rows - r0) for g in range(self.s.G)]

    def emit(self):
        ls, pe, sfp = Unit(), Unit(), Unit()
        T = len(self.items)
        if T * 40 * self.s.G > MAX_INSTRUCTIONS_PER_CORE:
            raise Unsupported(f"attention plan with {T} chunks on core {self.core}: too many to unroll")
        ns = self.t.slots
        # (positions counted on chip are read once per unit, with the counts: not a mask per chunk)
        masks = [m for m in ("bias", "keep") + (() if self.on_chip else ("positions",)) if getattr(self.s, m) is not None]
        slots = range(min(ns, T))
        qslots = range(min(2, len(self.units)))
        oslots = range(min(2, len(self.units) + len(self.empty_units)))
        qf = {k: self.q(f"q_full{k}", "ls", "pe") for k in qslots}
        qe = {k: self.q(f"q_free{k}", "pe", "ls") for k in qslots}
        kf = {k: self.q(f"kv_full{k}", "ls", "pe") for k in slots}
        ke = {k: self.q(f"kt_free{k}", "pe", "ls") for k in slots}
        ve = {k: self.q(f"v_free{k}", "pe", "ls") for k in slots}
        mf = {k: self.q(f"mask_full{k}", "ls", "sfp") for k in slots}
        me = {k: self.q(f"mask_free{k}", "sfp", "ls") for k in slots}
        sf = {k: self.q(f"s_full{k}", "pe", "sfp") for k in (0, 1)}
        se = {k: self.q(f"s_free{k}", "sfp", "pe") for k in (0, 1)}
        pf = {k: self.q(f"p_full{k}", "sfp", "pe") for k in (0, 1)}
        pfree = {k: self.q(f"p_free{k}", "pe", "sfp") for k in (0, 1)}
        ar = self.q("acc_ready", "pe", "sfp")
        split = any(u.parts > 1 for u in self.units)
        ready = self.q("partial_ready", "sfp", "ls") if split else None
        if split and self.units[0].part > 0:  # the ring queue to the part before, this core's ls to its sfp
            self.queues.append(Queue(self.landing_queue(self.core - 1), (self.core, "ls"), (self.core - 1, "sfp"), 1))
        of = {k: self.q(f"o_full{k}", "sfp", "ls") for k in oslots}
        oe = {k: self.q(f"o_free{k}", "ls", "sfp") for k in oslots}
        if self.on_chip:  # the positions to the sfp, the chunks' run counts back to the ls and the pe
            bounds = self.q("bounds_full", "ls", "sfp")
            self.waiting = {id(ls): self.q("counts_ls", "sfp", "ls"), id(pe): self.q("counts_pe", "sfp", "pe")}

        # priming: one free token per buffer, from the buffer's consumer
        for k in qslots:
            pe.emit(Push(qe[k]))
        for k in slots:
            pe.emit(Push(ke[k]), Push(ve[k]))
            if masks:
                sfp.emit(Push(me[k]))
        used_sp = range(min(2, T))
        for k in used_sp:
            sfp.emit(Push(se[k]))
            pe.emit(Push(pfree[k]))
        for k in oslots:
            ls.emit(Push(oe[k]))
        for name, value in (("scale", self.s.scale), ("ninf", NINF), ("fill", self.s.masked_score), ("zero", 0.0),
                            ("one", 1.0), ("izero", 0)):
            sfp.emit(Fill(self.tile(name, None, 0, 1, 1, "int32" if name == "izero" else "fp32"), value))
        if self.s.kv_size is not None:  # issue 18: the kv length, from the launch's size words
            sfp.emit(Fill(self.tile("kv_size", None, 0, 1, 1, "int32"), self.s.kv_size))
        if self.on_chip:
            self.load_bounds(ls)
            ls.emit(Fence(), Push(bounds))
            sfp.emit(Pop(bounds))
            self.count_chunks(sfp)
            sfp.emit(*(Push(q) for q in self.waiting.values()))

        # units no row of which sees any position: their rows are the empty-row value
        for e, u in enumerate(self.empty_units):
            b = e % len(oslots)
            sfp.emit(Pop(oe[b]))
            fill = 0.0 if self.s.empty_rows == "zero" else float("nan")
            for g in range(self.s.G):
                sfp.emit(Fill(self.tile("o", b, g * self.t.rows, u.rows, self.s.Dv), fill))
            sfp.emit(Push(of[b]))
            ls.emit(Pop(of[b]))
            self.store(ls, u, b)
            ls.emit(Push(oe[b]))
        base_o = len(self.empty_units)

        # ---- ls -------------------------------------------------------------------------------
        last_item = {}
        for t, (k, u, c) in enumerate(self.items):
            last_item[k] = t
        store_after: dict[int, list[int]] = {}
        for k in range(len(self.units)):
            store_after.setdefault(min(last_item[k] + 2, T - 1), []).append(k)

        def issue_k(t):  # the unit's Q tiles when it starts, then the chunk's K rows into staging
            k, u, c = self.items[t]
            if c == 0:
                ls.emit(Pop(qe[k % 2]))
                self.load_q(ls, u, k % 2)
            self.load_rows(ls, "k_rows", self.s.k, self.s.D, u, u.chunks[c], t % ns)

        def issue_v(t):  # V and the masks: their slots free up only once the pe is past chunk t - slots
            k, u, c = self.items[t]
            slot = t % ns
            ls.emit(Pop(ve[slot]))
            self.load_rows(ls, "v", self.s.v, self.s.Dv, u, u.chunks[c], slot)
            if masks:
                ls.emit(Pop(me[slot]))
                self.load_masks(ls, u, u.chunks[c], slot)

        if T:
            issue_k(0)
            issue_v(0)
            ls.emit(Fence())
        for t in range(T):
            k, u, c = self.items[t]
            slot = t % ns
            # chunk t + 1's K rows are in flight while chunk t's are transposed, but for the first
            # chunk: the pe's first product waits for nothing more than its own K (on a bus every
            # core is loading its first chunks over, another chunk's K is most of a microsecond)
            if 0 < t < T - 1:
                self.guarded(ls, t + 1, lambda: issue_k(t + 1))
            n = u.chunks[c].n

            def transpose():
                ls.emit(Pop(ke[slot]))
                ls.emit(Transpose(self.tile("kt", slot, 0, self.s.D, n), self.tile("k_rows", slot, 0, n, self.s.D)))
            self.guarded(ls, t, transpose)
            ls.emit(Fence())
            if c == 0:
                ls.emit(Push(qf[k % 2]))

            def hand_over():
                ls.emit(Push(kf[slot]))
                if masks:
                    ls.emit(Push(mf[slot]))
            self.guarded(ls, t, hand_over)
            if t == 0 and T > 1:
                self.guarded(ls, 1, lambda: issue_k(1))
            if t + 1 < T:
                # (after chunk t is handed over: the pe frees V slots only past it)
                self.guarded(ls, t + 1, lambda: issue_v(t + 1))
            if t == 0 and T > 1:
                ls.emit(Fence())  # (chunk 1's K rows land before they are transposed)
            for done in store_after.get(t, ()):
                u_done = self.units[done]
                if u_done.part > 0:  # a later part of a split block: its partial goes to the part before
                    ls.emit(Pop(ready))
                    self.send_partial(ls, u_done)
                    continue
                b = (base_o + done) % len(oslots)
                ls.emit(Pop(of[b]))
                self.store(ls, u_done, b)
                ls.emit(Push(oe[b]))
        for k in qslots:
            ls.emit(Pop(qe[k]))
        for k in slots:
            ls.emit(Pop(ke[k]), Pop(ve[k]))
            if masks:
                ls.emit(Pop(me[k]))

        # ---- pe -------------------------------------------------------------------------------
        def qk(t):
            k, u, c = self.items[t]
            ch, slot, b = u.chunks[c], t % ns, t % 2
            if c == 0:
                pe.emit(Pop(qf[k % 2]))
            pe.emit(Pop(kf[slot]), Pop(se[b]))
            for row, rows in self.blocks(u, ch.r0):
                pe.emit(MatMul(self.tile("s", b, row, rows, ch.n), self.tile("q", k % 2, row, rows, self.s.D),
                               self.tile("kt", slot, 0, self.s.D, ch.n), accumulate=False))
            pe.emit(Push(ke[slot]))
            if c == len(u.chunks) - 1 and not self.on_chip:
                pe.emit(Push(qe[k % 2]))
            pe.emit(Push(sf[b]))

        def qk_guarded(t):
            k, u, c = self.items[t]
            self.guarded(pe, t, lambda: qk(t))
            if c == len(u.chunks) - 1 and self.on_chip:  # (whether the chunk ran or not: Q is done with)
                pe.emit(Push(qe[k % 2]))

        def pv(t):
            k, u, c = self.items[t]
            ch, slot, b = u.chunks[c], t % ns, t % 2
            pe.emit(Pop(pf[b]))
            for row, rows in self.blocks(u, ch.r0):
                pe.emit(MatMul(self.tile("acc", None, row, rows, self.s.Dv), self.tile("p", b, row, rows, ch.n),
                               self.tile("v", slot, 0, ch.n, self.s.Dv), accumulate=True))
            pe.emit(Push(pfree[b]), Push(ve[slot]), Push(ar))

        if T:
            qk_guarded(0)
        for t in range(T):
            if t + 1 < T:
                qk_guarded(t + 1)
            self.guarded(pe, t, lambda: pv(t))
        for k in used_sp:
            pe.emit(Pop(se[k]))

        # ---- sfp ------------------------------------------------------------------------------
        for t, (k, u, c) in enumerate(self.items):
            if c == 0:
                self.init(sfp, u)
            self.guarded(sfp, t, lambda: self.softmax_step(sfp, t, u, c, sf, se, pf, pfree, mf, me, ar, bool(masks)))
            if c == len(u.chunks) - 1:
                sfp.emit(Pop(ar))
                if u.part < u.parts - 1:  # the partial of the next part lands: combine it with ours
                    sfp.emit(Pop(self.landing_queue(self.core)))
                    self.combine(sfp, u)
                if u.part > 0:
                    sfp.emit(Push(ready))
                    continue
                b = (base_o + k) % len(oslots)
                sfp.emit(Pop(oe[b]))
                self.finish(sfp, u, b)
                sfp.emit(Push(of[b]))
        for k in used_sp:
            sfp.emit(Pop(pfree[k]))
        for k in oslots:
            sfp.emit(Pop(oe[k]))
        for unit in (ls, pe):  # (a core none of whose chunks could be skipped: the counts' token, unused)
            wait = self.waiting.pop(id(unit), None)
            if wait is not None:
                unit.emit(Pop(wait))
        return {"ls": ls.instrs, "pe": pe.instrs, "sfp": sfp.instrs}, self.queues

    # ---- a block split over cores: partials combined along the ring ---------------------------

    def landing_queue(self, core: int) -> str:
        """The queue on which core + 1's partial lands on `core` (named by the producer's core)."""
        return f"c{core + 1}.partial_to{core}"

    def final_max(self, u: WorkUnit) -> str:
        """The column holding the unit's running max after its last chunk (they alternate)."""
        return "t2" if len(u.chunks) % 2 else "m"

    def send_partial(self, ls, u: WorkUnit):
        """(max, sum, accumulator) into the previous core's landing tiles, then its token."""
        for own, landing in ((self.final_max(u), "m_in"), ("l", "l_in"), ("acc", "acc_in")):
            src, dst = self.p.at(own), self.p.at(landing)
            ls.emit(Send(self.core - 1, ls.sp(dst.offset), ls.sp(src.offset), src.nbytes))
        ls.emit(Push(self.landing_queue(self.core - 1)))

    def combine(self, sfp, u: WorkUnit):
        """own = own (+) landed: the softmax partials of two ranges of positions, rescaled to their
        common max (0 where both are -inf: then both sums are 0)."""
        mine = self.final_max(u)
        free = "m" if mine == "t2" else "t2"
        for row, rows in self.sfp_blocks(u, 0):
            m, m_in, shift, new = (self.column(x, row, rows) for x in (mine, "m_in", free, "t1"))
            l, l_in, empty = (self.column(x, row, rows) for x in ("l", "l_in", "empty"))
            acc, acc_in = (self.tile(x, None, row, rows, self.s.Dv) for x in ("acc", "acc_in"))
            sfp.emit(Binary("max", new, m, m_in),
                     Binary("eq", empty, new, self.const("ninf", rows, 1)),
                     Select(shift, empty, self.const("zero", rows, 1), new),
                     Binary("sub", m, m, shift), Unary("exp", m, m),               # ours' weight
                     Binary("sub", m_in, m_in, shift), Unary("exp", m_in, m_in),   # theirs
                     Binary("mul", l, l, m), Binary("mul", l_in, l_in, m_in), Binary("add", l, l, l_in),
                     Binary("mul", acc, acc, self.column(mine, row, rows, self.s.Dv)),
                     Binary("mul", acc_in, acc_in, self.column("m_in", row, rows, self.s.Dv)),
                     Binary("add", acc, acc, acc_in),
                     Unary("copy", m, new))

    # ---- ls: moves ----------------------------------------------------------------------------

    def load_q(self, ls, u: WorkUnit, slot):
        q, isz = self.s.q, ITEMSIZE[self.s.q.dtype]
        a = self.p.at("q", slot)
        for g in range(self.s.G):
            h = u.kvh * self.s.G + g
            symbol, element = q.dev(u.b, h, u.i0, 0)
            rows_in_pieces(ls, a.offset + g * self.t.rows * a.row_stride, symbol, element * isz,
                           u.rows, self.s.D * isz, q.strides[2] * isz, a.row_stride)

    def load_rows(self, ls, name, acc, cols, u: WorkUnit, ch: Chunk, slot):
        isz = ITEMSIZE[acc.dtype]
        a = self.p.at(name, slot)
        symbol, element = acc.dev(u.b, u.kvh, ch.j0, 0)
        rows_in_pieces(ls, a.offset, symbol, element * isz, ch.n, cols * isz, acc.strides[2] * isz, a.row_stride)

    def mask_rows(self, m, u: WorkUnit, ch: Chunk):
        """Per head: (first row of its region in the mask tile, rows loaded, device element), one
        region for all heads when the mask does not vary over heads."""
        per_head = self.t.rows if m.strides[2] else 1
        heads = range(self.s.G) if m.strides[1] else range(1)
        rows = (u.rows - ch.r0) if m.strides[2] else 1
        first = ch.r0 if m.strides[2] else 0
        return [(g * per_head + first, rows, m.at(u.b, u.kvh * self.s.G + g, u.i0 + first, ch.j0)) for g in heads]

    def load_masks(self, ls, u: WorkUnit, ch: Chunk, slot):
        p = self.s.positions
        if p is not None and not self.on_chip:  # the unit's rows' positions, one per stick
            isz = ITEMSIZE[p.dtype]
            a = self.p.at("positions", slot)
            rows_in_pieces(ls, a.offset, p.buffer, p.at(0, 0, u.i0, 0) * isz, u.rows, isz, p.strides[2] * isz, STICK)
        for name in ("bias", "keep"):
            m = getattr(self.s, name)
            if m is None:
                continue
            isz = ITEMSIZE[m.dtype]
            a = self.p.at(name, slot)
            for row, rows, elem in self.mask_rows(m, u, ch):
                rows_in_pieces(ls, a.offset + row * a.row_stride, m.buffer, elem * isz, rows, ch.n * isz,
                           m.strides[2] * isz, a.row_stride)

    def store(self, ls, u: WorkUnit, b):
        o, isz = self.s.out, ITEMSIZE[self.s.out.dtype]
        a = self.p.at("o", b)
        for g in range(self.s.G):
            h = u.kvh * self.s.G + g
            per = max(1, PIECE_BYTES // a.row_stride)
            for r0 in range(0, u.rows, per):
                n = min(per, u.rows - r0)
                symbol, element = o.dev(u.b, h, u.i0 + r0, 0)
                ls.emit(Store(ls.dev(symbol, element * isz),
                              ls.sp(a.offset + (g * self.t.rows + r0) * a.row_stride), n, self.s.Dv * isz,
                              o.strides[2] * isz if n > 1 else 0, a.row_stride))

    # ---- sfp: the online softmax ---------------------------------------------------------------

    def init(self, sfp, u: WorkUnit):
        for row, rows in self.sfp_blocks(u, 0):
            sfp.emit(Fill(self.column("m", row, rows), NINF), Fill(self.column("l", row, rows), 0.0),
                     Fill(self.tile("acc", None, row, rows, self.s.Dv), 0.0))

    def softmax_step(self, sfp, t, u, c, sf, se, pf, pfree, mf, me, ar, masks: bool):
        s, G, R = self.s, self.s.G, self.t.rows
        ch, b, slot = u.chunks[c], t % 2, t % self.t.slots
        n = ch.n
        sfp.emit(Pop(sf[b]))
        if masks:
            sfp.emit(Pop(mf[slot]))
        blocks = self.sfp_blocks(u, ch.r0)
        for row, rows in blocks:
            S = self.tile("s", b, row, rows, n)
            sfp.emit(Binary("mul", S, S, self.const("scale", rows, n)))
        heads = [(g * R + ch.r0, u.rows - ch.r0) for g in range(G)]
        if ch.masked and s.positions is not None:
            rows = u.rows
            idx = self.tile("diag_index", None, 0, rows, n)
            keep = self.tile("diag_keep", None, 0, rows, n)
            position = self.tile("row_position", None, 0, rows, 1)
            # keep j <= positions[i] + causal: j - causal <= the row's position
            k = self.units.index(u)
            mine = self.tile("pos_col", None, k * self.t.rows, rows, 1) if self.on_chip else \
                self.tile("positions", slot, 0, rows, 1)

            def mask():
                sfp.emit(Unary("copy", position, mine),
                         Iota(idx, ch.j0 - s.causal, (), 0, 1),
                         Binary("le", keep, idx, self.tile("row_position", None, 0, rows, n, broadcast="cols")))
                for row, rows_h in heads:
                    S = self.tile("s", b, row, rows_h, n)
                    sfp.emit(Select(S, keep, S, self.const("ninf", rows_h, n)))
            if self.on_chip:  # (only if some row of the unit does not see all of the chunk)
                with sfp.loop(ScratchCount(self.tile("mask_count", None, k * self.chunks + c, 1, 1, "int32"), 1)):
                    mask()
            else:
                mask()
        elif ch.masked:
            rows = u.rows - ch.r0
            idx = self.tile("diag_index", None, 0, rows, n)
            keep = self.tile("diag_keep", None, 0, rows, n)
            # keep j <= i + causal: (i + causal) - j >= 0 over the rows from r0 and the chunk's positions
            sfp.emit(Iota(idx, u.i0 + ch.r0 + s.causal - ch.j0, (), 1, -1),
                     Binary("ge", keep, idx, self.const("izero", rows, n)))
            for row, rows_h in heads:
                S = self.tile("s", b, row, rows_h, n)
                sfp.emit(Select(S, keep, S, self.const("ninf", rows_h, n)))
        if s.kv_size is not None and ch.j0 + n > s.kv_least:
            # issue 18: positions past the launch's kv length (their K rows loaded as zeros) score
            # -inf: j < size over the chunk (a chunk before the bucket's least size needs no mask)
            rows = u.rows - ch.r0
            idx = self.tile("diag_index", None, 0, rows, n)
            keep = self.tile("diag_keep", None, 0, rows, n)
            sfp.emit(Iota(idx, ch.j0, (), 0, 1),
                     Binary("lt", keep, idx, self.tile("kv_size", None, 0, rows, n, "int32", "scalar")))
            for row, rows_h in heads:
                S = self.tile("s", b, row, rows_h, n)
                sfp.emit(Select(S, keep, S, self.const("ninf", rows_h, n)))
        for name in ("bias", "keep"):
            m = getattr(s, name)
            if m is None:
                continue
            regions = self.mask_rows(m, u, ch)
            for g, (row, rows_h) in enumerate(heads):
                mrow, mrows, _ = regions[g if len(regions) > 1 else 0]
                tile = self.tile(name, slot, mrow, rows_h, n, broadcast="none" if mrows > 1 or rows_h == 1 else "rows")
                S = self.tile("s", b, row, rows_h, n)
                if name == "bias":
                    sfp.emit(Binary("add", S, S, tile))
                else:
                    sfp.emit(Select(S, tile, S, self.const("fill", rows_h, n)))
        # the running max alternates between two columns (no copy per chunk): rows a chunk skips
        # (causal, before r0) are never read again, since r0 only grows along a unit's chunks
        m_in, m_out = ("m", "t2") if c % 2 == 0 else ("t2", "m")
        # a row whose scores are all -inf has a -inf max: only a data mask can do that (a causal
        # row from r0 on sees a position of every chunk it visits), so only then is it made 0
        # (or a causal diagonal: the rows a chunk skips are rounded down to whole sticks of the
        # packed statistics, so rows before the diagonal's own r0 may see nothing of the chunk)
        safe = (s.bias is not None or (s.keep is not None and s.masked_score == NINF)
                or s.positions is not None or s.kv_size is not None or s.causal is not None)
        for row, rows in blocks:
            S = self.tile("s", b, row, rows, n)
            old, new, l = (self.column(x, row, rows) for x in (m_in, m_out, "l"))
            t1, t3 = self.column("t1", row, rows), self.column("t3", row, rows)
            sfp.emit(Reduce("max", t1, S), Binary("max", new, old, t1))
            shift = m_out
            if safe:
                empty = self.column("empty", row, rows)
                sfp.emit(Binary("eq", empty, new, self.const("ninf", rows, 1)),
                         Select(t1, empty, self.const("zero", rows, 1), new))
                shift = "t1"
            sfp.emit(Binary("sub", t3, old, self.column(shift, row, rows)),
                     Unary("exp", t3, t3),                                  # alpha = exp(m_old - m_new)
                     Binary("sub", S, S, self.column(shift, row, rows, n)),
                     Unary("exp", S, S),
                     Reduce("sum", t1, S),
                     Binary("mul", l, l, t3),
                     Binary("add", l, l, t1))
        if c > 0:
            sfp.emit(Pop(ar))  # the accumulator holds the previous chunk's PV
            for row, rows in blocks:
                acc = self.tile("acc", None, row, rows, s.Dv)
                sfp.emit(Binary("mul", acc, acc, self.column("t3", row, rows, s.Dv)))
        sfp.emit(Pop(pfree[b]))
        for row, rows in blocks:
            sfp.emit(Unary("copy", self.tile("p", b, row, rows, n), self.tile("s", b, row, rows, n)))
        sfp.emit(Push(se[b]))
        if masks:
            sfp.emit(Push(me[slot]))
        sfp.emit(Push(pf[b]))

    def finish(self, sfp, u: WorkUnit, b):
        s = self.s
        for row, rows in self.sfp_blocks(u, 0):
            acc, l = self.tile("acc", None, row, rows, s.Dv), self.column("l", row, rows)
            if s.empty_rows == "zero":  # rows with no finite score: acc is 0, divide by 1
                empty = self.column("empty", row, rows)
                sfp.emit(Binary("eq", empty, l, self.const("zero", rows, 1)),
                         Select(l, empty, self.const("one", rows, 1), l))
            sfp.emit(Binary("div", acc, acc, self.column("l", row, rows, s.Dv)),
                     Unary("copy", self.tile("o", b, row, rows, s.Dv), acc))


def _tile(offset, dtype, rows, cols, row_stride, broadcast="none"):
    from spyre_runtime.program.operands import Addr, Tile

    return Tile(Addr(offset), dtype, rows, cols, row_stride, broadcast)


__all__ = ["MAX_INSTRUCTIONS_PER_CORE", "NINF"]
