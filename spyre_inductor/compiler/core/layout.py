"""Layout: how every buffer and on-chip value is laid out.

Graph inputs and outputs keep PyTorch's strided layout (DESIGN, "where
layouts live"): the plan only records them. What the compiler owns are the
scratchpad tiles of the kernel's values, and for them it chooses

* the element type on chip: floats are computed in fp32 (Inductor's
  contract), so every float operation result is an fp32 tile; loaded values
  keep their buffer's dtype (the reader widens exactly); a Cast to fp16/bf16
  keeps that dtype, because the Cast is where rounding happens;
* the stick dim: the iteration dim that runs along a tile row, i.e. along
  a stick, and the row dim, along a tile's columns of rows. In the
  ``sticks`` relayout every access has stride 0 or 1 on the stick dim (a
  row load moves contiguous bytes). When no dim qualifies because producer
  and consumer disagree (``x.t().contiguous()``: the load walks dim 0
  contiguously, the store dim 1), the ``transposed`` relayout takes the
  stick dim from one side and the row dim from the other: an access with
  stride 1 on the row dim (and not 0/1 on the stick dim) is *transposed*
  (``Access.transposed``): it moves as rows of whole sticks along its own
  contiguous dim into a STAGING tile, and the load/store unit transposes
  it on chip (fusion.py, codegen.py). Of the pairs that work, the one
  transposing the fewest bytes wins. Only an access that walks neither dim
  of any pair contiguously (three accesses contiguous in three different
  dims, a gather-like permute) leaves the ``elements`` relayout: one
  element per stick, correct for any strides, and charged for every whole
  stick it moves;
* padding: each tile row is padded to whole sticks of 128 bytes (64 fp16 /
  bf16, 32 fp32, 128 int8 elements);
* constants (``operand_value``): a Python number becomes the value its tile
  holds here, at compile time, by PyTorch's conversion, never at run time.

Before choosing, the iteration space is canonicalized: dims of extent 1
are dropped and neighbouring dims that every access walks contiguously are
merged, so a contiguous (67, 71) kernel is one flat dim of 4757 elements
with no per-row padding.

Element indices are relative to each buffer's first element (the address a
placeholder resolves to); ``Buffer.offset`` is the tensor's storage offset
and is already folded into that address at launch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from spyre_runtime.program.operands import DTYPES, ITEMSIZE, STICK
from spyre_runtime.program.program import Symbol

from ..ir.errors import Unsupported
from ..ir.scalars import scalar_as
from ..ir.kernel_ir import Cast, IndexValue, Load, PointwiseKernel
from ._dump import Describable

FLOATS = ("fp16", "bf16", "fp32")
# The layout's relayouts (module docstring): which the plan chose is LayoutPlan.relayout.
STICKS_MODE, TRANSPOSED_MODE, ELEMENTS_MODE = "sticks", "transposed", "elements"
# Kernels compute int64 values in int64 tiles (issue 9): exact, never narrowed.
TILE_DTYPES = tuple(DTYPES)


def on_chip_dtype(dtype: str, where: str) -> str:
    """The tile dtype that holds a computed value of IR dtype `dtype`."""
    if dtype not in TILE_DTYPES:
        raise Unsupported(f"{where}: dtype {dtype} has no spyre tile type for this (the ISA computes in "
                          f"{', '.join(TILE_DTYPES)})")
    return "fp32" if dtype in FLOATS else dtype


def operand_value(value, dtype: str):
    """Python constant `value` as a tile of `dtype` holds it: what a Fill of that tile may write.

    Inductor hands constants over as Python numbers (``a * 1e39`` is the constant 1e39), and
    the sfp's fill only writes a value its tile can represent: 1e39 in an fp32 tile is a run-time
    error that leaves the stream in error, where PyTorch computes inf. So the conversion happens
    here, at compile time, as PyTorch converts a Python scalar to a tensor's type
    (``torch.tensor(v, dtype=torch.float64).to(torch.float32)``): a float beyond the type's range
    is +-inf, nan stays nan, others round to nearest; an integer wraps to the type's width (two's
    complement, as ``.to(torch.int32)`` does); a bool is itself. Float constants live in fp32
    tiles (on_chip_dtype) whatever their IR dtype, because that is where Inductor computes them
    (eager's opmath: ``fp16 * 1e6`` multiplies by 1e6 in fp32, then rounds the product).
    """
    return scalar_as(value, DTYPES[dtype])


@dataclass(frozen=True)
class Access:
    """One load or store in the canonical iteration space (element strides, may be 0)."""

    buffer: str
    dtype: str
    strides: tuple[int, ...]
    offset: int
    transposed: bool = False  # moved along the row dim (its contiguous one) and transposed on chip


@dataclass(frozen=True)
class Counting:
    """An index value (kernel_ir.IndexValue) in the canonical iteration space: offset + strides."""

    dtype: str
    strides: tuple[int, ...]
    offset: int


@dataclass(frozen=True)
class BufferLayout:
    name: str
    role: str  # "input", "output" (stored; may also be read: an in-place update)
    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int
    layout: str = "strided"  # graph buffers keep PyTorch's layout


@dataclass(frozen=True)
class ValueLayout:
    value: int
    dtype: str            # on-chip element type
    elems_per_stick: int  # 128 bytes / itemsize


@dataclass(frozen=True)
class LayoutPlan(Describable):
    ranges: tuple[int, ...]               # canonical iteration space, outermost first
    dim_map: tuple[tuple[int, ...], ...]  # for each canonical dim, the IR dims merged into it
    stick_dim: int | None                 # canonical dim along tile rows; None: one element per stick
    row_dim: int | None                   # canonical dim along tile columns of rows
    buffers: tuple[BufferLayout, ...]
    loads: tuple[tuple[int, Access], ...]  # (value position, access)
    stores: tuple[Access, ...]             # parallel to kernel.stores
    values: tuple[ValueLayout, ...]
    relayout: str = STICKS_MODE           # STICKS_MODE, TRANSPOSED_MODE or ELEMENTS_MODE
    reason: str = ""                      # why this relayout, for a person (the plan's summary)
    counts: tuple[tuple[int, Counting], ...] = ()  # (value position, index value)

    @property
    def numel(self) -> int:
        n = 1
        for r in self.ranges:
            n *= r
        return n

    def load(self, value: int) -> Access:
        return dict(self.loads)[value]

    def counting(self, value: int) -> Counting:
        return dict(self.counts)[value]

    def accesses(self) -> tuple[Access, ...]:
        return tuple(a for _, a in self.loads) + self.stores

    def value(self, position: int) -> ValueLayout:
        return self.values[position]


def buffers_of(kernel) -> tuple[BufferLayout, ...]:
    """The kernel's buffers as launch arguments: stored ones are outputs (an in-place update
    too), the rest inputs; PyTorch's strided layout kept (every family's launch spec)."""
    stored = set(kernel.outputs)
    return tuple(BufferLayout(b.name, "output" if b.name in stored else "input", b.dtype, tuple(b.shape),
                              tuple(b.strides), b.offset) for b in kernel.buffers)


def symbols_of(kernel) -> tuple[Symbol, ...]:
    """The program's placeholder symbols for the kernel's buffers, in buffers_of's order and roles."""
    return tuple(Symbol(b.name, b.role, b.dtype, b.shape, b.strides) for b in buffers_of(kernel))


