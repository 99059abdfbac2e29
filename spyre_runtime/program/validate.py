"""The validator: every program is checked before it runs.

Rejects, naming core, unit and instruction index (PlacementError where it is a
placement's fault: scratchpad and queues): scratchpad access outside
the core's usable scratchpad; device access outside a buffer (a gather's or
scatter's: anywhere its indices' bounds let it reach); data movement
that is not whole, stick-aligned sticks on the scratchpad side; sends to a
core that is not a ring neighbour; instructions on the wrong unit;
unbalanced loops; queues that are unknown, used by the wrong unit, or whose
pushes and pops cannot match (a token-level dry run finds deadlocks).
Format problems (magic, version, checksum) are rejected when a program is read.
"""

from __future__ import annotations

from . import isa
from .operands import BROADCASTS, ITEMSIZE, STICK, Addr, ScratchCount, SizeExpr, Tile, count_at
from .program import ROLES, Program

DRY_RUN_LIMIT = 2_000_000  # control steps; beyond this the runtime's own deadlock check stands


class ProgramError(ValueError):
    """A program the device must not run."""


class PlacementError(ProgramError):
    """Scratchpad used outside its usable bytes, off stick boundaries or by a result partly over
    its operand, or queues whose pushes and pops cannot match: where a program puts its tiles
    and tokens. Only a planner makes these (a compiler that meets one has a bug: it raises)."""


class ProgramIndexError(ProgramError, IndexError):
    """A program stopped at an index out of range (isa.IndexOutOfRange): `op`, `value` and
    `bound` say which; an IndexError, as the CPU raises for the same op."""

    def __init__(self, message: str, op: str, value: int, bound: int):
        super().__init__(message)
        self.op, self.value, self.bound = op, value, bound


def _where(program: Program, core: int, unit: str, index: int, ins) -> str:
    return f"program {program.name!r}: core {core} unit {unit} instruction {index} ({ins.opcode})"


def loop_counts(instrs) -> list[tuple[int, ...]]:
    """For each instruction, the counts of the loops enclosing it (outermost first)."""
    stack: list[int] = []
    out = []
    for ins in instrs:
        if isinstance(ins, isa.EndLoop):
            if not stack:
                out.append(tuple(stack))
                continue
            stack.pop()
        out.append(tuple(stack))
        if isinstance(ins, isa.Loop):
            stack.append(count_at(ins.count, None))  # a size-dependent count: its maximum
    return out


def validate_once(program: Program) -> None:
    """validate(), remembered on the (immutable) program itself, never by id(): ids are reused."""
    if not program.__dict__.get("_validated"):
        validate(program)
        program.__dict__["_validated"] = True


def _device_rows(program, where, dev, rows, nbytes, stride):
    """The symbol a device transfer of `rows` rows addresses, after its shape checks."""
    try:
        sym = program.symbol(dev.symbol)
    except KeyError:
        raise ProgramError(f"{where}: unknown device buffer {dev.symbol!r}") from None
    if stride < 0 or rows < 0 or nbytes < 0:
        raise ProgramError(f"{where}: {rows} rows of {nbytes} bytes at stride {stride} of {dev.symbol!r}: "
                           f"device rows are walked forwards (no negative strides or counts)")
    return sym


def validate(program: Program, hardware=None) -> None:
    from ..hardware import HARDWARE

    hw = hardware or HARDWARE
    usable = hw.scratchpad_usable_bytes
    for sym in program.symbols:
        if sym.role not in ROLES:
            raise ProgramError(f"program {program.name!r}: symbol {sym.name!r} has unknown role {sym.role!r}")
        if sym.dtype not in ITEMSIZE:
            raise ProgramError(f"program {program.name!r}: symbol {sym.name!r} has unknown dtype {sym.dtype!r}")
        if sym.role == "temp" and (sym.offset is None or sym.offset % STICK or sym.offset < program.correction_bytes):
            raise ProgramError(
                f"program {program.name!r}: temporary {sym.name!r} needs a stick-aligned offset after the "
                f"correction area ({program.correction_bytes} B), got {sym.offset}")
    _check_sizes(program)
    queues = {q.name: q for q in program.queues}
    for q in program.queues:
        if q.depth < 1:
            raise ProgramError(f"program {program.name!r}: queue {q.name!r} has depth {q.depth}; it must be at least 1")
    seen_cores = set()
    for cp in program.cores:
        if not 0 <= cp.core < hw.cores:
            raise ProgramError(f"program {program.name!r}: core {cp.core} does not exist (0..{hw.cores - 1})")
        if cp.core in seen_cores:
            raise ProgramError(f"program {program.name!r}: core {cp.core} has two programs")
        seen_cores.add(cp.core)
        for unit, instrs in cp.units:
            if unit not in isa.UNITS:
                raise ProgramError(f"program {program.name!r}: core {cp.core} has unknown unit {unit!r}")
            _check_unit(program, cp.core, unit, instrs, queues, usable, hw.cores)
    _check_queues(program, queues)


