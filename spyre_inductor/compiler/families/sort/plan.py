"""The sort family's plan: the problem's shape, the scratchpad a chunk of rows needs, and the tilings.

Each core takes a contiguous share of the rows (row-major: a share is one span of the source
and of each output) and streams it in **chunks** of ``rows`` rows through two buffers: the ls unit
loads chunk t + 1 while the sfp runs the network over chunk t. A chunk's rows sit in the
scratchpad as a key tile [rows, N] (the source's dtype, N the padded row length) and an index
tile [rows, N] (int32: half the sticks of int64 through every step; cast to the int64 output's
[rows, k] tile once the network is done). Elements past n (a row length that is not a
power of two) are set to the **pad**, the value that comes last in the requested order (NaN
ascending, -inf descending; an integer dtype's maximum or minimum): with their indices past n
they sort after every element of the row, so the first k are the row's own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from spyre_runtime.hardware import HARDWARE
from spyre_runtime.program.operands import ITEMSIZE, STICK, sticks

from ...core._dump import Describable
from ...core.allocate import Need, Placement, allocate
from ...ir.errors import Unsupported
from ...ir.kernel_ir import TORCH_DTYPES, SortKernel
from .network import NetworkStep, network, padded

KEY_DTYPES = ("fp32", "fp16", "bf16", "int64", "int32", "int16", "int8", "uint8")
INDEX_DTYPE = "int64"    # the indices output's
NETWORK_INDEX = "int32"  # the indices the network moves: half int64's sticks (rows are < 2**31 long)
SPLITS = (1, 2, 4)  # a core's rows in at least this many chunks (more chunks: loads overlap the network)
BUFFERS = 2


@dataclass(frozen=True)
class Rows(Describable):
    """One buffer's rows: element (r, c) at offset + r * stride + c."""

    buffer: str
    dtype: str
    stride: int
    offset: int

    def byte(self, row) -> object:
        """The byte offset of row `row` (an int or an emitter.Aff)."""
        return row * (self.stride * ITEMSIZE[self.dtype]) + self.offset * ITEMSIZE[self.dtype]

    @property
    def row_bytes_stride(self) -> int:
        return self.stride * ITEMSIZE[self.dtype]


@dataclass(frozen=True)
class SortShape(Describable):
    R: int             # rows
    n: int             # elements per row
    N: int             # the network's row length (n padded to a power of two)
    k: int             # the first k of each sorted row are stored
    dtype: str         # the keys' (the source's and the values')
    descending: bool
    source: Rows
    values: Rows
    indices: Rows

    @property
    def pad(self) -> float | int | None:
        """The value elements past n take (None: no padding)."""
        if self.N == self.n:
            return None
        torch_dtype = TORCH_DTYPES[self.dtype]
        if torch_dtype.is_floating_point:
            return float("-inf") if self.descending else float("nan")
        info = torch.iinfo(torch_dtype)
        return info.min if self.descending else info.max

    @property
    def steps(self) -> tuple[NetworkStep, ...]:
        """The network: a sort of the row, or a top-k one when k is well under N (network.py)."""
        return network(self.N, self.k)

    @property
    def key_stride(self) -> int:
        """Bytes between a chunk's rows in the key tile (whole sticks)."""
        return sticks(self.N * ITEMSIZE[self.dtype])

    @property
    def index_stride(self) -> int:
        return sticks(self.N * ITEMSIZE[NETWORK_INDEX])

    @property
    def out_stride(self) -> int:
        """Bytes between a chunk's rows in the int64 indices tile (the first k, cast)."""
        return sticks(self.k * ITEMSIZE[INDEX_DTYPE])


def analyse(kernel: SortKernel) -> SortShape:
    where = f"sort kernel {kernel.name!r}"
    try:
        kernel.check()
    except ValueError as e:
        raise Unsupported(str(e)) from e
    if kernel.symbolic is not None and any(d != 0 for _, d, _, _, _ in kernel.symbolic.buffers):
        raise Unsupported(f"{where}: a symbolic row length (the network is planned for its length)")
    if kernel.source.dtype not in KEY_DTYPES:
        raise Unsupported(f"{where}: keys of {kernel.source.dtype} (the network orders {', '.join(KEY_DTYPES)})")
    if min(kernel.rows, kernel.n, kernel.k) == 0:
        raise Unsupported(f"{where}: nothing to sort ({kernel.rows} rows of {kernel.n}, first {kernel.k})")
    rows = tuple(Rows(b.name, b.dtype, b.strides[0], b.offset) for b in kernel.buffers)
    return SortShape(kernel.rows, kernel.n, padded(kernel.n), kernel.k, kernel.source.dtype, kernel.descending,
                     *rows)


@dataclass(frozen=True)
class Tiling(Describable):
    """A chunk of `rows` rows per buffer; `split`: the variant (a core's rows in >= split chunks)."""

    rows: int
    split: int
    label: str


def fixed_bytes(shape: SortShape) -> int:
    """What a core keeps whatever the chunk: the pad's column mask and scalars (only when padded)."""
    if shape.pad is None:
        return 0
    return sticks(shape.N) + sticks(shape.N * 4) + 2 * STICK


def chunk_bytes(shape: SortShape, rows: int) -> int:
    return rows * (shape.key_stride + shape.index_stride + shape.out_stride)


def most_rows(shape: SortShape) -> int:
    """The most rows a chunk can hold (both buffers and the fixed tiles in the scratchpad)."""
    free = HARDWARE.scratchpad_usable_bytes - fixed_bytes(shape)
    return max(0, free // (BUFFERS * chunk_bytes(shape, 1)))


def tiling(shape: SortShape, per_core: int, split: int) -> Tiling:
    fit = most_rows(shape)
    if fit < 1:
        raise Unsupported(f"a row of {shape.N} {shape.dtype} keys and their indices does not fit the scratchpad "
                          f"twice ({BUFFERS * chunk_bytes(shape, 1)} B)")
    rows = max(1, min(fit, math.ceil(per_core / split)))
    return Tiling(rows, split, f"chunks of {rows} row(s)")


def placement(shape: SortShape, t: Tiling) -> Placement:
    needs = [Need("keys", t.rows * shape.key_stride, shape.key_stride, BUFFERS),
             Need("index", t.rows * shape.index_stride, shape.index_stride, BUFFERS),
             Need("indices", t.rows * shape.out_stride, shape.out_stride, BUFFERS)]
    if shape.pad is not None:
        needs += [Need("columns", sticks(shape.N * 4), sticks(shape.N * 4)),
                  Need("valid", sticks(shape.N), sticks(shape.N)), Need("length", STICK, STICK),
                  Need("pad", STICK, STICK)]
    place = allocate(needs, HARDWARE.scratchpad_usable_bytes)
    if not place.fits:
        raise Unsupported(f"{t.label}: needs {place.high_water} B of scratchpad")
    return place


__all__ = ["BUFFERS", "INDEX_DTYPE", "NETWORK_INDEX", "Rows", "SPLITS", "SortShape", "Tiling", "analyse", "placement",
           "tiling"]
