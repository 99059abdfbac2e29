"""Values -> tiles and sfp steps: the space of each kernel IR value, its tile, and the steps computing it.

``StepBuilder`` walks the kernel's values in IR order (lowering.py
drives it) and records, per value, its tile (a ``Tile`` with a space and a
role), its space (space.py), its *depth* (how many reductions it
sits behind: a reduction of a depth-d value is of level d + 1), and the
steps computing it. Full-space and along-reduced values are computed per
chunk (``defs``: recomputed in every pass that needs them), per-row values
once per group (``o_steps``, with their depth: the pass after whose chunks
they can run), and every step also goes to ``resident_steps`` in IR order
(the resident mode runs those on the whole row).

A reduction's own steps are recorded apart: its accumulator fills
(``red_init``), its per-chunk accumulation (``red_chunk``) and how two
cores' partials combine (``red_combine``, reading the RING_LANDING tiles of
its accumulators: ring plans only); welford's and argmax's forms are in their own modules.

Tiles a relayout passes through (space.py's transposed, gathered and
packed-row moves) are STAGING tiles of the tile they serve, and constants
that depend on a chunk's extent are CHUNK_CONSTANT tiles: the plan sizes
and places them by their role, never by their name.

With ``columns`` (space.py: column tiles) nothing is relayouted: an
access that does not walk the tiles' stick axis (the innermost outer dim)
contiguously refuses the orientation (Unsupported), and so do index
reductions and scans, which run along tile rows only. A reduction step then
reads (source, scratch): the SCRATCH tile its rows fold in, one per dtype
(the source's for max/min/any/all, which are exact in it, the accumulator's
for sums and products), shared by every reduction, one step at a time.
"""

from __future__ import annotations

import math
from dataclasses import replace

from ...ir.errors import Unsupported
from ...ir.kernel_ir import Cast, Constant, IndexValue, Load, Op, Reduction, SizeValue
from ...symbolic.reduce import fill_of
from . import argreduce as reduction_argreduce, welford as reduction_welford
from ...core.fusion import aliases, isa_op
from ...core.layout import FLOATS, TILE_DTYPES, operand_value
from ...core.reduction_ops import COMBINE, INDEX_OPS, INTEGERS, WELFORD, accumulator_dtype, identity, op_of
from .space import ALONG_REDUCED, FULL, PER_ROW, REDUCED, SCALAR, Access, join, load_relayout, space_of, store_relayout
from ...core.tiles import ChunkValue, Relayout, Role, Step, Tile


