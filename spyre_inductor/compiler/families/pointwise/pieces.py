"""Pieces: a pointwise kernel whose index masks cut its iteration space into boxes.

A cat, a pad, a rotary embedding's ``rotate_half`` reach us as ONE kernel
over the output, each element choosing its source with masks on the loop
indices (Inductor's ``masked``: where(i1 < 64, x[i1], y[i1 - 64])). Computed
as written, every element would load from every source, at indices outside
the sources where the mask is false. Instead the iteration space is cut
where a mask can change (a compare of a one-dim index value with a
constant), and each box is a kernel of its own in which every such mask is
a constant: the where picks one side, the other side's loads are dead, and
what remains is a plain copy (or fill, or the pad's border constant). The
boxes are planned by the pointwise family one by one and their programs run
one after another on each core, as ONE program that writes each part.

A mask over several dims cuts along one of them when each slab along it decides the mask
(transformers' rotary: Inductor splits the head dim into (2, 8) and asks ``8*i2 + i3 < 8``).
Masks that no one dim decides (a causal ``i1 <= i0``) stay on chip:
an iota and a compare (core/fusion.py). Every load left in a box must stay
inside its buffer over the whole box (``check_bounds``): a kernel whose
masked-off loads would leave their buffer somewhere no cut removes them is
refused, never run.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

from spyre_runtime.program.isa import Fence, Pop, Push
from spyre_runtime.program.program import CoreProgram, Program, Queue

from ...ir.errors import PlanError
from ...ir.kernel_ir import Cast, Constant, Index, IndexValue, Kernel, Load, Op, PointwiseKernel, needed, renumbered
from ...core._dump import Describable
from ...core.bounds import index_range

COMPARES = {"lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b,
            "ge": lambda a, b: a >= b, "eq": lambda a, b: a == b, "ne": lambda a, b: a != b}
LOGICAL = {"logical_and": all, "bitwise_and": all, "logical_or": any, "bitwise_or": any}
MAX_PIECES = 64  # beyond this the unrolled program is too long to be worth it: masks stay on chip


@dataclass(frozen=True)
class Piece:
    """One box of the iteration space (per IR dim: first index, extent) as a kernel of its own."""

    starts: tuple[int, ...]
    counts: tuple[int, ...]
    kernel: PointwiseKernel


@dataclass(frozen=True)
class PiecesPlan(Describable):
    """What the cut made of a kernel, for the summary: each piece's box, core count and time."""

    cuts: tuple[tuple[int, ...], ...]   # per IR dim, the cut points
    boxes: tuple[tuple[int, ...], ...]  # per piece: starts then counts
    cores: tuple[int, ...]
    ns: tuple[float, ...]
    reason: str


def _compare(kernel, v) -> tuple[Index, int, str] | None:
    """(index, constant, op) when `v` compares an index value with an integer constant (either
    side, turned so the index is on the left), else None."""
    if not isinstance(v, Op) or v.name not in COMPARES:
        return None
    a, b = (kernel.values[x] for x in v.args)
    op = v.name
    if isinstance(a, Constant) and isinstance(b, IndexValue):
        a, b = b, a
        op = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}.get(op, op)
    if not (isinstance(a, IndexValue) and isinstance(b, Constant)) or isinstance(b.value, float):
        return None
    return a.index, int(b.value), op


def _decided(op: str, lo: int, hi: int, c: int) -> bool | None:
    """The compare of every x in [lo, hi] with c when it is the same for all of them, else None."""
    test = COMPARES[op]
    ends = test(lo, c), test(hi, c)
    if ends[0] != ends[1] or (op in ("eq", "ne") and lo != hi and lo <= c <= hi):
        return None
    return ends[0]


def _slab_cuts(index: Index, c: int, op: str, d: int, ranges) -> set[int] | None:
    """Where along dim `d` the compare changes, when every slab i_d = j (the other dims over
    their whole extents) decides it; None when some slab does not. A rotary embedding's
    ``8*i2 + i3 < 8`` (Inductor split the head dim 16 into 2 x 8) is decided by i2 alone."""
    stride, n = index.strides[d], ranges[d]
    rest_lo = rest_hi = index.offset
    for e, (s, m) in enumerate(zip(index.strides, ranges)):
        if e != d:
            rest_lo += min(0, s * (m - 1))
            rest_hi += max(0, s * (m - 1))
    # away from where stride*j + rest crosses c every slab is decided and all agree (the compare
    # is monotone in j; eq/ne are decided off the crossing): look only at slabs near it
    roots = (c - rest_hi) / stride, (c - rest_lo) / stride
    window = range(max(0, math.floor(min(roots)) - 1), min(n, math.ceil(max(roots)) + 2))
    decisions = {}
    for j in window:
        decided = _decided(op, stride * j + rest_lo, stride * j + rest_hi, c)
        if decided is None:
            return None
        decisions[j] = decided
    cuts = set()
    for j in window:
        if j - 1 in decisions and decisions[j - 1] != decisions[j]:
            cuts.add(j)
    return cuts


