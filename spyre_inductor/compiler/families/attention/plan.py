"""The attention family's plan: the problem's shape, its tilings, its work units and their cores.

A **work unit** is one (batch, kv head, block of query rows): the G query heads that read one
kv head, stacked into one Q tile of G x rows rows, so every K and V chunk a core loads serves
all of them (grouped-query attention never copies K or V per head). A unit walks the kv
positions in **chunks** of ``kv`` positions; under a causal mask it visits only the chunks some
of its rows can see, and in each only the rows that see any of it (rows ``r0`` and below are
skipped: their scores would all be -inf), with the mask computed on chip on the diagonal chunks.

The **tiling** is (rows per head per unit, kv positions per chunk, K/V slots); the scratchpad
need of a tiling is fixed (every core allocates the largest unit's tiles), and a tiling that
does not fit the scratchpad is not a candidate. Units are spread over cores longest first
(each to the core with the least work so far), the work of a unit being its score elements:
causal units differ, and the last cores must not wait on the first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from spyre_runtime.hardware import HARDWARE
from spyre_runtime.program.operands import ITEMSIZE, STICK, sticks

from ...ir.errors import Unsupported
from ...ir.kernel_ir import AttentionKernel
from ...core._dump import Describable
from ...core.allocate import Need, Placement, allocate

FLOAT_INPUTS = ("fp16", "bf16", "fp32")
ROWS = (1, 8, 16, 32, 64, 128, 256, 512, 1024)   # query rows per head per unit
KV = (64, 128, 256, 512, 1024)                   # kv positions per chunk
SLOTS = (2, 3)                                   # K/V chunk buffers in flight
COLUMN_TILES = ("m", "l", "t1", "t2", "t3")      # fp32 per-row statistics, packed (column_bytes per head)
PACKED_ROWS = STICK // 4                         # rows per stick of a packed statistics column


def column_bytes(rows: int) -> int:
    """Bytes of one head's packed per-row statistics (4 bytes a row, whole sticks)."""
    return sticks(rows * 4)


@dataclass(frozen=True)
class Access(Describable):
    """element = offset + sum(strides[k] * index_k) over (batch, head, row, column)."""

    buffer: str
    dtype: str
    strides: tuple[int, int, int, int]
    offset: int
    heads: bool = False  # issue 18: each (batch, head) is its own placeholder (sizes.py)

    def at(self, b: int, h: int, i: int, j: int) -> int:
        s = self.strides
        return self.offset + s[0] * b + s[1] * h + s[2] * i + s[3] * j

    def dev(self, b: int, h: int, i: int, j: int) -> tuple[str, int]:
        """(placeholder, element in it) of element (b, h, i, j)."""
        if not self.heads:
            return self.buffer, self.at(b, h, i, j)
        from .sizes import head_name

        return head_name(self.buffer, b, h), self.offset + self.strides[2] * i + self.strides[3] * j


@dataclass(frozen=True)
class AttentionShape(Describable):
    B: int
    H: int
    KVH: int
    L: int
    S: int
    D: int
    Dv: int
    q: Access
    k: Access
    v: Access
    out: Access
    bias: Access | None
    keep: Access | None
    scale: float
    causal: int | None
    empty_rows: str
    p_dtype: str           # the probabilities' dtype for PV (the output's: softmax(...).to(v.dtype) @ v)
    masked_score: float    # what the keep mask makes a dropped position's score
    positions: Access | None = None  # per-row positions (strides (0, 0, stride, 0)): the diagonal is theirs
    # Issue 18: the kv length known only at launch, when positions past it must be masked: (the
    # SizeExpr the program fills, its value at the bucket's least size: chunks before it need no mask)
    kv_size: object | None = None
    kv_least: int = 0

    @property
    def skips(self) -> bool:
        """Whether units skip the chunks and rows a causal diagonal hides (not with data positions)."""
        return self.causal is not None and self.positions is None

    @property
    def bounds_on_chip(self) -> bool:
        """Whether units skip, on chip, the chunks past every row's data position (issue 31): a
        mask ``j <= positions[i] + causal`` over contiguous positions (read as one row per unit),
        unless the kv length is a launch size."""
        p = self.positions
        return p is not None and (p.strides[2] == 1 or self.L == 1) and self.kv_size is None

    def assumed(self) -> "AttentionShape":
        """The shape the planner times a units-skip-on-chip kernel as: the positions taken to be
        the rows' own, at the end of the kv positions (a prefill filling a cache: row i at
        S - L + i), i.e. a static causal diagonal. The program itself reads the positions."""
        from dataclasses import replace

        return replace(self, positions=None, causal=self.causal + self.S - self.L)

    @property
    def G(self) -> int:
        return self.H // self.KVH

    def visible(self, i_last: int) -> int:
        """How many kv positions row i_last sees (S without a causal mask, or with data positions)."""
        if not self.skips:
            return self.S
        return max(0, min(self.S, i_last + self.causal + 1))