class StepBuilder:
    def __init__(self, kernel, mode, outer, K, looped=(), one_row=False, columns=False):
        self.kernel, self.mode, self.outer, self.K = kernel, mode, outer, K
        self.columns = columns  # column tiles (module docstring)
        self.would_transpose = False  # row tiles would move some full-space access transposed
        self.scratch: dict[str, str] = {}  # dtype -> the SCRATCH tile column reductions fold in
        self.looped = looped
        self.one_row = one_row  # see space.space_of
        self.where = f"kernel {kernel.name!r}"
        self.tiles: dict[str, Tile] = {}
        self.vtile: dict[int, str] = {}
        self.vspace: dict[int, frozenset] = {}
        self.depth: dict = {}
        self.defs: dict = {}                 # full/along-reduced value -> its step(s) (recomputed per pass)
        self.deps: dict = {}
        self.constants, self.once_loads, self.group_loads = [], [], []
        self.f_loads: dict[int, tuple] = {}  # value -> (tile, access) per chunk
        self.o_steps: list[tuple[int, Step]] = []   # (depth, step) per-row epilogue
        self.red: list[tuple[int, int]] = []         # (level, value) reductions
        self.red_init: dict[int, list] = {}
        self.red_chunk: dict[int, list] = {}
        self.red_combine: list[Step] = []
        self.scan_init: dict[int, Step] = {}        # scan value -> its carry's identity fill
        self.accs: list[str] = []                   # tiles whose partials combine across cores
        self.f_stores, self.outer_stores = [], []
        self.resident_steps: list[Step] = []
        self.transposed = False
        self.shared: dict[tuple, object] = {}       # constants and welford triples, by what they are
        self.landings: dict[str, str] = {}          # accumulator -> its RING_LANDING tile
        self.chunk_consts: dict[ChunkValue, str] = {}

    # ---- tiles ---------------------------------------------------------------------------

    def new(self, dtype, space, role, **kw) -> str:
        name = f"t{len(self.tiles)}"
        self.tiles[name] = Tile(name, dtype, space, role, **kw)
        return name

    def const(self, value, dtype) -> str:
        value = operand_value(value, dtype)  # what the tile holds (1e39 in fp32 is inf), not a run-time fill error
        key = ("const", repr(value), dtype)
        if key not in self.shared:
            self.shared[key] = self.new(dtype, SCALAR, Role.CONSTANT)
            self.constants.append((self.shared[key], value))
        return self.shared[key]

    def size(self, i, v: SizeValue) -> None:
        # A size known only at launch (issue 18: a mask's bound): a constant tile the program fills
        # from its size words (symbolic/reduce.fill_of), once per core like every constant.
        fill = fill_of(self.kernel, v)
        key = ("size", fill)
        if key not in self.shared:
            self.shared[key] = self.new(v.dtype, SCALAR, Role.CONSTANT)
            self.constants.append((self.shared[key], fill))
        self.vtile[i], self.vspace[i], self.depth[i], self.deps[i] = self.shared[key], SCALAR, 0, ()

    def chunk_constant(self, value: ChunkValue) -> str:
        if value not in self.chunk_consts:
            self.chunk_consts[value] = self.new(value.dtype, SCALAR, Role.CHUNK_CONSTANT, chunk_value=value)
        return self.chunk_consts[value]

    def landing(self, acc: str) -> str:
        """The tile a neighbour core's partial of `acc` lands in (ring plans)."""
        if acc not in self.landings:
            t = self.tiles[acc]
            self.landings[acc] = self.new(t.dtype, t.space, Role.RING_LANDING, of=acc)
        return self.landings[acc]

    def staging(self, of: str, relayout: Relayout) -> str:
        t = self.tiles[of]
        space = {Relayout.TRANSPOSED: FULL, Relayout.GATHERED: ALONG_REDUCED, Relayout.ROW: PER_ROW}[relayout]
        return self.new(t.dtype, space, Role.STAGING, of=of, relayout=relayout)

    def reduce_args(self, op: str, dst_dtype: str, src: str) -> tuple[str, ...]:
        """A reduce step's args: the source, and with column tiles the scratch its rows fold in."""
        if not self.columns:
            return (src,)
        dtype = self.tiles[src].dtype if op in ("max", "min", "any", "all") else dst_dtype
        if dtype not in self.scratch:
            self.scratch[dtype] = self.new(dtype, FULL, Role.SCRATCH)
        return (src, self.scratch[dtype])

    def column_walk(self, what: str, space, os_, rs) -> None:
        """Column tiles move every access as it lies in memory: refuse one they cannot."""
        if space == FULL and rs != 1 and self.K > 1:
            self.would_transpose = True
        if space in (FULL, PER_ROW) and not (os_ and os_[-1] == 1):
            raise Unsupported(f"{self.where}: column tiles: {what} does not walk the innermost outer dim "
                              f"contiguously")
        if space == FULL and rs == 1 and self.K > 1:
            raise Unsupported(f"{self.where}: column tiles: {what} walks the reduced dim contiguously")

    def emit(self, i, step: Step, space) -> None:
        """A step computing value i (or a helper of it)."""
        if REDUCED in space:
            self.defs.setdefault(i, []).append(step)
        else:
            self.o_steps.append((self.depth[i], step))
        self.resident_steps.append(step)

    # ---- values --------------------------------------------------------------------------

    def load(self, i, v: Load | IndexValue, os_, rs, ls_=()) -> None:
        space = space_of(os_, rs, self.K, self.one_row)
        if space == FULL and self.K > 1 and not self.one_row and os_[-1] == 0:
            # Constant down a group's rows (they lie along the innermost outer dim), varying only over
            # the outer dims looped around the groups: one row per group, broadcast over its rows
            # (BERT's padding mask, (b, 1, 1, s) under (b, h, q, s) scores: loaded per row it was
            # 4.96x the minimum read bytes).
            space = ALONG_REDUCED
        if v.dtype not in TILE_DTYPES:
            raise Unsupported(f"{self.where}: value {i} loads {v.dtype}")
        counted = isinstance(v, IndexValue)  # computed in place, in the tile's own orientation
        if self.columns and not counted:
            self.column_walk(f"the load of {v.buffer!r}", space, os_, rs)
        tr, gathered = (False, False) if counted or self.columns else load_relayout(space, os_, rs, self.K)
        self.transposed |= tr
        acc = Access(None if counted else v.buffer, v.dtype, tuple(os_), rs, v.index.offset, tr, gathered,
                     tuple(ls_))
        t = self.new(v.dtype, space, Role.INPUT)
        if tr:
            self.staging(t, Relayout.TRANSPOSED)
        if gathered:
            self.staging(t, Relayout.GATHERED)
        self.vtile[i], self.vspace[i], self.depth[i], self.deps[i] = t, space, 0, ()
        if space == FULL or (space == ALONG_REDUCED and (self.mode != "resident" or any(os_))):
            self.f_loads[i] = (t, acc)  # (an along-reduced load that an outer loop moves: per group)
        elif space == PER_ROW:
            if acc.o_contiguous and not counted and not self.columns:  # a packed row, transposed into the column
                self.staging(t, Relayout.ROW)
            self.group_loads.append((t, acc))
        else:
            self.once_loads.append((t, acc))

    def constant(self, i, v: Constant) -> None:
        # Integers keep their width (int64 values live in int64 tiles: exact, never narrowed).
        dtype = v.dtype if v.dtype in ("bool",) + INTEGERS else "fp32"
        if v.dtype not in FLOATS + ("bool",) + INTEGERS:
            raise Unsupported(f"{self.where}: constant of {v.dtype}")
        self.vtile[i], self.vspace[i], self.depth[i], self.deps[i] = self.const(v.value, dtype), SCALAR, 0, ()

    def cast(self, i, v: Cast) -> None:
        src = self.vtile[v.arg]
        src_dtype, space = self.tiles[src].dtype, self.vspace[v.arg]
        self.vspace[i], self.depth[i], self.deps[i] = space, self.depth[v.arg], (v.arg,)
        dtype = v.dtype if v.dtype in ("fp16", "bf16") else "fp32" if v.dtype in FLOATS else v.dtype
        if dtype not in TILE_DTYPES:
            raise Unsupported(f"{self.where}: value {i} casts to {v.dtype}")
        if aliases(dtype, src_dtype):
            self.vtile[i] = src
            return
        self.vtile[i] = self.new(dtype, space, Role.TEMPORARY)
        self.emit(i, Step("unary", "copy", self.vtile[i], (src,)), space)

    def op(self, i, v: Op) -> None:
        args = tuple(self.vtile[a] for a in v.args)
        space = join(self.vspace[a] for a in v.args)
        self.vspace[i], self.depth[i], self.deps[i] = space, max(self.depth[a] for a in v.args), v.args
        kind, op, args = isa_op(self.where, i, v, args, [self.tiles[a].dtype for a in args])
        dtype = "fp32" if v.dtype in FLOATS else v.dtype
        if dtype not in TILE_DTYPES:
            raise Unsupported(f"{self.where}: value {i} computes {v.dtype}")
        self.vtile[i] = self.new(dtype, space, Role.TEMPORARY)
        self.emit(i, Step(kind, op, self.vtile[i], args), space)

    def reduction(self, i, v: Reduction) -> None:
        arg = self.vtile[v.arg]
        level = self.depth[v.arg] + 1
        self.vspace[i], self.depth[i], self.deps[i] = PER_ROW, level, (v.arg,)
        if REDUCED not in self.vspace[v.arg]:
            self._of_a_constant(i, v, arg)
            return
        op = op_of(v.op)
        if op in WELFORD:
            reduction_welford.accumulate(self, i, v, arg, level)
            return
        if op in INDEX_OPS:
            if self.columns:
                raise Unsupported(f"{self.where}: column tiles: value {i} is an {v.op} (its index runs along "
                                  f"tile rows)")
            reduction_argreduce.accumulate(self, i, v, arg, level)
            return
        if op in ("max", "min") and self.tiles[arg].dtype == "bool" and v.dtype == "bool":
            op = "any" if op == "max" else "all"  # the max of bools is their any, the min their all
        if op in ("any", "all"):
            dtype = "bool"
            if self.tiles[arg].dtype != "bool":  # nonzero -> True, as torch.any
                b = self.new("bool", self.vspace[v.arg], Role.TEMPORARY)
                zero = self.const(0.0, "fp32") if self.tiles[arg].dtype in FLOATS else self.const(0, "int32")
                self.defs.setdefault(v.arg, []).append(Step("binary", "ne", b, (arg, zero)))
                self.resident_steps.append(self.defs[v.arg][-1])
                arg = b
        else:
            dtype = accumulator_dtype(self.where, i, v.dtype, self.tiles[arg].dtype, f"{v.op} of")
        t = self.new(dtype, PER_ROW, Role.ACCUMULATOR)
        self.vtile[i] = t
        self.red.append((level, i))
        args = self.reduce_args(op, dtype, arg)
        self.resident_steps.append(Step("reduce", op, t, args))
        self.red_init[i] = [Step("fill", "fill", t, value=identity(op, dtype))]
        self.red_chunk[i] = [Step("reduce", op, t, args, accumulate=True)]
        self.accs.append(t)
        if self.mode == "ring":
            self.red_combine.append(Step("binary", COMBINE[op], t, (self.landing(t), t)))

    def _of_a_constant(self, i, v: Reduction, arg: str) -> None:
        """A reduction of a value that does not vary over the reduced dim (an argmax over a dim
        of 1 summed, a broadcast constant): K copies of it, computed without a loop."""
        space, K = self.vspace[v.arg], self.K * math.prod(self.looped)
        self.vspace[i], self.depth[i] = space, self.depth[v.arg]
        adt = self.tiles[arg].dtype
        op = op_of(v.op)
        if op in INDEX_OPS:  # every element ties: the first index
            self.vtile[i] = self.const(0, "int32")
            self.vspace[i] = SCALAR
            return
        if op == "welford_weight":
            self.vtile[i], self.vspace[i] = self.const(float(K), "fp32"), SCALAR
            return
        if op in WELFORD:  # as eager's Welford: an inf or nan turns the mean (K > 1) and m2 into nan
            nan_or_0 = self.new("fp32", space, Role.TEMPORARY)
            self.emit(i, Step("binary", "sub", nan_or_0, (arg, arg)), space)
            if op == "welford_mean" and K == 1:
                self.vtile[i] = arg
                return
            self.vtile[i] = self.new("fp32", space, Role.TEMPORARY)
            step = ("add", (arg, nan_or_0)) if op == "welford_mean" else ("add", (nan_or_0, nan_or_0))
            self.emit(i, Step("binary", step[0], self.vtile[i], step[1]), space)
            return
        if op in ("any", "all"):
            dtype, step = "bool", ("binary", "ne", (arg, self.const(0.0, "fp32") if adt in FLOATS
                                                   else self.const(0, "int32")))
        else:
            dtype = accumulator_dtype(self.where, i, v.dtype, "int32" if adt == "bool" else adt, f"{v.op} of")
            if op == "prod" and dtype == "fp32" and K > 2 ** 24:  # fp32 would round an odd K even
                raise Unsupported(f"{self.where}: value {i}: a float product of {K} copies of one value")
            k = self.const(float(K), "fp32") if dtype == "fp32" else self.const(K, dtype)
            step = {"sum": ("binary", "mul", (arg, k)), "prod": ("binary", "pow", (arg, k)),
                    "max": ("unary", "copy", (arg,)), "min": ("unary", "copy", (arg,))}[op]
        self.vtile[i] = self.new(dtype, space, Role.TEMPORARY)
        self.emit(i, Step(step[0], step[1], self.vtile[i], step[2]), space)

    def store(self, s, os_, rs, ls_=()) -> None:
        buf = self.kernel.buffer(s.buffer)
        src = self.vtile[s.value]
        space = self.vspace[s.value]
        if REDUCED in space:
            if space == ALONG_REDUCED:
                raise Unsupported(f"{self.where}: store to {s.buffer!r} of a value that does not vary over the outer dims")
            if self.columns:
                self.column_walk(f"the store to {s.buffer!r}", FULL, os_, rs)
            tr, scattered = (False, False) if self.columns else store_relayout(os_, rs, self.K)
            self.transposed |= tr
            out = self.new(buf.dtype, FULL, Role.OUTPUT)
            if tr:
                self.staging(out, Relayout.TRANSPOSED)
            if scattered:
                self.staging(out, Relayout.GATHERED)
            step = Step("unary", "copy", out, (src,))
            self.defs.setdefault(("store", s.buffer), []).append(step)
            self.deps[("store", s.buffer)] = (s.value,)
            self.depth[("store", s.buffer)] = self.depth[s.value]
            self.resident_steps.append(step)
            self.f_stores.append((out, Access(s.buffer, buf.dtype, tuple(os_), rs, s.index.offset, tr,
                                              scattered, tuple(ls_)), ("store", s.buffer)))
        else:
            out = self.new(buf.dtype, PER_ROW, Role.OUTPUT)
            if self.columns:  # already a packed row
                self.column_walk(f"the store to {s.buffer!r}", PER_ROW, os_, 0)
            else:
                self.staging(out, Relayout.ROW)  # the column of results leaves as a packed row when it can
            step = Step("unary", "copy", out, (src,))
            self.o_steps.append((self.depth[s.value], step))
            self.resident_steps.append(step)
            self.outer_stores.append((out, Access(s.buffer, buf.dtype, tuple(os_), 0, s.index.offset)))