def _check_unit(program, core, unit, instrs, queues, usable, ncores) -> None:
    depth = 0
    for i, (ins, counts) in enumerate(zip(instrs, loop_counts(instrs))):
        where = _where(program, core, unit, i, ins)
        if unit not in ins.units:
            raise ProgramError(f"{where}: runs on {'/'.join(ins.units)}, not on {unit}")
        if isinstance(ins, isa.Loop):
            depth += 1
            if isinstance(ins.count, SizeExpr):
                problem = _size_problem(program, ins.count)
                if problem is None and ins.count.hi < 1:
                    problem = f"a size-dependent loop count {ins.count} must allow at least 1"
                if problem:
                    raise ProgramError(f"{where}: {problem}")
            elif isinstance(ins.count, int) and ins.count < 1:
                raise ProgramError(f"{where}: loop count must be at least 1, got {ins.count}")
        elif isinstance(ins, isa.Fill) and isinstance(ins.value, SizeExpr):
            problem = _size_problem(program, ins.value)
            if problem:
                raise ProgramError(f"{where}: {problem}")
            if ins.dst.dtype not in ("int32", "int64"):
                raise ProgramError(f"{where}: a size fills an integer tile, not {ins.dst.dtype}")
        elif isinstance(ins, isa.EndLoop):
            depth -= 1
            if depth < 0:
                raise ProgramError(f"{where}: endloop without a loop")
        elif isinstance(ins, (isa.Push, isa.Pop)):
            q = queues.get(ins.queue)
            if q is None:
                raise PlacementError(f"{where}: unknown queue {ins.queue!r}")
            end = q.producer if isinstance(ins, isa.Push) else q.consumer
            if tuple(end) != (core, unit):
                role = "pushed by" if isinstance(ins, isa.Push) else "popped by"
                raise PlacementError(f"{where}: queue {ins.queue!r} is {role} core {end[0]} unit {end[1]}")
        _check_operation(where, ins)
        problem = ins.problem()
        if problem:
            raise ProgramError(f"{where}: {problem}")
        for access in ins.touches():
            _check_access(program, where, core, access, counts, usable, ncores)
        _check_overlap(where, ins, counts)
    if depth != 0:
        raise ProgramError(f"program {program.name!r}: core {core} unit {unit}: {depth} loop(s) not closed")


_OPERATIONS = {"unary": isa.UNARY, "binary": isa.BINARY, "reduce": isa.REDUCE}


def _check_operation(where: str, ins) -> None:
    table = _OPERATIONS.get(ins.opcode)
    if table is not None and ins.op not in table:
        raise ProgramError(f"{where}: unknown operation {ins.op!r}; {ins.opcode} knows {', '.join(sorted(table))}")


def _aligned(where: str, what: str, addr: Addr) -> None:
    if addr.base % STICK or any(s % STICK for s in addr.steps):
        raise PlacementError(f"{where}: {what} address {addr.base} (steps {addr.steps}) is not on a {STICK}-byte stick boundary")


def _in_scratchpad(where, what, lo, hi, usable) -> None:
    if lo < 0 or hi > usable:
        raise PlacementError(f"{where}: {what} touches scratchpad bytes [{lo}, {hi}) outside the usable {usable} bytes")


