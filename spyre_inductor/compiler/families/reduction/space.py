"""A reduction kernel's canonical iteration space, the space of each value, and how each access moves.

The canonical iteration space of a reduction kernel is (outer dims..., r):
the outer ranges are canonicalized as in core/layout.py (extent-1 dims dropped,
neighbours walked contiguously merged), and so are the reduction ranges:
the innermost merged reduced dim is r, of extent K; any others (a sum over
dims 0 and 2, BatchNorm's statistics over N, H, W) are *looped*: only the
chunked mode takes them, as counted loops around each pass's chunks, so the
accumulators see every (looped index, chunk) in row-major order.

A tile covers G consecutive elements of the innermost outer dim (the tile
rows, axis ``outer``) times Kc elements of r (the tile columns, axis
``reduced``): the ISA reduces along a tile row. A value's space is the set
of those axes it varies over:

* FULL {outer, reduced}: [G, Kc] (loads that walk both, what is computed from them);
* PER_ROW {outer}: [G, 1], one stick per row (reduction results, loads with
  stride 0 on r), broadcast along the row into full-space work;
* ALONG_REDUCED {reduced}: [1, Kc] (e.g. layer_norm's weight), broadcast over the rows;
* SCALAR {}: constants, one stick.

A load whose r stride is not 1 (the reduced dim is not the contiguous one,
e.g. a sum over dim 0) is *transposed*: it loads [Kc, G] rows along o (o
must be contiguous) and the load/store unit transposes it on chip into the
[G, Kc] tile, so the reduction is still a row reduction; full-space stores
of such a kernel transpose back. A load that walks neither r nor o
contiguously (an operand transposed in another pair of dims), and an
ALONG_REDUCED load whose r is strided, is *gathered*: each tile row's Kc
elements are loaded one per stick into a [Kc, 1] column and transposed
into the row (a store the other way round: scattered). That moves a whole
stick per element (charged as such) but stays on the card. The on-chip
tiles these relayouts pass through are STAGING tiles of the lowering.

Column tiles (a lowering with ``columns``, axes ``COLUMN_AXES``): when the
reduced dim is not the contiguous one but the innermost outer dim is (a
softmax over dim 0), the tiles may instead keep device memory's orientation:
a full tile is [Kc, G], Kc rows of G consecutive outer elements, loaded and
stored as they lie (no transposes, which run on the load/store unit at the
on-chip transpose rate); a per-row value is one packed row [1, G] (its loads
and stores move packed sticks as they are), an along-reduced one a [Kc, 1]
column (one element per stick). A reduction then runs over the tile's rows:
the sfp folds the rows pairwise (half of them with the other half, then
half of what is left...) in a SCRATCH tile, the same sticks through the sfp
as a row reduction of the transposed tile.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...ir.errors import Unsupported
from ...ir.kernel_ir import IndexValue, Load, ReductionKernel
from ...core.layout import canonical_dims
from ...core.tiles import space

OUTER, REDUCED = "outer", "reduced"
AXES = (OUTER, REDUCED)          # tile rows along the outer dim, sticks along the reduced one
COLUMN_AXES = (REDUCED, OUTER)   # column tiles: rows along the reduced dim, sticks along the outer one
FULL = space(OUTER, REDUCED)
PER_ROW = space(OUTER)
ALONG_REDUCED = space(REDUCED)
SCALAR = space()


@dataclass(frozen=True)
class Access:
    """A load or store: element index = offset + sum(outer_strides * i_outer) + r_stride * i_r.
    An index value (kernel_ir.IndexValue) is an access without a buffer: its tile holds the element
    indices themselves, computed in place of a load (an iota), in any orientation (no relayout)."""

    buffer: str | None
    dtype: str
    outer_strides: tuple[int, ...]
    r_stride: int
    offset: int
    transposed: bool = False  # a full-space access whose r is not contiguous: moved as [Kc, G] and transposed
    gathered: bool = False    # r strided and no contiguous o: one element per stick, rows transposed
    looped_strides: tuple[int, ...] = ()  # per looped reduced dim (ReductionLowering.looped)

    @property
    def o_contiguous(self) -> bool:
        """Walks the innermost outer dim contiguously (a per-row value moves as one packed row)."""
        return bool(self.outer_strides) and self.outer_strides[-1] == 1


def join(spaces) -> frozenset[str]:
    """The space of a value computed from values of these spaces: every axis any of them varies over."""
    return frozenset().union(*spaces)


def space_of(outer_strides, r_stride, K, one_row=False) -> frozenset[str]:
    # one_row: the kernel has a single row (a full reduction) and stores full-space values
    # (x.sum() and x - x.amax() in one kernel): what varies over r is a [1, K] full tile.
    on_o = any(outer_strides) or (one_row and r_stride != 0)
    # a reduced dim of extent 1: every load that varies over the outer dims is a [G, 1] full tile
    on_r = r_stride != 0 or (K == 1 and on_o)
    return frozenset(a for a, on in ((OUTER, on_o), (REDUCED, on_r)) if on)


def load_relayout(value_space, outer_strides, r_stride, K) -> tuple[bool, bool]:
    """(transposed, gathered) of a load of this space and walk (module docstring)."""
    tr = value_space == FULL and r_stride != 1 and K > 1
    gathered = value_space == ALONG_REDUCED and r_stride not in (0, 1) and K > 1
    if tr and (not outer_strides or outer_strides[-1] != 1):  # neither r nor o contiguous
        tr, gathered = False, True
    return tr, gathered


def store_relayout(outer_strides, r_stride, K) -> tuple[bool, bool]:
    """(transposed, scattered) of a full-space store of this walk."""
    tr = r_stride != 1 and K > 1
    scattered = tr and (not outer_strides or outer_strides[-1] != 1)  # neither dim contiguous
    return tr and not scattered, scattered


def canonical(kernel: ReductionKernel):
    """(outer ranges, outer map, K, per access (outer strides, r stride), looped extents, per
    access looped strides), accesses being the loads then the stores."""
    n = len(kernel.ranges)
    loads = [v for v in kernel.values if isinstance(v, (Load, IndexValue))]
    raw = [v.index.strides for v in loads] + [s.index.strides for s in kernel.stores]
    outer, outer_map, o_strides = canonical_dims(kernel.ranges, [s[:n] for s in raw])
    red, _, r_strides = canonical_dims(kernel.reduction_ranges, [s[n:] for s in raw])
    return (outer, outer_map, red[-1], [(o, r[-1]) for o, r in zip(o_strides, r_strides)], tuple(red[:-1]),
            [tuple(r[:-1]) for r in r_strides])


def loads_and_stores(kernel: ReductionKernel) -> list[str]:
    """Names of the accesses in canonical()'s order: loads, then stores."""
    return ([f"the load of {v.buffer!r}" if isinstance(v, Load) else "an index value"
             for v in kernel.values if isinstance(v, (Load, IndexValue))]
            + [f"the store to {s.buffer!r}" for s in kernel.stores])


