"""The instruction set: each instruction's operands, unit and semantics in one place.

Adding an instruction is one class here: its fields (operands), the unit it
runs on, ``run`` (what it does, on the machine of execute.py) and ``cost``
(what it would take on the card, from the rates of timing.py). ``touches`` lists the memory it reads and writes, for
the validator.

An instruction may also declare a fast form, ``bind`` (a class method): given
the same instruction as several independent cores run it (or one core), and a
binder that turns operands into views resolved once (schedule.py), it returns
a callable that does all of it in one go, with exactly ``run``'s effect; or
None, and ``run`` is used. ``run`` is the reference: tests compare the two.

Units of a core: "ls" (load/store: device memory <-> scratchpad, scratchpad
copies, ring sends), "pe" (the processing-element array: matrix tiles, fp32
accumulation) and "sfp" (the special-function pipeline: elementwise,
transcendental, compare, select, cast, reduce, broadcast). Every unit also
runs the control instructions (push/pop on queues, counted loops).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

import torch

from .philox import MODES as PHILOX_MODES, philox as philox_values, philox_result_dtype
from .operands import (COMPUTE, DTYPES, ITEMSIZE, STICK, Addr, DevAddr, ScratchCount, SizeExpr, Tile, clipped_rows,
                       count_at, sticks)

UNITS = ("ls", "pe", "sfp")
REGISTRY: dict[str, type] = {}


def instruction(opcode: str, units: tuple[str, ...]):
    def register(cls):
        cls.opcode = opcode
        cls.units = units
        REGISTRY[opcode] = cls
        return cls

    return register


class Instruction:
    opcode: ClassVar[str]
    units: ClassVar[tuple[str, ...]]
    writes_device: ClassVar[bool] = False  # its device operand is written (else only read)

    @classmethod
    def bind(cls, b, group) -> "callable | None":
        """The fast form: `group` is [(core, instruction, loop indices)], instances of this class
        that may run as one operation (different cores, no data shared between them); `b` is a
        schedule.Binder. A callable with the effect of running each by `run`, or None."""
        return None

    def run(self, m, core: int, idx: tuple[int, ...]) -> None:
        raise NotImplementedError(f"instruction {self.opcode} has no semantics")

    def cost(self, t, core: int, idx: tuple[int, ...]) -> float:
        """Simulated ns on the card, from the timing model `t` (timing.py). Control: free."""
        return 0.0

    def touches(self):
        """(kind, operand, nbytes-or-None) for every memory access: kind is
        'sp_tile', 'sp' (with a byte count) or 'dev' (with rows/row bytes/stride)."""
        return ()

    def scratch_modes(self) -> tuple[str, ...]:
        """Per entry of ``touches``, what it does to scratchpad bytes: "r" (reads them), "w"
        (writes them), "rw" (reads, then writes them: an accumulation), "" (not scratchpad).
        The scratchpad hazard check (hazards.py) replays programs by it."""
        return ()

    def problem(self) -> str | None:
        """What is wrong with this instruction's own operands (shapes, dtypes), for the validator."""
        return None

    def listing(self) -> str:
        names = _FIELD_NAMES.get(type(self))
        if names is None:
            names = _FIELD_NAMES[type(self)] = tuple(f.name for f in fields(self))
        return f"{self.opcode:<8} " + " ".join(f"{name}={_show(getattr(self, name))}" for name in names)


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _show(value) -> str:
    if isinstance(value, Addr):
        return f"sp[{value.base}{_steps(value.steps)}]"
    if isinstance(value, DevAddr):
        return f"{value.symbol}[{value.offset}{_steps(value.steps)}]"
    if isinstance(value, Tile):
        b = "" if value.broadcast == "none" else f" bcast={value.broadcast}"
        return f"{_show(value.addr)}:{value.dtype}[{value.rows}x{value.cols}/{value.row_stride}{b}]"
    return str(value)


def _steps(steps: tuple[int, ...]) -> str:
    return "".join(f"{s:+d}*i{k}" for k, s in enumerate(steps) if s)


# ---- control ------------------------------------------------------------------


@instruction("loop", UNITS)
@dataclass(frozen=True)
class Loop(Instruction):
    """Run the instructions up to the matching endloop `count` times. A SizeExpr count (issue
    18) is read from the launch's size words: it may be 0 (the body is skipped) and is never
    more than its static maximum. A ScratchCount (issue 31) is read from the scratchpad when the
    loop starts (a read of its tile, ordered like any other)."""

    count: int | SizeExpr | ScratchCount

    def touches(self):
        return (("tile", self.count.tile),) if isinstance(self.count, ScratchCount) else ()

    def scratch_modes(self):
        return ("r",) if isinstance(self.count, ScratchCount) else ()

    def problem(self):
        if isinstance(self.count, ScratchCount):
            t = self.count.tile
            if t.dtype not in ("int32", "int64") or t.stored_shape != (1, 1):
                return f"a loop count read from the scratchpad is one int32 or int64 element, got {t.dtype} " \
                       f"{t.stored_shape}"
            if self.count.hi < 1:
                return f"a loop count read from the scratchpad must allow at least 1, got at most {self.count.hi}"
        return None


@instruction("endloop", UNITS)
@dataclass(frozen=True)
class EndLoop(Instruction):
    pass


def reads_counts(program) -> bool:
    """Whether some loop of `program` reads its count from the scratchpad (a ScratchCount)."""
    return any(isinstance(ins, Loop) and isinstance(ins.count, ScratchCount)
               for cp in program.cores for _, instrs in cp.units for ins in instrs)


def loop_ends(instrs) -> dict[int, int]:
    """Each Loop's position in `instrs` -> its matching EndLoop's (the validator proved them nested)."""
    ends, stack = {}, []
    for i, ins in enumerate(instrs):
        if isinstance(ins, Loop):
            stack.append(i)
        elif isinstance(ins, EndLoop):
            ends[stack.pop()] = i
    return ends


def loop_step(ins, pc: int, loops: list, ends: dict, sizes, read=None) -> int:
    """The position after Loop or EndLoop `ins` at `pc`, in one unit's stream: `loops` is its stack
    of [Loop position, count, iteration] (updated), `ends` its loop_ends, `sizes` the launch's
    (None: a size-dependent count at its maximum), `read(tile)` the scratchpad's value of a
    ScratchCount's tile (None: its maximum). A loop of count 0 is skipped whole."""
    if isinstance(ins, Loop):
        count = count_at(ins.count, sizes, read)
        if count <= 0:  # a size-dependent loop with nothing to do at these sizes
            return ends[pc] + 1
        loops.append([pc, count, 0])
        return pc + 1
    top = loops[-1]
    top[2] += 1
    if top[2] < top[1]:
        return top[0] + 1
    loops.pop()
    return pc + 1


@instruction("push", UNITS)
@dataclass(frozen=True)
class Push(Instruction):
    """Put a token on a queue (blocks while the queue is full)."""

    queue: str


@instruction("pop", UNITS)
@dataclass(frozen=True)
class Pop(Instruction):
    """Take a token from a queue (blocks while it is empty)."""

    queue: str


@instruction("fence", ("ls",))
@dataclass(frozen=True)
class Fence(Instruction):
    """Wait until this unit's device transfers are done (they are asynchronous: see timing.py).

    A push already waits for them; a fence orders transfers without a token,
    e.g. so that the next loads start only once a store has landed.
    """

    def run(self, m, core, idx):
        pass  # the functional machine completes every transfer at once

    @classmethod
    def bind(cls, b, group):
        return b.NOTHING

    def cost(self, t, core, idx):
        return t.fence()


