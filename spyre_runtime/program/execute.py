"""Functional execution: the per-core, per-unit programs really run.

Each (core, unit) is an instruction stream with its own program counter and
loop counters. Units run as far as their queues let them: a pop waits for a
token, a push for room. The machine steps every unit until it blocks, round
and round, until all are done; if none can move while some are unfinished,
that is a deadlock and it raises, naming the blocked units.

Data lives in torch CPU tensors: device buffers are views of the simulated
device memory (or of any host bytes, for tests); each core has a 2 MiB
scratchpad, which keeps whatever the previous kernel left in it (programs
must write before they read). The cores' scratchpads are slices of one bank
(core c's at c * scratchpad_bytes), taken from a pool for a run and given
back after it, so a kernel finds what the kernel before it on that bank left.
Arithmetic rules are those stated in operands.py (fp32 for floats, int32 for
integers, rounding to nearest even on store; matmul accumulates in fp32).

This interpreter is the reference. A launched program usually runs through
schedule.py instead: the same instructions in the order this machine runs
them, over views bound once, with the same bits.
"""

from __future__ import annotations

import itertools
import threading

import torch

from ..hardware import HARDWARE
from . import isa
from .operands import COMPUTE, DTYPES, ITEMSIZE, ScratchCount, Tile
from .program import Program
from .validate import ProgramError, ProgramIndexError