def analyse(kernel: AttentionKernel) -> AttentionShape:
    where = f"attention kernel {kernel.name!r}"
    try:
        kernel.check()
    except ValueError as e:
        raise Unsupported(str(e)) from e
    B, H, KVH, L, S, D, Dv = kernel.dims
    for role, buf in (("q", kernel.q), ("k", kernel.k), ("v", kernel.v), ("out", kernel.out)):
        if buf.dtype not in FLOAT_INPUTS:
            raise Unsupported(f"{where}: {role} is {buf.dtype} (the PE arrays multiply fp16, bf16 or fp32)")
        if buf.strides[3] != 1 and buf.shape[3] > 1:
            raise Unsupported(f"{where}: {role}'s feature dim is not contiguous (stride {buf.strides[3]})")
    if min(B, H, L, S, D, Dv) == 0:
        raise Unsupported(f"{where}: an empty dim in {kernel.dims}")

    heads = set()
    kv_size, kv_least = None, 0
    if kernel.symbolic is not None:
        from spyre_runtime.program.operands import SizeExpr

        from .sizes import kv_size as kv_of, split

        heads = set(split(kernel))
        fit = kv_of(kernel)
        if fit is not None:
            (name, lo, _), = kernel.symbolic.sizes
            kv_size, kv_least = SizeExpr(name, hi=S, coef=fit[0], const=fit[1]), fit[0] * lo + fit[1]

    def access(buf, strides=None) -> Access:
        # offset 0: a buffer's storage offset is already in the address its symbol resolves to
        return Access(buf.name, buf.dtype, tuple(strides or buf.strides), 0, buf.name in heads)

    masks = {}
    for role, buf, strides in (("bias", kernel.bias, kernel.bias_strides), ("keep", kernel.keep, kernel.keep_strides)):
        if buf is None:
            masks[role] = None
            continue
        if strides[3] != 1 and S > 1:
            raise Unsupported(f"{where}: the {role} mask is not contiguous along the kv positions "
                              f"(strides {strides})")
        if role == "bias" and buf.dtype not in FLOAT_INPUTS:
            raise Unsupported(f"{where}: a {buf.dtype} bias")
        masks[role] = access(buf, strides)
    positions = None
    if kernel.positions is not None:
        positions = access(kernel.positions, (0, 0, kernel.positions_stride, 0))
    return AttentionShape(B, H, KVH, L, S, D, Dv, access(kernel.q), access(kernel.k), access(kernel.v),
                          access(kernel.out), masks["bias"], masks["keep"], kernel.scale, kernel.causal,
                          kernel.empty_rows, kernel.p_dtype or kernel.out.dtype, kernel.masked_score, positions,
                          kv_size, kv_least)


@dataclass(frozen=True)
class AttentionTiling(Describable):
    rows: int       # query rows per head in one unit
    kv: int         # kv positions per chunk
    slots: int      # K/V chunk buffers
    label: str = ""
    kv_split: int = 1  # >1: each (batch, kv head, rows) is split over this many neighbouring cores along S
    # >1: the units of one (batch, kv head) go one each to up to this many neighbouring cores (a
    # ring group); one of them loads each K/V chunk and hands it along the ring (ring.py)
    share: int = 1


@dataclass(frozen=True)
class Chunk:
    j0: int         # first kv position
    n: int          # positions
    r0: int         # the first row of the unit (per head) that sees any of them
    masked: bool    # some of the rows [r0, rows) see only part of it (the causal diagonal)


