"""Reduction lowering: a kernel with reductions or scans -> a TileKernel (family "reduction").

The tile axes are ``outer`` (G consecutive elements of the innermost outer
dim: the tile rows) and ``reduced`` (Kc elements of the reduced dim: the
tile columns); space.py has the canonical iteration space, the
space of each value and how each access moves, steps.py the tile
and steps of each value, welford.py, argreduce.py and scan.py the forms of
those reductions and of scans.

Three modes (the planner picks; see division.py):

* "resident": Kc = K. A group's rows are loaded once and every step runs
  from scratchpad, in IR order: one CHUNK phase (a chunk is a whole group)
  with the group's loads, every step, and its stores. Reductions write
  their per-row tiles directly and welford is the corrected two-pass form.
* "chunked": the rows do not fit, so r is cut into chunks of Kc and each
  reduction accumulates over the chunks. A reduction whose argument needs
  another reduction's result (softmax's sum needs the max) cannot start
  before that one is complete, so the chunks are streamed from device
  memory once per *level*: pass p computes the reductions of level p, and
  the full-space stores come in the pass after the reductions they need.
  Each pass is three phases: INIT (its accumulator and carry fills; the
  first also loads the group's per-row inputs and computes what follows
  from them), CHUNK (per chunk: loads, steps, stores) and EPILOGUE (the
  per-row values computed from its results; the last pass's epilogue is
  the kernel's per-row epilogue and its per-row stores). Each CHUNK phase
  says why its pass exists (``reason``).
* "ring": like "chunked" with one pass, on a core's slice of r; the partial
  accumulators are then combined core to core over the ring (the tile
  kernel's ``Combine``: each accumulator has a RING_LANDING tile the
  neighbour's partial lands in) before the last epilogue. A kernel of
  scans keeps each core's slice resident instead (scan.py).

A SETUP phase, when there is one, loads once per core what no group
changes (a layer norm's weight row when rows are resident, a scalar).

``columns`` (resident and chunked): column tiles (space.py), for a
kernel whose reduced dim is not the contiguous one: the tile kernel's axes
are ``COLUMN_AXES`` (rows along the reduced dim), nothing is transposed on
chip, and each reduction folds its tile's rows (steps.py). The
planner times both orientations; a kernel the column tiles cannot move
raises Unsupported for that orientation only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

from ...ir.errors import Unsupported
from ...ir.kernel_ir import (Cast, Constant, Index, IndexValue, Load, Op, PointwiseKernel, Reduction,
    ReductionKernel, Scan, SizeValue)
from ...core._dump import Describable, plain
from ...core.layout import TILE_DTYPES
from ...core.reduction_ops import IDENTITY, op_of
from .scan import ring_phases, scan
from .space import AXES, COLUMN_AXES, canonical, check_walks
from .steps import StepBuilder, fold_copies
from .welford import exact
from ...core.tiles import Combine, Phase, PhaseKind, Role, Tile, TileKernel

MODES = ("resident", "chunked", "ring")


@dataclass(frozen=True)
class Pass:
    """One pass over the rows in device memory: its phases (init/epilogue None where the mode has none)."""

    init: Phase | None
    chunk: Phase
    epilogue: Phase | None


@dataclass(frozen=True)
class ReductionLowering(Describable):
    mode: str
    outer: tuple[int, ...]          # canonical outer ranges (at least one; (1,) for a full reduction)
    outer_map: tuple[tuple[int, ...], ...]
    K: int
    looped: tuple[int, ...]         # extents of the looped reduced dims (chunked)
    transposed: bool                # some full-space access moves transposed
    tile_kernel: TileKernel
    columns: bool = False           # column tiles: rows along the reduced dim (module docstring)

    def describe(self) -> dict:  # the tile kernel is described by the Plans it belongs to
        return {k: plain(getattr(self, k))
                for k in ("mode", "outer", "outer_map", "K", "looped", "transposed", "columns")}

    @property
    def outer_sticks(self) -> bool:
        """The innermost outer dim runs along the tiles' sticks (transposed moves, or column
        tiles): groups are whole sticks of it, so no two cores move one stick."""
        return self.transposed or self.columns

    def tile(self, name: str) -> Tile:
        return self.tile_kernel.tile(name)

    @property
    def setup(self) -> Phase | None:
        return next((p for p in self.tile_kernel.phases if p.kind is PhaseKind.SETUP), None)

    @property
    def passes(self) -> tuple[Pass, ...]:
        out, init, phases = [], None, self.tile_kernel.phases
        for k, p in enumerate(phases):
            if p.kind is PhaseKind.INIT:
                init = p
            elif p.kind is PhaseKind.CHUNK:
                nxt = phases[k + 1] if k + 1 < len(phases) else None
                out.append(Pass(init, p, nxt if nxt is not None and nxt.kind is PhaseKind.EPILOGUE else None))
                init = None
        return tuple(out)

    @cached_property
    def moved_per_chunk(self) -> frozenset[str]:
        """Tiles moved between device memory and scratchpad in a CHUNK phase, and the staging
        tiles their moves pass through: what a plan streams through its buffers."""
        moved = {t for p in self.tile_kernel.phases if p.kind is PhaseKind.CHUNK for t, _ in p.loads + p.stores}
        return frozenset(moved | {t.name for t in self.tile_kernel.with_role(Role.STAGING) if t.of in moved})

    @property
    def combine(self) -> Combine | None:
        return self.tile_kernel.combine

    @property
    def ring_scan(self) -> bool:
        """A ring plan of scans: each core's slice resident, running prefixes over the ring."""
        c = self.combine
        return c is not None and any(self.tile(t).role is Role.CARRY for t in c.tiles)


