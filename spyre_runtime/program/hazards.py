"""The scratchpad hazard check: a finished program replayed for what its accesses do to scratchpad bytes.

The validator (validate.py) proves each access in bounds, stick-aligned, and the queues
balanced. What it cannot see is time: two tiles placed on the same bytes while both are live.
This check finds that from the program alone, never from the plan that made it.

It walks every unit's instruction stream as the machine runs it (loops unrolled, a pop waiting
for a push, a push for room), with a vector clock per unit: one unit's instructions are ordered,
and a push orders what its unit did before it ahead of what the popping unit does after it (a
push waiting for room is ordered after the pop that made it). Per scratchpad stick (every row of
every access starts on one, so sticks are exact) it keeps the last write and the reads since,
and raises on:

* a race: an access and an earlier write (or a write and an earlier read) of the same bytes by
  different units with nothing ordering them (the card may run them either way round): e.g. a
  temporary placed on a stream buffer the load/store unit is filling;
* a clobbered value: a read of bytes of which some still hold one write's value and others hold
  a later write that overwrote part of that value: e.g. a tile placed across the end of another
  one that is read again after it;
* a buried value: a read of bytes written over a value nothing had read yet (a program may
  compute what it never uses, but then it does not read those bytes again): e.g. two constants,
  or two loaded tiles, placed on the same bytes;
* a reshaped value: a tile read as other elements than it was written as (another dtype, or
  rows another stride apart): e.g. a wider temporary written over a loaded tile read again.

A write that reads the bytes it writes (an accumulation, a result over its operand) updates
the value there rather than making a new one. Two tiles on exactly the same bytes (or one inside
the other, read alike) within one unit's order look like one tile updated there: the bytes cannot
tell that from a correct program, so the planners' own placement checks (allocate.py) stay.

Identical cores (the same scratchpad accesses, loop counts and queue pattern, no ring between
them: they differ only in the device bytes they move) are replayed once. Loops whose count is a
size (issue 18) run at their static maximum.
"""

from __future__ import annotations

import collections
import functools

import numpy as np

from . import isa
from .operands import ITEMSIZE, STICK
from .program import Program
from .validate import PlacementError, ProgramError


class ScratchpadHazard(PlacementError):
    """Two tiles of a program share scratchpad bytes while both are live."""


class _Unit:
    __slots__ = ("core", "name", "local", "g", "instrs", "ends", "pc", "loops", "done", "clock")

    def __init__(self, core, name, instrs, g, nunits):
        self.core, self.name, self.instrs, self.g = core, name, instrs, g
        self.local = isa.UNITS.index(name)
        self.ends = isa.loop_ends(instrs)
        self.pc, self.loops, self.done = 0, [], False
        self.clock = np.zeros(nunits, dtype=np.int64)  # per unit, the latest of its clock this one knows
        self.clock[g] = 1


class _Queue:
    __slots__ = ("depth", "tokens", "pushes", "pops", "popped")

    def __init__(self, depth):
        self.depth, self.tokens = depth, 0
        self.pushes = collections.deque()  # the pusher's clock at each push not yet popped
        self.pops = 0
        self.popped = collections.deque(maxlen=depth)  # the popper's clock at the last `depth` pops


_PC = 24  # a read mark: the reader's clock << _PC | its pc (the latest read has the largest mark)


class _Shadow:
    """One core's scratchpad, per stick: the write that holds it (its slot, 0: never written)
    and, per unit of the core, that unit's latest read of it since (its mark, 0: none)."""

    def __init__(self, sticks):
        self.slot = np.zeros(sticks, dtype=np.int64)
        self.marks = np.zeros((len(isa.UNITS), sticks), dtype=np.int64)


def check_scratchpad(program: Program, scratchpad_bytes: int | None = None) -> None:
    """Raise ScratchpadHazard naming the cores, units, instructions and bytes of the first hazard
    in `program` (see the module docstring), PlacementError if its queues deadlock. The program
    is one the validator accepted (its accesses are on sticks and inside the scratchpad)."""
    _Replay(program, scratchpad_bytes).run()


