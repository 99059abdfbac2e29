"""Functional execution: the per-core, per-unit programs really run.

Each (core, unit) is an instruction stream with its own program counter and
loop counters. Units run as far as their queues let them: a pop waits for a
token, a push for room. The machine steps every unit until it blocks, round
and round, until all are done; if none can move while some are unfinished,
that is a deadlock and it raises, naming the blocked units.

Data lives in torch CPU tensors: device buffers are views of the simulated
device memory (or of any host bytes, for tests); each core has a 2 MiB
scratchpad, which keeps whatever the previous kernel left in it (programs
must write before they read). Arithmetic rules are those stated in operands.py (fp32 for
floats, int32 for integers, rounding to nearest even on store; matmul
accumulates in fp32).
"""

from __future__ import annotations

import threading

import torch

from . import isa
from .operands import COMPUTE, DTYPES, ITEMSIZE, Tile, count_at
from .program import Program
from .validate import ProgramError, ProgramIndexError


class Machine:
    def __init__(self, program: Program, buffers: dict[str, torch.Tensor], scratchpad_bytes: int, timing=None,
                 functional: bool = True, sizes: dict[str, int] | None = None):
        # functional=False walks the control flow only (queues, loops, costs): a timing estimate.
        self.functional = functional
        missing = [s.name for s in program.symbols if s.name not in buffers] if functional else []
        if missing:
            raise ProgramError(f"program {program.name!r}: no memory bound for {', '.join(missing)}")
        self.program = program
        self.buffers = buffers  # symbol -> uint8 CPU tensor of its bytes
        self.scratchpad_bytes = scratchpad_bytes
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
            sp = self._scratch[core] = _scratchpads.take(self.scratchpad_bytes)
        return sp

    def scratch_rows(self, core: int, addr: int, rows: int, nbytes: int, stride: int) -> torch.Tensor:
        return torch.as_strided(self.scratch(core), (rows, nbytes), (stride, 1), addr)

    def device_rows(self, symbol: str, offset: int, rows: int, nbytes: int, stride: int) -> torch.Tensor:
        return torch.as_strided(self.buffers[symbol], (rows, nbytes), (stride, 1), offset)

    def view(self, core: int, tile: Tile, idx) -> torch.Tensor:
        """The tile's stored elements, in its dtype (writable)."""
        key = (core, tile.dtype)
        typed = self._typed.get(key)
        if typed is None:
            typed = self._typed[key] = self.scratch(core).view(DTYPES[tile.dtype])
        size = ITEMSIZE[tile.dtype]
        return torch.as_strided(typed, tile.stored_shape, (tile.row_stride // size, 1), tile.addr.at(idx) // size)

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
            for sp in self._scratch.values():
                _scratchpads.give(sp)
            self._scratch.clear()
            self._typed.clear()


class _ScratchpadPool:
    """Scratchpads outlive a kernel, as on the card: reused, not zeroed, between runs."""

    def __init__(self):
        self._lock = threading.Lock()
        self._free: list[torch.Tensor] = []

    def take(self, nbytes: int) -> torch.Tensor:
        with self._lock:
            for i, sp in enumerate(self._free):
                if sp.numel() == nbytes:
                    return self._free.pop(i)
        return torch.empty(nbytes, dtype=torch.uint8)

    def give(self, sp: torch.Tensor) -> None:
        with self._lock:
            if len(self._free) < 64:
                self._free.append(sp)


_scratchpads = _ScratchpadPool()


class _Unit:
    __slots__ = ("core", "unit", "instrs", "ends", "pc", "loops", "done")

    def __init__(self, core: int, unit: str, instrs):
        self.core, self.unit, self.instrs = core, unit, instrs
        self.ends = _match_loops(instrs)
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
            elif kind is isa.Loop:
                count = count_at(ins.count, m.sizes)
                if count <= 0:  # a size-dependent loop with nothing to do at these sizes
                    self.pc = self.ends[self.pc] + 1
                    ran = True
                    continue
                self.loops.append([self.pc, count, 0])
            elif kind is isa.EndLoop:
                top = self.loops[-1]
                top[2] += 1
                if top[2] < top[1]:
                    self.pc = top[0]
                else:
                    self.loops.pop()
            else:
                idx = tuple(loop[2] for loop in self.loops)
                if timing is not None:
                    timing.run(self.core, self.unit, ins, idx)
                if m.functional:
                    try:
                        ins.run(m, self.core, idx)
                    except ProgramError:
                        raise
                    except isa.IndexOutOfRange as e:
                        raise ProgramIndexError(
                            f"program {m.program.name!r}: core {self.core} unit {self.unit} instruction "
                            f"{self.pc} ({ins.opcode}): IndexError: {e}", e.op, e.value, e.bound) from e
                    except Exception as e:
                        raise ProgramError(
                            f"program {m.program.name!r}: core {self.core} unit {self.unit} instruction "
                            f"{self.pc} ({ins.opcode}) failed: {type(e).__name__}: {e}") from e
            m.executed += 1
            self.pc += 1
            ran = True
        self.done = True
        return ran

    def blocked_on(self) -> str:
        ins = self.instrs[self.pc]
        return f"core {self.core} unit {self.unit} instruction {self.pc} ({ins.opcode} {getattr(ins, 'queue', '')})"


def _match_loops(instrs) -> dict[int, int]:
    ends, stack = {}, []
    for i, ins in enumerate(instrs):
        if isinstance(ins, isa.Loop):
            stack.append(i)
        elif isinstance(ins, isa.EndLoop):
            ends[stack.pop()] = i
    return ends
