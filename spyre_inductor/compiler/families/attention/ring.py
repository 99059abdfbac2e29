"""K/V chunks shared over the ring by the cores of one kv head (issue 31).

Every core of a ring group runs one work unit of the same (batch, kv head). Without sharing,
each core reads every K/V chunk its rows see from device memory: the chunks of one kv head are
read once per core, which on a prefill is most of the bytes moved (refetch) and what kept the
planner from using all 32 cores. In a group, one core, the **loader** (the group's middle, so
the ring hands a chunk at most half the group's length), reads each chunk once, transposes K on
chip once, and sends K^T and V to its neighbours; every other core forwards what lands to the
neighbour farther from the loader. K^T travels before V: the next core's QK^T starts while V is
still on the way (V has its own "full" queue to the pe).

The loader reads the chunks of all its slots and its own Q first, in small pieces; once they
land, a **start** token travels the ring and only then do the other cores read their Q (the bus
serves the group's first chunks before the Q wave, and their transpose and hops overlap it).
A short last chunk travels as K rows (its K^T tile would be partly stale) and every core
transposes it.

Flow control, per chunk t in slot t % slots, between a core and the neighbour it receives from:
``free`` (receiver ls -> sender ls: the slot's last chunk is done with, by this core's pe and
forwarded on) and ``k``/``v`` (sender ls -> receiver ls: landed). Every core of a group visits
the group's chunks (the chunks of its longest unit): a chunk its own rows do not see it only
receives and forwards (its pe hands the slot straight back).

Positions counted on chip: each core counts its own unit's chunks as the unshared program does;
the loader also counts the **group's** (some row of the group reaches the chunk) from the
group's positions, and those counts travel the ring with the start. A count word is one core's
(the validator matches the queue operations of loops per core and address), so every token
between cores is exchanged for every chunk, and only the data is guarded by the group's count
(each core's copy): the loader's loads and transpose, every send. A core's own work on a chunk
(its pe's and sfp's, the tokens to them) sits in loops on its own count. A chunk no row of the
group sees is not read at all, nor sent.
"""

from __future__ import annotations

from dataclasses import dataclass

from spyre_runtime.program.emitter import Unit
from spyre_runtime.program.isa import Binary, Fence, Fill, Load, MatMul, Pop, Push, Reduce, Send, Transpose
from spyre_runtime.program.operands import ITEMSIZE, STICK, Addr, ScratchCount
from spyre_runtime.program.program import Queue

from ...ir.errors import PlanError
from ...core.transfers import rows_in_pieces
from .codegen import NINF, _Core
from .plan import Chunk, CoreWork, ring_groups


# The loader's K and V loads move as transfers of about this size: as the Q tiles every core
# loads meanwhile (a few rows of a head), so its chunks land with them, not after
RING_PIECE_BYTES = 2048


@dataclass(frozen=True)
class RingRole:
    """Where one core sits in its ring group."""

    group: tuple[int, ...]            # the group's cores, in ring order
    loader: int                       # the core that reads the group's chunks
    up: int | None                    # the neighbour this core receives from (None: the loader)
    downs: tuple[int, ...]            # the neighbours it hands chunks to
    chunks: tuple[Chunk, ...]         # the group's chunks (its longest unit's)
    rows: tuple[int, int]             # the group's query rows [first, last) (its positions)