# ---- load/store unit -------------------------------------------------------------


@instruction("load", ("ls",))
@dataclass(frozen=True)
class Load(Instruction):
    """Device memory -> scratchpad, `rows` rows of `row_bytes` valid bytes.

    Moves whole sticks: each scratchpad row is padded to a stick boundary and
    the bytes past `row_bytes` are masked (written as zero).
    """

    dst: Addr
    src: DevAddr
    rows: int
    row_bytes: int
    src_stride: int
    dst_stride: int

    def run(self, m, core, idx):
        limit = m.limits.get(self.src.symbol)
        if limit is not None:
            return self._run_clipped(m, core, idx, limit)
        src = m.device_rows(self.src.symbol, self.src.at(idx), self.rows, self.row_bytes, self.src_stride)
        dst = m.scratch_rows(core, self.dst.at(idx), self.rows, self.row_bytes, self.dst_stride)
        dst.copy_(src)
        pad = -self.row_bytes % STICK
        if pad:
            m.scratch_rows(core, self.dst.at(idx) + self.row_bytes, self.rows, pad, self.dst_stride).zero_()

    @classmethod
    def bind(cls, b, group):
        views = _bound_rows(b, group, "src", "dst")
        if views is None:
            return None
        first, src, dst = views
        pad = -first.row_bytes % STICK
        zero = b.sp_rows([(c, i.dst.at(idx) + first.row_bytes) for c, i, idx in group], first.rows, pad,
                         first.dst_stride) if pad else None
        if pad and zero is None:
            return None
        if not pad:
            return lambda: dst.copy_(src)

        def load():
            dst.copy_(src)
            zero.zero_()
        return load

    def _run_clipped(self, m, core, idx, limit):
        # A buffer with a symbolic dim (issue 18): only its bytes below `limit` exist at this
        # launch's sizes; the rest of each scratchpad row is masked, as the padding is.
        src, dst = self.src.at(idx), self.dst.at(idx)
        m.scratch_rows(core, dst, self.rows, sticks(self.row_bytes), self.dst_stride).zero_()
        for first, rows, valid in clipped_rows(src, self.rows, self.row_bytes, self.src_stride, limit):
            m.scratch_rows(core, dst + first * self.dst_stride, rows, valid, self.dst_stride).copy_(
                m.device_rows(self.src.symbol, src + first * self.src_stride, rows, valid, self.src_stride))

    def cost(self, t, core, idx):
        return _dma(t, self.src.symbol, self.src.at(idx), self.rows, self.row_bytes, self.src_stride,
                    self.dst.at(idx), self.dst_stride, write=False)

    def touches(self):
        return (("sp_rows", self.dst, self.rows, sticks(self.row_bytes), self.dst_stride),
                ("dev_rows", self.src, self.rows, self.row_bytes, self.src_stride))

    def scratch_modes(self):
        return ("w", "")


def _bound_rows(b, group, device_side: str, scratch_side: str):
    """(first instruction, device rows, scratchpad rows) bound for a batch of loads or stores
    (`device_side`/`scratch_side`: the operands naming each), or None when the batch does not move
    the same rows of one device buffer with the same strides, or a view cannot be bound."""
    def shape(i):
        return getattr(i, device_side).symbol, i.rows, i.row_bytes, i.src_stride, i.dst_stride

    first = group[0][1]
    want = shape(first)
    if any(shape(i) != want for _, i, _ in group):
        return None
    dev_stride, sp_stride = getattr(first, f"{device_side}_stride"), getattr(first, f"{scratch_side}_stride")
    dev = b.dev_rows(getattr(first, device_side).symbol, [getattr(i, device_side).at(idx) for _, i, idx in group],
                     first.rows, first.row_bytes, dev_stride)
    sp = b.sp_rows([(c, getattr(i, scratch_side).at(idx)) for c, i, idx in group], first.rows, first.row_bytes,
                   sp_stride)
    return None if dev is None or sp is None else (first, dev, sp)


@instruction("store", ("ls",))
@dataclass(frozen=True)
class Store(Instruction):
    """Scratchpad -> device memory: only the `row_bytes` valid bytes of each row land."""

    dst: DevAddr
    src: Addr
    rows: int
    row_bytes: int
    dst_stride: int
    src_stride: int
    writes_device: ClassVar[bool] = True

    def run(self, m, core, idx):
        limit = m.limits.get(self.dst.symbol)
        if limit is not None:  # a symbolic dim (issue 18): only the bytes that exist land
            src, dst = self.src.at(idx), self.dst.at(idx)
            for first, rows, valid in clipped_rows(dst, self.rows, self.row_bytes, self.dst_stride, limit):
                m.device_rows(self.dst.symbol, dst + first * self.dst_stride, rows, valid, self.dst_stride).copy_(
                    m.scratch_rows(core, src + first * self.src_stride, rows, valid, self.src_stride))
            return
        src = m.scratch_rows(core, self.src.at(idx), self.rows, self.row_bytes, self.src_stride)
        m.device_rows(self.dst.symbol, self.dst.at(idx), self.rows, self.row_bytes, self.dst_stride).copy_(src)

    @classmethod
    def bind(cls, b, group):
        views = _bound_rows(b, group, "dst", "src")
        if views is None:
            return None
        _, dst, src = views
        return lambda: dst.copy_(src)

    def cost(self, t, core, idx):
        return _dma(t, self.dst.symbol, self.dst.at(idx), self.rows, self.row_bytes, self.dst_stride,
                    self.src.at(idx), self.src_stride, write=True)

    def touches(self):
        return (("sp_rows", self.src, self.rows, sticks(self.row_bytes), self.src_stride),
                ("dev_rows", self.dst, self.rows, self.row_bytes, self.dst_stride))

    def scratch_modes(self):
        return ("r", "")


@instruction("copy", ("ls",))
@dataclass(frozen=True)
class Copy(Instruction):
    """Scratchpad -> scratchpad on the same core, whole sticks."""

    dst: Addr
    src: Addr
    nbytes: int

    def run(self, m, core, idx):
        m.scratch_rows(core, self.dst.at(idx), 1, self.nbytes, 0).copy_(
            m.scratch_rows(core, self.src.at(idx), 1, self.nbytes, 0).clone())

    @classmethod
    def bind(cls, b, group):
        n = group[0][1].nbytes
        if any(i.nbytes != n for _, i, _ in group):
            return None
        dst = b.sp_rows([(c, i.dst.at(idx)) for c, i, idx in group], 1, n, 0)
        src = b.sp_rows([(c, i.src.at(idx)) for c, i, idx in group], 1, n, 0)
        if src is None or dst is None:
            return None
        return lambda: dst.copy_(src.clone())

    def cost(self, t, core, idx):
        return t.local(self.nbytes)

    def touches(self):
        return (("sp_rows", self.dst, 1, self.nbytes, 0), ("sp_rows", self.src, 1, self.nbytes, 0),
                ("whole_sticks", self.nbytes))

    def scratch_modes(self):
        return ("w", "r", "")