def cut_points(kernel: PointwiseKernel) -> tuple[tuple[int, ...], ...]:
    """Per IR dim, the indices (0 < k < extent) where some index compare changes value, cutting
    along the one dim whose slabs each decide it (a compare no single dim decides is left to the
    chip: an iota and a compare)."""
    cuts = [set() for _ in kernel.ranges]
    for v in kernel.values:
        c = _compare(kernel, v)
        if c is None:
            continue
        index, constant, op = c
        for d, stride in enumerate(index.strides):
            if not stride:
                continue
            found = _slab_cuts(index, constant, op, d, kernel.ranges)
            if found is not None:
                cuts[d] |= found
                break
    return tuple(tuple(sorted(c)) for c in cuts)


def unmasked_part(kernel: PointwiseKernel) -> tuple[PointwiseKernel, PointwiseKernel] | None:
    """(the stores no index mask reaches, the rest) as two kernels, or None when there is no
    such split. A fused rotary embedding and KV-cache write (``k_cache.index_copy_(2, pos,
    rotary(k))`` beside ``v_cache.index_copy_(2, pos, v)``) is one kernel, and cutting it at
    rotate_half's mask would cut v's copy too: its rows would move as two half-stick pieces,
    each charged a whole stick (twice the bytes, read and written). A store whose values
    depend on no cut mask gains nothing from the cut: planned whole, its rows move once."""
    def cut_by(stores) -> bool:
        values, kept = _live(kernel.values, stores)
        return any(cut_points(Kernel.of(kernel.name, kernel.ranges, kernel.buffers, values, kept)))

    free = tuple(s for s in kernel.stores if not cut_by((s,)))
    masked = tuple(s for s in kernel.stores if s not in free)
    if not free or not masked:
        return None
    return tuple(Kernel.of(kernel.name, kernel.ranges, kernel.buffers, *_live(kernel.values, stores))
                 for stores in (free, masked))


def split(kernel: PointwiseKernel) -> tuple[Piece, ...] | None:
    """The kernel's pieces, or None when no mask cuts it (plan it whole)."""
    cuts = cut_points(kernel)
    count = math.prod(len(c) + 1 for c in cuts)
    if count == 1 or count > MAX_PIECES:
        return None
    bounds = [list(zip((0,) + c, c + (r,))) for c, r in zip(cuts, kernel.ranges)]
    pieces = []
    for box in itertools.product(*bounds):
        starts = tuple(lo for lo, _ in box)
        counts = tuple(hi - lo for lo, hi in box)
        pieces.append(Piece(starts, counts, box_kernel(kernel, starts, counts)))
    return tuple(pieces)


def stacked(group: tuple[Piece, ...]) -> PointwiseKernel | None:
    """Pieces of one shape as ONE kernel over that shape: every piece's values and stores side by
    side, so a tile computes all of them and the pointwise family loads each distinct (buffer,
    index) once per tile. A rotary embedding's two halves read x[:, :64] and x[:, 64:] each (its
    own half, and the other one rotated): stacked, x is read once, not twice. None when stacking
    could change the answer: a piece reads a buffer another piece writes (an in-place update
    through a mask, as a slice assignment is)."""
    first = group[0]
    if len(group) < 2 or any(p.counts != first.counts for p in group):
        return None
    written = {st.buffer for p in group for st in p.kernel.stores}
    read = {v.buffer for p in group for v in p.kernel.values if isinstance(v, Load)}
    if written & read:
        return None
    values, stores = [], []
    for p in group:
        base = len(values)
        values += [renumbered(v, lambda x, b=base: x + b) for v in p.kernel.values]
        stores += [renumbered(st, lambda x, b=base: x + b) for st in p.kernel.stores]
    return Kernel.of(first.kernel.name, first.counts, first.kernel.buffers, tuple(values), tuple(stores))


def box_kernel(kernel: PointwiseKernel, starts, counts) -> PointwiseKernel:
    """The kernel over one box: indices shifted to the box's origin, masks that are constant over
    the box folded, dead values dropped."""
    def shifted(index: Index) -> Index:
        return replace(index, offset=index.offset + sum(s * a for s, a in zip(index.strides, starts)))

    values = []
    for v in kernel.values:
        if isinstance(v, (Load, IndexValue)):
            v = replace(v, index=shifted(v.index))
        values.append(v)
    stores = tuple(replace(s, index=shifted(s.index)) for s in kernel.stores)
    values, stores = _fold(values, stores, counts)
    return Kernel.of(kernel.name, tuple(counts), kernel.buffers, values, stores)


