"""Matmul planning: tile shape, operand slots and the division of the output over cores.

A core owns a block of the output (batches x rows x columns) and walks it in
output tiles of ``tm x tn``; each output tile is ``K / tk`` k-steps, one PE
matmul of an A tile [tm, tk] by a B tile [tk, tn] into an fp32 accumulator.

Operand tiles live in **slots**: each operand has a pool of them, and a
tile already in a slot is not moved again. The schedule of the whole core
is known before emission, so eviction is optimal (the slot whose tile is
needed again farthest in the future, then the least recently used): a pool
as large as the operand's distinct tiles keeps it resident (each byte read
once per core: weights stationary), two slots double-buffer a stream.
The re-fetch factor (bytes read from device memory over the kernel's
minimum) follows from the pools and the division, and the timing model
chooses among them.

Division: the output's batches, rows and columns are split into a grid of
``gb x gm x gn`` blocks, one per core. Columns split in whole sticks of the
output dtype, so no two cores store into one stick. A block's operands are
read once per block, so a grid reads A ``gn`` times and B ``gm`` times: for
each core count the grid that moves the fewest bytes is the candidate, and
the timing model picks the count (core/search.py).

Split k (a decode projection: few rows, so the output has too few blocks for
every core): each block's k range is split further into ``gk`` slices of
whole sticks of the operands, on ``gk`` consecutive cores; each computes the
fp32 partial sum of its slice and the partials are combined along the ring
(core/combine.py: the tile kernel's Combine), the last core of the chain
running the epilogue once on the whole sum, so the output is rounded once.
A split block is one output tile (its accumulator is what travels).

A tiles may span several k-steps (MatmulTiling.a_tk, whole k-steps, each step's columns on a
stick of the tile): the pe reads each step's columns of the A tile it was filled into.
"""

from __future__ import annotations

from dataclasses import dataclass

from spyre_runtime.hardware import HARDWARE
from spyre_runtime.program.emitter import split_evenly
from spyre_runtime.program.operands import ITEMSIZE, STICK

from ...core._dump import Describable
from ...core.allocate import Need, Placement, allocate
from ...core.division import CoreShare
from .lowering import MatmulShape
from ...core.tiles import Role, TileKernel, live_ranges, tile_geometry
from ...ir.errors import PlanError

PE_ROWS = 64  # rows per core from which the PE arrays run at full fill efficiency (8 rows x 8 passes)
SPLIT_K_ROWS = 64  # matmuls with at most this many rows (per batch) try plans that split k over cores


@dataclass(frozen=True)
class MatmulTiling(Describable):
    tm: int
    tn: int
    tk: int
    a_slots: int
    b_slots: int
    label: str
    order: str = "output"      # "output": each output tile's k-steps in turn; "k-outer": every
                               # output tile of the block advances one k chunk at a time (their
                               # accumulators all resident), so each operand tile is used in one go
    acc_copies: int = 2
    share: str | None = None   # "a" / "b": that operand is all-gathered over the ring, read once
    k_split: int = 1           # k slices per output block (plan.make_grid's gk): partials combined on the ring
    a_tk: int = 0              # k of an A tile if not tk (a whole number of k-steps): A is filled in fewer,
                               # larger tiles than the pe's k-steps, each used by several of them

    @property
    def tka(self) -> int:
        return self.a_tk or self.tk


@dataclass(frozen=True)
class Grid(Describable):
    gb: int
    gm: int
    gn: int
    blocks: tuple[CoreShare, ...]  # one core's block over (flat batch index, m, n, k)
    gk: int = 1                    # k slices per output block, on consecutive cores (a combine chain)
    ring: int = 0                  # a shared operand's chain: this many consecutive cores share its tiles
                                   # (0: all of them)

    @property
    def cores(self) -> int:
        return len(self.blocks)


def n_granule(shape: MatmulShape) -> int:
    return STICK // ITEMSIZE[shape.out_dtype]