def _check_access(program, where, core, access, counts, usable, ncores) -> None:
    kind = access[0]
    if kind == "tile":
        tile: Tile = access[1]
        if tile.broadcast not in BROADCASTS:
            raise ProgramError(f"{where}: tile broadcast {tile.broadcast!r} is not one of {', '.join(BROADCASTS)}")
        if tile.rows < 1 or tile.cols < 1:
            raise ProgramError(f"{where}: tile of {tile.rows} x {tile.cols} elements; both must be at least 1")
        _aligned(where, "tile", tile.addr)
        rows, _ = tile.stored_shape
        if rows > 1 and tile.row_stride % STICK and not tile.packed:
            raise PlacementError(f"{where}: tile row stride {tile.row_stride} is not a whole number of sticks "
                                 f"(nor one element of a packed column)")
        if tile.dtype not in ITEMSIZE:
            raise ProgramError(f"{where}: unknown dtype {tile.dtype!r}")
        _in_scratchpad(where, "tile", *tile.byte_extent(counts), usable)
    elif kind in ("sp_rows", "sp_rows_on"):
        if kind == "sp_rows_on":
            access = access[1:]
        _, addr, rows, nbytes, stride = access
        _aligned(where, "scratchpad", addr)
        if rows > 1 and stride % STICK:
            raise PlacementError(f"{where}: scratchpad row stride {stride} is not a whole number of sticks")
        lo, hi = addr.extent(counts)
        _in_scratchpad(where, "transfer", lo, hi + (rows - 1) * stride + nbytes, usable)
    elif kind == "dev_rows":
        _, dev, rows, nbytes, stride = access
        sym = _device_rows(program, where, dev, rows, nbytes, stride)
        lo, hi = dev.extent(counts)
        end = hi + (rows - 1) * stride + nbytes
        if lo < 0 or end > sym.nbytes:
            raise ProgramError(
                f"{where}: touches bytes [{lo}, {end}) of {dev.symbol!r}, which has {sym.nbytes} bytes")
    elif kind == "dev_indirect":
        if program.symbol(access[1].symbol).sized:
            raise ProgramError(f"{where}: a gather or scatter of {access[1].symbol!r}, which has a symbolic dim "
                               f"(its transfers are clipped row by row; indexed rows are not)")
        # A gather's or scatter's rows land where their indices say; the instruction checks each
        # index against its bound, so the bounds (never the data) bound its device footprint.
        _, dev, rows, nbytes, stride, indices = access
        sym = _device_rows(program, where, dev, rows, nbytes, stride)
        lo, hi = dev.extent(counts)
        lo += sum(term.reach()[0] for term in indices)
        end = hi + (rows - 1) * stride + sum(term.reach()[1] for term in indices) + nbytes
        if lo < 0 or end > sym.nbytes:
            bounds = ", ".join(f"{term.bound} x {term.stride} B" for term in indices)
            raise ProgramError(
                f"{where}: may touch bytes [{lo}, {end}) of {dev.symbol!r} (indices up to {bounds}), "
                f"which has {sym.nbytes} bytes")
    elif kind == "whole_sticks":
        if access[1] % STICK:
            raise ProgramError(f"{where}: moves {access[1]} bytes, not a whole number of {STICK}-byte sticks")
    elif kind == "neighbour":
        dst = access[1]
        if (dst - core) % ncores not in (1, ncores - 1):
            raise ProgramError(f"{where}: core {dst} is not a ring neighbour of core {core}")


def _check_overlap(where, ins, counts) -> None:
    """A tile result may overwrite an operand in place, but not partly overlap it."""
    tiles = [a[1] for a in ins.touches() if a[0] == "tile"]
    if len(tiles) < 2 or ins.opcode == "matmul":
        return
    dst, srcs = tiles[0], tiles[1:]
    d_lo, d_hi = dst.byte_extent(counts)
    for src in srcs:
        s_lo, s_hi = src.byte_extent(counts)
        same = src.addr == dst.addr and src.row_stride == dst.row_stride and src.stored_shape == dst.stored_shape
        if d_lo < s_hi and s_lo < d_hi and not same:
            raise PlacementError(
                f"{where}: destination bytes [{d_lo}, {d_hi}) partly overlap an operand's [{s_lo}, {s_hi}); "
                f"write in place (same tile) or to separate scratchpad")


def _size_problem(program: Program, e) -> str | None:
    if not isinstance(e, SizeExpr):
        return f"{e!r} is not a size expression"
    if e.symbol not in program.sizes:
        return f"size expression {e} reads {e.symbol!r}, which is not one of the program's sizes {list(program.sizes)}"
    if e.coef < 1:
        return f"size expression {e} must grow with its size (coef at least 1)"
    return e.problem()