class _Replay:
    def __init__(self, program: Program, scratchpad_bytes: int | None):
        if scratchpad_bytes is None:
            from ..hardware import HARDWARE

            scratchpad_bytes = HARDWARE.scratchpad_bytes
        self.program = program
        self.sticks = scratchpad_bytes // STICK
        cores = _cores_to_replay(program)
        specs = [(cp.core, name, instrs) for cp in program.cores if cp.core in cores
                 for name, instrs in cp.units if instrs]
        n = len(specs)
        self.units = [_Unit(core, name, instrs, g, n) for g, (core, name, instrs) in enumerate(specs)]
        self.by_place = {(u.core, u.local): u for u in self.units}
        self.queues = {q.name: _Queue(q.depth) for q in program.queues}
        self.shadows: dict[int, _Shadow] = {}
        self.nunits = n
        # Per write, by slot in replay order (slot 0: never written): its unit, its clock then, its
        # pc, and the value it holds: its own slot, or for an update in place the value updated.
        self.w_unit, self.w_clock, self.w_pc, self.w_value = [-1], [0], [0], [0]
        # Per value (by its first slot): how many sticks still hold it, how it was written
        # (_shape), whether anything read it, whether a later write took some of its sticks
        # (damaged: by which unit and pc) or it was written over one nothing read (buried: which).
        self.alive: dict[int, int] = {}
        self.shape: dict[int, int] = {0: -1}
        self.was_read: set[int] = set()
        self.damaged: dict[int, tuple[int, int]] = {}
        self.buried: dict[int, int] = {}

    def shadow(self, core: int) -> _Shadow:
        s = self.shadows.get(core)
        if s is None:
            s = self.shadows[core] = _Shadow(self.sticks)
        return s

    # ---- the walk ------------------------------------------------------------------

    def run(self) -> None:
        live = self.units
        while live:
            progressed = False
            for u in live:
                progressed |= self.advance(u)
            live = [u for u in live if not u.done]
            if live and not progressed:
                blocked = "; ".join(f"core {u.core} unit {u.name} at {u.instrs[u.pc].opcode} "
                                    f"{getattr(u.instrs[u.pc], 'queue', '')!r}" for u in live)
                raise PlacementError(f"program {self.program.name!r}: queues deadlock: {blocked}")

    def advance(self, u: _Unit) -> bool:
        ran = False
        instrs, n = u.instrs, len(u.instrs)
        while u.pc < n:
            ins = instrs[u.pc]
            kind = type(ins)
            if kind is isa.Pop:
                q = self.queues[ins.queue]
                if q.tokens == 0:
                    return ran
                q.tokens -= 1
                np.maximum(u.clock, q.pushes.popleft(), out=u.clock)
                q.popped.append(u.clock.copy())
                q.pops += 1
                u.clock[u.g] += 1
            elif kind is isa.Push:
                q = self.queues[ins.queue]
                if q.tokens >= q.depth:
                    return ran
                pushed = q.pops + q.tokens  # this is push number `pushed`
                if pushed >= q.depth:  # it waited for room: after pop number pushed - depth
                    np.maximum(u.clock, q.popped[pushed - q.depth - (q.pops - len(q.popped))], out=u.clock)
                q.tokens += 1
                q.pushes.append(u.clock.copy())
                u.clock[u.g] += 1
            elif kind is isa.Loop or kind is isa.EndLoop:
                if kind is isa.Loop and ins.touches():  # a count read from the scratchpad (issue 31)
                    self.access(u, ins, tuple(loop[2] for loop in u.loops))
                # (a size's loop, or one counted on chip, at its maximum)
                u.pc = isa.loop_step(ins, u.pc, u.loops, u.ends, None)
                ran = True
                continue
            else:
                self.access(u, ins, tuple(loop[2] for loop in u.loops))
            u.pc += 1
            ran = True
        u.done = True
        return ran

    # ---- one instruction's scratchpad accesses --------------------------------------

    def access(self, u: _Unit, ins, idx) -> None:
        touches = ins.touches()
        modes = ins.scratch_modes()
        if len(modes) != len(touches):
            raise ProgramError(f"{self.where(u, u.pc, ins)}: declares {len(modes)} scratchpad modes for its "
                               f"{len(touches)} accesses (isa.Instruction.scratch_modes)")
        spans = [(_sticks(t, idx, u.core), m, _shape(t)) for t, m in zip(touches, modes) if m]
        read = []
        for (core, sticks), mode, shape in spans:
            if "r" in mode:
                self.read(u, ins, idx, core, sticks, shape)
                read.append((core, sticks))
        for (core, sticks), mode, shape in spans:
            if "w" in mode:
                # written where it was read (an accumulation, a result over its operand): the same
                # value updated, not a new one (the validator allows no partial overlap)
                self.write(u, ins, idx, core, sticks, shape, any(_same(where, (core, sticks)) for where in read))

    def read(self, u: _Unit, ins, idx, core: int, sticks, shape: int) -> None:
        sh = self.shadow(core)
        ids = sh.slot[sticks]
        low, high = int(ids.min()), int(ids.max())
        slots = (low,) if low == high else np.unique(ids).tolist()
        values = set()
        for slot in slots:
            if slot:
                self.ordered(u, ins, idx, "reads", "writes", slot, core, sticks, ids == slot)
                values.add(self.w_value[slot])
        for value in values:
            if len(values) > 1 and value in self.damaged:  # some of a value, beside what cut into it
                self.clobbered(u, ins, idx, sticks, ids, value)
            if value in self.buried:
                self.dead(u, ins, idx, sticks, ids, value)
            if not _alike(shape, self.shape[value]):
                self.reshaped(u, ins, idx, sticks, shape, value)
        self.was_read |= values
        sh.marks[u.local][sticks] = int(u.clock[u.g]) << _PC | u.pc

    def write(self, u: _Unit, ins, idx, core: int, sticks, shape: int, in_place: bool) -> None:
        sh = self.shadow(core)
        latest = sh.marks[:, sticks].max(axis=1).tolist()
        for local, mark in enumerate(latest):
            reader = self.by_place.get((core, local))
            if mark and reader is not u and u.clock[reader.g] < mark >> _PC:
                self.race(u, ins, idx, "writes", "reads", reader, mark & ((1 << _PC) - 1), core, sticks,
                          sh.marks[local][sticks] == mark)
        ids = sh.slot[sticks]
        low, high = int(ids.min()), int(ids.max())
        slots = (low,) if low == high else np.unique(ids).tolist()
        for slot in slots:
            if slot:
                self.ordered(u, ins, idx, "writes", "writes", slot, core, sticks, ids == slot)
        if in_place:  # each stick keeps its value: a new slot per value updated
            for slot in slots:
                new = self.new_slot(u, self.w_value[slot])
                if len(slots) == 1:
                    sh.slot[sticks] = new
                else:
                    _where(sh.slot, sticks, ids == slot, new)
        else:  # a new value: the ones it overwrites lose these sticks
            new = self.new_slot(u, None)
            self.alive[new], self.shape[new] = _count(sticks), shape
            counts = ((low, ids.size),) if low == high else zip(*np.unique(ids, return_counts=True))
            for slot, n in counts:
                if slot:
                    self.retire(u, new, self.w_value[int(slot)], int(n))
            sh.slot[sticks] = new
        sh.marks[:, sticks] = 0

    def ordered(self, u, ins, idx, does, did, slot, core, sticks, which) -> None:
        """A race unless the write in `slot` is this unit's own or ordered before u's clock."""
        g = self.w_unit[slot]
        if g != u.g and u.clock[g] < self.w_clock[slot]:
            self.race(u, ins, idx, does, did, self.units[g], self.w_pc[slot], core, sticks, which)

    def new_slot(self, u: _Unit, value: int | None) -> int:
        slot = len(self.w_unit)
        self.w_unit.append(u.g)
        self.w_clock.append(int(u.clock[u.g]))
        self.w_pc.append(u.pc)
        self.w_value.append(slot if value is None else value)
        return slot

    def retire(self, u, new: int, value: int, n: int) -> None:
        """`value` loses `n` sticks to the new value `new`: if it keeps some it is damaged; if it
        keeps none and nothing read it, `new` is written over it (a program may compute what it
        never uses, but if it then reads these bytes, it read the wrong value)."""
        self.alive[value] -= n
        if self.alive[value] > 0:
            self.damaged.setdefault(value, (u.g, u.pc))
        elif value not in self.was_read:
            self.buried.setdefault(new, value)

    # ---- what a hazard says ------------------------------------------------------------

    def where(self, u: _Unit, pc: int, ins=None) -> str:
        ins = ins if ins is not None else u.instrs[pc]
        return f"core {u.core} unit {u.name} instruction {pc} ({ins.opcode})"

    def race(self, u, ins, idx, does, did, other, pc, core, sticks, which) -> None:
        lo, hi = _bytes(sticks, which)
        on = "" if core == u.core else f" of core {core}"
        raise ScratchpadHazard(
            f"program {self.program.name!r}: {self.where(u, u.pc, ins)}{_at(idx)} {does} scratchpad bytes "
            f"[{lo}, {hi}){on}, which {self.where(other, pc)} {did}, and no queue orders the two: two tiles "
            f"live at once share these bytes")

    def writer(self, slot: int) -> str:
        return self.where(self.units[self.w_unit[slot]], self.w_pc[slot])

    def holding(self, ids, value):
        """Which of the sticks read (`ids`: their slots) hold `value`."""
        return np.isin(ids, [s for s in np.unique(ids).tolist() if self.w_value[s] == value])

    def clobbered(self, u, ins, idx, sticks, ids, value) -> None:
        mine = self.holding(ids, value)
        kept, other = _bytes(sticks, mine), _bytes(sticks, ~mine)
        dg, dpc = self.damaged[value]
        raise ScratchpadHazard(
            f"program {self.program.name!r}: {self.where(u, u.pc, ins)}{_at(idx)} reads scratchpad bytes "
            f"[{kept[0]}, {kept[1]}) still holding the value {self.writer(value)} wrote, beside "
            f"[{other[0]}, {other[1]}) written since, after {self.where(self.units[dg], dpc)} overwrote part "
            f"of that value: two tiles live at once share these bytes")

    def reshaped(self, u, ins, idx, sticks, shape, value) -> None:
        lo, hi = _bytes(sticks, slice(None))
        raise ScratchpadHazard(
            f"program {self.program.name!r}: {self.where(u, u.pc, ins)}{_at(idx)} reads scratchpad bytes "
            f"[{lo}, {hi}) as {_describe(shape)}, which hold the value {self.writer(value)} wrote as "
            f"{_describe(self.shape[value])}: two tiles live at once share these bytes")

    def dead(self, u, ins, idx, sticks, ids, value) -> None:
        lo, hi = _bytes(sticks, self.holding(ids, value))
        raise ScratchpadHazard(
            f"program {self.program.name!r}: {self.where(u, u.pc, ins)}{_at(idx)} reads scratchpad bytes "
            f"[{lo}, {hi}) holding the value {self.writer(value)} wrote over the value "
            f"{self.writer(self.buried[value])} wrote before anything read it: two tiles live at once share "
            f"these bytes")


