"""Operands of Spyre instructions: where data lives and how it is laid out.

Every address is affine in the enclosing loop counters of its unit: the
effective address is ``base + sum(steps[k] * i_k)``, with ``i_k`` the
counter of the k-th enclosing loop (outermost first). That keeps programs
small for big tensors: one instruction in a loop walks a whole tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DTYPES = {
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp32": torch.float32,
    "int32": torch.int32,
    "int8": torch.int8,
    "bool": torch.bool,
    # Added for reductions (issue 8): argmax/argmin results are int64 in PyTorch. Pointwise work
    # (issue 9) computes int64 in int64, so int64 values stay exact.
    "int64": torch.int64,
    # Added for issue 16: Inductor computes some index values in them (eye's iota is uint8), and
    # they are tensor dtypes users have.
    "uint8": torch.uint8,
    "int16": torch.int16,
}
# The arithmetic type of each dtype: the special-function pipeline computes
# floats in fp32, int64 in int64 and the narrower integers in int32; results are rounded (to nearest even)
# or wrapped when stored in the destination dtype.
COMPUTE = {
    "fp16": torch.float32,
    "bf16": torch.float32,
    "fp32": torch.float32,
    "int32": torch.int32,
    "int8": torch.int32,
    "bool": torch.bool,
    "int64": torch.int64,
    "uint8": torch.int32,
    "int16": torch.int32,
}
ITEMSIZE = {name: torch.empty(0, dtype=dt).element_size() for name, dt in DTYPES.items()}
STICK = 128


def sticks(nbytes: int) -> int:
    """nbytes rounded up to whole sticks: what a row of that many bytes occupies and moves."""
    return -(-nbytes // STICK) * STICK


def _affine(base: int, steps: tuple[int, ...], idx: tuple[int, ...]) -> int:
    return base + sum(s * i for s, i in zip(steps, idx))


def _extent(base: int, steps: tuple[int, ...], counts: tuple[int, ...]) -> tuple[int, int]:
    """Lowest and highest value of an affine address over all loop iterations."""
    lo = hi = base
    for s, n in zip(steps, counts):
        span = s * (max(n, 1) - 1)
        lo += min(0, span)
        hi += max(0, span)
    return lo, hi


@dataclass(frozen=True)
class Addr:
    """A byte address in the core's scratchpad."""

    base: int
    steps: tuple[int, ...] = ()

    def at(self, idx: tuple[int, ...]) -> int:
        return _affine(self.base, self.steps, idx)

    def extent(self, counts: tuple[int, ...]) -> tuple[int, int]:
        return _extent(self.base, self.steps, counts)


@dataclass(frozen=True)
class DevAddr:
    """A byte offset into a device buffer named by a symbol of the program."""

    symbol: str
    offset: int = 0
    steps: tuple[int, ...] = ()

    def at(self, idx: tuple[int, ...]) -> int:
        return _affine(self.offset, self.steps, idx)

    def extent(self, counts: tuple[int, ...]) -> tuple[int, int]:
        return _extent(self.offset, self.steps, counts)


BROADCASTS = ("none", "rows", "cols", "scalar")


@dataclass(frozen=True)
class Tile:
    """A rows x cols tile of `dtype` in scratchpad, rows `row_stride` bytes apart.

    broadcast: "rows" stores one row used for every row, "cols" one column
    used for every column, "scalar" one element used everywhere.
    """

    addr: Addr
    dtype: str
    rows: int
    cols: int
    row_stride: int
    broadcast: str = "none"

    @property
    def stored_shape(self) -> tuple[int, int]:
        return {
            "none": (self.rows, self.cols),
            "rows": (1, self.cols),
            "cols": (self.rows, 1),
            "scalar": (1, 1),
        }[self.broadcast]

    @property
    def packed(self) -> bool:
        """A packed column (issue 31): rows of one element each, stored adjacent (row stride =
        the element's size), so a column of per-row values takes its bytes, not a stick per row.
        Its first element is on a stick like any tile's."""
        return self.stored_shape[1] == 1 and self.stored_shape[0] > 1 and self.row_stride == ITEMSIZE[self.dtype]

    @property
    def shape_key(self) -> tuple:
        """Everything about the tile but where it is: tiles with equal keys are the same view, moved."""
        return (self.dtype, self.rows, self.cols, self.row_stride, self.broadcast)

    def byte_extent(self, counts: tuple[int, ...]) -> tuple[int, int]:
        """[lo, hi) bytes of scratchpad the tile touches over all iterations."""
        rows, cols = self.stored_shape
        lo, hi = self.addr.extent(counts)
        return lo, hi + (rows - 1) * self.row_stride + cols * ITEMSIZE[self.dtype]