def _check_sizes(program: Program) -> None:
    """Size symbols and symbolic dims (issue 18): each symbolic dim reads a declared size, never
    exceeds its dim of the symbol's shape (so the static checks, done at the maxima, hold at
    every size), and is the outermost dim, whose valid bytes are a prefix of the buffer (what
    clipping a transfer to the buffer's bytes at the launch's sizes relies on)."""
    name = program.name
    if len(set(program.sizes)) != len(program.sizes) or not all(isinstance(n, str) and n for n in program.sizes):
        raise ProgramError(f"program {name!r}: size symbols {list(program.sizes)} must be distinct names")
    for sym in program.symbols:
        if not sym.dims:
            continue
        where = f"program {name!r}: symbol {sym.name!r}"
        if len(sym.dims) != len(sym.shape):
            raise ProgramError(f"{where}: {len(sym.dims)} symbolic dims for a rank-{len(sym.shape)} shape")
        symbolic = [d for d, e in enumerate(sym.dims) if e is not None]
        if sym.role == "temp" and symbolic:
            raise ProgramError(f"{where}: a temporary has fixed bytes; only placeholders have symbolic dims")
        if len(symbolic) > 1:
            raise ProgramError(f"{where}: dims {symbolic} are symbolic; at most one (the outermost) may be")
        for d in symbolic:
            e = sym.dims[d]
            problem = _size_problem(program, e)
            if problem:
                raise ProgramError(f"{where}: dim {d}: {problem}")
            if e.hi > sym.shape[d]:
                raise ProgramError(f"{where}: dim {d} is {e}, which can reach {e.hi} rows past its "
                                   f"{sym.shape[d]} (the transfers, checked at the shape, would read past the buffer)")
            inner = 1 + sum((n - 1) * st for k, (n, st) in enumerate(zip(sym.shape, sym.strides)) if k != d)
            if sym.strides[d] < inner:
                raise ProgramError(f"{where}: symbolic dim {d} (stride {sym.strides[d]}) is not the outermost: "
                                   f"the other dims span {inner} elements, so its valid bytes are not a prefix")