def k_granule(shape: MatmulShape) -> int:
    """k elements per slice unit of a split: a whole stick of either operand's dtype, so no two
    cores read one stick of A (whose rows run along k) or of a transposed B."""
    return max(STICK // ITEMSIZE[shape.a.dtype], STICK // ITEMSIZE[shape.b.dtype])


def grids(shape: MatmulShape, cores: int) -> list[Grid]:
    """Every grid of at most `cores` blocks that uses all of them it can."""
    g = n_granule(shape)
    n_units = -(-shape.N // g)
    out = []
    for gb in range(1, min(shape.batches, cores) + 1):
        for gn in range(1, min(n_units, cores // gb) + 1):
            gm = min(shape.M, cores // (gb * gn))
            if gm < 1:
                continue
            out.append(make_grid(shape, gb, gm, gn))
    best = max(o.cores for o in out)
    return [o for o in out if o.cores == best]


def make_grid(shape: MatmulShape, gb: int, gm: int, gn: int, gk: int = 1) -> Grid:
    g, kg = n_granule(shape), k_granule(shape)
    n_units, k_units = -(-shape.N // g), -(-shape.K // kg)
    if gk > 1 and gk > k_units:
        raise PlanError(f"matmul grid: {gk} k slices of a k of {shape.K} ({k_units} units of {kg})")
    k_slices = ([(0, shape.K)] if gk == 1 else
                [(k0 * kg, min(kn * kg, shape.K - k0 * kg)) for k0, kn in split_evenly(k_units, gk)])
    blocks = []
    for b0, bc in split_evenly(shape.batches, gb):
        for m0, mc in split_evenly(shape.M, gm):
            for u0, un in split_evenly(n_units, gn):
                n0 = u0 * g
                nc = min(un * g, shape.N - n0)
                if bc and mc and nc > 0:
                    blocks += [CoreShare(len(blocks) + i, (b0, m0, n0, k0), (bc, mc, nc, kc))
                               for i, (k0, kc) in enumerate(k_slices)]
    return Grid(gb, gm, gn, tuple(blocks), gk)


def group_grid(shape: MatmulShape, gm: int, gn: int) -> Grid:
    """`gn` groups of columns, each of `gm` consecutive cores splitting the rows: a B shared within
    each group over its chain (a core needs only its group's columns of B, 1/gn of it, and its
    rows of A; A is read once per group)."""
    g = n_granule(shape)
    n_units = -(-shape.N // g)
    blocks = []
    for u0, un in split_evenly(n_units, gn):
        n0 = u0 * g
        nc = min(un * g, shape.N - n0)
        blocks += [CoreShare(len(blocks) + i, (0, m0, n0, 0), (shape.batches, mc, nc, shape.K))
                   for i, (m0, mc) in enumerate(split_evenly(shape.M, gm))]
    if any(b.counts[1] < 1 or b.counts[2] < 1 for b in blocks) or len(blocks) != gm * gn:
        raise PlanError(f"matmul group grid {gm}x{gn} of {shape.M}x{shape.N}: an empty block")
    return Grid(1, gm, gn, tuple(blocks), 1, gm)


def _span(access, block: CoreShare, shape: MatmulShape, m: bool, n: bool, k: bool) -> int:
    """Bytes between the first and the last element `access` touches in `block`."""
    b0, (bc, mc, nc, kc) = block.starts[0], block.counts
    offsets = [_batch_offset(shape, access, f) for f in range(b0, b0 + bc)]
    extent = max(offsets) - min(offsets)
    extent += abs(access.m_stride) * (mc - 1) if m else 0
    extent += abs(access.n_stride) * (nc - 1) if n else 0
    extent += abs(access.k_stride) * (kc - 1) if k else 0
    return (extent + 1) * ITEMSIZE[access.dtype]


def _batch_offset(shape: MatmulShape, access, flat: int) -> int:
    off = 0
    for extent, stride in zip(reversed(shape.batch), reversed(access.batch_strides)):
        flat, i = divmod(flat, extent)
        off += stride * i
    return off


def span_problem(shape: MatmulShape, grid: Grid) -> str | None:
    """Why a core's slice of some tensor spreads over more than the per-core addressable span."""
    limit = HARDWARE.core_span_bytes
    for block in grid.blocks:
        checks = [("A", shape.a, True, False, True), ("B", shape.b, False, True, True)]
        checks += [(a.buffer, a, True, True, False) for _, a in shape.epilogue_loads + shape.stores]
        for what, access, m, n, k in checks:
            span = _span(access, block, shape, m, n, k)
            if span > limit:
                return (f"core {block.core}'s slice of {what} ({access.buffer}) spans {span} B of device memory, "
                        f"more than the per-core addressable span of {limit} B")
    return None


def grid_bytes(shape: MatmulShape, grid: Grid) -> int:
    """Device bytes the grid moves if each block reads its operands once: A once per column
    block, B once per row block (per batch block too, unless B is batched), the output once
    (k slices split the operands' reads, they do not repeat them)."""
    ia, ib, io = ITEMSIZE[shape.a.dtype], ITEMSIZE[shape.b.dtype], ITEMSIZE[shape.out_dtype]
    a_bytes = shape.batches * shape.M * shape.K * ia
    batched_b = any(shape.b.batch_strides)
    b_bytes = (shape.batches if batched_b else 1) * shape.K * shape.N * ib
    out = shape.batches * shape.M * shape.N * io
    return grid.gn * a_bytes + grid.gm * (1 if batched_b else grid.gb) * b_bytes + out


def block_bytes(shape: MatmulShape, block: CoreShare) -> int:
    """Device bytes one block moves if it reads its operands once."""
    ia, ib, io = ITEMSIZE[shape.a.dtype], ITEMSIZE[shape.b.dtype], ITEMSIZE[shape.out_dtype]
    bc, mc, nc, kc = block.counts
    return bc * (mc * kc * ia + kc * nc * ib + mc * nc * io)


def best_grid(shape: MatmulShape, cores: int) -> Grid:
    """The grid that moves the fewest bytes, counting a ragged grid as if every core moved its
    largest block's bytes (the cores finish when the largest does)."""
    def cost(g: Grid):
        return (max(grid_bytes(shape, g), g.cores * max(block_bytes(shape, b) for b in g.blocks)), -g.gm)

    return min(grids(shape, cores), key=cost)


# ---- tiles and scratchpad ----------------------------------------------------------------


def operand_tiles(tk_: TileKernel) -> tuple[str, str]:
    """The A and B tiles: the two loads of the chunk phase."""
    (ta, _), (tb, _) = tk_.phases[0].loads
    return ta, tb


def tile_needs(tk_: TileKernel, t: MatmulTiling) -> list[Need]:
    """What every tile needs at this tiling (the verifier recomputes the same from the tile kernel):
    A tiles are [tm, tk] rows, B tiles [tk, tn], everything else [tm, tn], a staging tile is its
    operand with the axes swapped; an axis a tile does not vary over has extent 1. Operand
    pools have their slots, accumulators, epilogue operands and outputs two copies (the PE
    fills one while the sfp drains the other), staging and temporaries one."""
    ta, tb = operand_tiles(tk_)
    size = {"m": t.tm, "n": t.tn, "k": t.tk}
    a_size = dict(size, k=t.tka)
    # the epilogue's temporaries live from the step that writes them to the last that reads them:
    # later ones reuse the bytes of dead ones (an activation is a chain of them, each a full tile)
    live = live_ranges(tk_.phases[1].steps)
    needs = []
    for tile in tk_.tiles:
        if tile.role is Role.CONSTANT:
            needs.append(Need(tile.name, STICK, STICK))
            continue
        served = tile.of or tile.name
        rows_axis, cols_axis = ("m", "k") if served == ta else ("k", "n") if served == tb else ("m", "n")
        rows, row = tile_geometry(tile, rows_axis, cols_axis, a_size if served == ta else size)
        if tile.name in (ta, tb):
            copies = t.a_slots if tile.name == ta else t.b_slots
        elif tile.role is Role.ACCUMULATOR:
            copies = t.acc_copies
        elif tile.role is Role.RING_LANDING:  # a split k's partials from either side (codegen.combine_chain)
            copies = 2
        else:
            copies = 1 if tile.role in (Role.STAGING, Role.TEMPORARY) else 2
        needs.append(Need(tile.name, rows * row, row, copies,
                          live.get(tile.name) if tile.role is Role.TEMPORARY else None))
    return needs


def place(tk_: TileKernel, t: MatmulTiling) -> tuple[list[Need], Placement]:
    needs = tile_needs(tk_, t)
    return needs, allocate(needs, HARDWARE.scratchpad_usable_bytes)


# Tile-shape targets (rows, columns, k) the search tries; a tile is the target clipped to the
# core's block.
TARGETS = ((128, 256, 1024), (64, 256, 256), (128, 128, 256))
POOLS = ("B resident", "A resident", "streamed")
# Shared-operand plans: the k-outer order walks every operand tile once per core, and the
# shared one is all-gathered, so each operand is read from device memory once in all. Its
# tiles are large (each core's slice of one is 1/32 of it, and a slice pays a ring hop).
SHARED_TARGETS = ((512, 256, 256), (512, 256, 128), (512, 128, 128), (256, 256, 512), (128, 256, 256))


# Split-k plans: the k tile of each core's slice (the block is one output tile): one stick of fp16 k,
# so the PE starts on the first tile while the rest of the slice streams in (1024 and 256 were
# timed too and never won on the decode rows); k slices per block.
SPLIT_K_TILES = (64,)
SPLIT_K_SLICES = (2, 4, 8, 16, 32)


def variants() -> list[tuple]:
    """(tile target, operand pools, order, shared operand, k slices) of the plain plans."""
    out = [(tgt, pool, "output", None, 1) for tgt in TARGETS for pool in POOLS]
    out += [(tgt, "streamed", "k-outer", None, 1) for tgt in TARGETS[1:]]
    return out


def split_k_variants(shape: MatmulShape, cores: int) -> list[tuple]:
    """Plans splitting k into slices over consecutive cores, for a matmul whose rows are too few to
    give every core a block of its own (a decode projection)."""
    k_units = -(-shape.K // k_granule(shape))
    if shape.M > SPLIT_K_ROWS or cores < 2 or k_units < 2:
        return []
    return [((PE_ROWS, STICK, tk), "streamed", "output", None, gk)
            for gk in SPLIT_K_SLICES if gk <= min(cores, k_units) for tk in SPLIT_K_TILES]


# A small kernel's ring plans start from short k-steps instead of the first target: what follows
# its last load is the last k-step's matmul, the epilogue and the stores, and a kernel of a few us
# (a 128-row prefill projection) cannot hide a 0.9 us matmul of 128 k there (0.46 us at 64). The
# first also fills A in tiles of 256 k: each fill of a shared A waits for its slices from the far
# end of the chain (0.25 us on 12 cores), once per A tile, not once per k-step.
SMALL_SHARED_TARGETS = ((512, 256, 64, 256), (512, 256, 64))


def shared_variants(shape: MatmulShape, small: bool = False) -> list[tuple]:
    """Ring plans sharing the smaller operand (the larger stays private, read once per core's slice);
    `small`: a small kernel's (SMALL_SHARED_TARGETS first)."""
    targets = SMALL_SHARED_TARGETS + SHARED_TARGETS if small else SHARED_TARGETS
    a_bytes = shape.batches * shape.M * shape.K * ITEMSIZE[shape.a.dtype]
    b_bytes = (shape.batches if any(shape.b.batch_strides) else 1) * shape.K * shape.N * ITEMSIZE[shape.b.dtype]
    order = ("a", "b") if a_bytes <= b_bytes else ("b", "a")
    return [(tgt, "streamed", "k-outer", share, 1) for share in order for tgt in targets]


# A transposed B shared over chains: rows per core (the PE fill is 0.86 at 32 rows, and a chain of
# fewer, longer blocks forwards more of B through each core's load/store unit: 128x256x128 on 16
# chains of 8 rows 2.85 us, on 8 of 16 rows 2.65, on 4 of 32 rows 2.45)
SHARED_B_ROWS = 32


def grid_for(shape: MatmulShape, cores: int, variant) -> Grid | None:
    """The grid of a variant at `cores`: a shared operand needs every core on the same tiles of
    it (A: split the columns only; B: the rows only); otherwise the fewest bytes."""
    share, gk = variant[3], variant[4]
    if gk > 1:  # the fewest bytes at the cores a k slice leaves, each block then split in k
        if cores < gk:
            return None
        base = best_grid(shape, cores // gk)
        if any(b.counts[0] > 1 for b in base.blocks):  # a block of several batches is several output tiles
            return None
        return make_grid(shape, base.gb, base.gm, base.gn, gk)
    if share is None:
        return best_grid(shape, cores)
    # a transposed B is shared too: each slice is transposed by the core that loads it and sent on
    # transposed (codegen.ring_pieces); a transposed A is not
    if cores < 2 or (share == "a" and shape.a_transposed):
        return None
    if share == "a":
        units = -(-shape.N // n_granule(shape))
        return make_grid(shape, 1, 1, min(cores, units)) if units >= 2 else None
    if shape.b_transposed:  # B shared within groups of cores, each core transposing its slices of it
        # (x @ W.t(): on one chain of all the cores, 4 rows each, W passed through every core: 9.5 us
        # for 128x256x128); the rest of the cores take further groups of columns
        units = -(-shape.N // n_granule(shape))
        gm = max(2, min(cores, shape.M // SHARED_B_ROWS))
        gn = min(units, cores // gm)
        if gn < 1 or shape.batches > 1 or shape.M < 2:
            return None
        return group_grid(shape, gm, gn)
    return make_grid(shape, 1, min(cores, shape.M), 1) if shape.M >= 2 else None


def tiling_for(shape: MatmulShape, grid: Grid, variant) -> MatmulTiling:
    target, pool, order, share, gk = variant
    (tm_t, tn_t, tk_t), tka_t = target[:3], (target[3] if len(target) > 3 else 0)
    mc = max(b.counts[1] for b in grid.blocks)
    nc = max(b.counts[2] for b in grid.blocks)
    kc = max(b.counts[3] for b in grid.blocks)
    g = n_granule(shape)
    tm, tk = min(mc, tm_t), min(kc, tk_t)
    tn = min(nc, max(g, tn_t // g * g))
    if gk > 1:  # one output tile per core: its accumulator is the partial that travels
        tm, tn = mc, nc
    if share == "b":  # the shared B tile is [tk, tn]: make it as large as the rows' tile is for A
        tn, tm = min(nc, max(g, tm_t // g * g)), min(mc, tn_t)
    ktiles = -(-kc // tk)
    # A's tiles: whole k-steps, each k-step's columns starting on a stick of the tile
    a_tk = min(tka_t // tk * tk, ktiles * tk) if tk * ITEMSIZE[shape.a.dtype] % STICK == 0 else 0
    a_tk = a_tk if a_tk > tk else 0
    m_tiles, n_tiles = -(-mc // tm), -(-nc // tn)
    a_tiles, b_tiles = m_tiles * -(-kc // (a_tk or tk)), n_tiles * ktiles
    if order == "k-outer":  # per k chunk: the A tiles of every row tile, the B tiles of every column tile
        # a shared operand's fill waits on the slowest core of the chain: one more slot lets the
        # load/store unit run a tile further ahead of the PE
        ahead = 3 if share else 2
        a_slots = min(a_tiles, ahead if share != "b" else 2)
        b_slots = min(b_tiles, n_tiles + (ahead - 1 if share == "b" else 1))
        if share == "b" and shape.b_transposed:  # a slot per fill: each core transposes its slices up front
            b_slots = b_tiles
        acc = m_tiles * n_tiles
        label = "k-outer" + (f", {share.upper()} shared over the ring" if share else "")
        label += f", A in tiles of {a_tk} k" if a_tk else ""
    else:
        a_slots = a_tiles if pool == "A resident" else min(2, a_tiles)
        b_slots = b_tiles if pool == "B resident" else min(2, b_tiles)
        acc, label = 2, pool
        if gk > 1:
            acc, label = 1, f"k split {gk} ways, partials combined on the ring"
    return MatmulTiling(tm, tn, tk, a_slots, b_slots, label, order, acc, share, gk, a_tk)


def fitting(tk_: TileKernel, shape: MatmulShape, grid: Grid, variant) -> tuple[MatmulTiling, Placement] | None:
    """The variant's tiling on this grid and its placement, or None if it does not fit."""
    t = tiling_for(shape, grid, variant)
    _, p = place(tk_, t)
    return (t, p) if p.fits else None


__all__ = ["Grid", "MatmulTiling", "SPLIT_K_ROWS", "best_grid", "fitting", "grid_bytes", "grids", "make_grid",
           "grid_for", "group_grid", "k_granule", "n_granule", "operand_tiles", "place", "shared_variants", "span_problem",
           "split_k_variants", "tile_needs", "tiling_for", "variants"]
