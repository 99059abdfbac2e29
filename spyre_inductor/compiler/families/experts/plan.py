"""The grouped matmul's shape, its tilings and column blocks, and what its tiles need of the scratchpad.

Work is split over the cores by output columns (whole sticks): every core runs every expert's
rows over its own columns, so each expert's weights are read once in all (each core reads its
columns of them) and no core waits on another. When there are fewer column sticks than cores
(or rows enough to share), a column block's row tiles are also dealt over a few cores (row
groups): those read the block's weights once each, the timing model weighs that against the
rows (a, re-read once per column block) they share. Within a core, a tiling is (rows, cols): a row
tile of `rows` rows of one expert times that expert's [K, cols] weight tile, the weight tile
resident while the expert's row tiles stream past it.
"""

from __future__ import annotations

from dataclasses import dataclass

from spyre_runtime.hardware import HARDWARE
from spyre_runtime.program.emitter import split_evenly
from spyre_runtime.program.operands import ITEMSIZE, STICK, sticks

from ...core._dump import Describable
from ...core.allocate import Need, Placement, allocate
from ...ir.errors import Unsupported
from ...ir.kernel_ir import GroupedMatmulKernel


@dataclass(frozen=True)
class ExpertsShape(Describable):
    """Elements and element strides of the four buffers (a [S, K], w [E, K, N], offs [E], out [S, N])."""

    S: int
    K: int
    N: int
    E: int
    dtype: str          # a's and w's
    out_dtype: str
    offs_dtype: str
    a: str
    a_offset: int
    a_row: int
    w: str
    w_offset: int
    w_expert: int
    w_k: int
    w_n: int
    offs: str
    offs_offset: int
    offs_stride: int
    out: str
    out_offset: int
    out_row: int

    @property
    def transposed(self) -> bool:
        """w's k is its contiguous dim (``weight.transpose(-2, -1)`` of an [E, N, K] parameter):
        its tiles move as [cols, K] and are transposed on chip."""
        return self.w_n != 1

    @property
    def granule(self) -> int:
        """Output columns per stick of the narrower of w and out: the unit columns are split in."""
        return STICK // max(ITEMSIZE[self.dtype], ITEMSIZE[self.out_dtype])


def analyse(kernel: GroupedMatmulKernel) -> ExpertsShape:
    a, w, offs, out = kernel.a, kernel.w, kernel.offs, kernel.out
    S, K, N, E = kernel.dims
    if a.strides[1] != 1 and K > 1:
        raise Unsupported(f"kernel {kernel.name!r}: a's rows are not contiguous (strides {a.strides})")
    if out.strides[1] != 1 and N > 1:
        raise Unsupported(f"kernel {kernel.name!r}: out's rows are not contiguous (strides {out.strides})")
    if w.strides[2] != 1 and w.strides[1] != 1:
        raise Unsupported(f"kernel {kernel.name!r}: w {w.strides} has neither k nor n contiguous")
    if min(S, K, N, E) < 1:
        raise Unsupported(f"kernel {kernel.name!r}: an empty grouped matmul {kernel.dims}")
    return ExpertsShape(S, K, N, E, a.dtype, out.dtype, offs.dtype, a.name, a.offset, a.strides[0], w.name,
                        w.offset, w.strides[0], w.strides[1], w.strides[2] if N > 1 else 1, offs.name, offs.offset,
                        offs.strides[0], out.name, out.offset, out.strides[0])


@dataclass(frozen=True)
class ExpertsTiling(Describable):
    rows: int   # rows of one row tile
    cols: int   # columns of one weight tile (the widest a core's block has)
    tiles: int  # row tiles per expert at most (every row in one expert): ceil(S / rows)
    k: int = 0  # rows of a weight chunk: 0 keeps [K, cols] resident per expert; fewer than K
    #             streams [k, cols] chunks per row tile (a K too long to keep a tile resident)

    @property
    def label(self) -> str:
        return f"{self.rows} rows x {self.cols} columns" + (f", weights streamed in {self.k}-row chunks"
                                                            if self.k else "")


@dataclass(frozen=True)
class CoreBlock(Describable):
    """A core's share: output columns [n0, n0 + n) of every expert's row tiles t with
    t % row_groups == row_group (row tiles dealt round-robin, so the first group has the most)."""

    core: int
    n0: int
    n: int
    row_group: int = 0
    row_groups: int = 1


