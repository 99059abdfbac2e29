"""Matmul code generation: one core's block of the output as ls, pe and sfp instruction streams.

Per core, the output tiles of its block in order, each ``K / tk`` k-steps:

* ls: every operand tile a k-step needs that is not already in a slot is
  moved into one (``pop free``, load, ``push full``; a transposed operand
  is moved in its own layout into the staging tile, fenced, and transposed
  on chip into the slot); then the epilogue operands of the output tile;
  a *shared* operand (every core needs the same tiles in the same order:
  A when the cores split the columns, B when they split the rows) is
  all-gathered instead: each core loads one slice of rows of the tile from
  device memory and the slices travel core to core along the chain of
  neighbours in both directions (``ring_fill``), so the operand is read
  from device memory once, not once per core;
  then the store of the previous output tile (one behind, so the loads of
  the next tile are not held up by the sfp).
* pe: per k-step, ``pop full`` of each slot at its first use since it was
  filled, the MatMul into the tile's accumulator (the first k-step
  initializes it), ``push free`` after its last use; per output tile
  ``push acc_full``.
* sfp: per output tile, the epilogue steps from the fp32 accumulator into
  the output tiles (the one rounding to the output dtype is their copy),
  then ``push out_full``.

A plan that splits k (plan.py: ``grid.gk`` consecutive cores per output
block, each one output tile over its k slice) combines the fp32 partials
along the chain of those cores (core/combine.py, the tile kernel's
Combine): a core after the first waits for the previous core's partial in
its landing tile and adds it into its accumulator; a core before the last
hands its accumulator on; only the last runs the epilogue and the stores,
so the sum is rounded once, from fp32.

Accumulators, epilogue operands and outputs alternate between two copies,
so the pe fills one output tile while the sfp finishes the other. Every
queue is primed by its consumer's side (one free token per slot up front,
popped again at the end), so the loop bodies are uniform. The schedule is
unrolled: addresses are plain offsets.
"""

from __future__ import annotations

import itertools

from spyre_runtime.program.emitter import Unit, assemble, split_evenly
from spyre_runtime.program.isa import Fence, Fill, MatMul, Pop, Push, Transpose
from spyre_runtime.program.operands import ITEMSIZE, STICK
from spyre_runtime.program.program import Program, Queue, Symbol

from ...core import combine
from ...core.transfers import PIECE_BYTES, min_pieces, rows_in_pieces, rows_out_in_pieces
from ...core.allocate import Placement
from ...core.division import CoreShare
from ...core.codegen import emit_elementwise
from .lowering import MAccess, MatmulShape
from .plan import Grid, MatmulTiling, operand_tiles
from ...core.tiles import Role, TileKernel, broadcast_of, tile_extent

# More instructions than this per core is a plan the timing model should not have to replay.
MAX_INSTRUCTIONS_PER_CORE = 200_000


def build_matmul_program(name: str, symbols: tuple[Symbol, ...], shape: MatmulShape, tk: TileKernel,
                         tiling: MatmulTiling, placement: Placement, grid: Grid, notes: str = "",
                         blocks: tuple[CoreShare, ...] | None = None, share: str | None = None,
                         core: type | None = None) -> Program:
    """`blocks` (default: the grid's) lets a planner time one representative core; `share` ("a"
    or "b") all-gathers that operand over the ring between the grid's cores; `core` (a
    MatmulCore subclass) moves an operand its own way (the conv family gathers A's patches)."""
    cores, queues = {}, []
    for block in (grid.blocks if blocks is None else blocks):
        cores[block.core], qs = (core or _Core)(shape, tk, tiling, placement, block, share, grid.cores,
                                                grid.gk, grid.ring).emit()
        queues += qs
    return assemble(name, symbols, queues, cores, notes, check=False)


def _batch_index(shape: MatmulShape, flat: int) -> tuple[int, ...]:
    idx = []
    for extent in reversed(shape.batch):
        flat, r = divmod(flat, extent)
        idx.append(r)
    return tuple(reversed(idx))


def _element(access: MAccess, bidx, m: int, n: int, k: int) -> int:
    return (access.offset + sum(s * i for s, i in zip(access.batch_strides, bidx)) + access.m_stride * m
            + access.n_stride * n + access.k_stride * k)


