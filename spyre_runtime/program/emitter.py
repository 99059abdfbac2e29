"""Writing dataflow programs: the emitter every program builder shares.

Hand-written reference programs (spyre_authoring/handwritten.py,
calibration.py) and the compiler's code generation
(spyre_inductor/compiler/core/codegen.py, families/*/codegen.py) build programs the same way. ``Unit`` keeps the loop depth of one unit's
instruction stream, so that addresses are written as affine expressions in
loop counters (``Aff``) and turned into ``Addr``/``DevAddr`` steps for
whatever loops enclose the instruction. Two idioms recur:

* **Unroll by the buffer count.** A buffer index cannot be a loop counter's
  parity (addresses are affine, and queue names are static), so a loop over
  tiles that alternates buffers is emitted as
  ``loop(count // B) { body(buffer 0); ...; body(buffer B-1) }`` plus a tail.
  Every buffer has its own pair of queues ("full<b>" producer -> consumer,
  "done<b>"/"free<b>" back), so both units only have to agree on the static
  sequence of buffers, and a sequence that uses buffer 0 twice in a row (a
  tail) is still correct (it just waits).
* **Priming.** When the consumer frees a buffer the producer reuses, the
  consumer pushes one "free" token per buffer up front and the producer pops
  the extra tokens at the end, so the loop bodies are uniform (no peeled
  first iteration) and pushes and pops match.

``pipeline`` is the streaming loop built from both; ``assemble`` makes and
validates the Program.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

from .isa import EndLoop, Fence, Loop, Pop, Push
from .operands import Addr, DevAddr, Tile, sticks
from .program import CoreProgram, Program, Queue
from .validate import validate

__all__ = ["Aff", "Scratch", "Unit", "assemble", "nothing", "pipeline", "pipeline_queues", "split_evenly"]




@dataclass(frozen=True)
class Aff:
    """const + sum(coef * counter[level]): an affine expression in loop counters."""

    const: int = 0
    terms: tuple[tuple[int, int], ...] = ()  # (loop level, coefficient)

    def __add__(self, other):
        if isinstance(other, int):
            return Aff(self.const + other, self.terms)
        coefs = dict(self.terms)
        for level, c in other.terms:
            coefs[level] = coefs.get(level, 0) + c
        return Aff(self.const + other.const, tuple(sorted(coefs.items())))

    __radd__ = __add__

    def __mul__(self, k: int):
        return Aff(self.const * k, tuple((level, c * k) for level, c in self.terms))

    __rmul__ = __mul__


def aff(value) -> Aff:
    return value if isinstance(value, Aff) else Aff(int(value))


class Unit:
    """One unit's instruction stream, with its current loop depth."""

    def __init__(self):
        self.instrs: list = []
        self.depth = 0

    def emit(self, *instrs) -> None:
        self.instrs.extend(instrs)

    @contextmanager
    def loop(self, count: int):
        level = self.depth
        self.emit(Loop(count))
        self.depth += 1
        try:
            yield Aff(0, ((level, 1),))
        finally:
            self.depth -= 1
            self.emit(EndLoop())

    def _steps(self, value) -> tuple[int, tuple[int, ...]]:
        value = aff(value)
        steps = [0] * self.depth
        for level, c in value.terms:
            if level >= self.depth:
                raise AssertionError("address uses the counter of a loop that is closed")
            steps[level] += c
        while steps and steps[-1] == 0:
            steps.pop()
        return value.const, tuple(steps)

    def affine(self, value) -> tuple[int, tuple[int, ...]]:
        """(constant, per-loop steps) of an affine value for the loops enclosing the next
        instruction: an operand that is not an address (an iota's start)."""
        return self._steps(value)

    def sp(self, value) -> Addr:
        return Addr(*self._steps(value))

    def dev(self, symbol: str, value) -> DevAddr:
        return DevAddr(symbol, *self._steps(value))

    def tile(self, value, dtype, rows, cols, row_stride, broadcast="none") -> Tile:
        return Tile(self.sp(value), dtype, rows, cols, row_stride, broadcast)

    def range(self, count: int):
        """A plain counted loop (no loop at all for a count of 1): yields the counter."""
        if count == 1:
            yield Aff(0)
        elif count > 1:
            with self.loop(count) as i:
                yield i

    def each(self, count: int, offset: int = 0, ways: int = 2):
        """Iterations offset..offset+count-1 unrolled by `ways`: yields (index, index % ways).

        The remainder is static in every emitted body, so it can pick a buffer.
        """
        if count <= 0:
            return
        groups, tail = divmod(count, ways)
        if groups == 1:
            for j in range(ways):
                yield Aff(offset + j), (offset + j) % ways
        elif groups > 1:
            with self.loop(groups) as p:
                for j in range(ways):
                    yield p * ways + (offset + j), (offset + j) % ways
        for t in range(offset + count - tail, offset + count):
            yield Aff(t), t % ways