def empty_as_pointwise(kernel: ReductionKernel) -> PointwiseKernel:
    """K == 0: every reduction is its identity (sum 0, prod 1, any False, all True; welford nan/0):
    a pointwise kernel over the outer ranges."""
    n = len(kernel.ranges)
    values = []
    for v in kernel.values:
        if isinstance(v, Reduction):
            if v.op in ("max", "min", "argmax", "argmin"):
                raise Unsupported(f"kernel {kernel.name!r}: {v.op} over an empty dim has no identity")
            ident = {"welford_mean": float("nan"), "welford_m2": float("nan"), "welford_weight": 0.0}.get(
                v.op, IDENTITY.get(op_of(v.op)))
            values.append(Constant(ident, v.dtype))
        elif isinstance(v, (Load, IndexValue)):
            values.append(replace(v, index=Index(v.index.strides[:n], v.index.offset)))
        else:
            values.append(v)
    stores = tuple(replace(s, index=Index(s.index.strides[:n], s.index.offset)) for s in kernel.stores)
    return PointwiseKernel(kernel.name, kernel.ranges, kernel.buffers, tuple(values), stores)


def lower(kernel: ReductionKernel, mode: str, columns: bool = False) -> ReductionLowering:
    if mode not in MODES:
        raise ValueError(f"reduction mode {mode!r} is not one of {MODES}")
    if columns and (mode == "ring" or kernel.has_scan):
        raise Unsupported(f"kernel {kernel.name!r}: column tiles are for resident and chunked reductions "
                          f"without scans")
    if mode == "resident":
        kernel = exact(kernel)
    outer, outer_map, K, accesses, looped, looped_strides = canonical(kernel)
    for b in kernel.buffers:
        if b.dtype not in TILE_DTYPES:
            raise Unsupported(f"kernel {kernel.name!r}: buffer {b.name!r} has dtype {b.dtype}")
    check_walks(kernel, mode, accesses, looped, looped_strides)
    n_loads = sum(isinstance(v, (Load, IndexValue)) for v in kernel.values)
    # a scan's values are full-space even when nothing full-space is stored (cumsum(x).sum())
    one_row = all(d == 1 for d in outer) and (any(rs for _, rs in accesses[n_loads:]) or kernel.has_scan)
    if columns and one_row:
        raise Unsupported(f"kernel {kernel.name!r}: column tiles: a full reduction has no outer dim to lay "
                          f"along sticks")
    b = StepBuilder(kernel, mode, outer, K, looped, one_row, columns)
    load_k = 0
    for i, v in enumerate(kernel.values):
        if isinstance(v, (Load, IndexValue)):
            os_, rs = accesses[load_k]
            b.load(i, v, os_, rs, looped_strides[load_k])
            load_k += 1
        elif isinstance(v, Constant):
            b.constant(i, v)
        elif isinstance(v, SizeValue):
            b.size(i, v)
        elif isinstance(v, Cast):
            b.cast(i, v)
        elif isinstance(v, Op):
            b.op(i, v)
        elif isinstance(v, Reduction):
            b.reduction(i, v)
        elif isinstance(v, Scan):
            scan(b, i, v)
    for k, s in enumerate(kernel.stores):
        os_, rs = accesses[n_loads + k]
        b.store(s, os_, rs, looped_strides[n_loads + k])
    if columns and not b.would_transpose:
        raise Unsupported(f"kernel {kernel.name!r}: column tiles: the reduced dim is the contiguous one (row "
                          f"tiles move it as it lies)")
    return _assemble(b, outer_map)