def _fold(values, stores, counts):
    """Constant-fold what the box decides (compares of index values, logic of constants, a where
    with a constant condition), then keep only what the stores need."""
    out, where = [], {}  # new values; old position -> new position

    def const(pos):
        v = out[pos]
        return v.value if isinstance(v, Constant) else None

    def add(v) -> int:
        out.append(v)
        return len(out) - 1

    for i, v in enumerate(values):
        if isinstance(v, Op):
            args = tuple(where[a] for a in v.args)
            v = replace(v, args=args)
            folded = None
            if v.name in COMPARES:
                a, b = (out[x] for x in args)
                if isinstance(a, IndexValue) and isinstance(b, Constant) or isinstance(a, Constant) and isinstance(b, IndexValue):
                    iv, c, flip = (a, b.value, False) if isinstance(a, IndexValue) else (b, a.value, True)
                    lo, hi = index_range(iv, counts)
                    test = COMPARES[v.name]
                    at = [test(c, x) if flip else test(x, c) for x in (lo, hi)]
                    # monotone compares are decided by the two ends; eq/ne only when lo == hi or c is outside
                    decided = at[0] == at[1] and (v.name not in ("eq", "ne") or lo == hi or not lo <= c <= hi)
                    if decided:
                        folded = Constant(bool(at[0]), v.dtype)
            elif v.name in LOGICAL and (v.name.startswith("logical") or all(out[x].dtype == "bool" for x in args)):
                # (a bitwise and/or of integers is arithmetic, not logic: 6 & 3 is 2, left to the sfp)
                cs = [const(x) for x in args]
                if all(c is not None for c in cs):
                    folded = Constant(bool(LOGICAL[v.name](cs)), v.dtype)
                elif v.name in ("logical_and", "bitwise_and") and any(c is False for c in cs):
                    folded = Constant(False, v.dtype)
                elif v.name in ("logical_or", "bitwise_or") and any(c is True for c in cs):
                    folded = Constant(True, v.dtype)
            elif v.name == "logical_not" and const(args[0]) is not None:
                folded = Constant(not const(args[0]), v.dtype)
            elif v.name == "where" and const(args[0]) is not None:
                kept = args[1] if const(args[0]) else args[2]
                # the where's dtype is its operands' promotion: keep it (a Cast), as the where would
                where[i] = kept if out[kept].dtype == v.dtype else add(Cast(kept, v.dtype))
                continue
            where[i] = add(folded if folded is not None else v)
        else:
            where[i] = add(renumbered(v, where.__getitem__))
    stores = tuple(renumbered(s, where.__getitem__) for s in stores)
    return _live(tuple(out), stores)


def _live(values, stores):
    live = sorted(needed(values, stores))
    new = {old: k for k, old in enumerate(live)}
    return (tuple(renumbered(values[p], new.__getitem__) for p in live),
            tuple(renumbered(s, new.__getitem__) for s in stores))


def check_independent(kernel: PointwiseKernel) -> None:
    """PlanError unless every buffer the kernel both reads and writes is read exactly where it is
    written: the pieces run on each core in order but on different cores unordered, so no piece
    may read what another writes (capture refuses such kernels; this is the planner's check)."""
    stored = {(s.buffer, s.index) for s in kernel.stores}
    written = {b for b, _ in stored}
    for v in kernel.values:
        if isinstance(v, Load) and v.buffer in written and (v.buffer, v.index) not in stored:
            raise PlanError(f"kernel {kernel.name!r}: {v.buffer!r} is read at another index than it is written; "
                            f"its pieces could read what another piece writes")


def in_sequence(name: str, symbols, programs, notes: str = "") -> Program:
    """The pieces' programs as one: on each core, each unit runs piece after piece, with each
    piece's queues renamed apart. Between two pieces the ls unit waits for its transfers and hands
    the sfp a token (a push waits for in-flight transfers) that the sfp takes before the next
    piece: so the next piece's loads and fills cannot touch scratchpad a previous store still
    reads, and the pieces' scratchpad placements may share bytes."""
    units: dict[int, dict[str, list]] = {}
    queues = []
    for k, program in enumerate(programs):
        prefix = f"p{k}."
        queues += [replace(q, name=prefix + q.name) for q in program.queues]
        for cp in program.cores:
            core = units.setdefault(cp.core, {})
            mine = dict(cp.units)
            if k and core.get("ls") and mine.get("sfp"):
                token = f"{prefix}next.c{cp.core}"
                queues.append(Queue(token, (cp.core, "ls"), (cp.core, "sfp"), 1))
                core["ls"] += [Fence(), Push(token)]
                core.setdefault("sfp", []).append(Pop(token))
            for unit, instrs in cp.units:
                core.setdefault(unit, []).extend(
                    replace(i, queue=prefix + i.queue) if isinstance(i, (Push, Pop)) else i for i in instrs)
    cores = tuple(CoreProgram(c, tuple((u, tuple(i)) for u, i in sorted(us.items()))) for c, us in sorted(units.items()))
    return Program(name, tuple(symbols), cores, tuple(queues), notes=notes)


__all__ = ["Piece", "PiecesPlan", "box_kernel", "check_independent", "cut_points", "in_sequence", "split", "stacked",
           "unmasked_part"]