def core_blocks(shape: ExpertsShape, cores: int, row_groups: int = 1) -> tuple[CoreBlock, ...]:
    """The output columns in whole sticks over cores // row_groups column blocks (the first the
    widest), each block's row tiles dealt over `row_groups` cores."""
    g = shape.granule
    units = -(-shape.N // g)
    out = []
    for b, (u0, n) in enumerate(split_evenly(units, min(max(1, cores // row_groups), units))):
        n0 = u0 * g
        for r in range(row_groups):
            out.append(CoreBlock(len(out), n0, min(n * g, shape.N - n0), r, row_groups))
    return tuple(out)


ROW_GROUPS = (1, 2, 4, 8)


ROW_TARGETS = (128, 64, 32, 16, 8)
COL_TARGETS = (256, 128, 64)


def variants(shape: ExpertsShape, block: int) -> list[ExpertsTiling]:
    """The (rows, cols) tilings of a core's block of `block` columns, each clipped to the kernel.

    A row tile holds at most the rows an expert has when the routing is even (S / E, in passes of
    8 rows): a larger one would run mostly its expert's last row again, and the timing walk, which
    takes every count at its maximum (all rows in one expert), would not see that."""
    g, out = shape.granule, []
    even = max(8, -(-shape.S // shape.E // 8) * 8)
    for r in ([r for r in ROW_TARGETS if r <= even] or [min(ROW_TARGETS)])[:2]:  # (smaller: more to time)
        for c in COL_TARGETS:
            rows, cols = min(r, shape.S), min(block, max(g, c // g * g))
            t = ExpertsTiling(rows, cols, -(-shape.S // rows))
            if t not in out:
                out.append(t)
    return out


K_CHUNKS = (1024, 512, 256)


def streamed_variants(shape: ExpertsShape, block: int) -> list[ExpertsTiling]:
    """variants() with the weights streamed in k chunks (whole sticks of k), tried when no
    resident weight tile fits: a row tile of fewer rows, since it holds all of K."""
    per_stick = STICK // ITEMSIZE[shape.dtype]
    out = []
    for t in variants(shape, block):
        for k in K_CHUNKS:
            if k < shape.K and k % per_stick == 0:
                for rows in dict.fromkeys((t.rows, min(t.rows, 16))):
                    v = ExpertsTiling(rows, t.cols, -(-shape.S // rows), k)
                    if v not in out:
                        out.append(v)
    return out


def needs(shape: ExpertsShape, t: ExpertsTiling) -> list[Need]:
    """Every tile for the whole program: the weight tile, the row tiles, the accumulators, the
    outputs and the row indices double-buffered; the per-expert row ranges and the loop-count words
    one element per stick (a count word is a [1, 1] tile of its own)."""
    isz, osz = ITEMSIZE[shape.dtype], ITEMSIZE[shape.out_dtype]
    w_row = sticks(t.cols * isz)
    a_row = sticks(shape.K * isz)
    k = t.k or shape.K
    out = [Need("w", k * w_row, w_row, 2)]
    if shape.transposed:
        out.append(Need("w_rows", t.cols * sticks(k * isz), sticks(k * isz)))
    out += [Need("a", t.rows * a_row, a_row, 2),
            Need("acc", t.rows * sticks(t.cols * 4), sticks(t.cols * 4), 2),
            Need("o", t.rows * sticks(t.cols * osz), sticks(t.cols * osz), 2),
            Need("index", sticks(t.rows * 4), STICK, 2),  # (a packed int32 column: codegen.index)
            Need("zero", t.rows * sticks(t.cols * osz), sticks(t.cols * osz)),
            Need("offs_in", shape.E * STICK, STICK)]
    for column in ("ends", "starts", "rows_of", "last"):  # per expert, then the rows past offs[-1]
        out.append(Need(column, (shape.E + 1) * STICK, STICK))
    out += [Need("one", STICK, STICK), Need("tile_start", t.tiles * STICK, STICK),
            Need("run", (shape.E + 1) * t.tiles * STICK, STICK)]
    return out


def place(shape: ExpertsShape, t: ExpertsTiling) -> Placement | None:
    p = allocate(needs(shape, t), HARDWARE.scratchpad_usable_bytes)
    return p if p.fits else None


__all__ = ["CoreBlock", "ROW_GROUPS", "ExpertsShape", "ExpertsTiling", "analyse", "core_blocks", "needs", "place",
           "streamed_variants",
           "variants"]