def canonical_dims(ranges, accesses):
    """Drop extent-1 dims, merge neighbours walked contiguously by every access:
    (ranges, the IR dims merged into each, each access's strides on them)."""
    dims = [(r, [s[d] for s in accesses], (d,)) for d, r in enumerate(ranges) if r != 1]
    merged = []
    for r, strides, orig in dims:
        if merged:
            pr, pstrides, porig = merged[-1]
            if all(ps == s * r for ps, s in zip(pstrides, strides)):
                merged[-1] = (pr * r, strides, porig + orig)
                continue
        merged.append((r, strides, orig))
    if not merged:
        merged = [(1, [0] * len(accesses), ())]
    out_ranges = tuple(m[0] for m in merged)
    out_strides = [tuple(m[1][i] for m in merged) for i in range(len(accesses))]
    return out_ranges, tuple(m[2] for m in merged), out_strides


def plan_layout(kernel: PointwiseKernel) -> LayoutPlan:
    kernel.check()
    where = f"kernel {kernel.name!r}"
    for b in kernel.buffers:
        if b.dtype not in TILE_DTYPES:
            raise Unsupported(f"{where}: buffer {b.name!r} has dtype {b.dtype}, which the ISA has no type for")
    buffers = buffers_of(kernel)
    # Loads with the same buffer and index are one load (each input is read once).
    load_values = [(i, v) for i, v in enumerate(kernel.values) if isinstance(v, Load)]
    for i, v in load_values:
        if v.dtype != kernel.buffer(v.buffer).dtype:
            raise Unsupported(f"{where}: value {i} loads {v.buffer!r} as {v.dtype}, the buffer is "
                              f"{kernel.buffer(v.buffer).dtype}")
    index_values = [(i, v) for i, v in enumerate(kernel.values) if isinstance(v, IndexValue)]
    # Index values take part in merging dims: i1 of a (8, 64) kernel is not i of a flat 512.
    raw = ([v.index.strides for _, v in load_values] + [s.index.strides for s in kernel.stores]
           + [v.index.strides for _, v in index_values])
    ranges, dim_map, strides = canonical_dims(kernel.ranges, raw)
    if not any(all(st[d] >= 0 for st in strides) for d in range(len(ranges))):
        # every dim is walked backwards by some access and forwards by another (a 1-D flip): tile
        # rows move forward only, so a dim of one row is added and the others are loops
        ranges, dim_map, strides = ranges + (1,), dim_map + ((),), [tuple(st) + (0,) for st in strides]
    loads = tuple((i, Access(v.buffer, v.dtype, strides[k], v.index.offset)) for k, (i, v) in enumerate(load_values))
    stores = tuple(Access(s.buffer, kernel.buffer(s.buffer).dtype, strides[len(load_values) + k], s.index.offset)
                   for k, s in enumerate(kernel.stores))
    first = len(load_values) + len(kernel.stores)
    counts = tuple((i, Counting(v.dtype, strides[first + k], v.index.offset)) for k, (i, v) in enumerate(index_values))
    _check_stores(where, kernel, ranges, loads, stores)
    choice = _choose_dims(where, ranges, loads, stores)
    loads = tuple((i, _marked(a, choice)) for i, a in loads)
    stores = tuple(_marked(a, choice) for a in stores)
    values = tuple(_value_layout(where, i, v, kernel) for i, v in enumerate(kernel.values))
    return LayoutPlan(ranges, dim_map, choice.stick_dim, choice.row_dim, tuple(buffers), loads, stores, values,
                      choice.relayout, choice.reason, counts)