_DTYPES = {name: k for k, name in enumerate(ITEMSIZE)}


def _shape(touch) -> int:
    """How an access lays out its elements: a tile's dtype and, when it has several rows, their
    stride (-1: bytes, as a transfer moves them)."""
    if touch[0] != "tile":
        return -1
    tile = touch[1]
    rows = tile.stored_shape[0]
    return _DTYPES[tile.dtype] << 40 | (tile.row_stride if rows > 1 else 0)


def _describe(shape: int) -> str:
    dtype = list(_DTYPES)[shape >> 40]
    stride = shape & 0xFFFFFFFFFF
    return f"{dtype}" + (f" rows {stride} B apart" if stride else " (one row)")


def _alike(read: int, written: int) -> bool:
    """A tile read as it was written: the same dtype, and the same row stride where both have
    several rows (bytes moved by a transfer may be read as anything)."""
    if read < 0 or written < 0:
        return True
    if read >> 40 != written >> 40:
        return False
    a, b = read & 0xFFFFFFFFFF, written & 0xFFFFFFFFFF
    return a == b or not a or not b


def _same(a, b) -> bool:
    (ca, sa), (cb, sb) = a, b
    if ca != cb or type(sa) is not type(sb):
        return False
    return sa == sb if isinstance(sa, slice) else (sa.shape == sb.shape and bool((sa == sb).all()))