def fold_copies(steps, tiles, kinds=("unary", "binary", "select", "scan"), later=()) -> list:
    """A stored value's final copy (the rounding) folded into the step that computes it, when
    that step's result is a temporary nobody else reads, in `steps` or in the `later` steps that
    run after them: the sfp writes fp32 results straight into the output tile, rounding once,
    and saves a pass over the tile. Until nothing folds: a cast before the store (fp32 -> fp16,
    then the store's copy) folds first into one copy, which then folds into the step before it
    (a softmax's division writes the fp16 output; the dtype rule below keeps every rounding)."""
    steps = list(steps)
    while True:
        folded = _fold_once(steps, tiles, kinds, list(later))
        if len(folded) == len(steps):
            return folded
        steps = folded


def _fold_once(steps, tiles, kinds, later) -> list:
    out = []
    for k, st in enumerate(steps):
        src = tiles.get(st.args[0]) if st.args else None
        dst = tiles[st.dst]
        if (st.kind == "unary" and st.op == "copy" and dst.role is Role.OUTPUT and src is not None
                and out and out[-1].dst == st.args[0] and out[-1].kind in kinds
                and src.role is Role.TEMPORARY and src.space == dst.space
                and (src.dtype == dst.dtype or (src.dtype == "fp32" and dst.dtype in FLOATS))
                and not any(st.args[0] in (o.args + (o.dst,)) for o in out[:-1])
                and not any(st.args[0] in o.args for o in steps[k + 1:] + later)):
            out[-1] = replace(out[-1], dst=st.dst)
            continue
        out.append(st)
    return out


__all__ = ["StepBuilder", "fold_copies"]