COMBINE_PIECES = 8  # a split k's partial travels the chain in at most this many pieces of rows
_LANDING = {1: 0, -1: 1}  # the landing tile's copy a chain running each way round the ring lands in
# A split k's operand tiles are small (a slice of k each) and loaded once: in smaller transfers,
# so that a few cores' loads still keep the bus full (timing.py: the bus share grows with the
# transfers in flight)
SPLIT_PIECE_BYTES = 2 * 1024


# An output tile's epilogue runs in this many pieces of rows, each handed to the load/store unit
# as it is done: the store of one overlaps the sfp's work on the next (an up projection's
# silu(gate) * up is five sfp passes, 0.7 us per tile, that ran before any of its store).
EPILOGUE_PIECES = 4


def epilogue_pieces(rows: int) -> list[tuple[int, int]]:
    return split_evenly(rows, min(rows, EPILOGUE_PIECES))


class _Pool:
    """Optimal slot assignment for one operand over the core's whole schedule (Belady): a
    miss evicts the slot whose tile is needed again farthest ahead (then the least recently
    used), so a miss never waits on a slot the next steps still read."""

    def __init__(self, keys: list, slots: int):
        n = len(keys)
        next_same, seen = [n] * n, {}
        for t in range(n - 1, -1, -1):
            next_same[t] = seen.get(keys[t], n)
            seen[keys[t]] = t
        self.slot, self.new, self.fill = [], [], []
        self.last: dict[int, int] = {}  # fill -> its last step
        holding: dict[int, tuple] = {}
        fill_of: dict[int, int] = {}
        last_used: dict[int, int] = {}
        where: dict[tuple, int] = {}
        for t, key in enumerate(keys):
            hit = where.get(key)
            created = hit is None
            if created:
                free = [s for s in range(slots) if s not in holding]
                hit = free[0] if free else max(holding, key=lambda s: (next_same[last_used[s]], -last_used[s]))
                if hit in holding:
                    del where[holding[hit]]
                holding[hit], where[key] = key, hit
                fill_of[hit] = len(self.last)
                self.last[fill_of[hit]] = t
            self.new.append(created)
            self.slot.append(hit)
            self.fill.append(fill_of[hit])
            last_used[hit] = t
            self.last[fill_of[hit]] = t

    def last_use(self, t: int) -> bool:
        return self.last[self.fill[t]] == t