def check_walks(kernel: ReductionKernel, mode: str, accesses, looped, looped_strides) -> None:
    """Refuse (Unsupported) the iteration spaces and walks no reduction tile can move."""
    where = f"kernel {kernel.name!r}"
    if looped and mode != "chunked":
        raise Unsupported(f"{where}: reduced dims {kernel.reduction_ranges} do not merge into one contiguously "
                          f"walked dim: only a chunked plan loops over the others")
    if looped and kernel.has_scan:
        raise Unsupported(f"{where}: a scan over reduced dims {kernel.reduction_ranges} that do not merge")
    names = loads_and_stores(kernel)
    counted = [isinstance(v, IndexValue) for v in kernel.values if isinstance(v, (Load, IndexValue))]
    for k, (os_, rs) in enumerate(accesses):
        if k < len(counted) and counted[k]:
            continue  # an index value, computed in place: any walk, even backwards (a causal mask's j - i)
        if rs < 0 or any(s < 0 for s in os_ + looped_strides[k]):
            raise Unsupported(f"{where}: {names[k]} walks its buffer backwards (a negative stride, e.g. a flip); "
                              f"reduction tiles move forward rows")
        if rs == 0 and any(looped_strides[k]):
            raise Unsupported(f"{where}: {names[k]} varies over a looped reduced dim but not over the chunked one")


__all__ = ["ALONG_REDUCED", "AXES", "Access", "COLUMN_AXES", "FULL", "OUTER", "PER_ROW", "REDUCED", "SCALAR",
           "canonical", "check_walks", "join", "load_relayout", "loads_and_stores", "space_of", "store_relayout"]