def _assemble(b: StepBuilder, outer_map) -> ReductionLowering:
    combine = None
    if b.mode == "ring" and b.scan_init:
        phases, combine = ring_phases(b)
    elif b.mode == "resident":
        phases = (Phase(PhaseKind.CHUNK, tuple(fold_copies(b.resident_steps, b.tiles)),
                        loads=tuple(b.group_loads) + tuple(b.f_loads.values()),
                        stores=tuple((t, a) for t, a, _ in b.f_stores) + tuple(b.outer_stores),
                        reason="rows resident: loaded once, every reduction and the epilogue from scratchpad"),)
    else:
        phases = _passes(b)
        if b.mode == "ring":
            combine = Combine("ring", tuple(b.accs), tuple(b.red_combine))
    setup = ()
    if b.once_loads:
        setup = (Phase(PhaseKind.SETUP, (), loads=tuple(b.once_loads),
                       reason="once per core: the loads no group changes"),)
    tiles = _used(b.tiles.values(), tuple(b.constants), setup + tuple(phases), combine)
    notes = [f"{b.mode}: outer {list(b.outer)}, reduced extent {b.K}"]
    if b.looped:
        notes.append(f"looped over reduced dims {list(b.looped)} around each pass's chunks")
    if b.transposed:
        notes.append("transposed moves: the reduced dim is not the contiguous one")
    if b.columns:
        notes.append("column tiles: rows along the reduced dim, moved as they lie; reductions fold the rows")
    tk = TileKernel("reduction", COLUMN_AXES if b.columns else AXES, tiles, tuple(b.constants),
                    setup + tuple(phases), combine, tuple(notes))
    tk.check()
    return ReductionLowering(b.mode, b.outer, outer_map, b.K, b.looped, b.transposed, tk, b.columns)


def _used(tiles, constants, phases, combine) -> tuple[Tile, ...]:
    """The tiles a step, a move, a constant fill or the combine uses, the staging tiles that
    serve them, and the temporaries of values (a load no pass needs is never moved).

    A temporary nothing uses is the one a stored value's folded copy left behind: it is kept,
    and placed (at the first chunk step), as it was before the port. Dropping it frees its
    bytes, which lets the tile-size variants (tiling.TARGETS) keep bigger tiles, and two scan
    plans of the reduction benchmark got 0.6% slower that way: smaller target tiles first."""
    steps = [s for p in phases for s in p.steps] + list(combine.steps if combine else ())
    used = {n for s in steps for n in (s.dst,) + s.args} | {t for t, _ in constants}
    used |= {t for p in phases for t, _ in p.loads + p.stores} | set(combine.tiles if combine else ())
    return tuple(t for t in tiles if t.name in used or t.role is Role.TEMPORARY
                 or (t.role is Role.STAGING and t.of in used))