class Machine:
    def __init__(self, program: Program, buffers: dict[str, torch.Tensor], scratchpad_bytes: int, timing=None,
                 functional: bool = True, trace: list | None = None, sizes: dict[str, int] | None = None):
        # functional=False walks the control flow only (queues, loops, costs): a timing estimate.
        # trace: a list that gets (core, unit, pc, instruction, loop indices) of every data
        # instruction in the order run (control flow is static: schedule.py replays that order).
        self.functional = functional
        self.trace = trace
        # Loops counted on chip (issue 31): with a trace, `guards` gets per traced instruction the
        # count words (core, byte address, dtype) of the loops enclosing it; a walk without data
        # reads their counts through `count_reader(core, tile, idx)` (None: each at its maximum).
        self.guards: list | None = [] if trace is not None else None
        self.count_words: set = set()  # (with a trace) every count word a loop read
        self.count_reader = None
        missing = [s.name for s in program.symbols if s.name not in buffers] if functional else []
        if missing:
            raise ProgramError(f"program {program.name!r}: no memory bound for {', '.join(missing)}")
        self.program = program
        self.buffers = buffers  # symbol -> uint8 CPU tensor of its bytes
        self.scratchpad_bytes = scratchpad_bytes
        self.bank: ScratchBank | None = None  # taken on first use; given back by run()
        self._scratch: dict[int, torch.Tensor] = {}
        self._typed: dict[tuple[int, str], torch.Tensor] = {}
        self.tokens = {q.name: 0 for q in program.queues}
        self.depth = {q.name: q.depth for q in program.queues}
        self.executed = 0
        self.timing = timing  # a timing.Timing, or None for results only
        # The launch's sizes (issue 18; None: every SizeExpr at its static maximum) and, per
        # buffer with a symbolic dim, the bytes it has at them: its transfers are clipped there.
        missing = [n for n in program.sizes if sizes is not None and n not in sizes]
        if missing:
            raise ProgramError(f"program {program.name!r}: no value for size(s) {', '.join(missing)}")
        self.sizes = sizes
        self.limits = {} if sizes is None else {
            s.name: s.nbytes_at(sizes) for s in program.symbols if s.sized}
        if timing is not None:
            timing.limits = self.limits  # what the timing model charges: the rows that move

    # ---- memory -------------------------------------------------------------------

    def scratch(self, core: int) -> torch.Tensor:
        sp = self._scratch.get(core)
        if sp is None:
            if self.bank is None:
                self.bank = _banks.take(self.scratchpad_bytes, bank_cores(self.program))
            sp = self._scratch[core] = self.bank.core(core)
        return sp

    def scratch_rows(self, core: int, addr: int, rows: int, nbytes: int, stride: int) -> torch.Tensor:
        sp = self.scratch(core)  # a slice of the bank: as_strided's offset counts from the bank's start
        self._within(core, addr, rows, nbytes, stride)
        return torch.as_strided(sp, (rows, nbytes), (stride, 1), sp.storage_offset() + addr)

    def _within(self, core: int, addr: int, rows: int, nbytes: int, stride: int) -> None:
        # The bank would let a view run on into the next core's scratchpad: refuse it here.
        if rows > 0 and nbytes > 0:
            last = addr + (rows - 1) * stride
            lo, hi = min(addr, last), max(addr, last) + nbytes
            if lo < 0 or hi > self.scratchpad_bytes:
                raise IndexError(f"scratchpad bytes [{lo}, {hi}) are outside core {core}'s "
                                 f"{self.scratchpad_bytes}")

    def device_rows(self, symbol: str, offset: int, rows: int, nbytes: int, stride: int) -> torch.Tensor:
        buf = self.buffers[symbol]  # as_strided's offset counts from the storage's start
        return torch.as_strided(buf, (rows, nbytes), (stride, 1), buf.storage_offset() + offset)

    def view(self, core: int, tile: Tile, idx) -> torch.Tensor:
        """The tile's stored elements, in its dtype (writable)."""
        key = (core, tile.dtype)
        typed = self._typed.get(key)
        if typed is None:
            typed = self._typed[key] = self.scratch(core).view(DTYPES[tile.dtype])
        size, addr = ITEMSIZE[tile.dtype], tile.addr.at(idx)
        rows, cols = shape = tile.stored_shape
        self._within(core, addr, rows, cols * size, tile.row_stride)
        return torch.as_strided(typed, shape, (tile.row_stride // size, 1), typed.storage_offset() + addr // size)

    def read(self, core: int, tile: Tile, idx, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The tile as rows x cols in its arithmetic type (broadcasts expanded)."""
        value = self.view(core, tile, idx).to(dtype or COMPUTE[tile.dtype])
        if tile.broadcast != "none":
            value = value.expand(tile.rows, tile.cols)
        return value

    def write(self, core: int, tile: Tile, idx, value: torch.Tensor) -> None:
        self.view(core, tile, idx).copy_(value)  # rounds to nearest even / wraps on store

    # ---- execution ------------------------------------------------------------------

    def run(self) -> None:
        units = [_Unit(cp.core, unit, instrs) for cp in self.program.cores for unit, instrs in cp.units if instrs]
        live = units
        try:
            while live:
                progressed = False
                for u in live:
                    progressed |= u.advance(self)
                live = [u for u in live if not u.done]
                if live and not progressed:
                    blocked = "; ".join(u.blocked_on() for u in live)
                    raise ProgramError(f"program {self.program.name!r} deadlocked: {blocked}")
        finally:
            self.release()

    def release(self) -> None:
        """Give the scratchpad bank back to the pool (its contents stay, as on the card)."""
        if self.bank is not None:
            _banks.give(self.bank)
            self.bank = None
        self._scratch.clear()
        self._typed.clear()


def bank_cores(program: Program) -> int:
    """How many scratchpads a bank for `program` holds: the card's cores, or more if it runs on more
    (the validator keeps ring sends to existing cores)."""
    return max(BANK_CORES, 1 + max((cp.core for cp in program.cores), default=0))


BANK_CORES = HARDWARE.cores  # a bank of the card's cores serves every program


class ScratchBank:
    """The cores' scratchpads as one tensor: core c's is bytes [c * nbytes, (c + 1) * nbytes).

    One tensor lets an instruction that every core runs on its own tile be one strided
    operation over all of them (schedule.py). Pages never touched are never committed.
    `serial` names the bank for caches of views into it (ids are reused, serials are not).
    """

    _serials = itertools.count()

    def __init__(self, nbytes: int, cores: int):
        self.nbytes, self.cores = nbytes, cores
        self.data = torch.empty(nbytes * cores, dtype=torch.uint8, device="cpu")
        self.serial = next(self._serials)
        self._cores: dict[int, torch.Tensor] = {}
        self._typed: dict[torch.dtype, torch.Tensor] = {}

    def core(self, core: int) -> torch.Tensor:
        sp = self._cores.get(core)
        if sp is None:
            if not 0 <= core < self.cores:
                raise ProgramError(f"core {core} has no scratchpad (the bank holds {self.cores})")
            sp = self._cores[core] = self.data[core * self.nbytes:(core + 1) * self.nbytes]
        return sp

    def typed(self, dtype: torch.dtype) -> torch.Tensor:
        """The whole bank as elements of `dtype` (for views spanning cores)."""
        t = self._typed.get(dtype)
        if t is None:
            t = self._typed[dtype] = self.data.view(dtype)
        return t


class _BankPool:
    """Scratchpads outlive a kernel, as on the card: reused, not zeroed, between runs.

    Last given, first taken: a thread launching program after program gets the same bank
    each time (and so the views bound into it stay valid). Concurrent runs get banks of their own.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._free: list[ScratchBank] = []

    def take(self, nbytes: int, cores: int) -> ScratchBank:
        with self._lock:
            for i in range(len(self._free) - 1, -1, -1):
                bank = self._free[i]
                if bank.nbytes == nbytes and bank.cores >= cores:
                    return self._free.pop(i)
        return ScratchBank(nbytes, cores)

    def give(self, bank: ScratchBank) -> None:
        with self._lock:
            if len(self._free) >= 8:
                self._free.pop(0)
            self._free.append(bank)


_banks = _BankPool()


class _Unit:
    __slots__ = ("core", "unit", "instrs", "ends", "pc", "loops", "done")

    def __init__(self, core: int, unit: str, instrs):
        self.core, self.unit, self.instrs = core, unit, instrs
        self.ends = isa.loop_ends(instrs)
        self.pc = 0
        self.loops: list[list[int]] = []  # [start pc, count, counter]
        self.done = False

    def advance(self, m: Machine) -> bool:
        """Run until blocked or finished; True if any instruction ran."""
        ran = False
        instrs, n = self.instrs, len(self.instrs)
        while self.pc < n:
            ins = instrs[self.pc]
            kind = type(ins)
            timing = m.timing
            if kind is isa.Pop:
                if m.tokens[ins.queue] == 0:
                    return ran
                m.tokens[ins.queue] -= 1
                if timing is not None:
                    timing.pop(self.core, self.unit, ins.queue)
            elif kind is isa.Push:
                if m.tokens[ins.queue] >= m.depth[ins.queue]:
                    return ran
                m.tokens[ins.queue] += 1
                if timing is not None:
                    timing.push(self.core, self.unit, ins.queue, m.depth[ins.queue])
            elif kind is isa.Loop or kind is isa.EndLoop:
                read = None
                if kind is isa.Loop and type(ins.count) is ScratchCount:  # (issue 31)
                    idx = tuple(loop[2] for loop in self.loops)
                    if m.guards is not None:
                        m.count_words.add((self.core, ins.count.tile.addr.at(idx), ins.count.tile.dtype))
                    if m.functional:
                        read = lambda tile: m.read(self.core, tile, idx).reshape(-1)[0]  # noqa: E731
                    elif m.count_reader is not None:
                        read = lambda tile: m.count_reader(self.core, tile, idx)  # noqa: E731
                after = isa.loop_step(ins, self.pc, self.loops, self.ends, m.sizes, read)
                if kind is isa.Loop and after == self.ends[self.pc] + 1:  # skipped: not executed
                    self.pc = after
                    ran = True
                    continue
                self.pc = after - 1
            else:
                idx = tuple(loop[2] for loop in self.loops)
                if timing is not None:
                    timing.run(self.core, self.unit, ins, idx)
                if m.trace is not None:
                    m.trace.append((self.core, self.unit, self.pc, ins, idx))
                    m.guards.append(self.guards())
                if m.functional:
                    run_one(m, self.core, self.unit, self.pc, ins, idx)
            m.executed += 1
            self.pc += 1
            ran = True
        self.done = True
        return ran

    def guards(self) -> tuple:
        """The count words (core, byte address, dtype) of the loops counted on chip around the
        next instruction (schedule.py skips it when one of them holds 0)."""
        out = ()
        for depth, (pc, _, _) in enumerate(self.loops):
            count = self.instrs[pc].count
            if type(count) is ScratchCount:
                outer = tuple(loop[2] for loop in self.loops[:depth])
                out += ((self.core, count.tile.addr.at(outer), count.tile.dtype),)
        return out

    def blocked_on(self) -> str:
        ins = self.instrs[self.pc]
        return f"core {self.core} unit {self.unit} instruction {self.pc} ({ins.opcode} {getattr(ins, 'queue', '')})"


def run_one(m: Machine, core: int, unit: str, pc: int, ins, idx) -> None:
    """One data instruction by its general semantics, a failure named by where it happened."""
    try:
        ins.run(m, core, idx)
    except ProgramError:
        raise
    except Exception as e:
        raise failure(m.program, core, unit, pc, ins, e) from e


def failure(program: Program, core: int, unit: str, pc: int, ins, e: Exception) -> Exception:
    """The error a failed instruction raises: which core, unit, instruction, and why."""
    if isinstance(e, isa.IndexOutOfRange):
        return ProgramIndexError(
            f"program {program.name!r}: core {core} unit {unit} instruction "
            f"{pc} ({ins.opcode}): IndexError: {e}", e.op, e.value, e.bound)
    return ProgramError(
        f"program {program.name!r}: core {core} unit {unit} instruction "
        f"{pc} ({ins.opcode}) failed: {type(e).__name__}: {e}")