class Scratch:
    """Bump allocation of stick-aligned scratchpad ranges on one core."""

    def __init__(self, usable: int):
        self.top, self.usable = 0, usable

    def take(self, nbytes: int) -> int:
        addr = self.top
        self.top += sticks(nbytes)
        if self.top > self.usable:
            raise ValueError(f"plan needs {self.top} B of scratchpad, only {self.usable} B usable")
        return addr


def assemble(name, symbols, queues, cores, notes="", check: bool = True) -> Program:
    """Assemble `cores` ({core: {unit: instructions}}) in core order, dropping queues no
    instruction uses, and validate (unless not `check`: the compiler validates only the program
    it keeps, never the candidates it times)."""
    used = {ins.queue for units in cores.values() for instrs in units.values()
            for ins in instrs if isinstance(ins, (Push, Pop))}
    program = Program(
        name,
        symbols=tuple(symbols),
        queues=tuple(q for q in queues if q.name in used),
        cores=tuple(CoreProgram(c, tuple((u, tuple(instrs)) for u, instrs in units.items() if instrs))
                    for c, units in sorted(cores.items())),
        notes=notes,
    )
    if check:
        validate(program)
    return program


def split_evenly(total: int, parts: int) -> list[tuple[int, int]]:
    """(start, count) of `parts` near-equal contiguous pieces (the first ones one bigger)."""
    q, r = divmod(total, parts)
    out, start = [], 0
    for p in range(parts):
        count = q + (p < r)
        out.append((start, count))
        start += count
    return out


def pipeline(ls: Unit, sfp: Unit, tiles: int, rem: int, q, load, compute, store, buffers: int = 2,
              phased: bool = False) -> None:
    """Stream `tiles` equal tiles (then one remainder tile, if `rem`) through `buffers` buffers.

    ls loads tile t into buffer t % buffers and pushes q["full", b]; sfp pops
    it, computes, pushes q["done", b]; ls pops that, stores tile t (if
    `store` emits anything) and loads tile t + 2 into buffer (t + 2) % buffers.
    ls starts two loads ahead, so the load of tile t + 1 overlaps the compute
    of tile t. With two buffers the load of tile t + 2 reuses tile t's buffer
    and so waits for its store; with three it goes to the buffer tile t - 1
    freed, and the store of tile t and the load of tile t + 2 are in flight
    together (a streaming plan: reads and writes interleave on the bus).
    `phased` puts a Fence between the store of tile t and the load of tile
    t + 2 even when they use different scratchpad bytes, so a core never has
    reads and writes in flight together; with every core in step the bus
    sees a write phase, then a read phase (the pure-stream rate, no
    turnaround), while the sfp computes the tile loaded before.
    The remainder tile (a different shape, e.g. a partial stick or fewer
    rows) goes through buffer 0 after the stream has drained.

    load/compute/store(unit, t, b, size) emit one tile's instructions, t an
    affine tile index, b the buffer, size `None` for a full tile or `rem`.
    """
    if buffers not in (2, 3):
        raise ValueError(f"buffers must be 2 or 3, got {buffers}")
    for t in range(min(tiles, 2)):
        load(ls, Aff(t), t, None)
        ls.emit(Push(q["full", t]))
    for t, b in ls.each(tiles - 2, ways=buffers):
        ahead = (b + 2) % buffers
        ls.emit(Pop(q["done", b]))
        store(ls, t, b, None)
        if phased:
            ls.emit(Fence())
        load(ls, t + 2, ahead, None)
        ls.emit(Push(q["full", ahead]))
    for t in range(max(tiles - 2, 0), tiles):
        ls.emit(Pop(q["done", t % buffers]))
        store(ls, Aff(t), t % buffers, None)
    for t, b in sfp.each(tiles, ways=buffers):
        sfp.emit(Pop(q["full", b]))
        compute(sfp, t, b, None)
        sfp.emit(Push(q["done", b]))
    if rem:
        t = Aff(tiles)
        load(ls, t, 0, rem)
        ls.emit(Push(q["full", 0]), Pop(q["done", 0]))
        store(ls, t, 0, rem)
        sfp.emit(Pop(q["full", 0]))
        compute(sfp, t, 0, rem)
        sfp.emit(Push(q["done", 0]))


def pipeline_queues(core: int, buffers: int = 2) -> tuple[dict, list[Queue]]:
    q, queues = {}, []
    for kind, producer, consumer in (("full", "ls", "sfp"), ("done", "sfp", "ls")):
        for b in range(buffers):
            name = f"c{core}.{kind}{b}"
            q[kind, b] = name
            queues.append(Queue(name, (core, producer), (core, consumer), depth=1))
    return q, queues



def nothing(*_):
    pass