@instruction("send", ("ls",))
@dataclass(frozen=True)
class Send(Instruction):
    """Scratchpad -> a neighbour core's scratchpad over the ring, whole sticks."""

    core: int
    dst: Addr
    src: Addr
    nbytes: int

    def run(self, m, core, idx):
        data = m.scratch_rows(core, self.src.at(idx), 1, self.nbytes, 0)
        m.scratch_rows(self.core, self.dst.at(idx), 1, self.nbytes, 0).copy_(data)

    @classmethod
    def bind(cls, b, group):
        # (a group's sends touch no bytes another of them writes: schedule.ring_order)
        n = group[0][1].nbytes
        if any(i.nbytes != n or i.core == c for c, i, _ in group):
            return None
        src = b.sp_rows([(c, i.src.at(idx)) for c, i, idx in group], 1, n, 0)
        dst = b.sp_rows([(i.core, i.dst.at(idx)) for c, i, idx in group], 1, n, 0)
        if src is None or dst is None:
            return None
        return lambda: dst.copy_(src)

    def cost(self, t, core, idx):
        return t.ring(core, self.core, self.nbytes)

    def touches(self):
        return (("sp_rows", self.src, 1, self.nbytes, 0), ("sp_rows_on", self.core, self.dst, 1, self.nbytes, 0),
                ("whole_sticks", self.nbytes), ("neighbour", self.core))

    def scratch_modes(self):
        return ("r", "w", "", "")


@instruction("transpose", ("ls",))
@dataclass(frozen=True)
class Transpose(Instruction):
    """dst[cols, rows] = src[rows, cols] transposed within the scratchpad (same dtype)."""

    dst: Tile
    src: Tile

    def run(self, m, core, idx):
        m.view(core, self.dst, idx).copy_(m.view(core, self.src, idx).t().clone())

    @classmethod
    def bind(cls, b, group):
        first = group[0][1]
        if any((i.dst.shape_key, i.src.shape_key) != (first.dst.shape_key, first.src.shape_key) for _, i, _ in group):
            return None
        dst = b.tile([(c, i.dst, idx) for c, i, idx in group])
        src = b.tile([(c, i.src, idx) for c, i, idx in group])
        if dst is None or src is None or dst.shape[1:] != (first.dst.rows, first.dst.cols):
            return None
        flipped = src.transpose(1, 2)
        if _apart(dst, src):
            return lambda: dst.copy_(flipped)
        return lambda: dst.copy_(flipped.clone())  # (in place, as run: read all before writing)

    def cost(self, t, core, idx):
        return t.transpose(self.src.rows * self.src.cols * ITEMSIZE[self.src.dtype])

    def touches(self):
        return (("tile", self.dst), ("tile", self.src))

    def scratch_modes(self):
        return ("w", "r")

    def problem(self):
        if self.dst.dtype != self.src.dtype:
            return f"transpose cannot cast ({self.src.dtype} -> {self.dst.dtype})"
        if (self.dst.rows, self.dst.cols) != (self.src.cols, self.src.rows):
            return (f"transpose of a {self.src.rows} x {self.src.cols} tile needs a {self.src.cols} x "
                    f"{self.src.rows} destination, got {self.dst.rows} x {self.dst.cols}")
        if "none" != self.dst.broadcast or "none" != self.src.broadcast:
            return "transpose tiles cannot broadcast"
        return None


def _dma(t, symbol, offset, rows, row_bytes, stride, sp_addr, sp_stride, write):
    """t.dma of a transfer, clipped (issue 18) to the bytes its buffer has at the launch's sizes
    (the timing model's `limits`, when it has them): the rows that move are charged, each whole."""
    limit = getattr(t, "limits", {}).get(symbol)
    if limit is not None:
        runs = clipped_rows(offset, rows, row_bytes, stride, limit)
        rows = sum(n for _, n, _ in runs)
        if rows == 0:
            return 0.0
    return t.dma(symbol, offset, rows, row_bytes, stride, sp_addr, sp_stride, write=write)


# ---- processing-element array ------------------------------------------------------


@instruction("matmul", ("pe",))
@dataclass(frozen=True)
class MatMul(Instruction):
    """acc[M,N] (fp32) = (acc if accumulate else 0) + a[M,K] @ b[K,N], accumulated in fp32."""

    acc: Tile
    a: Tile
    b: Tile
    accumulate: bool = True

    def run(self, m, core, idx):
        a = m.read(core, self.a, idx, torch.float32)
        b = m.read(core, self.b, idx, torch.float32)
        out = m.view(core, self.acc, idx)
        if self.accumulate:
            out.add_(a @ b)
        else:
            torch.mm(a, b, out=out)

    @classmethod
    def bind(cls, b, group):
        first = group[0][1]
        key = (first.acc.shape_key, first.a.shape_key, first.b.shape_key, first.accumulate)
        if any((i.acc.shape_key, i.a.shape_key, i.b.shape_key, i.accumulate) != key for _, i, _ in group):
            return None
        out = b.tile([(c, i.acc, idx) for c, i, idx in group])
        a = b.tile([(c, i.a, idx) for c, i, idx in group])
        bb = b.tile([(c, i.b, idx) for c, i, idx in group])
        if out is None or a is None or bb is None:
            return None
        # Every member's operands converted at once into buffers bound now (a round's members
        # touch no bytes another writes), then one torch.mm per member into its own tile, as run
        # does: one batched product may sum in another order. No allocation per run.
        refresh_a, a32 = b.converted(a, first.a, torch.float32)
        refresh_b, b32 = b.converted(bb, first.b, torch.float32)
        refresh = [r for r in (refresh_a, refresh_b) if r is not None]
        mm = torch.mm
        if first.accumulate:
            # each member's product into a buffer of its own, then one add over them all: the
            # same elementwise sums as run's `out.add_(a @ b)`, in one operation
            products = b.buffer(out.shape, torch.float32)
            members = [(a32[k], b32[k], products[k]) for k in range(len(group))]

            def accumulate():
                for r in refresh:
                    r()
                for x, y, p in members:
                    mm(x, y, out=p)
                out.add_(products)
            return accumulate
        members = [(a32[k], b32[k], out[k]) for k in range(len(group))]

        def overwrite():
            for r in refresh:
                r()
            for x, y, o in members:
                mm(x, y, out=o)
        return overwrite

    def cost(self, t, core, idx):
        return t.pe(self.a.rows, self.b.cols, self.a.cols)

    def touches(self):
        return (("tile", self.acc), ("tile", self.a), ("tile", self.b))

    def scratch_modes(self):
        return ("rw" if self.accumulate else "w", "r", "r")


# ---- special-function pipeline ------------------------------------------------------

UNARY = {
    "copy": lambda x: x,  # with a different destination dtype: a cast
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "exp2": torch.exp2, "log": torch.log,
    "log2": torch.log2, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt, "reciprocal": torch.reciprocal,
    "tanh": torch.tanh, "sigmoid": torch.sigmoid, "relu": torch.relu, "sin": torch.sin,
    "cos": torch.cos, "erf": torch.erf, "floor": torch.floor, "ceil": torch.ceil,
    "not": torch.logical_not,
    # Added for compiled pointwise kernels (issue 7): Inductor ops with no exact composition.
    "expm1": torch.expm1, "log1p": torch.log1p, "trunc": torch.trunc, "round": torch.round,
    "sign": torch.sign,
    # Added for issue 9's coverage: NaN/inf tests (bool results) and bitwise not on integers
    # (on bool it is logical not, as in PyTorch).
    "isnan": torch.isnan, "isinf": torch.isinf, "bitwise_not": torch.bitwise_not,
}
BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "max": torch.maximum,
    "min": torch.minimum, "pow": torch.pow, "and": torch.logical_and, "or": torch.logical_or,
    "xor": torch.logical_xor, "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le,
    "gt": torch.gt, "ge": torch.ge,
    # Added for compiled pointwise kernels (issue 7): integer division with Python (floordiv,
    # remainder) and C (fmod) semantics.
    "floordiv": torch.floor_divide, "fmod": torch.fmod, "remainder": torch.remainder,
    # Added for issue 9's coverage: integer division rounding toward zero, bitwise ops and shifts
    # on integers (and bools), each PyTorch's own semantics.
    "truncdiv": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or, "bitwise_xor": torch.bitwise_xor,
    "shl": torch.bitwise_left_shift, "shr": torch.bitwise_right_shift,
}


