"""Tiling: the shape of one tile of the iteration space, and which dim the pipeline streams.

A tile is ``tile_rows x tile_cols`` elements: columns along the layout's
stick dim (contiguous in device memory for every non-broadcast access, so a
tile row is one row load), rows along its row dim (a strided row load: any
non-negative device stride, e.g. a sliced input). The load/store unit
streams tiles along ``stream_dim`` through two buffers while the sfp
computes (emit.py); every other dim is a plain loop around that stream.

* The stick dim fits in one tile row (the common case): a tile is whole
  rows, ``tile_cols`` = its extent, and the stream walks the row dim.
* It does not: the stream walks the stick dim in chunks of ``tile_cols``
  elements, a whole number of sticks of every dtype in the kernel so chunk
  boundaries stay stick-aligned; one row per tile.
* "elements" layout (no stick dim): one element per stick, ``tile_cols`` 1.

In the ``transposed`` relayout (layout.py) a transposed access moves a tile
as ``tile_cols`` rows of ``tile_rows`` elements each, so a tile's rows are
a whole number of sticks of every transposed access (``row_granule``
elements) or the whole row dim: whole-row tiles round their rows down to
it, and when the stick dim does not fit a tile row the tile is a block of
``row_granule`` rows times a chunk of the stick dim: the stream walks the
chunks and the row dim is a loop in blocks of ``tile_rows``
(``row_block``), the last block of a share possibly shorter. A block is
one or more sticks of rows (ROW_STICKS, a plan variant: a block as tall as
a core's share streams once, without a second pipeline fill and drain).

Each streamed tile (fusion.streamed: loaded or stored) has ``buffers``
copies in scratchpad: the load/store unit fills one while the sfp computes
on another. With three, the store of tile t and the load of tile t + 2 are
in flight together (reads and writes interleave on the bus: the streaming
plan of the calibration kernels, spyre_runtime.program.emitter.pipeline);
with two, the load of tile t + 2 waits for the store of tile t, so with
every core in step the bus sees read phases and write phases (the
pure-stream rate), at the price of less overlap on one core. The backend
plans both (BUFFER_CHOICES) and keeps the faster.

The tile is sized by a target of bytes per streamed operand per tile.
Which target is best depends on the kernel and the core count (small tiles
overlap load, compute and store sooner; large ones keep more of the bus in
one direction at a time), so the backend plans each of TARGETS and keeps the
one the timing model says is fastest (32 KiB is the chunk the calibration
kernels use). scratchpad.py shrinks the tile if the kernel's tiles do not fit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from spyre_runtime.program.operands import ITEMSIZE, STICK, sticks

from ._dump import Describable
from .fusion import streamed
from .layout import LayoutPlan
from .tiles import TileKernel

TARGET_BYTES = 32 * 1024
TARGETS = (32 * 1024, 128 * 1024)
BUFFERS = 3
BUFFER_CHOICES = (3, 2)
ROW_STICKS = (1, 2)  # rows of a block of the transposed relayout, in sticks of its transposed accesses


@dataclass(frozen=True)
class TilePlan(Describable):
    ranges: tuple[int, ...]
    stick_dim: int | None
    row_dim: int | None
    stream_dim: int
    tile_rows: int   # extent along row_dim (1 when the row dim is a loop)
    tile_cols: int   # extent along stick_dim (1 in elements layout)
    loop_dims: tuple[int, ...]
    granule: int     # elements per stick of the narrowest dtype: chunk and core boundaries
    buffers: int = BUFFERS  # copies of each streamed tile: the stream's depth
    row_granule: int = 1    # rows a tile has a multiple of (transposed accesses' elements per stick)

    @property
    def row_block(self) -> int:
        """Rows of the row dim one step of its loop covers (1: a plain loop, or not a loop)."""
        return self.tile_rows if self.stream_dim != self.row_dim and self.row_dim is not None else 1

    @property
    def row_unit(self) -> int:
        """The unit a share of the row dim is a multiple of (division.py): whole blocks when it
        is a blocked loop, whole sticks of the transposed accesses when it is streamed."""
        return self.row_block if self.row_block > 1 else self.row_granule

    @property
    def tile_extent(self) -> int:
        """Elements of the stream dim one tile covers (1 when the stream walks a third dim)."""
        if self.stream_dim == self.stick_dim:
            return self.tile_cols
        return self.tile_rows if self.stream_dim == self.row_dim else 1

    def with_extent(self, extent: int) -> "TilePlan":
        if self.stream_dim == self.stick_dim:
            return replace(self, tile_cols=extent)
        if self.stream_dim != self.row_dim:
            return self
        return replace(self, tile_rows=extent)

    def with_buffers(self, buffers: int) -> "TilePlan":
        return replace(self, buffers=buffers)

    def shrunk(self) -> "TilePlan | None":
        """A smaller tile (half the rows, else half the chunk), or None at one stick. Rows stay
        a multiple of row_granule: below it a transposed move would split sticks."""
        if self.tile_rows > self.row_granule:
            return replace(self, tile_rows=max(self.row_granule, self.tile_rows // 2 // self.row_granule
                                               * self.row_granule))
        if self.stick_dim is not None and self.tile_cols > self.granule:
            sticks = -(-self.tile_cols // self.granule)
            return replace(self, tile_cols=max(1, sticks // 2) * self.granule)
        return None


def plan_tiling(layout: LayoutPlan, tile_kernel: TileKernel, target_bytes: int = TARGET_BYTES,
                buffers: int = BUFFERS, row_sticks: int = 1) -> TilePlan:
    """The tile shape for a target of bytes per streamed tile; `row_sticks`: a block of rows
    (transposed relayout, stick dim in chunks) is that many sticks of the transposed accesses."""
    ranges = layout.ranges
    sizes = [ITEMSIZE[t.dtype] for t in tile_kernel.tiles] or [4]
    granule = STICK // min(sizes)
    widest = max([ITEMSIZE[t.dtype] for t in tile_kernel.tiles if streamed(t)] or sizes)
    sd, rd = layout.stick_dim, layout.row_dim
    if sd is None:
        rows = min(ranges[rd], max(1, target_bytes // STICK))
        return TilePlan(ranges, None, rd, rd, rows, 1, _others(ranges, rd), granule, buffers)
    moved = [ITEMSIZE[a.dtype] for a in layout.accesses() if a.transposed]
    # whole sticks of every transposed access, or the whole row dim when it is shorter
    row_granule = min(ranges[rd], STICK // min(moved)) if moved else 1
    block = min(ranges[rd], row_granule * row_sticks) if moved else 1
    if not moved and rd is not None and ranges[sd] * widest > target_bytes and _broadcast_over(layout, rd):
        # the stick dim is chunked and an operand is broadcast over the rows (a table over heads
        # whose rows merged with its columns): blocks of rows share each chunk of it, instead of
        # one row per tile loading the chunk again for every row
        block = min(ranges[rd], BROADCAST_BLOCK)
    chunk = max(granule, target_bytes // widest // block // granule * granule)
    if ranges[sd] > chunk:
        return TilePlan(ranges, sd, rd, sd, block, chunk, _others(ranges, sd), granule, buffers, row_granule)
    cols = ranges[sd]
    if rd is None:
        return TilePlan(ranges, sd, None, sd, 1, cols, _others(ranges, sd), granule, buffers)
    row_bytes = sticks(cols * widest)
    rows = min(ranges[rd], max(row_granule, target_bytes // row_bytes // row_granule * row_granule))
    loops = [d for d in _others(ranges, sd, rd) if ranges[d] > 1]
    if rows == ranges[rd] and loops:
        # Every row fits one tile, so a stream along the row dim would be one tile long, with
        # nothing to overlap, once per step of the loops around it: stream along the longest
        # loop instead, one tile of all the rows per step (a rotary table broadcast over heads,
        # with the rows along the heads).
        dim = max(loops, key=lambda d: (ranges[d], d))
        return TilePlan(ranges, sd, rd, dim, rows, cols, _others(ranges, sd, dim), granule, buffers, row_granule)
    return TilePlan(ranges, sd, rd, rd, rows, cols, _others(ranges, sd, rd), granule, buffers, row_granule)


BROADCAST_BLOCK = 32  # rows that share one load of a row-broadcast operand's chunk


def _broadcast_over(layout: LayoutPlan, rd: int) -> bool:
    accesses = layout.accesses()
    return any(a.strides[rd] == 0 for a in accesses) and any(a.strides[rd] != 0 for a in accesses)


def _others(ranges, *exclude) -> tuple[int, ...]:
    return tuple(d for d in range(len(ranges)) if d not in exclude)