def _check_stores(where, kernel, ranges, loads, stores) -> None:
    for st in stores:
        if any(s == 0 and r > 1 for s, r in zip(st.strides, ranges)):
            raise Unsupported(f"{where}: the store to {st.buffer!r} writes one element from several iterations")
    # An in-place update is safe only if every iteration reads exactly what it writes.
    for st in stores:
        for _, ld in loads:
            if ld.buffer == st.buffer and (ld.strides, ld.offset) != (st.strides, st.offset):
                raise Unsupported(f"{where}: {st.buffer!r} is read and written at different indices")


@dataclass(frozen=True)
class _Choice:
    stick_dim: int | None
    row_dim: int | None
    relayout: str
    reason: str


def _marked(access: Access, choice: _Choice) -> Access:
    if choice.relayout != TRANSPOSED_MODE or not _is_transposed(access, choice.stick_dim, choice.row_dim):
        return access
    return replace(access, transposed=True)


def _is_transposed(access: Access, sd: int, rd: int) -> bool:
    # a negative stick-dim stride (a flip) would walk the staging rows backwards: no pair takes it
    return access.strides[sd] > 1 and access.strides[rd] == 1


def _choose_dims(where, ranges, loads, stores) -> _Choice:
    accesses = [a for _, a in loads] + list(stores)
    names = [f"the load of {a.buffer!r}" for _, a in loads] + [f"the store to {a.buffer!r}" for a in stores]

    def row_dim_besides(sd):
        for d in reversed(range(len(ranges))):
            if d != sd and all(a.strides[d] >= 0 for a in accesses):
                return d
        return None

    for d in reversed(range(len(ranges))):
        col = [a.strides[d] for a in accesses]
        if all(s in (0, 1) for s in col) and any(s == 1 for s in col):
            rd = row_dim_besides(d)
            better = _broadcast_row_dim(ranges, accesses, d, rd)
            if better is not None:
                return _Choice(d, better, STICKS_MODE,
                               f"every access walks dim {d} with stride 0 or 1; rows along dim {better}, not "
                               f"dim {rd}: an operand broadcast over dim {better} is then loaded once per tile "
                               f"of rows instead of once per step of a loop around the tiles")
            return _Choice(d, rd, STICKS_MODE, f"every access walks dim {d} with stride 0 or 1")
    transposed = _transposed_pair(ranges, accesses)
    if transposed is not None:
        sd, rd, moved = transposed
        which = ", ".join(names[k] for k in sorted(moved))
        direct = ", ".join(n for k, n in enumerate(names) if k not in moved) or "none"
        return _Choice(sd, rd, TRANSPOSED_MODE,
                       f"no dim is walked with stride 0 or 1 by every access: the stick dim is dim {sd} "
                       f"(walked contiguously by {direct}), the row dim dim {rd}; {which} walk(s) dim {rd} "
                       f"contiguously and move(s) as rows of whole sticks along it, transposed on chip")
    rd = row_dim_besides(None)
    if rd is None:
        raise Unsupported(f"{where}: no iteration dim is walked with non-negative strides by every access")
    return _Choice(None, rd, ELEMENTS_MODE,
                   "no pair of dims lets every access move whole sticks (directly or transposed on chip): "
                   "one element per stick, every stick moved charged")