def _integer_division(op, quotient: bool):
    """`op` on integer operands, defined where the CPU's divide instruction is not.

    Division by zero raises, as PyTorch on the CPU does (a failed program). The minimum
    integer divided by -1 traps the CPU's divide instruction (SIGFPE); here it wraps like
    any other integer overflow: x // -1 is -x (wrapped) and x % -1 is 0, for every x.
    Floats go straight to `op` (IEEE: no traps).
    """
    def run(a, b):
        if a.is_floating_point() or b.is_floating_point():
            return op(a, b)
        if (b == 0).any():
            raise ZeroDivisionError("integer division by zero")
        minus_one = b == -1
        if not minus_one.any():
            return op(a, b)
        safe = op(a, torch.where(minus_one, torch.ones_like(b), b))
        return torch.where(minus_one, torch.neg(a) if quotient else torch.zeros_like(safe), safe)
    return run


for _name, _quotient in (("floordiv", True), ("truncdiv", True), ("fmod", False), ("remainder", False)):
    BINARY[_name] = _integer_division(BINARY[_name], _quotient)
REDUCE = {
    "sum": lambda x: x.sum(dim=-1, keepdim=True),
    "max": lambda x: x.amax(dim=-1, keepdim=True),
    "min": lambda x: x.amin(dim=-1, keepdim=True),
    "prod": lambda x: x.prod(dim=-1, keepdim=True),
    # Added for reductions (issue 8). argmax/argmin: the index of each row's first maximum
    # (minimum) within the tile row, NaN counting as the maximum (minimum) as in PyTorch; the
    # destination is an integer tile; they do not accumulate (a planner combines (value, index)
    # pairs itself, with compares and selects). any/all: on bool tiles.
    "argmax": lambda x: x.argmax(dim=-1, keepdim=True),
    "argmin": lambda x: x.argmin(dim=-1, keepdim=True),
    "any": lambda x: x.to(torch.bool).any(dim=-1, keepdim=True),
    "all": lambda x: x.to(torch.bool).all(dim=-1, keepdim=True),
}
COMBINE = {"sum": torch.add, "max": torch.maximum, "min": torch.minimum, "prod": torch.mul,
           "any": torch.logical_or, "all": torch.logical_and}
INDEX_REDUCE = ("argmax", "argmin")
# Ops whose every element is correctly rounded (or exact) whichever loop computes it: torch's
# vectorized and scalar paths agree, so one operation over several cores' tiles gives the very
# bits of one per core. Transcendentals (a vector polynomial vs libm on a loop's tail), pow and
# the guarded integer divisions run one core at a time, and so do max and min (their vector form
# returns another NaN's bits than the scalar one: checked, a NaN is a NaN but not the same bits).
EXACT_UNARY = frozenset({"copy", "neg", "abs", "relu", "floor", "ceil", "trunc", "round", "sign", "sqrt", "not",
                         "isnan", "isinf", "bitwise_not"})
# Those whose result has their operands' dtype (div: of floats only), so `out=` writes the tile.
OUT_BINARY = frozenset({"add", "sub", "mul", "div", "max", "min", "bitwise_and", "bitwise_or", "bitwise_xor"})


def _writable_over(dst, src) -> bool:
    """`out=dst` may read `src`: the very same elements (an elementwise op reads each before it
    writes it), or none in common (_apart); a partial overlap would need the temporary."""
    return (dst.data_ptr() == src.data_ptr() and dst.shape == src.shape and dst.stride() == src.stride()) or \
        _apart(dst, src)


def _apart(dst, src) -> bool:
    """No element of `src` is one of `dst`'s. Views of many cores' tiles interleave in the bank
    (torch's own check sees their spans overlap): with the same spacing of members, each
    member's elements lie in one block per spacing, so the two are apart if their blocks are,
    wherever each starts within the spacing."""
    if dst.numel() == 0 or src.numel() == 0 or not torch._C._overlaps(dst, src):
        return True
    if (dst.dim() < 2 or dst.shape[0] != src.shape[0] or dst.element_size() != src.element_size()
            or min(dst.stride()) < 0 or min(src.stride()) < 0):
        return False
    size = dst.element_size()

    def block(t):  # bytes of one member, from its first element
        return (sum((n - 1) * st for n, st in zip(t.shape[1:], t.stride()[1:])) + 1) * size

    a, b = block(dst), block(src)
    gap = src.data_ptr() - dst.data_ptr()
    if dst.shape[0] == 1:  # one member: its two blocks
        return gap >= a or -gap >= b
    step = dst.stride(0) * size
    if src.stride(0) * size != step or step == 0:
        return False
    r = gap % step
    return a <= r and r + b <= step


EXACT_BINARY = frozenset({"add", "sub", "mul", "div", "and", "or", "xor", "eq", "ne", "lt", "le",
                          "gt", "ge", "bitwise_and", "bitwise_or", "bitwise_xor", "shl", "shr"})


@instruction("unary", ("sfp",))
@dataclass(frozen=True)
class Unary(Instruction):
    op: str
    dst: Tile
    src: Tile

    def run(self, m, core, idx):
        m.write(core, self.dst, idx, UNARY[self.op](m.read(core, self.src, idx)))

    @classmethod
    def bind(cls, b, group):
        first = group[0][1]
        if len(group) > 1 and (first.op not in EXACT_UNARY or
                               any((i.op, i.dst.shape_key, i.src.shape_key) !=
                                   (first.op, first.dst.shape_key, first.src.shape_key) for _, i, _ in group)):
            return None
        dst = b.tile([(c, i.dst, idx) for c, i, idx in group])
        src = b.tile([(c, i.src, idx) for c, i, idx in group])
        if dst is None or src is None:
            return None
        fn, read = UNARY[first.op], b.reader(src, first.src)
        return lambda: dst.copy_(fn(read()))

    def cost(self, t, core, idx):
        return t.sfp(*_passes(self.dst), _widest(self.dst, self.src))

    def touches(self):
        return (("tile", self.dst), ("tile", self.src))

    def scratch_modes(self):
        return ("w", "r")


@instruction("binary", ("sfp",))
@dataclass(frozen=True)
class Binary(Instruction):
    """Elementwise a (op) b, including compares (bool result); broadcasts by tile."""

    op: str
    dst: Tile
    a: Tile
    b: Tile

    def run(self, m, core, idx):
        m.write(core, self.dst, idx, BINARY[self.op](m.read(core, self.a, idx), m.read(core, self.b, idx)))

    @classmethod
    def bind(cls, b, group):
        first = group[0][1]
        key = (first.op, first.dst.shape_key, first.a.shape_key, first.b.shape_key)
        if len(group) > 1 and (first.op not in EXACT_BINARY or
                               any((i.op, i.dst.shape_key, i.a.shape_key, i.b.shape_key) != key
                                   for _, i, _ in group)):
            return None
        dst = b.tile([(c, i.dst, idx) for c, i, idx in group])
        a = b.tile([(c, i.a, idx) for c, i, idx in group])
        bb = b.tile([(c, i.b, idx) for c, i, idx in group])
        if dst is None or a is None or bb is None:
            return None
        fn = BINARY[first.op]
        if first.op in OUT_BINARY:
            x, y = b.operand(a, first.a), b.operand(bb, first.b)
            if x is not None and y is not None and x.dtype == y.dtype == dst.dtype and \
                    (x.is_floating_point() or first.op != "div") and _writable_over(dst, x) and _writable_over(dst, y):
                # The result straight into the tile: the same kernel, with no temporary and no copy.
                return lambda: fn(x, y, out=dst)
        read_a, read_b = b.reader(a, first.a), b.reader(bb, first.b)
        return lambda: dst.copy_(fn(read_a(), read_b()))

    def cost(self, t, core, idx):
        return t.sfp(*_passes(self.dst), _widest(self.dst, self.a, self.b))

    def touches(self):
        return (("tile", self.dst), ("tile", self.a), ("tile", self.b))

    def scratch_modes(self):
        return ("w", "r", "r")