class _Core:
    def __init__(self, shape, tk, tiling, placement, block: CoreShare, share: str | None = None, group: int = 1,
                 k_slices: int = 1, ring: int = 0):
        self.shape, self.tk, self.t, self.p, self.block = shape, tk, tiling, placement, block
        self.core = block.core
        self.share, self.group = share, group
        # the chain of cores a shared operand is all-gathered over: `ring` consecutive cores (a grid
        # of groups, each sharing its own tiles), all `group` of them by default
        self.ring = ring or group
        self.ring_pos, self.ring_base = block.core % self.ring, block.core - block.core % self.ring
        # a split k: this core's place in its block's chain (grid blocks are k slices innermost)
        self.k_slices, self.k_pos = k_slices, block.core % k_slices
        self.finishes = self.k_pos == k_slices // 2  # where the chains from both ends meet
        self.piece_bytes = PIECE_BYTES if k_slices == 1 else SPLIT_PIECE_BYTES
        self.pieces = min_pieces(group)
        self.ta, self.tb = operand_tiles(tk)
        self.staging = {t.of: t.name for t in tk.tiles if t.role is Role.STAGING}
        self.acc = tk.with_role(Role.ACCUMULATOR)[0].name
        landing = tk.serving(self.acc, Role.RING_LANDING)
        self.landing = landing[0].name if landing else None
        self.epi = tk.phases[1]
        self.queues: list[Queue] = []

    def q(self, name, producer, consumer, depth=2) -> str:
        full = f"c{self.core}.{name}"
        self.queues.append(Queue(full, (self.core, producer), (self.core, consumer), depth))
        return full

    # ---- the schedule --------------------------------------------------------------------

    def schedule(self):
        """(output tiles, k-steps in order, A pool, B pool); a k-step is (output, batch, m, n, k)."""
        s, t = self.shape, self.t
        (b0, m0, n0, k0), (bc, mc, nc, kc) = self.block.starts, self.block.counts
        m_tiles = [(m, min(t.tm, m0 + mc - m)) for m in range(m0, m0 + mc, t.tm)]
        n_tiles = [(n, min(t.tn, n0 + nc - n)) for n in range(n0, n0 + nc, t.tn)]
        k_tiles = [(k, min(t.tk, k0 + kc - k)) for k in range(k0, k0 + kc, t.tk)]
        outputs, steps = [], []
        for flat in range(b0, b0 + bc):
            bidx = _batch_index(s, flat)
            pairs = (itertools.product(m_tiles, n_tiles) if t.label != "B resident" else
                     ((mt, nt) for nt in n_tiles for mt in m_tiles))
            block = [(len(outputs) + i, (bidx, mt, nt)) for i, (mt, nt) in enumerate(pairs)]
            outputs += [o for _, o in block]
            if t.order == "k-outer":  # a batch's output tiles advance together, one k chunk at a time
                steps += [(o, bi, mt, nt, kt) for kt in k_tiles for o, (bi, mt, nt) in block]
            else:
                steps += [(o, bi, mt, nt, kt) for o, (bi, mt, nt) in block for kt in k_tiles]
        a_keys = [(_element(s.a, bidx, mt[0], 0, ka[0]), mt[1], ka[1])
                  for _, bidx, mt, nt, kt in steps for ka in (self.a_chunk(kt),)]
        b_keys = [(_element(s.b, bidx, 0, nt[0], kt[0]), kt[1], nt[1]) for _, bidx, mt, nt, kt in steps]
        return outputs, steps, _Pool(a_keys, t.a_slots), _Pool(b_keys, t.b_slots)

    def a_chunk(self, kt) -> tuple[int, int]:
        """The k range of the A tile holding k-step `kt` (tiling.tka: whole k-steps of the block)."""
        (k0, kc), tka = (self.block.starts[3], self.block.counts[3]), self.t.tka
        start = k0 + (kt[0] - k0) // tka * tka
        return start, min(tka, k0 + kc - start)

    def shared_fills(self) -> list:
        """The shared operand's fills in order, each (batch, tile, k chunk, slot): every core must
        have the same, slots included (a slice lands at the sender's own slot address)."""
        outputs, steps, pa, pb = self.schedule()
        pool = pa if self.share == "a" else pb
        return [(steps[i][1], steps[i][2 if self.share == "a" else 3],
                 self.a_chunk(steps[i][4]) if self.share == "a" else steps[i][4], pool.slot[i])
                for i in range(len(steps)) if pool.new[i]]

    # ---- emission --------------------------------------------------------------------------

    def emit(self):
        ls, pe, sfp = Unit(), Unit(), Unit()
        outputs, steps, pa, pb = self.schedule()
        if len(steps) * 4 > MAX_INSTRUCTIONS_PER_CORE:
            from ...ir.errors import Unsupported

            raise Unsupported(f"matmul plan with {len(steps)} k-steps on core {self.core}: too many to unroll")
        if self.share:
            self.ring_queues()
        if self.k_slices > 1 and len(outputs) != 1:
            from ...ir.errors import PlanError

            raise PlanError(f"matmul split-k plan: core {self.core} has {len(outputs)} output tiles, not one")
        A = self.t.acc_copies
        qa = {s: (self.q(f"a_full{s}", "ls", "pe"), self.q(f"a_free{s}", "pe", "ls")) for s in set(pa.slot)}
        qb = {s: (self.q(f"b_full{s}", "ls", "pe"), self.q(f"b_free{s}", "pe", "ls")) for s in set(pb.slot)}
        self._qb = qb
        qacc = [(self.q(f"acc_full{c}", "pe", "sfp"), self.q(f"acc_free{c}", "sfp", "pe")) for c in range(A)]
        qepi = [(self.q(f"epi_full{c}", "ls", "sfp"), self.q(f"epi_free{c}", "sfp", "ls")) for c in (0, 1)]
        qout = [(self.q(f"out_full{c}", "sfp", "ls", EPILOGUE_PIECES), self.q(f"out_free{c}", "ls", "sfp"))
                for c in (0, 1)]
        first, last = {}, {}
        for i, st in enumerate(steps):
            first.setdefault(st[0], i)
            last[st[0]] = i
        done = sorted(range(len(outputs)), key=lambda o: last[o])  # completion order
        rank = {o: r for r, o in enumerate(done)}   # epilogue copies alternate in completion order
        has_epi_loads = bool(self.epi.loads) and self.finishes
        acc_used = range(min(A, len(outputs)))
        io_used = range(min(2, len(outputs))) if self.finishes else range(0)
        # priming: one free token per slot / copy from the consumer of the data
        for slot in sorted(qa):
            pe.emit(Push(qa[slot][1]))
        for slot in sorted(qb):
            pe.emit(Push(qb[slot][1]))
        for name, value in self.tk.constants:
            a = self.p.at(name)
            sfp.emit(Fill(sfp.tile(a.offset, self.tk.tile(name).dtype, 1, 1, STICK), value))
        for c in acc_used:
            sfp.emit(Push(qacc[c][1]))
        for c in io_used:
            if has_epi_loads:
                sfp.emit(Push(qepi[c][1]))
            ls.emit(Push(qout[c][1]))
        stored = 0
        for i, (o, bidx, mt, nt, kt) in enumerate(steps):
            # ls: this step's new operand tiles; after an output's last step, its epilogue
            # operands and the store of the output finished before it
            # A shared operand's fill goes last: every hop of its slices pushes a token, and a push
            # waits for the unit's transfers in flight, so a private load issued after it would
            # hold up the whole chain of cores at every hop.
            fills = [("a", pa, qa), ("b", pb, qb)]
            # A split k's core loads its slice once: every operand's transfers are issued before
            # any of its pushes (a push waits for the unit's transfers in flight, so A's would
            # hold up the issue of B's)
            after = [] if self.k_slices > 1 else None
            ka = self.a_chunk(kt)
            for which, pool, queues in sorted(fills, key=lambda f: f[0] == self.share):
                if pool.new[i]:
                    k_range = ka if which == "a" else kt
                    if self.share == which:
                        self.ring_fill(ls, queues[pool.slot[i]], which, pool.slot[i], bidx, mt, nt, k_range)
                    else:
                        self.load_operand(ls, queues[pool.slot[i]], which, pool.slot[i], bidx, mt, nt, k_range,
                                          after)
            for finish in after or ():
                finish()
            if i == last[o] and self.finishes:
                c = rank[o] % 2
                if has_epi_loads:
                    ls.emit(Pop(qepi[c][1]))
                    self.epilogue_loads(ls, c, bidx, mt, nt)
                    ls.emit(Push(qepi[c][0]))
                if rank[o] >= 1:
                    prev = done[rank[o] - 1]
                    self.store(ls, qout[(rank[o] - 1) % 2], (rank[o] - 1) % 2, *outputs[prev])
                    stored += 1
            # pe
            slot = o % A
            if i == first[o]:
                pe.emit(Pop(qacc[slot][1]))
            if pa.new[i]:
                pe.emit(Pop(qa[pa.slot[i]][0]))
            if pb.new[i]:
                pe.emit(Pop(qb[pb.slot[i]][0]))
            self.matmul(pe, self.p.at(self.acc, slot), self.p.at(self.ta, pa.slot[i]),
                        self.p.at(self.tb, pb.slot[i]), mt, nt, kt, accumulate=i != first[o], ka=ka)
            if pa.last_use(i):
                pe.emit(Push(qa[pa.slot[i]][1]))
            if pb.last_use(i):
                pe.emit(Push(qb[pb.slot[i]][1]))
            if i == last[o]:
                pe.emit(Push(qacc[slot][0]))
        for o in done:  # sfp: the epilogue of each output in the order the pe finishes them
            slot, c = o % A, rank[o] % 2
            sfp.emit(Pop(qacc[slot][0]))
            rows, cols = outputs[o][1][1], outputs[o][2][1]
            if self.k_slices > 1:
                self.combine_chain(ls, sfp, slot, rows, cols)
            if not self.finishes:
                sfp.emit(Push(qacc[slot][1]))
                continue
            if has_epi_loads:
                sfp.emit(Pop(qepi[c][0]))
            sfp.emit(Pop(qout[c][1]))
            for r0, rc in epilogue_pieces(rows):  # each piece's store overlaps the next piece's epilogue
                self.steps(sfp, self.epi.steps, slot, c, rc, cols, r0)
                sfp.emit(Push(qout[c][0]))
            sfp.emit(Push(qacc[slot][1]))
            if has_epi_loads:
                sfp.emit(Push(qepi[c][1]))
        if done and self.finishes:
            r = len(done) - 1
            self.store(ls, qout[r % 2], r % 2, *outputs[done[r]])
        for slot in sorted(qa):
            ls.emit(Pop(qa[slot][1]))
        for slot in sorted(qb):
            ls.emit(Pop(qb[slot][1]))
        for c in acc_used:
            pe.emit(Pop(qacc[c][1]))
        for c in io_used:
            if has_epi_loads:
                ls.emit(Pop(qepi[c][1]))
            sfp.emit(Pop(qout[c][1]))
        return {"ls": ls.instrs, "pe": pe.instrs, "sfp": sfp.instrs}, self.queues

    def matmul(self, pe, acc, a, b, mt, nt, kt, accumulate: bool, ka=None) -> None:
        """The PE's product of one k-step: the A tile [rows, k] by the B tile [k, cols] into the
        accumulator (allocations `acc`, `a`, `b`). `ka`: the k range the A tile holds (several
        k-steps share one A tile, tiling.tka), from which k-step `kt` is an offset; None: `kt`'s."""
        dtype_a = self.tk.tile(self.ta).dtype
        a_col = 0 if ka is None else kt[0] - ka[0]
        pe.emit(MatMul(pe.tile(acc.offset, "fp32", mt[1], nt[1], acc.row_stride),
                       pe.tile(a.offset + a_col * ITEMSIZE[dtype_a], dtype_a, mt[1], kt[1], a.row_stride),
                       pe.tile(b.offset, self.tk.tile(self.tb).dtype, kt[1], nt[1], b.row_stride),
                       accumulate=accumulate))

    def move_rows(self, ls, which, dst, r0, count, bidx, mt, nt, kt, piece_bytes=PIECE_BYTES, pieces=1):
        """Rows [r0, r0 + count) of an operand tile moved in its own layout (not transposed) into
        allocation `dst` from its row r0 on: a slot's whole tile, or a core's slice of a shared one."""
        access = self.shape.a if which == "a" else self.shape.b
        cols = kt[1] if which == "a" else nt[1]
        row_stride = access.m_stride if which == "a" else access.k_stride   # device stride between tile rows
        isz = ITEMSIZE[access.dtype]
        origin = _element(access, bidx, mt[0], nt[0], kt[0]) + r0 * row_stride
        rows_in_pieces(ls, dst.offset + r0 * dst.row_stride, access.buffer, origin * isz, count, cols * isz,
                        row_stride * isz, dst.row_stride, piece_bytes, pieces)

    def load_operand(self, ls, queues, which, slot, bidx, mt, nt, kt, after=None):
        """Move one operand tile into its slot; `after` (a list) defers the fence, the on-chip
        transpose and the push that hands the tile to the pe, for the caller to emit later."""
        s = self.shape
        full, free = queues
        name = self.ta if which == "a" else self.tb
        access = s.a if which == "a" else s.b
        transposed = s.a_transposed if which == "a" else s.b_transposed
        rows, cols = (mt[1], kt[1]) if which == "a" else (kt[1], nt[1])
        col_stride = access.k_stride if which == "a" else access.n_stride   # device stride between tile columns
        origin = _element(access, bidx, mt[0], nt[0], kt[0])
        isz = ITEMSIZE[access.dtype]
        dst = self.p.at(name, slot)
        ls.emit(Pop(free))
        if not transposed:
            self.move_rows(ls, which, dst, 0, rows, bidx, mt, nt, kt, self.piece_bytes, self.pieces)
        else:  # moved as [cols, rows] (its contiguous dim along the sticks), transposed on chip
            st = self.p.at(self.staging[name])
            rows_in_pieces(ls, st.offset, access.buffer, origin * isz, cols, rows * isz, col_stride * isz,
                            st.row_stride, self.piece_bytes, self.pieces)

        def finish():
            if transposed:
                ls.emit(Fence(),
                        Transpose(ls.tile(dst.offset, access.dtype, rows, cols, dst.row_stride),
                                  ls.tile(st.offset, access.dtype, cols, rows, st.row_stride)))
            ls.emit(Push(full))

        if after is None:
            finish()
        else:
            after.append(finish)

    # ---- the shared operand, all-gathered along the chain of cores ---------------------------

    def ring_queues(self) -> None:
        """The queues this core consumes: slices arriving from each side, and each neighbour's
        word that its slot is open for this core's sends."""
        j, g, base = self.ring_pos, self.ring, self.ring_base
        for side, nb in (("L", j - 1), ("R", j + 1)):
            if 0 <= nb < g:
                for kind in ("from", "open"):
                    self.queues.append(Queue(f"r{base + j}.{kind}{side}", (base + nb, "ls"), (base + j, "ls"),
                                             depth=g))

    def ring_pieces(self, which, rows: int, fill: int, fills: int) -> list[tuple[int, int, int]]:
        """(owner core, first row, rows) of each slice of a shared tile's fill, by owner.

        Owners are positions in the chain. A tile in its own layout: one slice of rows per core, the
        j-th core the j-th. A transposed B
        (a weight W of x @ W.t(), [N, K] in device memory): a slice is whole sticks of k, which the
        owner loads as W's rows (contiguous) and transposes on chip before sending it on, so no
        core transposes more than its slices (the load/store unit cannot overlap a transpose with
        its transfers); with fewer slices than cores the owners are spread over the chain and
        rotate from fill to fill, so consecutive fills' transposes run on different cores."""
        g = self.ring
        if not (which == "b" and self.shape.b_transposed):
            return [(j, r0, rc) for j, (r0, rc) in enumerate(split_evenly(rows, g))]
        unit = STICK // ITEMSIZE[self.shape.b.dtype]
        units = -(-rows // unit)
        n = min(g, units)
        step = max(1, g // (n * max(1, fills)))
        owned = {}
        for p, (u0, uc) in enumerate(split_evenly(units, n)):
            owner = (p * g // n + fill * step * n) % g if n < g else p
            owned[owner] = (u0 * unit, min(uc * unit, rows - u0 * unit))
        if len(owned) != n:
            from ...ir.errors import PlanError

            raise PlanError(f"matmul shared B: {n} slices of fill {fill} on {len(owned)} owners of {g} cores")
        return sorted((o, r0, rc) for o, (r0, rc) in owned.items())

    def ring_fill(self, ls, queues, which, slot, bidx, mt, nt, kt):
        from spyre_runtime.program.isa import Send

        j, g, base = self.ring_pos, self.ring, self.ring_base  # queues and sends name cores base + position
        full, free = queues
        name = self.ta if which == "a" else self.tb
        rows = mt[1] if which == "a" else kt[1]
        dst = self.p.at(name, slot)
        fill = getattr(self, "_fills_done", 0)
        self._fills_done = fill + 1
        if not hasattr(self, "_fills"):
            self._fills = len(self.shared_fills())
        pieces = {o: (r0, rc) for o, r0, rc in self.ring_pieces(which, rows, fill, self._fills)}
        opened = set()
        transposed = which == "b" and self.shape.b_transposed
        if transposed and fill == 0:
            self.preload_transposed_slices(ls)

        def send(to, p):
            side = "R" if to > j else "L"
            if side not in opened:  # the neighbour's slot is open for this fill
                ls.emit(Pop(f"r{base + j}.open{side}"))
                opened.add(side)
            r0, rc = pieces[p]
            at = ls.sp(dst.offset + r0 * dst.row_stride)
            ls.emit(Send(base + to, at, at, rc * dst.row_stride))
            ls.emit(Push(f"r{base + to}.from{'L' if to > j else 'R'}"))

        preloaded = fill in getattr(self, "_preloaded", ())
        if not preloaded:
            ls.emit(Pop(free))
        if j > 0:
            ls.emit(Push(f"r{base + j - 1}.openR"))
        if j < g - 1:
            ls.emit(Push(f"r{base + j + 1}.openL"))
        if j in pieces:
            r0, rc = pieces[j]
            if transposed:
                if not preloaded:
                    self.load_transposed_slice(ls, dst, r0, rc, bidx, nt, kt)
            else:
                self.move_rows(ls, which, dst, r0, rc, bidx, mt, nt, kt, self.piece_bytes, self.pieces)
                ls.emit(Fence())  # the slice has landed before it is sent on
            if j < g - 1:
                send(j + 1, j)
            if j > 0:
                send(j - 1, j)
        for p in sorted((o for o in pieces if o < j), reverse=True):  # slices from the left, nearest first
            ls.emit(Pop(f"r{base + j}.fromL"))
            if j < g - 1:
                send(j + 1, p)
        for p in sorted(o for o in pieces if o > j):  # slices from the right, nearest first
            ls.emit(Pop(f"r{base + j}.fromR"))
            if j > 0:
                send(j - 1, p)
        for side, nb in (("R", j + 1), ("L", j - 1)):  # a neighbour this fill sent nothing to
            if 0 <= nb < g and side not in opened:
                ls.emit(Pop(f"r{base + j}.open{side}"))
        ls.emit(Push(full))

    def preload_transposed_slices(self, ls) -> None:
        """When the B pool holds every fill of a shared transposed B (a slot each), this core loads
        and transposes its slices of all of them before it forwards any: otherwise its transpose
        for one fill waits, in the load/store unit's order, for the previous fill's slices to pass
        through, and the owners' transposes run one after the other down the chain."""
        fills = self.shared_fills()
        if len({f[3] for f in fills}) != len(fills):
            return
        self._preloaded = set()
        for f, (bidx, nt, kt, slot) in enumerate(fills):
            mine = [(r0, rc) for o, r0, rc in self.ring_pieces("b", kt[1], f, len(fills)) if o == self.ring_pos]
            if mine:
                ls.emit(Pop(self._qb[slot][1]))
                self.load_transposed_slice(ls, self.p.at(self.tb, slot), *mine[0], bidx, nt, kt)
                self._preloaded.add(f)

    def load_transposed_slice(self, ls, dst, r0, rc, bidx, nt, kt):
        """Rows [r0, r0 + rc) of a transposed B's tile [tk, tn] (k from kt[0] + r0): moved as W's
        rows [tn, rc] into the staging tile and transposed on chip into the slot's rows."""
        access, isz = self.shape.b, ITEMSIZE[self.shape.b.dtype]
        st = self.p.at(self.staging[self.tb])
        origin = _element(access, bidx, 0, nt[0], kt[0] + r0)
        rows_in_pieces(ls, st.offset, access.buffer, origin * isz, nt[1], rc * isz, access.n_stride * isz,
                       st.row_stride, self.piece_bytes, self.pieces)
        ls.emit(Fence(),
                Transpose(ls.tile(dst.offset + r0 * dst.row_stride, access.dtype, rc, nt[1], dst.row_stride),
                          ls.tile(st.offset, access.dtype, nt[1], rc, st.row_stride)))

    def epilogue_loads(self, ls, c, bidx, mt, nt):
        for name, access in self.epi.loads:
            tile = self.tk.tile(name)
            a, isz = self.p.at(name, c), ITEMSIZE[access.dtype]
            rows, cols = tile_extent(tile.space, "m", "n", {"m": mt[1], "n": nt[1]})
            origin = _element(access, bidx, mt[0], nt[0], 0)
            rows_in_pieces(ls, a.offset, access.buffer, origin * isz, rows, cols * isz, access.m_stride * isz,
                           a.row_stride, self.piece_bytes, self.pieces)

    def store(self, ls, queues, c, bidx, mt, nt):
        """The output tile's stores, one epilogue piece of rows at a time as the sfp hands it over."""
        full, free = queues
        pieces = epilogue_pieces(mt[1])
        for p0, pc in pieces:
            ls.emit(Pop(full))
            for name, access in self.epi.stores:
                a, isz = self.p.at(name, c), ITEMSIZE[access.dtype]
                origin = _element(access, bidx, mt[0] + p0, nt[0], 0)
                # in transfers, as the loads: one per core would hold the bus at the one-transfer
                # ceiling while the cores store their tiles together
                rows_out_in_pieces(ls, access.buffer, origin * isz, a.offset + p0 * a.row_stride, pc, nt[1] * isz,
                                   access.m_stride * isz, a.row_stride, self.piece_bytes,
                                   -(-self.pieces // len(pieces)))
        ls.emit(Push(free))

    def combine_chain(self, ls, sfp, slot, rows, cols):
        """This core's link of a split k's combine: two chains, from the first core rightwards
        and from the last leftwards, meet at the middle core, which finishes (half the hops of
        one chain). The partial travels in pieces of rows so that the chains pipeline (a hop per
        core plus one per piece, not a hop per core for the whole tile): per piece, what the
        chains bring is added in (fp32; each side lands in its own copy of the landing tile),
        then the piece is handed on unless this core finishes."""
        pos, middle, end = self.k_pos, self.k_slices // 2, self.k_slices - 1
        pieces = split_evenly(rows, min(rows, COMBINE_PIECES))
        # the left neighbour sends rightwards if it is before the middle, the right one leftwards if after it
        incoming = ([1] if 0 <= pos - 1 < middle else []) + ([-1] if middle < pos + 1 <= end else [])
        out = None if self.finishes else (1 if pos < middle else -1)
        if out is not None:
            ready = self.q("ready", "sfp", "ls", len(pieces))
            self.queues.append(combine.queue(self.core, len(pieces), out))
        acc = self.p.at(self.acc, slot)
        for r0, rc in pieces:
            for step in incoming:
                combine.receive(sfp, self.core, step)
                self.steps(sfp, self.tk.combine.steps, slot, 0, rc, cols, r0, landing=_LANDING[step])
            if out is not None:
                at = r0 * acc.row_stride
                landing = self.p.at(self.landing, _LANDING[out])
                combine.send_on(ls, sfp, self.core, ready,
                                [(landing.offset + at, acc.offset + at, rc * acc.row_stride)], out)

    def steps(self, sfp, steps, acc_slot, c, rows, cols, row0=0, landing=0):
        """Elementwise steps over one [rows, cols] output tile (from its row `row0`): the
        epilogue's, or the combine's (adding the landing tile's copy `landing`)."""
        def tile(name):
            t = self.tk.tile(name)
            if t.role is Role.CONSTANT:
                a = self.p.at(name)
                return sfp.tile(a.offset, t.dtype, rows, cols, STICK, "scalar")
            a = self.p.at(name, landing if t.role is Role.RING_LANDING else acc_slot if t.role is Role.ACCUMULATOR else c)
            at = row0 * a.row_stride if "m" in t.space else 0
            return sfp.tile(a.offset + at, t.dtype, rows, cols, a.row_stride, broadcast_of(t.space, "m", "n"))

        for st in steps:
            emit_elementwise(sfp, st, tile)


MatmulCore = _Core  # (what a family building on the PE plan subclasses: load_operand, matmul)


def ring_ready(shape, tk, tiling, placement, grid) -> bool:
    """Whether the grid's cores can all-gather the shared operand: each fill splits into a slice
    per core (at least one row each), and every core fills the same tiles in the same order."""
    cores = [_Core(shape, tk, tiling, placement, b, tiling.share, grid.cores, ring=grid.ring) for b in grid.blocks]
    fills = [c.shared_fills() for c in cores]
    chains: dict[int, list] = {}  # every core of a chain fills the same tiles
    for c, f in zip(cores, fills):
        chains.setdefault(c.ring_base, []).append(f)
    if any(f != fs[0] for fs in chains.values() for f in fs[1:]) or not all(fills):
        return False
    if tiling.share == "b" and shape.b_transposed:  # slices of whole sticks of k, as many as there are
        return True
    rows = [(mt[1] if tiling.share == "a" else kt[1]) for _, mt, kt, _ in fills[0]]
    return min(rows) >= grid.cores


__all__ = ["MAX_INSTRUCTIONS_PER_CORE", "MatmulCore", "build_matmul_program", "epilogue_pieces", "ring_ready",
           "rows_in_pieces"]
