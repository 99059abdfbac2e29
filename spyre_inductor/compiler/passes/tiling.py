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

    @property
    def tile_extent(self) -> int:
        """Elements of the stream dim one tile covers."""
        return self.tile_cols if self.stream_dim == self.stick_dim else self.tile_rows

    def with_extent(self, extent: int) -> "TilePlan":
        if self.stream_dim == self.stick_dim:
            return replace(self, tile_cols=extent)
        return replace(self, tile_rows=extent)

    def with_buffers(self, buffers: int) -> "TilePlan":
        return replace(self, buffers=buffers)

    def shrunk(self) -> "TilePlan | None":
        """A smaller tile (half the rows, else half the chunk), or None at one stick."""
        if self.tile_rows > 1:
            return replace(self, tile_rows=self.tile_rows // 2)
        if self.stick_dim is not None and self.tile_cols > self.granule:
            sticks = -(-self.tile_cols // self.granule)
            return replace(self, tile_cols=max(1, sticks // 2) * self.granule)
        return None


def plan_tiling(layout: LayoutPlan, tile_kernel: TileKernel, target_bytes: int = TARGET_BYTES,
                buffers: int = BUFFERS) -> TilePlan:
    ranges = layout.ranges
    sizes = [ITEMSIZE[t.dtype] for t in tile_kernel.tiles] or [4]
    granule = STICK // min(sizes)
    widest = max([ITEMSIZE[t.dtype] for t in tile_kernel.tiles if streamed(t)] or sizes)
    sd, rd = layout.stick_dim, layout.row_dim
    if sd is None:
        rows = min(ranges[rd], max(1, target_bytes // STICK))
        return TilePlan(ranges, None, rd, rd, rows, 1, _others(ranges, rd), granule, buffers)
    chunk = max(granule, target_bytes // widest // granule * granule)
    if ranges[sd] > chunk:
        return TilePlan(ranges, sd, rd, sd, 1, chunk, _others(ranges, sd), granule, buffers)
    cols = ranges[sd]
    if rd is None:
        return TilePlan(ranges, sd, None, sd, 1, cols, _others(ranges, sd), granule, buffers)
    row_bytes = sticks(cols * widest)
    rows = min(ranges[rd], max(1, target_bytes // row_bytes))
    return TilePlan(ranges, sd, rd, rd, rows, cols, _others(ranges, sd, rd), granule, buffers)


def _others(ranges, *exclude) -> tuple[int, ...]:
    return tuple(d for d in range(len(ranges)) if d not in exclude)