def roles(work: tuple[CoreWork, ...], share: int) -> dict[int, RingRole]:
    """Each core's role, for `work` of one unit per core in problem order (plan.divide one_each)."""
    units = [w.units[0] for w in work]
    if any(len(w.units) != 1 for w in work) or [w.core for w in work] != list(range(len(work))):
        raise PlanError("attention ring groups need one unit per core, on cores 0, 1, ... in problem order")
    out = {}
    for members in ring_groups(units, share):
        cores = tuple(work[k].core for k in members)
        loader = cores[len(cores) // 2]
        longest = max((units[k] for k in members), key=lambda u: len(u.chunks))
        first, last = units[members[0]], units[members[-1]]
        for c in cores:
            up = None if c == loader else (c + 1 if c < loader else c - 1)
            downs = tuple(d for d in (c - 1, c + 1) if d in cores and (d < c <= loader or loader <= c < d))
            out[c] = RingRole(cores, loader, up, downs, longest.chunks, (first.i0, last.i0 + last.rows))
    return out


class RingCore(_Core):
    """One core of a ring group: the unshared core's softmax, Q, output and count code, with
    its own K/V schedule."""

    def __init__(self, shape, tk, tiling, placement, work: CoreWork, role: RingRole):
        super().__init__(shape, tk, tiling, placement, work)
        if len(self.units) != 1 or self.empty_units:
            raise PlanError(f"attention ring core {self.core}: one unit with chunks, got {len(work.units)}")
        self.role = role
        self.unit = self.units[0]
        if [c.j0 for c in self.unit.chunks] != [c.j0 for c in role.chunks[:len(self.unit.chunks)]]:
            raise PlanError(f"attention ring core {self.core}: its chunks are not a prefix of its group's")

    # ---- guards: the group's count outside, the unit's own inside ----------------------------

    def group_count(self, t: int, rows: int = 1):
        return self.tile("group_count", None, t, rows, 1, "int32")

    def in_group(self, unit, t: int, emit) -> None:
        """`emit()` chunk t's ring traffic: always the first chunk, a later one when some row of
        the group reaches it (counted on chip) or statically (the group's chunks)."""
        if not self.on_chip or t == 0:
            emit()
            return
        with unit.loop(ScratchCount(self.group_count(t), 1)):
            emit()

    def own(self, unit, t: int, emit) -> None:
        """`emit()` this core's work on chunk t when its unit has it and (counted on chip) some
        row of the unit reaches it."""
        if t >= len(self.unit.chunks):
            return
        if not self.on_chip or t == 0:
            emit()
            return
        with unit.loop(ScratchCount(self.count_tile(0, t), 1)):
            emit()

    def xq(self, name: str, producer: int, consumer: int, depth: int = 4) -> str:
        """A ring queue from `producer`'s ls to `consumer`'s ls, declared by its producer."""
        full = f"c{producer}.ring_{name}_to{consumer}"
        if producer == self.core:
            self.queues.append(Queue(full, (producer, "ls"), (consumer, "ls"), depth))
        return full

    def send(self, ls, dst: int, name: str, slot, nbytes: int) -> None:
        a = self.p.at(name, slot)
        ls.emit(Send(dst, Addr(a.offset), Addr(a.offset), nbytes))

    # ---- the program ---------------------------------------------------------------------------

    def emit(self):
        ls, pe, sfp = Unit(), Unit(), Unit()
        s, u, role = self.s, self.unit, self.role
        loader = role.up is None
        T, ns = len(role.chunks), self.t.slots
        slots = range(min(ns, T))
        used_sp = range(min(2, len(u.chunks)))
        qf, qe = self.q("q_full0", "ls", "pe"), self.q("q_free0", "pe", "ls")
        kf = {k: self.q(f"kv_full{k}", "ls", "pe") for k in slots}
        vf = {k: self.q(f"v_full{k}", "ls", "pe") for k in slots}
        ke = {k: self.q(f"kt_free{k}", "pe", "ls") for k in slots}
        ve = {k: self.q(f"v_free{k}", "pe", "ls") for k in slots}
        sf = {k: self.q(f"s_full{k}", "pe", "sfp") for k in (0, 1)}
        se = {k: self.q(f"s_free{k}", "sfp", "pe") for k in (0, 1)}
        pf = {k: self.q(f"p_full{k}", "sfp", "pe") for k in (0, 1)}
        pfree = {k: self.q(f"p_free{k}", "pe", "sfp") for k in (0, 1)}
        ar = self.q("acc_ready", "pe", "sfp")
        of, oe = {0: self.q("o_full0", "sfp", "ls")}, {0: self.q("o_free0", "ls", "sfp")}
        # ring queues: chunks (and the group's counts) from `up`, free slots back to it
        land = {(d, x): self.xq(x, self.core, d) for d in role.downs for x in ("k", "v", "start")}
        free_down = {d: self.xq("free", d, self.core) for d in role.downs}
        if not loader:
            land_up = {x: self.xq(x, role.up, self.core) for x in ("k", "v", "start")}
            free_up = self.xq("free", self.core, role.up)

        # priming: one free token per buffer, from the buffer's consumer
        pe.emit(Push(qe))
        for k in slots:
            pe.emit(Push(ke[k]), Push(ve[k]))
        for k in used_sp:
            sfp.emit(Push(se[k]))
            pe.emit(Push(pfree[k]))
        ls.emit(Push(oe[0]))
        for name, value in (("scale", s.scale), ("ninf", NINF), ("fill", s.masked_score), ("zero", 0.0),
                            ("one", 1.0), ("izero", 0)):
            sfp.emit(Fill(self.tile(name, None, 0, 1, 1, "int32" if name == "izero" else "fp32"), value))

        if self.on_chip:
            self.counts(ls, pe, sfp)

        def transpose(ch, slot):
            return Transpose(self.tile("kt", slot, 0, s.D, ch.n), self.tile("k_rows", slot, 0, ch.n, s.D))

        def read(t):
            """The loader's loads of chunk t: in pieces (the bus serves a core by the transfers
            it has in flight, and every core's Q is in flight with the first chunks)."""
            ch, slot = role.chunks[t], t % ns
            ls.emit(Pop(ke[slot]), Pop(ve[slot]))
            self.in_group(ls, t, lambda: (self.load_pieces(ls, "k_rows", s.k, s.D, ch, slot),
                                          self.load_pieces(ls, "v", s.v, s.Dv, ch, slot)))

        # ---- ls: the loader reads the chunks of every slot and its Q, in flight together (a
        # transpose or a send waits for every load of its ls: what is not loaded now waits for
        # this ls's work); once they land, the start (with the group's counts) travels the ring,
        # and only then do the other cores read their Q: the bus serves the group's first chunks
        # first, and their transposes and hops overlap the other cores' Q
        if loader:
            for t in slots:
                read(t)
            ls.emit(Pop(qe))
            self.load_q(ls, u, 0)
            ls.emit(Fence())
        else:
            ls.emit(Pop(land_up["start"]))
        for d in role.downs:
            if self.on_chip:
                self.send(ls, d, "group_count", None, self.chunks * STICK)
            ls.emit(Push(land[d, "start"]))
        if not loader:  # the slots of the first chunks are free (its pe primed them): say so upstream
            for t in slots:
                ls.emit(Pop(ke[t]), Pop(ve[t]), Push(free_up))
            ls.emit(Pop(qe))
            self.load_q(ls, u, 0)
        for t, ch in enumerate(role.chunks):
            slot = t % ns

            if loader:
                if t >= ns:
                    read(t)
                ls.emit(Fence())
                if ch.n == self.t.kv:
                    self.in_group(ls, t, lambda ch=ch, slot=slot: ls.emit(transpose(ch, slot)))
            else:
                if t >= ns:  # (this core's pe is done with the slot's last chunk, and it went on)
                    ls.emit(Pop(ke[slot]), Pop(ve[slot]), Push(free_up))
                ls.emit(Pop(land_up["k"]))
            if t == 0:
                ls.emit(Push(qf))   # (a push waits for every load of its ls: Q has landed)
            # K^T of a whole chunk fills its tile: it travels transposed, once; a short last chunk's
            # rows of K^T are partly stale, so its K rows travel and every core transposes them
            k_name = "kt" if ch.n == self.t.kv else "k_rows"
            k_bytes = (s.D if ch.n == self.t.kv else ch.n) * self.p.at(k_name, slot).row_stride
            for d in role.downs:
                ls.emit(Pop(free_down[d]))
                self.in_group(ls, t, lambda d=d, slot=slot: self.send(ls, d, k_name, slot, k_bytes))
                ls.emit(Push(land[d, "k"]))
            if ch.n == self.t.kv:
                self.own(ls, t, lambda slot=slot: ls.emit(Push(kf[slot])))
            if not loader:
                ls.emit(Pop(land_up["v"]))
            v_bytes = ch.n * self.p.at("v", slot).row_stride
            for d in role.downs:
                self.in_group(ls, t, lambda d=d, slot=slot: self.send(ls, d, "v", slot, v_bytes))
                ls.emit(Push(land[d, "v"]))
            if ch.n < self.t.kv:
                self.own(ls, t, lambda ch=ch, slot=slot: ls.emit(transpose(ch, slot), Push(kf[slot])))
            self.own(ls, t, lambda slot=slot: ls.emit(Push(vf[slot])))
        ls.emit(Pop(of[0]))
        self.store(ls, u, 0)
        ls.emit(Push(oe[0]), Pop(qe))
        for k in slots:
            ls.emit(Pop(ke[k]), Pop(ve[k]))

        # ---- pe: S_t = Q K_t^T, then P_{t-1} V_{t-1}; a slot goes back to the ls whether its chunk
        # was this core's or only handed on
        def qk(t):
            slot, b = t % ns, t % 2

            def mine():
                mc = u.chunks[t]
                if t == 0:
                    pe.emit(Pop(qf))
                pe.emit(Pop(kf[slot]), Pop(se[b]))
                for row, rows in self.blocks(u, mc.r0):
                    pe.emit(MatMul(self.tile("s", b, row, rows, mc.n), self.tile("q", 0, row, rows, s.D),
                                   self.tile("kt", slot, 0, s.D, mc.n), accumulate=False))
                pe.emit(Push(sf[b]))
            self.own(pe, t, mine)
            pe.emit(Push(ke[slot]))

        def pv(t):
            slot, b = t % ns, t % 2

            def mine():
                mc = u.chunks[t]
                pe.emit(Pop(pf[b]), Pop(vf[slot]))
                for row, rows in self.blocks(u, mc.r0):
                    pe.emit(MatMul(self.tile("acc", None, row, rows, s.Dv), self.tile("p", b, row, rows, mc.n),
                                   self.tile("v", slot, 0, mc.n, s.Dv), accumulate=True))
                pe.emit(Push(pfree[b]), Push(ar))
            self.own(pe, t, mine)
            pe.emit(Push(ve[slot]))

        qk(0)
        for t in range(T):
            if t + 1 < T:
                qk(t + 1)
            pv(t)
        pe.emit(Push(qe))
        for k in used_sp:
            pe.emit(Pop(se[k]))

        # ---- sfp: the unshared core's online softmax over this unit's chunks
        for c in range(len(u.chunks)):
            if c == 0:
                self.init(sfp, u)
            self.own(sfp, c, lambda c=c: self.softmax_step(sfp, c, u, c, sf, se, pf, pfree, {}, {}, ar, False))
        sfp.emit(Pop(ar), Pop(oe[0]))
        self.finish(sfp, u, 0)
        sfp.emit(Push(of[0]))
        for k in used_sp:
            sfp.emit(Pop(pfree[k]))
        sfp.emit(Pop(oe[0]))
        return {"ls": ls.instrs, "pe": pe.instrs, "sfp": sfp.instrs}, self.queues

    def load_pieces(self, ls, name, acc, cols, ch: Chunk, slot) -> None:
        isz = ITEMSIZE[acc.dtype]
        a = self.p.at(name, slot)
        symbol, element = acc.dev(self.unit.b, self.unit.kvh, ch.j0, 0)
        rows_in_pieces(ls, a.offset, symbol, element * isz, ch.n, cols * isz, acc.strides[2] * isz, a.row_stride,
                       RING_PIECE_BYTES)

    def _dtype(self, name):
        if name in ("group_pos", "group_max"):
            return self.s.positions.dtype
        if name == "group_count":
            return "int32"
        return super()._dtype(name)

    def counts(self, ls, pe, sfp) -> None:
        """The unit's own chunk counts (as unshared) and, on the loader, the group's: its sfp
        counts them from the group's positions (they travel the ring with the start). The ls and
        the pe wait for them before their first guarded loop."""
        s, role = self.s, self.role
        bounds = self.q("bounds_full", "ls", "sfp")
        own_ls, own_pe = self.q("counts_ls", "sfp", "ls"), self.q("counts_pe", "sfp", "pe")
        self.load_bounds(ls)
        if role.up is None:
            p, isz = s.positions, ITEMSIZE[s.positions.dtype]
            first, last = role.rows
            ls.emit(Load(ls.sp(self.p.at("group_pos").offset), ls.dev(p.buffer, p.at(0, 0, first, 0) * isz), 1,
                         (last - first) * isz, 0, self.p.at("group_pos").row_stride))
        ls.emit(Fence(), Push(bounds))
        sfp.emit(Pop(bounds))
        self.count_chunks(sfp)
        if role.up is None:
            first, last = role.rows
            group_ls = self.q("group_ls", "sfp", "ls")
            sfp.emit(Reduce("max", self.tile("group_max", None, 0, 1, 1), self.tile("group_pos", None, 0, 1, last - first)),
                     Binary("le", self.group_count(0, self.chunks), self.tile("chunk_start", None, 0, self.chunks, 1),
                            self.tile("group_max", None, 0, self.chunks, 1, broadcast="scalar")),
                     Push(group_ls))
            ls.emit(Pop(group_ls))
        sfp.emit(Push(own_ls), Push(own_pe))
        ls.emit(Pop(own_ls))
        pe.emit(Pop(own_pe))


__all__ = ["RingCore", "RingRole", "roles"]