@dataclass(frozen=True)
class RowIndex:
    """One data-dependent term of a gather's or scatter's row addresses (issue 16): row r
    moves at ``stride * index[r]`` bytes further, index[r] read from the integer column
    `tile` (rows x 1) in scratchpad, wrapped by +bound when negative and `wrap_neg`, and
    checked to be in [0, bound) before any byte moves."""

    tile: Tile
    stride: int  # bytes per unit of the index
    bound: int
    wrap_neg: bool = True

    def reach(self) -> tuple[int, int]:
        """Lowest and highest byte offset this term can add (the bound's, never the data's)."""
        span = self.stride * (max(self.bound, 1) - 1)
        return min(0, span), max(0, span)


@dataclass(frozen=True)
class SizeExpr:
    """A size known only at launch (issue 18): ``clamp((coef * size + const) // div, lo, hi)``,
    `size` the value of the program's size symbol `symbol`, read from the correction area.

    `hi` is a static maximum: whatever the launch writes, the value never exceeds it, so the
    validator proves bounds once, at `hi`, for every size. A program's symbolic sizes are a
    buffer's symbolic dim (Symbol.dims) and a loop's trip count (isa.Loop)."""

    symbol: str
    hi: int
    coef: int = 1
    const: int = 0
    div: int = 1
    lo: int = 0

    def value(self, sizes) -> int:
        v = (self.coef * int(sizes[self.symbol]) + self.const) // self.div
        return min(max(v, self.lo), self.hi)

    def problem(self) -> str | None:
        if self.div < 1:
            return f"size expression {self} divides by {self.div}"
        if self.lo < 0 or self.hi < self.lo:
            return f"size expression {self} has bounds [{self.lo}, {self.hi}]"
        return None

    def __str__(self) -> str:
        e = self.symbol if self.coef == 1 else f"{self.coef}*{self.symbol}"
        if self.const:
            e += f"{self.const:+d}"
        if self.div != 1:
            e = f"({e})//{self.div}"
        return f"clamp({e}, {self.lo}, {self.hi})"


@dataclass(frozen=True)
class ScratchCount:
    """A loop count computed on chip (issue 31): the integer in the one-element `tile` of the
    unit's core's scratchpad when the loop starts, clamped to [0, hi]. How a program skips work
    its data rules out (attention's key chunks past every row's position): a count of 0 skips
    the body. A walk without data (the schedule, the planner's estimates, the checks) runs it at
    `hi`; a program with one runs on the general interpreter, timed as it goes."""

    tile: Tile
    hi: int

    def value(self, read) -> int:
        return min(max(int(read(self.tile)), 0), self.hi)


def count_at(n, sizes, read=None) -> int:
    """A count that may be a SizeExpr, at `sizes` (None: its static maximum), or a ScratchCount
    read by `read(tile)` (None: its static maximum)."""
    if isinstance(n, SizeExpr):
        return n.hi if sizes is None else n.value(sizes)
    if isinstance(n, ScratchCount):
        return n.hi if read is None else n.value(read)
    return n


def clipped_rows(offset: int, rows: int, row_bytes: int, stride: int, limit: int) -> list[tuple[int, int, int]]:
    """The parts of a device transfer of `rows` rows inside bytes [0, limit) of its buffer, as
    (first row, row count, valid bytes per row) runs: whole rows first, then the partial rows
    at the end (a buffer whose symbolic dim is its outermost: its valid bytes are a prefix)."""
    if rows <= 0 or row_bytes <= 0:
        return []
    if stride <= 0:
        valid = min(max(limit - offset, 0), row_bytes)
        return [(0, rows, valid)] if valid else []
    whole = min(max((limit - offset - row_bytes) // stride + 1, 0), rows)
    runs = [(0, whole, row_bytes)] if whole else []
    r = whole
    while r < rows:
        valid = min(limit - (offset + r * stride), row_bytes)
        if valid <= 0:
            break
        runs.append((r, 1, valid))
        r += 1
    return runs