@instruction("select", ("sfp",))
@dataclass(frozen=True)
class Select(Instruction):
    """dst = where(cond, a, b)."""

    dst: Tile
    cond: Tile
    a: Tile
    b: Tile

    def run(self, m, core, idx):
        cond = m.read(core, self.cond, idx).to(torch.bool)
        m.write(core, self.dst, idx, torch.where(cond, m.read(core, self.a, idx), m.read(core, self.b, idx)))

    @classmethod
    def bind(cls, b, group):
        first = group[0][1]
        key = (first.dst.shape_key, first.cond.shape_key, first.a.shape_key, first.b.shape_key)
        if any((i.dst.shape_key, i.cond.shape_key, i.a.shape_key, i.b.shape_key) != key for _, i, _ in group):
            return None
        tiles = [b.tile([(c, getattr(i, name), idx) for c, i, idx in group]) for name in ("dst", "cond", "a", "b")]
        if any(t is None for t in tiles):
            return None
        dst, cond, a, bb = tiles
        read_c, read_a, read_b = b.reader(cond, first.cond), b.reader(a, first.a), b.reader(bb, first.b)
        return lambda: dst.copy_(torch.where(read_c().to(torch.bool), read_a(), read_b()))

    def cost(self, t, core, idx):
        return t.sfp(*_passes(self.dst), _widest(self.dst, self.a, self.b))

    def touches(self):
        return (("tile", self.dst), ("tile", self.cond), ("tile", self.a), ("tile", self.b))

    def scratch_modes(self):
        return ("w", "r", "r", "r")


@instruction("reduce", ("sfp",))
@dataclass(frozen=True)
class Reduce(Instruction):
    """dst[rows,1] = reduce over each row of src (combined with dst when accumulate)."""

    op: str
    dst: Tile
    src: Tile
    accumulate: bool = False

    def run(self, m, core, idx):
        value = REDUCE[self.op](m.read(core, self.src, idx))
        if self.accumulate:
            value = COMBINE[self.op](m.read(core, self.dst, idx), value)
        m.write(core, self.dst, idx, value)

    @classmethod
    def bind(cls, b, group):
        # One operation over every core's tiles: torch reduces each row by the same loop
        # whatever the rows around it, so a batched reduction gives each core's very bits
        # (checked, NaN bits included, over strides, tails and dtypes: tests/test_fast_runs.py).
        # On ONE intra-op thread: a row of one output alone may be split over threads, summed in
        # another order. Batched runs are (schedule.BATCH_STEP_BYTES is below
        # device/programs.ONE_THREAD_STEP_BYTES: a batched program runs on one thread).
        first = group[0][1]
        key = (first.op, first.dst.shape_key, first.src.shape_key, first.accumulate)
        if any((i.op, i.dst.shape_key, i.src.shape_key, i.accumulate) != key for _, i, _ in group) or \
                (len(group) > 1 and first.accumulate and first.op in ("max", "min")):
            return None  # (combining by elementwise max/min: another NaN's bits, see EXACT_UNARY)
        dst = b.tile([(c, i.dst, idx) for c, i, idx in group])
        src = b.tile([(c, i.src, idx) for c, i, idx in group])
        if dst is None or src is None:
            return None
        fn, read = REDUCE[first.op], b.reader(src, first.src)
        if not first.accumulate:
            return lambda: dst.copy_(fn(read()))
        combine, read_dst = COMBINE[first.op], b.reader(dst, first.dst)
        return lambda: dst.copy_(combine(read_dst(), fn(read())))

    def cost(self, t, core, idx):
        return t.sfp(self.src.rows, self.src.cols, _widest(self.src))

    def touches(self):
        return (("tile", self.dst), ("tile", self.src))

    def scratch_modes(self):
        return ("rw" if self.accumulate else "w", "r")

    def problem(self):
        if self.op in INDEX_REDUCE:
            if self.accumulate:
                return f"reduce {self.op} cannot accumulate (combine (value, index) pairs with compares)"
            if self.dst.dtype not in ("int32", "int64"):
                return f"reduce {self.op} writes indices: its destination must be int32 or int64, not {self.dst.dtype}"
        return None


SCAN = {"sum": (torch.cumsum, torch.add), "prod": (torch.cumprod, torch.mul)}


@instruction("scan", ("sfp",))
@dataclass(frozen=True)
class Scan(Instruction):
    """dst[r, :] = inclusive prefix (op) along row r of src, continued from carry[r] when a
    carry column [rows, 1] is given; the carry then holds each row's last prefix, so the next
    chunk of the same rows continues from it. Floats accumulate in fp32 or wider (the carry is
    fp32; dst rounds to its dtype), integers in dst's width (the carry's too). Costed in timing.scan: a prefix across the lanes of a stick."""

    op: str
    dst: Tile
    src: Tile
    carry: Tile | None = None

    def run(self, m, core, idx):
        prefix, combine = SCAN[self.op]
        value = prefix(m.read(core, self.src, idx), dim=1)
        if self.carry is not None:
            value = combine(m.read(core, self.carry, idx), value)
            m.write(core, self.carry, idx, value[:, -1:])
        m.write(core, self.dst, idx, value)

    def cost(self, t, core, idx):
        return t.scan(self.src.rows, self.src.cols, _widest(self.dst, self.src))

    def touches(self):
        carry = (("tile", self.carry),) if self.carry is not None else ()
        return (("tile", self.dst), ("tile", self.src)) + carry

    def scratch_modes(self):
        return ("w", "r") + (("rw",) if self.carry is not None else ())

    def problem(self):
        if self.op not in SCAN:
            return f"scan {self.op!r} is not one of {sorted(SCAN)}"
        if (self.dst.rows, self.dst.cols) != (self.src.rows, self.src.cols):
            return f"scan of a {self.src.rows} x {self.src.cols} tile into a {self.dst.rows} x {self.dst.cols} one"
        if "none" != self.dst.broadcast or "none" != self.src.broadcast:
            return "scan tiles cannot broadcast"
        if self.carry is not None:
            want = "fp32" if self.dst.dtype in ("fp32", "fp16", "bf16") else self.dst.dtype
            if (self.carry.rows, self.carry.cols, self.carry.dtype) != (self.src.rows, 1, want):
                return (f"a scan carry is a {want} [{self.src.rows}, 1] column, got {self.carry.dtype} "
                        f"[{self.carry.rows}, {self.carry.cols}]")
        return None


