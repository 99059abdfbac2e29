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
from .operands import ITEMSIZE, STICK, count_at
from .program import Program
from .validate import PlacementError, ProgramError

_BIG = np.iinfo(np.int64).max


class ScratchpadHazard(PlacementError):
    """Two tiles of a program share scratchpad bytes while both are live."""


class _Unit:
    __slots__ = ("core", "name", "local", "g", "instrs", "ends", "pc", "loops", "done", "clock")

    def __init__(self, core, name, instrs, g, nunits):
        self.core, self.name, self.instrs, self.g = core, name, instrs, g
        self.local = isa.UNITS.index(name)
        self.ends = _loop_ends(instrs)
        self.pc, self.loops, self.done = 0, [], False
        self.clock = np.zeros(nunits + 1, dtype=np.int64)  # the last entry: "never written"
        self.clock[g] = 1
        self.clock[nunits] = _BIG


class _Queue:
    __slots__ = ("depth", "tokens", "pushes", "pops", "popped")

    def __init__(self, depth):
        self.depth, self.tokens = depth, 0
        self.pushes = collections.deque()  # the pusher's clock at each push not yet popped
        self.pops = 0
        self.popped = collections.deque(maxlen=depth)  # the popper's clock at the last `depth` pops


class _Shadow:
    """One core's scratchpad, per stick: who wrote it last (unit, its clock then, pc, which value)
    and, per unit of the core, when that unit last read it since (its clock then, pc)."""

    def __init__(self, sticks, nunits):
        self.w_unit = np.full(sticks, nunits, dtype=np.int64)
        self.w_clock = np.zeros(sticks, dtype=np.int64)
        self.w_pc = np.zeros(sticks, dtype=np.int64)
        self.w_id = np.full(sticks, -1, dtype=np.int64)
        self.r_clock = np.zeros((len(isa.UNITS), sticks), dtype=np.int64)
        self.r_pc = np.zeros((len(isa.UNITS), sticks), dtype=np.int64)


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
        # Per value (a write that is not an update in place), by slot in replay order (slot 0:
        # never written): its writer (unit << 32 | pc), how many of its sticks still hold it, whether
        # anything read it, whether a later write overwrote some of it (and which: damaged_by).
        self.origin = np.full(1024, -1, dtype=np.int64)
        self.was_read = np.zeros(1024, dtype=bool)
        self.damaged = np.zeros(1024, dtype=bool)
        self.alive: list[int] = [0]
        self.damaged_by: dict[int, tuple[int, int]] = {}
        self.buried = np.zeros(1024, dtype=bool)  # a value written over one nothing read
        self.buries: dict[int, int] = {}  # -> that value's slot
        self.shape = np.full(1024, -1, dtype=np.int64)  # how it was written (_shape; -1: as bytes)

    def shadow(self, core: int) -> _Shadow:
        s = self.shadows.get(core)
        if s is None:
            s = self.shadows[core] = _Shadow(self.sticks, self.nunits)
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
            elif kind is isa.Loop:
                count = count_at(ins.count, None)
                if count <= 0:
                    u.pc = u.ends[u.pc] + 1
                    ran = True
                    continue
                u.loops.append([u.pc, count, 0])
            elif kind is isa.EndLoop:
                top = u.loops[-1]
                top[2] += 1
                if top[2] < top[1]:
                    u.pc = top[0]
                else:
                    u.loops.pop()
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
        w_unit = sh.w_unit[sticks]
        late = u.clock[w_unit] < sh.w_clock[sticks]
        if late.any():
            k = int(np.argmax(late))
            other = self.units[int(w_unit[k])]
            self.race(u, ins, idx, "reads", "writes", other, int(sh.w_pc[sticks][k]), core, sticks, late)
        ids = sh.w_id[sticks] + 1  # the writes' slots (0: never written)
        first = ids[0]
        if (ids == first).all():
            if self.buried[first]:
                self.dead(u, ins, idx, core, sticks, ids, int(first))
            if not _alike(shape, int(self.shape[first])):
                self.reshaped(u, ins, idx, core, sticks, shape, int(first))
            self.was_read[first] = True
        else:
            hurt = self.damaged[ids]
            if hurt.any():  # bytes of a value a later write overwrote in part, beside others
                self.clobbered(u, ins, idx, core, sticks, ids, int(ids[np.argmax(hurt)]))
            buried = self.buried[ids]
            if buried.any():
                self.dead(u, ins, idx, core, sticks, ids, int(ids[np.argmax(buried)]))
            for slot in np.unique(ids).tolist():
                if not _alike(shape, int(self.shape[slot])):
                    self.reshaped(u, ins, idx, core, sticks, shape, slot)
            self.was_read[ids] = True
        sh.r_clock[u.local][sticks] = u.clock[u.g]
        sh.r_pc[u.local][sticks] = u.pc

    def write(self, u: _Unit, ins, idx, core: int, sticks, shape: int, in_place: bool) -> None:
        sh = self.shadow(core)
        w_unit = sh.w_unit[sticks]
        late = u.clock[w_unit] < sh.w_clock[sticks]
        if late.any():
            k = int(np.argmax(late))
            other = self.units[int(w_unit[k])]
            self.race(u, ins, idx, "writes", "writes", other, int(sh.w_pc[sticks][k]), core, sticks, late)
        for local in range(len(isa.UNITS)):
            reader = self.by_place.get((core, local))
            if reader is None or reader is u:
                continue
            late = u.clock[reader.g] < sh.r_clock[local][sticks]
            if late.any():
                k = int(np.argmax(late))
                self.race(u, ins, idx, "writes", "reads", reader, int(sh.r_pc[local][sticks][k]), core, sticks,
                          late)
        if not in_place:  # a new value: the one it overwrites loses these bytes
            slot = self.new_write(u, _count(sticks), shape)
            self.retire(u, slot, sh.w_id[sticks] + 1)
            sh.w_id[sticks] = slot - 1
        sh.w_unit[sticks] = u.g
        sh.w_clock[sticks] = u.clock[u.g]
        sh.w_pc[sticks] = u.pc
        sh.r_clock[:, sticks] = 0

    def new_write(self, u: _Unit, sticks: int, shape: int) -> int:
        slot = len(self.alive)
        if slot >= self.origin.size:
            grow = self.origin.size
            self.origin = np.concatenate([self.origin, np.zeros(grow, dtype=np.int64)])
            self.was_read = np.concatenate([self.was_read, np.zeros(grow, dtype=bool)])
            self.damaged = np.concatenate([self.damaged, np.zeros(grow, dtype=bool)])
            self.buried = np.concatenate([self.buried, np.zeros(grow, dtype=bool)])
            self.shape = np.concatenate([self.shape, np.full(grow, -1, dtype=np.int64)])
        self.origin[slot] = u.g << 32 | u.pc
        self.shape[slot] = shape
        self.alive.append(sticks)
        return slot

    def retire(self, u, slot, ids) -> None:
        """The values whose sticks `ids` the new value `slot` takes: one that keeps some is
        damaged; one that keeps none and that nothing read is buried under `slot` (a program may
        compute what it never uses, but if it then reads these bytes, it read the wrong value)."""
        first = ids[0]
        if (ids == first).all():
            groups = ((int(first), ids.size),) if first else ()
        else:
            values, counts = np.unique(ids[ids > 0], return_counts=True)
            groups = zip(values.tolist(), counts.tolist())
        for old, n in groups:
            self.alive[old] -= n
            if self.alive[old] > 0:
                if not self.damaged[old]:
                    self.damaged[old] = True
                    self.damaged_by[old] = (u.g, u.pc)
            elif not self.was_read[old] and not self.buried[slot]:
                self.buried[slot] = True
                self.buries[slot] = old

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
        if slot == 0:
            return "nothing (never written)"
        code = int(self.origin[slot])
        u = self.units[code >> 32]
        return self.where(u, code & 0xFFFFFFFF)

    def clobbered(self, u, ins, idx, core, sticks, ids, slot) -> None:
        kept, other = _bytes(sticks, ids == slot), _bytes(sticks, ids != slot)
        dg, dpc = self.damaged_by[slot]
        raise ScratchpadHazard(
            f"program {self.program.name!r}: {self.where(u, u.pc, ins)}{_at(idx)} reads scratchpad bytes "
            f"[{kept[0]}, {kept[1]}) still holding the value {self.writer(slot)} wrote, beside "
            f"[{other[0]}, {other[1]}) written since, after {self.where(self.units[dg], dpc)} overwrote part "
            f"of that value: two tiles live at once share these bytes")

    def reshaped(self, u, ins, idx, core, sticks, shape, slot) -> None:
        lo, hi = _bytes(sticks, slice(None))
        raise ScratchpadHazard(
            f"program {self.program.name!r}: {self.where(u, u.pc, ins)}{_at(idx)} reads scratchpad bytes "
            f"[{lo}, {hi}) as {_describe(shape)}, which hold the value {self.writer(slot)} wrote as "
            f"{_describe(int(self.shape[slot]))}: two tiles live at once share these bytes")

    def dead(self, u, ins, idx, core, sticks, ids, slot) -> None:
        lo, hi = _bytes(sticks, ids == slot)
        raise ScratchpadHazard(
            f"program {self.program.name!r}: {self.where(u, u.pc, ins)}{_at(idx)} reads scratchpad bytes "
            f"[{lo}, {hi}) holding the value {self.writer(slot)} wrote over the value "
            f"{self.writer(self.buries[slot])} wrote before anything read it: two tiles live at once share "
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
    aligned: the validator's): a slice when they are contiguous, else an index array."""
    width = -(-nbytes // STICK)
    first = addr // STICK
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


def _loop_ends(instrs) -> dict[int, int]:
    ends, stack = {}, []
    for i, ins in enumerate(instrs):
        if isinstance(ins, isa.Loop):
            stack.append(i)
        elif isinstance(ins, isa.EndLoop):
            ends[stack.pop()] = i
    return ends


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