@dataclass(frozen=True)
class WorkUnit:
    b: int
    kvh: int
    i0: int
    rows: int
    chunks: tuple[Chunk, ...]
    part: int = 0      # with a kv split: which part of the positions this unit has (0 stores the result)
    parts: int = 1

    @property
    def work(self) -> int:
        return sum((self.rows - c.r0) * c.n for c in self.chunks) + self.rows


def work_units(shape: AttentionShape, tiling: AttentionTiling, cores: int | None = None) -> list[WorkUnit]:
    """The units of `tiling`: (batch, kv head, blocks of at most `tiling.rows` query rows). For
    `cores`, when the units do not divide evenly among them (48 heads on 32 cores), the last
    ones are split into smaller row blocks so that every core gets the same rows (each core one
    head and one half): their K and V are read once more, which costs less than half the cores
    idling through a second round."""
    blocks = []
    for b in range(shape.B):
        for kvh in range(shape.KVH):
            blocks += [(b, kvh, i0, min(tiling.rows, shape.L - i0)) for i0 in range(0, shape.L, tiling.rows)]
    if cores and len(blocks) > cores and len(blocks) % cores:
        whole, rest = divmod(len(blocks), cores)
        parts = cores // math.gcd(rest, cores)
        if whole <= 3 and blocks[-1][3] >= 8 * parts:
            split = []
            for b, kvh, i0, rows in blocks[len(blocks) - rest:]:
                step = -(-(-(-rows // parts)) // 8) * 8   # ceil(rows / parts), rounded up to 8 rows
                split += [(b, kvh, r, min(step, i0 + rows - r)) for r in range(i0, i0 + rows, step)]
            blocks = blocks[:len(blocks) - rest] + split
    if tiling.kv_split > 1:
        return _split_units(shape, tiling, blocks)
    return [WorkUnit(b, kvh, i0, rows, _chunks(shape, tiling, i0, rows)) for b, kvh, i0, rows in blocks]


def _split_units(shape, tiling, blocks) -> list[WorkUnit]:
    """Every block's chunks dealt in kv_split contiguous runs, one unit per run (flash decoding:
    a decode step's few rows on many cores, their partial softmaxes combined over the ring)."""
    out = []
    for b, kvh, i0, rows in blocks:
        chunks = _chunks(shape, tiling, i0, rows)
        q, r = divmod(len(chunks), tiling.kv_split)   # (every part at least one chunk: variants checks)
        start = 0
        for part in range(tiling.kv_split):
            n = q + (part < r)
            out.append(WorkUnit(b, kvh, i0, rows, chunks[start:start + n], part, tiling.kv_split))
            start += n
    return out


def _chunks(shape, tiling, i0, rows) -> tuple[Chunk, ...]:
    chunks = []
    for j0 in range(0, shape.visible(i0 + rows - 1), tiling.kv):
        n = min(tiling.kv, shape.S - j0)
        if not shape.skips:
            chunks.append(Chunk(j0, n, 0, shape.positions is not None))
            continue
        r0 = max(0, j0 - shape.causal - i0)   # rows before r0 see no position of this chunk
        if r0 >= rows:
            continue
        r0 -= r0 % PACKED_ROWS   # (from a whole stick of the packed statistics: the diagonal masks the rest)
        masked = j0 + n - 1 > i0 + r0 + shape.causal
        chunks.append(Chunk(j0, n, r0, masked))
    return tuple(chunks)


@dataclass(frozen=True)
class CoreWork(Describable):
    core: int
    units: tuple[WorkUnit, ...]


def divide(units: list[WorkUnit], cores: int, one_each: bool = False) -> tuple[CoreWork, ...]:
    """Longest first, each unit to the least loaded core; each core's units in problem order.
    Split units (kv_split) and the units of ring groups (`one_each`: K/V shared over the ring)
    go one per core in problem order, the parts of a block (a group's blocks) on neighbouring
    cores (part p on the core after part p - 1's: their partials travel the ring one hop)."""
    if units and (units[0].parts > 1 or one_each):
        if len(units) > cores:
            return ()
        return tuple(CoreWork(c, (u,)) for c, u in enumerate(units))
    load = [0] * cores
    mine: list[list[int]] = [[] for _ in range(cores)]
    for u in sorted(range(len(units)), key=lambda k: -units[k].work):
        c = min(range(cores), key=lambda k: (load[k], k))
        load[c] += units[u].work
        mine[c].append(u)
    return tuple(CoreWork(c, tuple(units[u] for u in sorted(mine[c]))) for c in range(cores) if mine[c])


def _row(cols: int, dtype: str) -> int:
    return sticks(cols * ITEMSIZE[dtype])


def needs(shape: AttentionShape, t: AttentionTiling, units: int = 1) -> list[Need]:
    """Every tile of one core, whole-program (the allocation is the same for every unit; `units`:
    the most units a core has, for what is kept per unit, the chunks' run counts)."""
    G, R, kv, D, Dv = shape.G, t.rows, t.kv, shape.D, shape.Dv
    qd, kd, vd, od, pd = shape.q.dtype, shape.k.dtype, shape.v.dtype, shape.out.dtype, shape.p_dtype

    def need(name, rows, cols, dtype, copies=1):
        rs = _row(cols, dtype)
        return Need(name, rows * rs, rs, copies)

    out = [need("q", G * R, D, qd, 2), need("k_rows", kv, D, kd, t.slots), need("kt", D, kv, kd, t.slots),
           need("v", kv, Dv, vd, t.slots), need("s", G * R, kv, "fp32", 2), need("p", G * R, kv, pd, 2),
           need("acc", G * R, Dv, "fp32"), need("o", G * R, Dv, od, 2)]
    for name, m in (("bias", shape.bias), ("keep", shape.keep)):
        if m is not None:
            rows = (R if m.strides[2] else 1) * (G if m.strides[1] else 1)
            out.append(need(name, rows, kv, m.dtype, t.slots))
    if shape.causal is not None or shape.kv_size is not None:
        out += [need("diag_index", R, kv, "int32"), need("diag_keep", R, kv, "bool")]
    if shape.kv_size is not None:
        out.append(Need("kv_size", STICK, STICK))
    if shape.positions is not None:
        if not (shape.bounds_on_chip and t.kv_split == 1):
            out.append(Need("positions", R * STICK, STICK, t.slots))
        out.append(Need("row_position", R * STICK, STICK))
    if shape.bounds_on_chip and t.kv_split == 1:  # issue 31: the chunks each unit runs, counted on chip
        chunks = -(-shape.S // kv)
        row = _row(R, shape.positions.dtype)
        out += [Need("pos_row", units * row, row), Need("pos_col", units * R * STICK, STICK),
                Need("pos_max", units * STICK, STICK),
                Need("chunk_start", chunks * STICK, STICK), Need("chunk_count", units * chunks * STICK, STICK),
                Need("pos_min", units * STICK, STICK), Need("chunk_last", chunks * STICK, STICK),
                Need("mask_count", units * chunks * STICK, STICK)]
    column = G * column_bytes(R)
    out += [Need(n, column, STICK) for n in COLUMN_TILES] + [Need("empty", column, STICK)]
    if t.share > 1:  # a ring group's chunk run counts, from its rows' positions (ring.py)
        if shape.bounds_on_chip:
            chunks = -(-shape.S // kv)
            row = _row(t.share * R, shape.positions.dtype)
            out += [Need("group_pos", row, row), Need("group_max", STICK, STICK),
                    Need("group_count", chunks * STICK, STICK)]
    if t.kv_split > 1:  # a neighbour's partial lands here
        out += [need("acc_in", G * R, Dv, "fp32"), Need("m_in", column, STICK), Need("l_in", column, STICK)]
    out += [Need(n, STICK, STICK) for n in ("scale", "ninf", "fill", "zero", "one", "izero")]
    return out


def placement(shape: AttentionShape, t: AttentionTiling, units: int = 1) -> Placement | None:
    p = allocate(needs(shape, t, units), HARDWARE.scratchpad_usable_bytes)
    return p if p.fits else None


def variants(shape: AttentionShape) -> list[AttentionTiling]:
    """Every (rows, kv, slots) that fits, rows no more than L (rounded up to 8), kv no more than S."""
    rows_cap = -(-shape.L // 8) * 8 if shape.L > 1 else 1
    kv_cap = max(64, -(-shape.S // 64) * 64)
    out = []
    for rows in ROWS:
        if rows > max(rows_cap, 1) and rows != ROWS[0]:
            continue
        if shape.L > 1 and rows == 1:
            continue
        for kv in KV:
            if kv > kv_cap:
                continue
            for slots in SLOTS:
                t = AttentionTiling(min(rows, shape.L), kv, slots,
                                    f"{min(rows, shape.L)} rows x {kv} kv positions, {slots} K/V slots")
                if placement(shape, t) is not None:
                    out.append(t)
    # few rows (decode) and many kv positions for few cores: split the positions over cores too
    groups = shape.B * shape.KVH * -(-shape.L // max(rows_cap, 1))
    if not shape.skips and shape.L <= 8:
        for t in list(out):
            for split in (2, 4, 8, 16, 32):
                chunks = -(-shape.S // t.kv)
                if groups * split <= HARDWARE.cores and chunks >= split and t.rows >= shape.L:
                    st = AttentionTiling(t.rows, t.kv, t.slots, f"{t.label}, positions split over {split} cores",
                                         split)
                    if placement(shape, st) is not None:
                        out.append(st)
    out += _shared(shape, out)
    if not out:
        raise Unsupported(f"attention with head dims {shape.D}/{shape.Dv} and {shape.G} heads per kv head: no "
                          f"tiling fits the {HARDWARE.scratchpad_usable_bytes} usable scratchpad bytes")
    return out


def shares_kv(shape: AttentionShape) -> bool:
    """Whether units of one kv head may share K/V chunks over the ring: a prefill's many rows
    (a decode's few split the positions instead), no mask tile loaded per chunk (each core
    would read its own anyway), static sizes, K and V rows of whole sticks (what travels the
    ring is whole sticks, none of them partly stale)."""
    whole = all((n * ITEMSIZE[a.dtype]) % STICK == 0 for n, a in ((shape.D, shape.k), (shape.Dv, shape.v)))
    return (whole and shape.L > 8 and shape.bias is None and shape.keep is None and shape.kv_size is None
            and not any(a.heads for a in (shape.q, shape.k, shape.v, shape.out))
            and (shape.positions is None or shape.bounds_on_chip))


def groups(units) -> list[list[int]]:
    """The indices of `units` (problem order) in runs of one (batch, kv head)."""
    out, run = [], []
    for k, u in enumerate(units):
        if run and (units[run[0]].b, units[run[0]].kvh) != (u.b, u.kvh):
            out.append(run)
            run = []
        run.append(k)
    out.append(run)
    return out


def ring_groups(units, share: int) -> list[list[int]]:
    """The ring groups of one-unit-per-core `units` (problem order, so a group is neighbouring
    cores): each kv head's run cut into groups of at most `share` units, their sizes as even as
    the count allows (no straggler group of one)."""
    result = []
    for run in groups(units):
        n = -(-len(run) // share)
        size, extra = divmod(len(run), n)
        start = 0
        for g in range(n):
            step = size + (g < extra)
            result.append(run[start:start + step])
            start += step
    return result


def _shared(shape: AttentionShape, tilings: list[AttentionTiling]) -> list[AttentionTiling]:
    """The ring-group variants of `tilings` (issue 31): every core one unit, the cores of a kv
    head's units sharing its K/V chunks in groups of `share` (one device read per group)."""
    if not shares_kv(shape):
        return []
    out = []
    for t in tilings:
        if t.kv_split > 1:
            continue
        blocks = -(-shape.L // t.rows)
        if shape.B * shape.KVH * blocks > HARDWARE.cores or blocks < 2:
            continue
        units = work_units(shape.assumed() if shape.bounds_on_chip else shape, t)
        if any(not u.chunks for u in units):
            continue
        for share in sorted({min(s, blocks) for s in (2, 4, 8, 16, 32)}):
            st = AttentionTiling(t.rows, t.kv, t.slots, f"{t.label}, K/V shared over the ring by {share} cores",
                                 share=share)
            if placement(shape, st) is not None:
                out.append(st)
    return out


__all__ = ["PACKED_ROWS", "groups", "ring_groups", "shares_kv", "column_bytes", "Access", "AttentionShape", "AttentionTiling", "Chunk", "CoreWork", "WorkUnit", "analyse", "divide",
           "needs", "placement", "variants", "work_units"]