def _where(array, sticks, which, value) -> None:
    """array[sticks][which] = value, for a slice or an index array of sticks."""
    if isinstance(sticks, slice):
        sticks = np.arange(sticks.start, sticks.stop)
    array[sticks[which]] = value


def _count(sticks) -> int:
    if isinstance(sticks, slice):
        return sticks.stop - sticks.start
    return int(np.unique(sticks).size)


def _at(idx) -> str:
    return f" at loop indices {idx}" if idx else ""


def _bytes(sticks, which) -> tuple[int, int]:
    """The byte range of the sticks selected by the boolean mask `which` (lowest to highest)."""
    if isinstance(sticks, slice):
        sticks = np.arange(sticks.start, sticks.stop)
    chosen = sticks[which]
    return int(chosen.min()) * STICK, (int(chosen.max()) + 1) * STICK


@functools.lru_cache(maxsize=1024)
def _row_sticks(rows: int, width: int, stride_sticks: int) -> np.ndarray:
    return (np.arange(rows)[:, None] * stride_sticks + np.arange(width)).ravel()


def _rows(addr: int, rows: int, nbytes: int, stride: int):
    """The sticks of `rows` rows of `nbytes` bytes, `stride` bytes apart, from `addr` (all stick-
    aligned: the validator's, but for a packed column's rows): a slice when they are contiguous,
    else an index array."""
    width = -(-nbytes // STICK)
    first = addr // STICK
    if 0 < stride == nbytes < STICK:  # a packed column: its rows' elements adjacent
        return slice(first, -(-(addr + rows * nbytes) // STICK))
    if rows <= 1 or stride == 0:
        return slice(first, first + width)
    if stride == width * STICK:
        return slice(first, first + rows * width)
    return _row_sticks(rows, width, stride // STICK) + first


def _sticks(touch, idx, core: int):
    """(whose scratchpad, its sticks) for one scratchpad access of `touches`."""
    kind = touch[0]
    if kind == "tile":
        tile = touch[1]
        rows, cols = tile.stored_shape
        return core, _rows(tile.addr.at(idx), rows, cols * ITEMSIZE[tile.dtype], tile.row_stride)
    if kind == "sp_rows":
        _, addr, rows, nbytes, stride = touch
        return core, _rows(addr.at(idx), rows, nbytes, stride)
    if kind == "sp_rows_on":
        _, other, addr, rows, nbytes, stride = touch
        return other, _rows(addr.at(idx), rows, nbytes, stride)
    raise ProgramError(f"a scratchpad mode for a {kind!r} access")


def _cores_to_replay(program: Program) -> set[int]:
    """Every core that meets another (a queue between them, a ring send), and one of each set of
    alike cores that meet no other: their replays would be the same."""
    coupled = set()
    for q in program.queues:
        if q.producer[0] != q.consumer[0]:
            coupled.update((q.producer[0], q.consumer[0]))
    for cp in program.cores:
        for _, instrs in cp.units:
            for ins in instrs:
                if isinstance(ins, isa.Send):
                    coupled.update((cp.core, ins.core))
    keep, seen = set(coupled), set()
    depth = {q.name: q.depth for q in program.queues}
    for cp in program.cores:
        if cp.core in coupled:
            continue
        key = _core_key(cp, depth)
        if key not in seen:
            seen.add(key)
            keep.add(cp.core)
    return keep


def _core_key(cp, depth) -> tuple:
    """What a core's replay depends on: per unit, each instruction's scratchpad accesses and
    modes, loop counts and queue pattern (queues renamed in order of first use)."""
    names: dict[str, int] = {}
    units = []
    for unit, instrs in cp.units:
        out = []
        for ins in instrs:
            kind = type(ins)
            if kind is isa.Push or kind is isa.Pop:
                out.append((kind.opcode, names.setdefault(ins.queue, len(names)), depth.get(ins.queue)))
            elif kind is isa.Loop:
                out.append(("loop", ins.count))
            elif kind is isa.EndLoop:
                out.append(("endloop",))
            else:
                out.append((kind.opcode, ins.scratch_modes(),
                            tuple(_scratch_part(t) for t in ins.touches())))
        units.append((unit, tuple(out)))
    return tuple(units)


def _scratch_part(touch):
    # device bytes and checks are no part of the scratchpad's story
    return touch if touch[0] in ("tile", "sp_rows", "sp_rows_on") else (touch[0],)


__all__ = ["ScratchpadHazard", "check_scratchpad"]