def _closure(b: StepBuilder, roots) -> list:
    """Values varying over the reduced dim (in IR order) the roots need within one chunk."""
    need, stack = set(), list(roots)
    while stack:
        v = stack.pop()
        if v in need:
            continue
        need.add(v)  # aliases (casts that change nothing) have no step but their deps count
        stack.extend(b.deps.get(v, ()))
    order = [k for k in list(b.f_loads) + list(b.defs) if k in need]
    seen, out = set(), []
    for k in sorted(order, key=lambda k: k if isinstance(k, int) else 10**9):
        if k not in seen:
            seen.add(k)
            out.append(k)
    return out


def _passes(b: StepBuilder) -> tuple[Phase, ...]:
    """Chunked and ring: one pass per level of reductions (module docstring), three phases each."""
    tiles = b.tiles
    levels = sorted({lv for lv, _ in b.red})
    store_pass = {key: b.depth[key] + 1 for _, _, key in b.f_stores}
    if not levels and not store_pass:  # every reduction was of a constant: nothing to stream
        raise Unsupported(f"{b.where}: nothing varies over the reduced dim: no {b.mode} plan")
    n = max(levels + list(store_pass.values()))
    passes = []  # (init, loads, steps, stores, post, reason) per pass
    for p in range(1, n + 1):
        reds = [i for lv, i in b.red if lv == p]
        roots = [b.kernel.values[i].arg for i in reds] + [k for k, sp in store_pass.items() if sp == p]
        vals = _closure(b, roots)
        loads = tuple(b.f_loads[v] for v in vals if v in b.f_loads)
        steps = [s for v in vals if v in b.defs for s in b.defs[v]]
        for i in reds:
            steps += b.red_chunk[i]
        steps = fold_copies(steps, tiles)
        # a scan restarts its carry in every pass that (re)computes it
        init = tuple(s for i in reds for s in b.red_init[i]) + tuple(
            b.scan_init[v] for v in vals if v in b.scan_init)
        post = tuple(s for d, s in b.o_steps if d == p and p < n)
        stores = tuple((t, a) for t, a, key in b.f_stores if store_pass[key] == p)
        why = []
        if reds:
            why.append(f"level-{p} reduction(s) of values {reds}"
                       + (" (they need the level-" + str(p - 1) + " results)" if p > 1 else ""))
        if stores:
            why.append("the epilogue stores, which need the complete reductions")
        passes.append([init, loads, tuple(steps), stores, post, "; ".join(why)])
    last = tuple(fold_copies([s for d, s in b.o_steps if d >= n], tiles))
    # a per-row value computed after pass p's chunks may be read by any later pass
    for k, q in enumerate(passes):
        later = [s for r in passes[k + 1:] for s in r[0] + r[2] + r[4]] + list(last)
        q[4] = tuple(fold_copies(q[4], tiles, later=later))
    pre = tuple(s for d, s in b.o_steps if d == 0)
    passes[0][0] = pre + passes[0][0]
    phases = []
    for k, (init, loads, steps, stores, post, why) in enumerate(passes):
        first, final = k == 0, k == len(passes) - 1
        phases.append(Phase(PhaseKind.INIT, init, loads=tuple(b.group_loads) if first else (),
                            reason="per group: " + ("the per-row loads and what follows from them, "
                                                    if first and b.group_loads else "")
                            + "the accumulator and carry fills"))
        phases.append(Phase(PhaseKind.CHUNK, steps, loads=loads, stores=stores, reason=why))
        if final:
            phases.append(Phase(PhaseKind.EPILOGUE, post + last, stores=tuple(b.outer_stores),
                                reason="per group, once its reductions are complete"
                                + (" and combined over the ring" if b.mode == "ring" else "")
                                + ": the per-row epilogue and its stores"))
        else:
            phases.append(Phase(PhaseKind.EPILOGUE, post,
                                reason="per group: the per-row values the later passes read"))
    return tuple(phases)


__all__ = ["MODES", "Pass", "ReductionLowering", "empty_as_pointwise", "lower"]
