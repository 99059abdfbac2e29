"""The tile kernel: the one representation between a kernel family's lowering and a program.

Every kernel family (pointwise, reduction/scan, matmul, and the ones after
them) lowers its kernel IR into a ``TileKernel``; everything after that
(scratchpad allocation with live ranges, the verifier, core division and
the candidate search, emission, the plan summary) reads this and nothing
family-specific. No meaning travels in names: what a tile is for is its
``Role``, what it varies over is its ``space``, what it stands in for is
``of``.

A tile's **space** is the set of tile axes its value varies over. The axes
are the family's (pointwise: ``rows`` and ``sticks``; a reduction: ``outer``
and ``reduced``; a matmul: ``m``, ``n`` and ``k``), and every shape a
value takes is just a set of them: a full tile varies over all, a broadcast
row over the stick axis only, a per-row reduction result over the outer
axis only, a scalar over none. The tile's storage and the ISA broadcast it
is read with follow from the space (``broadcast_of``).

Steps read and write tiles by name; they are grouped into **phases**: the
work once per core before any group (``setup``: loads of what no group
changes), once per group of rows before the stream (``init``: accumulator
fills), per chunk of the stream (``chunk``), and after it (``epilogue``).
An optional **combine** merges per-core partial tiles across cores (a ring
reduction, a scan's running prefix).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Mapping

from spyre_runtime.program.operands import ITEMSIZE, sticks

from ._dump import Describable


class Role(str, enum.Enum):
    INPUT = "input"                # filled from device memory by the load/store unit
    OUTPUT = "output"              # written on chip, drained to device memory
    ACCUMULATOR = "accumulator"    # survives the chunks of its group (a reduction's partial, a matmul's sum)
    CARRY = "carry"                # a scan's running prefix from one chunk to the next
    RING_LANDING = "ring landing"  # where a neighbour core's partial of tile `of` lands
    STAGING = "staging"            # tile `of` in another on-chip layout (see Relayout)
    TEMPORARY = "temporary"        # a work value inside one phase
    CONSTANT = "constant"          # filled once per core
    CHUNK_CONSTANT = "chunk constant"  # a constant that depends on the chunk's extent (ChunkValue)
    SCRATCH = "scratch"            # work space steps use inside themselves (a reduction over tile rows folds there)

    def __str__(self) -> str:
        return self.value


class Relayout(str, enum.Enum):
    """How a staging tile differs from the tile it stands in for."""

    TRANSPOSED = "transposed"  # moved with its axes swapped, transposed on chip
    GATHERED = "gathered"      # moved one element per stick into a column, then transposed
    ROW = "row"                # a column of per-row values packed into one row of sticks

    def __str__(self) -> str:
        return self.value


class ChunkValue(str, enum.Enum):
    """The value of a CHUNK_CONSTANT tile, resolved for each chunk extent n the program has."""

    EXTENT = "n"              # n, fp32
    EXTENT_INT = "n (int32)"  # n, int32

    def __str__(self) -> str:
        return self.value

    def at(self, n: int):
        return {ChunkValue.EXTENT: float(n), ChunkValue.EXTENT_INT: int(n)}[self]

    @property
    def dtype(self) -> str:
        return "int32" if self is ChunkValue.EXTENT_INT else "fp32"


def space(*axes: str) -> frozenset[str]:
    return frozenset(axes)


@dataclass(frozen=True)
class Tile:
    name: str
    dtype: str
    space: frozenset[str]
    role: Role
    of: str | None = None               # RING_LANDING / STAGING: the tile this one serves
    relayout: Relayout | None = None    # STAGING: how it differs from `of`
    chunk_value: ChunkValue | None = None  # CHUNK_CONSTANT: what it holds

    def __post_init__(self):
        if (self.of is None) != (self.role not in (Role.RING_LANDING, Role.STAGING)):
            raise ValueError(f"tile {self.name!r}: role {self.role} {'needs' if self.of is None else 'has no'} "
                             f"tile it serves (of={self.of!r})")
        if (self.relayout is None) != (self.role is not Role.STAGING):
            raise ValueError(f"tile {self.name!r}: only a staging tile has a relayout")
        if (self.chunk_value is None) != (self.role is not Role.CHUNK_CONSTANT):
            raise ValueError(f"tile {self.name!r}: only a chunk constant has a chunk value")

    def varies(self, axis: str) -> bool:
        return axis in self.space


def broadcast_of(tile_space: frozenset[str], row_axis: str | None, stick_axis: str | None) -> str:
    """The ISA broadcast of a tile read as a [row_axis, stick_axis] tile (isa.Tile.broadcast):
    a value that does not vary over an axis is stored once along it and broadcast."""
    on_rows = row_axis is not None and row_axis in tile_space
    on_sticks = stick_axis is not None and stick_axis in tile_space
    if stick_axis is None:  # a column tile: one element per stick
        return "none" if on_rows else "rows"
    return {(True, True): "none", (False, True): "rows", (True, False): "cols", (False, False): "scalar"}[
        (on_rows, on_sticks)]


def tile_extent(tile_space: frozenset[str], row_axis: str | None, stick_axis: str | None,
                extent: Mapping[str, int]) -> tuple[int, int]:
    """(rows, elements per row) of a tile of `tile_space` laid out as [row_axis, stick_axis] at
    these axis extents: an axis the tile does not vary over has extent 1."""
    rows = extent[row_axis] if row_axis is not None and row_axis in tile_space else 1
    cols = extent[stick_axis] if stick_axis is not None and stick_axis in tile_space else 1
    return rows, cols


def tile_geometry(t: Tile, row_axis: str | None, stick_axis: str | None,
                  extent: Mapping[str, int]) -> tuple[int, int]:
    """(stored rows, row stride in bytes) of tile `t` laid out as [row_axis, stick_axis] rows at
    these axis extents. The orientation is an argument because a space only says which axes a
    tile varies over, not which one runs along its sticks (a reduction's column tiles turn its
    axes round, a matmul's B tile is [k, n] where A's is [m, k]). An axis the tile does not vary
    over has extent 1 (tile_extent), each row is padded to whole sticks, and a STAGING tile is the
    tile it serves with the axes swapped (a transposed move's rows, a gathered column, a packed row)."""
    rows, cols = tile_extent(t.space, row_axis, stick_axis, extent)
    if t.role is Role.STAGING:
        rows, cols = cols, rows
    return rows, sticks(cols * ITEMSIZE[t.dtype])


@dataclass(frozen=True)
class Step:
    """One instruction's worth of work: `op` of `args` into `dst` (tiles by name).

    kind: unary, binary, select (args: cond, a, b), fill (value), reduce (along the stick
    axis; accumulate into dst), scan (args: src[, carry]), matmul (args: a, b; accumulate),
    transpose (args: src), random (a philox draw, op its mode; args: key, counter).
    """

    kind: str
    op: str
    dst: str
    args: tuple[str, ...] = ()
    value: object = None
    accumulate: bool = False


class PhaseKind(str, enum.Enum):
    SETUP = "setup"        # once per core, before any group (loads of what no group changes: a weight row, a scalar)
    INIT = "init"          # once per group, before its chunks (accumulator and carry fills)
    CHUNK = "chunk"        # per chunk of the stream
    EPILOGUE = "epilogue"  # once per group, after its chunks

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Phase:
    kind: PhaseKind
    steps: tuple[Step, ...]
    loads: tuple[tuple[str, object], ...] = ()   # (tile, the family's access) moved in before the steps
    stores: tuple[tuple[str, object], ...] = ()  # (tile, access) moved out after them
    reason: str = ""                              # why this phase exists (e.g. "the sum needs the max")


def live_ranges(steps) -> dict[str, tuple[int, int]]:
    """(first, last) step of every tile a step writes: from the first step that writes it to the
    last that reads it (its own writing step if none reads it), steps numbered from 0 in order.
    A family numbers its steps however it allocates (one phase, or every phase in turn)."""
    first, last = {}, {}
    for k, st in enumerate(steps):
        for a in st.args:
            last[a] = k
        first.setdefault(st.dst, k)
        last.setdefault(st.dst, k)
    return {n: (f, max(last[n], f)) for n, f in first.items()}


@dataclass(frozen=True)
class Combine:
    """Partial tiles merged across cores: each core receives its neighbour's `tiles` into their
    RING_LANDING tiles and runs `steps` (own = combine(landed, own))."""

    kind: str                      # "ring"
    tiles: tuple[str, ...]
    steps: tuple[Step, ...]


@dataclass(frozen=True)
class TileKernel(Describable):
    family: str                              # pointwise, reduction, matmul, ...
    axes: tuple[str, ...]                    # the tile axes, outermost first
    tiles: tuple[Tile, ...]
    constants: tuple[tuple[str, object], ...]  # (CONSTANT tile, value) filled once per core
    phases: tuple[Phase, ...]
    combine: Combine | None = None
    notes: tuple[str, ...] = field(default=())  # a person's view of family decisions

    def tile(self, name: str) -> Tile:
        for t in self.tiles:
            if t.name == name:
                return t
        raise KeyError(f"tile kernel has no tile {name!r}")

    @property
    def full(self) -> frozenset[str]:
        """The space of a tile that varies over every axis."""
        return frozenset(self.axes)

    def phase(self, kind: PhaseKind) -> Phase:
        """The one phase of `kind` (KeyError if there is none or several)."""
        found = [p for p in self.phases if p.kind is kind]
        if len(found) != 1:
            raise KeyError(f"{self.family} tile kernel has {len(found)} {kind} phases, not one")
        return found[0]

    def with_role(self, role: Role) -> tuple[Tile, ...]:
        return tuple(t for t in self.tiles if t.role is role)

    def serving(self, name: str, role: Role) -> tuple[Tile, ...]:
        """The staging or landing tiles that serve tile `name`."""
        return tuple(t for t in self.tiles if t.of == name and t.role is role)

    def check(self) -> None:
        """Every name a step, phase or combine uses is a tile; a planner bug raises here."""
        from ..ir.errors import PlanError

        names = {t.name for t in self.tiles}
        if len(names) != len(self.tiles):
            raise PlanError(f"{self.family} tile kernel: duplicate tile names")
        for t in self.tiles:
            if t.of is not None and t.of not in names:
                raise PlanError(f"{self.family} tile kernel: {t.name!r} serves unknown tile {t.of!r}")
            if not t.space <= set(self.axes):
                raise PlanError(f"{self.family} tile kernel: {t.name!r} varies over {sorted(t.space)}, "
                                f"not axes of {self.axes}")
        steps = [s for p in self.phases for s in p.steps] + list(self.combine.steps if self.combine else ())
        for s in steps:
            for n in (s.dst,) + s.args:
                if n not in names:
                    raise PlanError(f"{self.family} tile kernel: step {s.kind} {s.op} uses unknown tile {n!r}")
        for p in self.phases:
            for n, _ in p.loads + p.stores:
                if n not in names:
                    raise PlanError(f"{self.family} tile kernel: {p.kind} phase moves unknown tile {n!r}")


__all__ = ["ChunkValue", "Combine", "Phase", "PhaseKind", "Relayout", "Role", "Step", "Tile", "TileKernel",
           "broadcast_of", "live_ranges", "space", "tile_extent", "tile_geometry"]