@instruction("fill", ("sfp",))
@dataclass(frozen=True)
class Fill(Instruction):
    """dst = value everywhere. A SizeExpr value (issue 18) is read from the launch's size words
    (its static maximum when the program runs without sizes): how a mask compares loop indices
    with a size known only at launch (the reduced elements past a symbolic length)."""

    dst: Tile
    value: float | SizeExpr

    def run(self, m, core, idx):
        m.view(core, self.dst, idx).fill_(count_at(self.value, m.sizes))

    @classmethod
    def bind(cls, b, group):
        first = group[0][1]
        if isinstance(first.value, SizeExpr):
            return None  # (a program with sizes runs on the general interpreter: run reads them)
        if any((i.value, i.dst.shape_key) != (first.value, first.dst.shape_key) for _, i, _ in group):
            return None
        dst = b.tile([(c, i.dst, idx) for c, i, idx in group])
        return None if dst is None else (lambda: dst.fill_(first.value))

    def cost(self, t, core, idx):
        return t.sfp(*_passes(self.dst), _widest(self.dst))

    def touches(self):
        return (("tile", self.dst),)

    def scratch_modes(self):
        return ("w",)


@instruction("iota", ("ls", "sfp"))
@dataclass(frozen=True)
class Iota(Instruction):
    """dst[r, c] = start + r * row_step + c * col_step: an integer tile of values from the loop
    indices (arange, the index compares of masks). `start` is affine in the loop counters
    (``start + sum(steps[k] * i_k)``), like an address; a broadcast dst holds its stored shape.
    It runs on the sfp, or on the load/store unit in place of the load of a tile whose values are
    its own element indices (the reductions' plans: it then flows to the sfp like loaded data);
    either way one pass per stick, like a fill."""

    dst: Tile
    start: int
    steps: tuple[int, ...]
    row_step: int
    col_step: int

    def run(self, m, core, idx):
        m.view(core, self.dst, idx).copy_(self._values(idx))

    def _values(self, idx) -> torch.Tensor:
        rows, cols = self.dst.stored_shape
        base = self.start + sum(s * i for s, i in zip(self.steps, idx))
        r = torch.arange(rows, dtype=torch.int64, device="cpu").unsqueeze(1) * self.row_step
        c = torch.arange(cols, dtype=torch.int64, device="cpu").unsqueeze(0) * self.col_step
        return base + r + c

    @classmethod
    def bind(cls, b, group):
        # The values follow from the instruction and its loop indices alone: computed once here,
        # copied in per run (the tile may hold something else between runs).
        dst = b.tile([(c, i.dst, idx) for c, i, idx in group])
        if dst is None:
            return None
        values = torch.stack([i._values(idx) for _, i, idx in group]).to(dst.dtype)
        if values.shape != dst.shape:
            return None
        return lambda: dst.copy_(values)

    def cost(self, t, core, idx):
        return t.sfp(*_passes(self.dst), _widest(self.dst))

    def touches(self):
        return (("tile", self.dst),)

    def scratch_modes(self):
        return ("w",)

    def problem(self):
        if self.dst.dtype not in ("int32", "int64"):
            return f"iota writes integers: its destination must be int32 or int64, not {self.dst.dtype}"
        return None


@instruction("philox", ("sfp",))
@dataclass(frozen=True)
class Philox(Instruction):
    """dst = philox.philox(key, counter, mode): one random value per element from Philox-4x32-10
    (philox.py), key and counter integer tiles read as int64 (a key is usually one broadcast
    seed, a counter an iota plus the generator's offset). ``uniform`` and ``normal`` give fp32
    (rounded to dst's float dtype on write), ``bits63`` int64. A pure function of
    its operands: no state on chip, so cores draw disjoint counters independently (issue 19).
    Costed in timing.philox: the rounds as elementwise integer passes, normal's log and cos as
    the sfp's own transcendental passes (the simulator evaluates them as fp64 polynomials only
    so that every tile gets the same bits, philox.py)."""

    mode: str
    dst: Tile
    key: Tile
    counter: Tile

    def run(self, m, core, idx):
        key, counter = m.read(core, self.key, idx, torch.int64), m.read(core, self.counter, idx, torch.int64)
        m.write(core, self.dst, idx, philox_values(key, counter, self.mode))

    @classmethod
    def bind(cls, b, group):
        first = group[0][1]
        key = (first.mode, first.dst.shape_key, first.key.shape_key, first.counter.shape_key)
        # Every mode is exact wherever it runs (integer rounds; normal's log and cos are polynomials
        # of correctly rounded ops, philox.py), so cores' tiles may be drawn in one operation.
        if len(group) > 1 and any(
                (i.mode, i.dst.shape_key, i.key.shape_key, i.counter.shape_key) != key for _, i, _ in group):
            return None
        dst = b.tile([(c, i.dst, idx) for c, i, idx in group])
        k = b.tile([(c, i.key, idx) for c, i, idx in group])
        n = b.tile([(c, i.counter, idx) for c, i, idx in group])
        if dst is None or k is None or n is None:
            return None
        read_k, read_n = b.reader(k, first.key, torch.int64), b.reader(n, first.counter, torch.int64)
        return lambda: dst.copy_(philox_values(read_k(), read_n(), first.mode))

    def cost(self, t, core, idx):
        return t.philox(self.dst.rows, self.dst.cols, self.mode)

    def touches(self):
        return (("tile", self.dst), ("tile", self.key), ("tile", self.counter))

    def scratch_modes(self):
        return ("w", "r", "r")

    def problem(self):
        if self.mode not in PHILOX_MODES:
            return f"philox mode {self.mode!r} is not one of {PHILOX_MODES}"
        for name in ("key", "counter"):
            if getattr(self, name).dtype not in ("int32", "int64"):
                return f"a philox {name} is an int32 or int64 tile, not {getattr(self, name).dtype}"
        want = philox_result_dtype(self.mode)
        if want == "int64" and self.dst.dtype != "int64":
            return f"philox {self.mode} writes int64, not {self.dst.dtype}"
        if want == "fp32" and self.dst.dtype not in ("fp32", "fp16", "bf16"):
            return f"philox {self.mode} writes floats, not {self.dst.dtype}"
        return None


def _passes(tile: Tile) -> tuple[int, int]:
    """(rows, cols) the sfp streams for a result tile: a packed column (issue 31: one element
    per row, the rows' elements adjacent, as attention's per-row statistics) is one row of
    elements, its sticks dense, not a stick per row."""
    if tile.packed:
        return 1, tile.rows
    return tile.rows, tile.cols


def _widest(*tiles: Tile) -> int:
    # The pipeline streams sticks: an fp32 operand takes two passes per 64 lanes.
    return max(ITEMSIZE[t.dtype] for t in tiles)


def compute_dtype(tile: Tile) -> torch.dtype:
    return COMPUTE[tile.dtype]


# ---- gathers and scatters (issue 16) ---------------------------------------------------


class IndexOutOfRange(IndexError):
    """A gather or scatter met an index outside [0, bound) (after wrapping a negative one): the
    instruction moved nothing. `op` is what the program says the op is (the aten op)."""

    def __init__(self, op: str, value: int, bound: int):
        super().__init__(f"{op}: index {value} is out of bounds for size {bound}")
        self.op, self.value, self.bound = op, value, bound


def _row_offsets(m, core, idx, indices, rows: int, op: str) -> torch.Tensor:
    """Per row, the bytes the data-dependent terms add, every index checked first."""
    total = torch.zeros(rows, dtype=torch.int64, device="cpu")
    for term in indices:
        values = m.read(core, term.tile, idx, torch.int64).reshape(-1)[:rows]
        if term.wrap_neg:
            values = torch.where(values < 0, values + term.bound, values)
        bad = (values < 0) | (values >= term.bound)
        if bool(bad.any()):
            first = int(torch.nonzero(bad)[0])
            raw = int(m.read(core, term.tile, idx, torch.int64).reshape(-1)[first])
            raise IndexOutOfRange(op, raw, term.bound)
        total += values * term.stride
    return total