def _broadcast_row_dim(ranges, accesses, sd, rd) -> int | None:
    """A row dim that moves clearly fewer bytes than `rd`, or None. The dims other than the stick
    and row dims are loops around the tiles, and an operand broadcast over a loop dim (stride 0:
    a rotary table over heads, a bias over the batch) is loaded again in every step of it; along
    the row dim it is loaded once per tile. So the rows go along the dim whose broadcasts cost
    the most (by bytes moved, a loop-step count; ties keep the innermost dim)."""
    if rd is None:
        return None

    def moved(r) -> int:
        total = 0
        for a in accesses:
            n = ITEMSIZE[a.dtype]
            for d, (e, s) in enumerate(zip(ranges, a.strides)):
                if s != 0 or (d not in (sd, r)):
                    n *= e
            total += n
        return total

    base = moved(rd)
    options = [(moved(d), -d, d) for d in range(len(ranges))
               if d not in (sd, rd) and ranges[d] > 1 and all(a.strides[d] >= 0 for a in accesses)]
    if not options:
        return None
    best, _, d = min(options)
    return d if best < base * 0.9 else None


def _transposed_pair(ranges, accesses):
    """(stick dim, row dim, transposed accesses) of the pair transposing the fewest bytes per
    element: every access walks the stick dim with stride 0 or 1 (moved directly) or the row
    dim with stride 1 (moved transposed); the row dim's strides are non-negative (rows move
    forward). None if no pair works. Ties go to the later dims, as for the sticks relayout."""
    best = None
    for sd in reversed(range(len(ranges))):
        if ranges[sd] < 2:
            continue
        for rd in reversed(range(len(ranges))):
            if rd == sd or ranges[rd] < 2 or any(a.strides[rd] < 0 for a in accesses):
                continue
            moved = frozenset(k for k, a in enumerate(accesses) if _is_transposed(a, sd, rd))
            if any(k not in moved and a.strides[sd] not in (0, 1) for k, a in enumerate(accesses)):
                continue
            if not any(a.strides[sd] == 1 for a in accesses):
                continue
            cost = sum(ITEMSIZE[accesses[k].dtype] for k in moved)
            if best is None or cost < best[0]:
                best = (cost, sd, rd, moved)
    return None if best is None else best[1:]


def value_dtype(where, i, v) -> str:
    """The tile dtype of IR value `v` at position `i`: a load's own, a Cast to a narrow float's
    (the Cast is the rounding point: keep the narrow type), else the computed one (on_chip_dtype)."""
    if isinstance(v, Load):
        return v.dtype
    if isinstance(v, Cast) and v.dtype in ("fp16", "bf16"):
        return v.dtype
    return on_chip_dtype(v.dtype, f"{where} value {i}")


def _value_layout(where, i, v, kernel) -> ValueLayout:
    dtype = value_dtype(where, i, v)
    if dtype not in ITEMSIZE:
        raise Unsupported(f"{where} value {i}: dtype {dtype} has no spyre tile type")
    return ValueLayout(i, dtype, STICK // ITEMSIZE[dtype])


__all__ = ["Access", "BufferLayout", "Counting", "ELEMENTS_MODE", "LayoutPlan", "STICKS_MODE", "TRANSPOSED_MODE",
           "ValueLayout", "canonical_dims", "on_chip_dtype", "operand_value", "plan_layout", "value_dtype"]