def _sized_totals(program: Program, units, queues):
    """Per size value the push/pop totals, for the one size symbol loops with queue ops depend on
    (a program is run at any size: pushes and pops must match at every one)."""
    exprs = [op.count for _, ops in units for op in ops if isinstance(op, isa.Loop) and isinstance(op.count, SizeExpr)]
    if not exprs:
        return [None]
    names = {e.symbol for e in exprs}
    if len(names) > 1:
        raise ProgramError(f"program {program.name!r}: loops carrying queue operations depend on sizes "
                           f"{sorted(names)}; at most one size may shape them")
    lo = min((e.lo * e.div - e.const) // e.coef - 1 for e in exprs)
    hi = max(-(-((e.hi + 1) * e.div - e.const) // e.coef) + 1 for e in exprs)
    lo = max(lo, 0)
    if hi - lo > 4096:
        raise ProgramError(f"program {program.name!r}: size-dependent queue loops over {hi - lo} sizes are too "
                           f"many to check (at most 4096)")
    name = names.pop()
    return [{name: v} for v in range(lo, hi + 1)]


def _check_queues(program: Program, queues) -> None:
    """Pushes and pops must match, and a token-level dry run must finish."""
    units = []
    for cp in program.cores:
        for unit, instrs in cp.units:
            ops = [ins for ins in instrs if isinstance(ins, (isa.Loop, isa.EndLoop, isa.Push, isa.Pop))]
            if any(isinstance(o, (isa.Push, isa.Pop)) for o in ops):
                units.append(((cp.core, unit), ops))
    if not units:
        return
    for sizes in _sized_totals(program, units, queues):
        totals = {name: [0, 0] for name in queues}
        for _, ops in units:
            mult = [1]
            for op in ops:
                if isinstance(op, isa.Loop):
                    mult.append(mult[-1] * count_at(op.count, sizes))
                elif isinstance(op, isa.EndLoop):
                    mult.pop()
                else:
                    totals[op.queue][0 if isinstance(op, isa.Push) else 1] += mult[-1]
        at = "" if sizes is None else f" at size {', '.join(f'{k}={v}' for k, v in sizes.items())}"
        for name, (pushes, pops) in totals.items():
            if pushes != pops:
                q = queues[name]
                raise PlacementError(
                    f"program {program.name!r}: queue {name!r} gets {pushes} pushes (core {q.producer[0]} unit "
                    f"{q.producer[1]}) but {pops} pops (core {q.consumer[0]} unit {q.consumer[1]}){at}: they "
                    f"cannot match")
    _check_counted_on_chip(program, units, queues)
    _dry_run(program, queues, units)
    if any(isinstance(op, isa.Loop) and isinstance(op.count, ScratchCount) for _, ops in units for op in ops):
        _dry_run(program, queues, units, on_chip=0)  # (every loop counted on chip skipped, too)


def _check_counted_on_chip(program: Program, units, queues) -> None:
    """Loops counted on chip (issue 31) run 0 times or once, and whatever value each count
    takes, pushes and pops must match: so per count word (a core's scratchpad element, which
    every unit of that core guarding one piece of work reads), the queue operations the loops
    reading it enclose must match by themselves. A count's word is named by (core, address)."""
    totals: dict[tuple, dict[str, list[int]]] = {}
    for (core, unit), ops in units:
        guards: list = []
        for op in ops:
            if isinstance(op, isa.Loop):
                word = None
                if isinstance(op.count, ScratchCount):
                    if op.count.hi != 1 or op.count.tile.addr.steps:
                        raise ProgramError(f"program {program.name!r}: core {core} unit {unit}: a loop counted on "
                                           f"chip enclosing queue operations runs at most once, at one address")
                    word = (core, op.count.tile.addr.base)
                guards.append(word)
            elif isinstance(op, isa.EndLoop):
                guards.pop()
            else:
                word = next((g for g in reversed(guards) if g is not None), None)
                if word is not None:
                    t = totals.setdefault(word, {}).setdefault(op.queue, [0, 0])
                    t[0 if isinstance(op, isa.Push) else 1] += 1
    for (core, addr), per in totals.items():
        for name, (pushes, pops) in per.items():
            if pushes != pops:
                raise PlacementError(f"program {program.name!r}: the loops counted at core {core} scratchpad byte "
                                     f"{addr} enclose {pushes} pushes but {pops} pops of queue {name!r}: skipping "
                                     f"them would unbalance it")


def _dry_run(program, queues, units, on_chip=None) -> None:
    """A token-level run (`on_chip`: the count of every loop counted on chip; None, its maximum)."""
    tokens = {name: 0 for name in queues}
    states = [[0, []] for _ in units]  # pc, loop stack of [start, remaining]
    steps = 0
    while True:
        progressed, finished = False, True
        for (who, ops), state in zip(units, states):
            while state[0] < len(ops):
                op = ops[state[0]]
                if isinstance(op, isa.Push):
                    if tokens[op.queue] >= queues[op.queue].depth:
                        break
                    tokens[op.queue] += 1
                elif isinstance(op, isa.Pop):
                    if tokens[op.queue] == 0:
                        break
                    tokens[op.queue] -= 1
                elif isinstance(op, isa.Loop):
                    count = on_chip if on_chip is not None and isinstance(op.count, ScratchCount) else \
                        count_at(op.count, None)
                    if count <= 0:
                        state[0] = _loop_end(ops, state[0]) + 1
                        progressed = True
                        continue
                    state[1].append([state[0], count])
                elif isinstance(op, isa.EndLoop):
                    top = state[1][-1]
                    top[1] -= 1
                    if top[1] > 0:
                        state[0] = top[0]
                    else:
                        state[1].pop()
                state[0] += 1
                progressed = True
                steps += 1
                if steps > DRY_RUN_LIMIT:
                    return
            if state[0] < len(ops):
                finished = False
        if finished:
            return
        if not progressed:
            blocked = [f"core {who[0]} unit {who[1]} at {ops[st[0]].opcode} {ops[st[0]].queue!r}"
                       for (who, ops), st in zip(units, states) if st[0] < len(ops)]
            raise PlacementError(f"program {program.name!r}: queues deadlock: " + "; ".join(blocked))


def _loop_end(ops, at: int) -> int:
    """The position of the EndLoop matching the Loop at `at`."""
    depth = 0
    for i in range(at, len(ops)):
        if isinstance(ops[i], isa.Loop):
            depth += 1
        elif isinstance(ops[i], isa.EndLoop):
            depth -= 1
            if depth == 0:
                return i
    raise ProgramError("a loop without its endloop")


def scratchpad_high_water(program: Program) -> dict[int, int]:
    """Per core, the highest scratchpad byte any instruction touches (+1)."""
    high: dict[int, int] = {}

    def note(core, hi):
        high[core] = max(high.get(core, 0), hi)

    for cp in program.cores:
        for _, instrs in cp.units:
            for ins, counts in zip(instrs, loop_counts(instrs)):
                for access in ins.touches():
                    if access[0] == "tile":
                        note(cp.core, access[1].byte_extent(counts)[1])
                    elif access[0] == "sp_rows":
                        _, addr, rows, nbytes, stride = access
                        note(cp.core, addr.extent(counts)[1] + (rows - 1) * stride + nbytes)
                    elif access[0] == "sp_rows_on":
                        _, other, addr, rows, nbytes, stride = access
                        note(other, addr.extent(counts)[1] + (rows - 1) * stride + nbytes)
    return high