def _bind_indexed(b, group, device: str, scratch: str, move):
    """The fast form of gathers or scatters (`device`/`scratch`: the operands naming each side):
    per member, its index columns and its scratchpad rows bound once; a run reads the indices,
    checks every one and makes every device row's view (as `run` would, and raising where it
    would) before `move(device rows, scratchpad rows)` moves any byte, so a failure (run again
    by the general semantics, which names it) has written nothing."""
    members = []
    for core, i, idx in group:
        terms = []
        for term in i.indices:
            view = b.tile([(core, term.tile, idx)])
            if view is None:
                return None
            terms.append((b.reader(view[0], term.tile, torch.int64), term.stride, term.bound, term.wrap_neg))
        stride = getattr(i, f"{scratch}_stride")
        first = getattr(i, scratch).at(idx)
        rows = [b.sp_rows([(core, first + r * stride)], 1, i.row_bytes, 0) for r in range(i.rows)]
        if any(r is None for r in rows):
            return None
        buf = b.buffers[getattr(i, device).symbol]
        members.append((i, terms, [r[0] for r in rows], buf, getattr(i, device).at(idx),
                        getattr(i, f"{device}_stride")))

    def run():
        moves = []
        for i, terms, sp_rows, buf, base, stride in members:
            extra = [0] * i.rows
            for read, step, bound, wrap in terms:
                for r, v in enumerate(read().reshape(-1)[:i.rows].tolist()):
                    if v < 0 and wrap:
                        v += bound
                    if not 0 <= v < bound:
                        raise IndexOutOfRange(i.op, v, bound)
                    extra[r] += v * step
            at = buf.storage_offset() + base
            moves.append((i, [torch.as_strided(buf, (1, i.row_bytes), (0, 1), at + r * stride + add)
                              for r, add in enumerate(extra)], sp_rows))
        for i, dev_rows, sp_rows in moves:
            move(i, dev_rows, sp_rows)
    return run


def _index_problem(indices, rows: int) -> str | None:
    for term in indices:
        t = term.tile
        if t.dtype not in ("int32", "int64"):
            return f"a row index tile must be int32 or int64, not {t.dtype}"
        if t.cols != 1 or t.rows != rows or t.broadcast not in ("none", "cols", "scalar"):
            return f"a row index is a [{rows}, 1] column, got [{t.rows}, {t.cols}] (broadcast {t.broadcast})"
        if term.bound < 1:
            return f"a row index needs a bound of at least 1, got {term.bound}"
    return None


@instruction("gather", ("ls",))
@dataclass(frozen=True)
class Gather(Instruction):
    """Device memory -> scratchpad, `rows` rows of `row_bytes` valid bytes; row r comes from
    src.at(idx) + r * src_stride + the `indices` terms (RowIndex: a checked integer from a
    scratchpad column times its stride). Each row is its own DMA of whole sticks (padded and
    masked as Load's); an index out of range raises IndexOutOfRange naming `op` and moves nothing."""

    dst: Addr
    src: DevAddr
    rows: int
    row_bytes: int
    src_stride: int
    dst_stride: int
    indices: tuple = ()
    op: str = "gather"

    def run(self, m, core, idx):
        extra = _row_offsets(m, core, idx, self.indices, self.rows, self.op).tolist()
        base, dst = self.src.at(idx), self.dst.at(idx)
        pad = -self.row_bytes % STICK
        for r, add in enumerate(extra):
            row = m.device_rows(self.src.symbol, base + r * self.src_stride + add, 1, self.row_bytes, 0)
            m.scratch_rows(core, dst + r * self.dst_stride, 1, self.row_bytes, 0).copy_(row)
            if pad:
                m.scratch_rows(core, dst + r * self.dst_stride + self.row_bytes, 1, pad, 0).zero_()

    @classmethod
    def bind(cls, b, group):
        pad = -group[0][1].row_bytes % STICK
        if any(-i.row_bytes % STICK != pad for _, i, _ in group):
            return None
        pads = [b.sp_rows([(c, i.dst.at(idx) + r * i.dst_stride + i.row_bytes)], 1, pad, 0)
                for c, i, idx in group for r in range(i.rows)] if pad else []
        if any(p is None for p in pads):
            return None
        zeros = iter(())

        def move(i, dev_rows, sp_rows):
            for src, dst in zip(dev_rows, sp_rows):
                dst.copy_(src)
                if pad:
                    next(zeros).zero_()

        run = _bind_indexed(b, group, "src", "dst", move)
        if run is None or not pad:
            return run
        pads = [p[0] for p in pads]

        def gather():
            nonlocal zeros
            zeros = iter(pads)
            run()
        return gather

    def cost(self, t, core, idx):
        return t.indirect_dma(self.src.symbol, self.src.at(idx), self.rows, self.row_bytes, self.src_stride,
                              self.indices, self.dst.at(idx), self.dst_stride, write=False)

    def touches(self):
        return (("sp_rows", self.dst, self.rows, sticks(self.row_bytes), self.dst_stride),
                ("dev_indirect", self.src, self.rows, self.row_bytes, self.src_stride, self.indices),
                *(("tile", term.tile) for term in self.indices))

    def scratch_modes(self):
        return ("w", "") + ("r",) * len(self.indices)

    def problem(self):
        return _index_problem(self.indices, self.rows)


@instruction("scatter", ("ls",))
@dataclass(frozen=True)
class Scatter(Instruction):
    """Scratchpad -> device memory, the mirror of Gather: row r of `src` lands at
    dst.at(idx) + r * dst_stride + the `indices` terms, rows in order (a later row to the same
    place wins). With `accumulate` each row is added to what is there, as `dtype` values
    (floats summed in fp32 and rounded once per row, as the CPU's index_put_ accumulates):
    every contribution counts, duplicates included; the device row is read and written back."""

    dst: DevAddr
    src: Addr
    rows: int
    row_bytes: int
    dst_stride: int
    src_stride: int
    indices: tuple = ()
    op: str = "scatter"
    accumulate: bool = False
    dtype: str = "fp32"
    writes_device: ClassVar[bool] = True

    def run(self, m, core, idx):
        extra = _row_offsets(m, core, idx, self.indices, self.rows, self.op).tolist()
        base, src = self.dst.at(idx), self.src.at(idx)
        dtype = DTYPES[self.dtype]
        for r, add in enumerate(extra):
            out = m.device_rows(self.dst.symbol, base + r * self.dst_stride + add, 1, self.row_bytes, 0)
            row = m.scratch_rows(core, src + r * self.src_stride, 1, self.row_bytes, 0)
            if self.accumulate:
                total = out.view(dtype).to(COMPUTE[self.dtype]) + row.view(dtype).to(COMPUTE[self.dtype])
                out.view(dtype).copy_(total)
            else:
                out.copy_(row)

    @classmethod
    def bind(cls, b, group):
        def move(i, dev_rows, sp_rows):
            if not i.accumulate:
                for out, row in zip(dev_rows, sp_rows):
                    out.copy_(row)
                return
            dtype, compute = DTYPES[i.dtype], COMPUTE[i.dtype]
            for out, row in zip(dev_rows, sp_rows):
                out.view(dtype).copy_(out.view(dtype).to(compute) + row.view(dtype).to(compute))
        return _bind_indexed(b, group, "dst", "src", move)

    def cost(self, t, core, idx):
        return t.indirect_dma(self.dst.symbol, self.dst.at(idx), self.rows, self.row_bytes, self.dst_stride,
                              self.indices, self.src.at(idx), self.src_stride, write=True,
                              read_back=self.accumulate)

    def touches(self):
        return (("sp_rows", self.src, self.rows, sticks(self.row_bytes), self.src_stride),
                ("dev_indirect", self.dst, self.rows, self.row_bytes, self.dst_stride, self.indices),
                *(("tile", term.tile) for term in self.indices))

    def scratch_modes(self):
        return ("r", "") + ("r",) * len(self.indices)

    def problem(self):
        if self.accumulate and (self.dtype not in ITEMSIZE or self.row_bytes % ITEMSIZE[self.dtype]):
            return f"an accumulating scatter of {self.row_bytes}-byte rows of {self.dtype}"
        return _index_problem(self.indices, self.rows)


# ---- sorting networks (issue 31) -------------------------------------------------------


def _first_in_order(a, ia, b, ib, descending: bool) -> torch.Tensor:
    """Whether (a, ia) comes strictly before (b, ib) in a stable sort: by value (descending or
    not), NaN greater than every number and equal to NaN, -0.0 equal to 0.0, then by index."""
    ahead = a > b if descending else a < b
    equal = a == b
    if a.is_floating_point():
        nan_a, nan_b = torch.isnan(a), torch.isnan(b)
        ahead = ahead | ((nan_a & ~nan_b) if descending else (~nan_a & nan_b))
        equal = equal | (nan_a & nan_b)
    return ahead | (equal & (ia < ib))


# Per compare-exchange, the sfp's passes over the key tile (the value compare, the equal flag, the
# exchange, and for floats the NaN flags) and over the index tile (the tie compare, the exchange):
# what the same work takes in its elementwise instructions (binary, unary isnan, select), one pass
# per stick each.
CMPX_KEY_PASSES = {"float": 4, "integer": 3}
CMPX_INDEX_PASSES = 2


@instruction("cmpx", ("sfp",))
@dataclass(frozen=True)
class CompareExchange(Instruction):
    """One step of a bitonic sorting network on every row of a tile (issue 31), values and indices together.

    Each row of `keys` is one sequence of `keys.cols` elements (a power of two), its element
    indices in the same row of `index`. For every position p whose bit `distance` is clear, the
    pairs (keys[p], index[p]) and (keys[p + distance], index[p + distance]) are put in order: the
    stable order (``descending`` or not; NaN greater than every number, ties by index, see
    _first_in_order) when bit `block` of p is clear, its reverse when it is set. The steps of
    distance block/2, ..., 1 for block = 2, 4, ..., cols sort every row; ``block = cols`` is the
    final merge (every pair in the requested order). With ``halve``, the pairs once in order are
    packed: the first of every pair, in position order, fills the row's first half and the second
    of every pair its second half. A top-k network's step (families/sort/network.py): two sorted
    runs of K in opposite orders, paired K apart, leave in the first half a bitonic run of the K
    that come first of both, and the rest of the network works on that half only.

    Why an instruction of its own: a step pairs elements `distance` apart, under a stick's lanes
    for distances below a stick, and no sfp instruction moves data across a stick's lanes (tiles
    start on sticks, rows a whole number of sticks apart); only the ls unit's transpose permutes,
    at 40 GB/s. Cost: CMPX_KEY_PASSES passes over the key tile (4 for floats, 3 for integers: no
    NaN flags) and CMPX_INDEX_PASSES over the index tile at the sfp's measured stick rate, i.e.
    what the compare, the NaN and tie flags and the two selects take as elementwise instructions (an estimate: no sorting kernel was measured);
    the pairing of lanes is taken to come with the operand read, and a halving's packing with the
    result's write, as a vector unit's permute network does."""

    keys: Tile
    index: Tile
    distance: int
    block: int
    descending: bool = False
    halve: bool = False

    def run(self, m, core, idx):
        keys, index = self._step(m.read(core, self.keys, idx), m.read(core, self.index, idx))
        m.write(core, self.keys, idx, keys)
        m.write(core, self.index, idx, index)

    def _step(self, keys, index):
        """The step over (..., cols) keys and indices (any leading dims: rows, or cores' rows)."""
        shape, cols, j = keys.shape, self.keys.cols, self.distance
        k = keys.reshape(-1, cols // (2 * j), 2, j)
        i = index.reshape(-1, cols // (2 * j), 2, j)
        lo_k, hi_k, lo_i, hi_i = k[:, :, 0], k[:, :, 1], i[:, :, 0], i[:, :, 1]
        first = torch.arange(0, cols, 2 * j, device=keys.device)  # each pair group's first position
        reverse = ((first & self.block) != 0).view(1, -1, 1)
        swap = torch.where(reverse, _first_in_order(lo_k, lo_i, hi_k, hi_i, self.descending),
                           _first_in_order(hi_k, hi_i, lo_k, lo_i, self.descending))
        # (halve: the first of every pair packed into the row's first half, the rest after it)
        at = 1 if self.halve else 2
        k = torch.stack((torch.where(swap, hi_k, lo_k), torch.where(swap, lo_k, hi_k)), dim=at)
        i = torch.stack((torch.where(swap, hi_i, lo_i), torch.where(swap, lo_i, hi_i)), dim=at)
        return k.reshape(shape), i.reshape(shape)

    @classmethod
    def bind(cls, b, group):
        # Rows are independent and the step is exact (compares and moves): every core's tile in one go.
        first = group[0][1]
        key = (first.keys.shape_key, first.index.shape_key, first.distance, first.block, first.descending,
               first.halve)
        if any((i.keys.shape_key, i.index.shape_key, i.distance, i.block, i.descending, i.halve) != key
               for _, i, _ in group):
            return None
        keys = b.tile([(c, i.keys, idx) for c, i, idx in group])
        index = b.tile([(c, i.index, idx) for c, i, idx in group])
        if keys is None or index is None:
            return None
        read_k, read_i = b.reader(keys, first.keys), b.reader(index, first.index)

        def step():
            k, i = first._step(read_k(), read_i())
            keys.copy_(k)
            index.copy_(i)
        return step

    def cost(self, t, core, idx):
        keys, index = _passes(self.keys), _passes(self.index)
        kind = "float" if DTYPES[self.keys.dtype].is_floating_point else "integer"
        return (CMPX_KEY_PASSES[kind] * t.sfp(*keys, ITEMSIZE[self.keys.dtype])
                + CMPX_INDEX_PASSES * t.sfp(*index, ITEMSIZE[self.index.dtype]))

    def touches(self):
        return (("tile", self.keys), ("tile", self.index))

    def scratch_modes(self):
        return ("rw", "rw")

    def problem(self):
        k, i = self.keys, self.index
        power = lambda n: n >= 1 and n & (n - 1) == 0  # noqa: E731
        if i.dtype not in ("int32", "int64"):
            return f"cmpx indices are int32 or int64, not {i.dtype}"
        if k.dtype == "bool":
            return "cmpx does not order bool keys"
        if (k.rows, k.cols) != (i.rows, i.cols) or k.broadcast != "none" or i.broadcast != "none":
            return f"cmpx keys [{k.rows}x{k.cols}] and indices [{i.rows}x{i.cols}] must be the same full tiles"
        if not (power(k.cols) and power(self.distance) and power(self.block)):
            return f"cmpx over {k.cols} columns at distance {self.distance}, block {self.block}: powers of two"
        if not (self.distance < k.cols and 2 * self.distance <= self.block):
            return f"cmpx distance {self.distance} (block {self.block}) does not fit rows of {k.cols}"
        return None
