"""Reduction lowering: a kernel with reductions -> tiles and sfp steps per pass.

The canonical iteration space of a reduction kernel is (outer dims..., r):
the outer ranges are canonicalized as in layout.py (extent-1 dims dropped,
neighbours walked contiguously merged), and so are the reduction ranges:
the innermost merged reduced dim is r, of extent K; any others (a sum over
dims 0 and 2, BatchNorm's statistics over N, H, W) are *looped*: only the
chunked mode takes them, as counted loops around each pass's chunks, so the
accumulators see every (looped index, chunk) in row-major order.

A tile covers G consecutive elements of the innermost outer dim ("o", the
tile rows) times Kc elements of r (the tile columns): the ISA reduces along
a tile row, so every value lives in one of four spaces:

* F, full: [G, Kc] (loads that walk both o and r, and what is computed from them);
* O, outer: [G, 1], one stick per row (reduction results, loads with stride
  0 on r), broadcast "cols" into F work (pinned in scratchpad for the group);
* R, reduced only: [1, Kc] (e.g. layer_norm's weight), broadcast "rows";
* S, scalar: constants, one stick.

A load whose r stride is not 1 (the reduced dim is not the contiguous one,
e.g. a sum over dim 0) is *transposed*: it loads [Kc, G] rows along o (o
must be contiguous) and the load/store unit transposes it on chip into the
[G, Kc] tile, so the reduction is still a row reduction; F stores of such a
kernel transpose back. A load that walks neither r nor o contiguously (an
operand transposed in another pair of dims), and an R load whose r is
strided, is *gathered*: each tile row's Kc elements are loaded one per
stick into a [Kc, 1] column and transposed into the row (a store the other
way round: scattered). That moves a whole stick per element (charged as
such) but stays on the card.

Three modes (the planner picks; see reduction_plan.py):

* "resident": Kc = K. The group's rows are loaded once and every step runs
  from scratchpad, in IR order: reductions write O tiles directly (no
  accumulation) and welford is the exact two-pass form: mean = sum(x) / K,
  m2 = sum((x - mean)^2), weight = K, all in fp32.
* "chunked": the rows do not fit, so r is cut into chunks of Kc and each
  reduction accumulates over the chunks (identity fill, then Reduce with
  accumulate); argmax/argmin keep (value, index) accumulators combined with
  compares and selects (first index wins ties, NaN wins like PyTorch); the
  welford triple is combined per chunk with Chan's formula. A reduction
  whose argument needs another reduction's result (softmax's sum needs the
  max) cannot start before that one is complete, so the chunks are streamed
  from device memory once per *level*: pass p computes the reductions of
  level p, and the F stores (the epilogue) come in the pass after the
  reductions they need. ``passes`` and ``pass_reasons`` record this.
* "ring": like "chunked" with one pass, on a core's slice of r; the partial
  accumulators are then combined core to core over the ring (reduction_codegen).

Scans (cumsum, cumprod) are full-space values computed with the sfp's
``scan`` along tile rows: in the resident mode over the whole row; when
chunked, the chunks of a group go through in order and an fp32 [G, 1]
carry tile (filled with the identity at the start of every pass that
computes the scan) continues each row's prefix from one chunk to the next.
In the "ring" mode (a kernel of scans and pointwise work, no reductions,
too few rows for the cores) each core holds its slice of the scanned dim
resident and reduces it to its total; the totals travel 0 -> 1 -> ... as
running prefixes, and core c scans its slice starting from the prefix it
received (``after_ring``: the scans, whose carry is the "in:" tile, then
the epilogue), then stores. Rows are read once and written once.

Steps name tiles; a chunk-size dependent constant is named "@n" (chunk
elements, fp32), "@inv_n" (1 / chunk elements) or "@n_i" (int32), which
codegen resolves for the full chunk and the remainder chunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from ..errors import Unsupported
from ..kernel_ir import TORCH_DTYPES, Cast, Constant, Index, Load, Op, PointwiseKernel, Reduction, ReductionKernel, Scan
from ._dump import Describable
from .fusion import _isa_op
from .layout import FLOATS, TILE_DTYPES, _canonical, operand_value

IDENTITY = {"sum": 0.0, "prod": 1.0, "max": float("-inf"), "min": float("inf"), "any": False, "all": True}
# The binary step that combines two partial results of a reduction (or two scan prefixes).
COMBINE = {"sum": "add", "prod": "mul", "max": "max", "min": "min", "any": "or", "all": "and"}
INTEGERS = ("int64", "int32", "int8")
INDEX_OPS = {"argmax": "max", "argmin": "min"}
WELFORD = ("welford_mean", "welford_m2", "welford_weight")


@dataclass(frozen=True)
class RAccess:
    """A load or store: element index = offset + sum(outer_strides * i_outer) + r_stride * i_r."""

    buffer: str
    dtype: str
    outer_strides: tuple[int, ...]
    r_stride: int
    offset: int
    transposed: bool = False  # an F access whose r is not contiguous: moved as [Kc, G] and transposed
    gathered: bool = False    # r strided and no contiguous o: one element per stick, rows transposed
    looped_strides: tuple[int, ...] = ()  # per looped reduced dim (ReductionLowering.looped)


@dataclass(frozen=True)
class RTile:
    name: str
    dtype: str
    space: str   # F, O, R, S
    role: str    # load, const, work, out (stored), acc (accumulator, one per group)

    @property
    def streamed(self) -> bool:
        return self.role in ("load", "out") and self.space in ("F", "R")


@dataclass(frozen=True)
class RStep:
    kind: str                  # unary, binary, select, fill, reduce, scan (args: src[, carry])
    op: str
    dst: str
    args: tuple[str, ...] = ()
    value: object = None       # fill value
    accumulate: bool = False


@dataclass(frozen=True)
class RPass:
    index: int
    init: tuple[RStep, ...]                   # per group, before the chunks (accumulator fills)
    loads: tuple[tuple[str, RAccess], ...]    # per chunk (F and, when chunked, R)
    steps: tuple[RStep, ...]                  # per chunk
    stores: tuple[tuple[str, RAccess], ...]   # per chunk (F stores)
    post: tuple[RStep, ...]                   # per group, after the chunks
    reason: str


@dataclass(frozen=True)
class ReductionLowering(Describable):
    mode: str
    outer: tuple[int, ...]          # canonical outer ranges (at least one; (1,) for a full reduction)
    outer_map: tuple[tuple[int, ...], ...]
    K: int
    tiles: tuple[RTile, ...]
    constants: tuple[tuple[str, object], ...]          # filled once per core
    once_loads: tuple[tuple[str, RAccess], ...]        # R (resident) and S loads, once per core
    group_loads: tuple[tuple[str, RAccess], ...]       # O loads, per group
    passes: tuple[RPass, ...]
    group_post: tuple[RStep, ...]                      # O epilogue after the last pass
    outer_stores: tuple[tuple[str, RAccess], ...]      # O stores, per group
    accumulators: tuple[str, ...]                      # O tiles combined across cores ("ring")
    combine: tuple[RStep, ...]                          # ring: own = combine(incoming, own); "in:" tiles
    transposed: bool
    after_ring: tuple[RStep, ...] = ()                  # ring scans: F steps once the prefix arrived
    looped: tuple[int, ...] = ()                        # extents of the looped reduced dims (chunked)

    @property
    def pass_count(self) -> int:
        return len(self.passes)

    def tile(self, name: str) -> RTile:
        for t in self.tiles:
            if t.name == name:
                return t
        raise KeyError(name)


# ---- analysis ------------------------------------------------------------------------------


def _join(spaces) -> str:
    s = set(spaces)
    if "F" in s or {"O", "R"} <= s:
        return "F"
    return "O" if "O" in s else "R" if "R" in s else "S"


def _space(outer_strides, r_stride, K, one_row=False) -> str:
    # one_row: the kernel has a single row (a full reduction) and stores full-space values
    # (x.sum() and x - x.amax() in one kernel): what varies over r is a [1, K] full tile, not R.
    on_o = any(outer_strides) or (one_row and r_stride != 0)
    # a reduced dim of extent 1: every load that varies over the outer dims is a [G, 1] full tile
    on_r = r_stride != 0 or (K == 1 and on_o)
    return {(True, True): "F", (True, False): "O", (False, True): "R", (False, False): "S"}[(on_o, on_r)]


def canonical(kernel: ReductionKernel):
    """(outer ranges, outer map, K, per access (outer strides, r stride), looped extents, per
    access looped strides), accesses being the loads then the stores."""
    n = len(kernel.ranges)
    loads = [v for v in kernel.values if isinstance(v, Load)]
    raw = [v.index.strides for v in loads] + [s.index.strides for s in kernel.stores]
    outer, outer_map, o_strides = _canonical(kernel.ranges, [s[:n] for s in raw])
    red, _, r_strides = _canonical(kernel.reduction_ranges, [s[n:] for s in raw])
    return (outer, outer_map, red[-1], [(o, r[-1]) for o, r in zip(o_strides, r_strides)], tuple(red[:-1]),
            [tuple(r[:-1]) for r in r_strides])


def loads_and_stores(kernel: ReductionKernel) -> list[str]:
    """Names of the accesses in canonical()'s order: loads, then stores."""
    return ([f"the load of {v.buffer!r}" for v in kernel.values if isinstance(v, Load)]
            + [f"the store to {s.buffer!r}" for s in kernel.stores])


def exact_welford(kernel: ReductionKernel) -> ReductionKernel:
    """Welford as the exact two-pass form over resident rows: mean = sum/K, m2 = sum((x - mean)^2)."""
    K = 1
    for r in kernel.reduction_ranges:
        K *= r
    values, remap, groups = [], {}, {}

    def add(v):
        values.append(v)
        return len(values) - 1

    for i, v in enumerate(kernel.values):
        if isinstance(v, Reduction) and v.op in WELFORD:
            arg = remap[v.arg]
            if arg not in groups:
                s = add(Reduction("sum", arg, "fp32"))
                mean = add(Op("mul", (s, add(Constant(1.0 / K if K else float("nan"), "fp32"))), "fp32"))
                groups[arg] = mean
            mean = groups[arg]
            if v.op == "welford_mean":
                remap[i] = mean
            elif v.op == "welford_weight":
                remap[i] = add(Constant(float(K), "fp32"))
            else:
                d = add(Op("sub", (arg, mean), "fp32"))
                remap[i] = add(Reduction("sum", add(Op("mul", (d, d), "fp32")), "fp32"))
            continue
        if isinstance(v, (Op,)):
            v = Op(v.name, tuple(remap[a] for a in v.args), v.dtype)
        elif isinstance(v, Cast):
            v = Cast(remap[v.arg], v.dtype)
        elif isinstance(v, (Reduction, Scan)):
            v = replace(v, arg=remap[v.arg])
        remap[i] = add(v)
    stores = tuple(replace(s, value=remap[s.value]) for s in kernel.stores)
    return replace(kernel, values=tuple(values), stores=stores)


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
                v.op, IDENTITY.get(v.op))
            values.append(Constant(ident, v.dtype))
        elif isinstance(v, Load):
            values.append(replace(v, index=Index(v.index.strides[:n], v.index.offset)))
        else:
            values.append(v)
    stores = tuple(replace(s, index=Index(s.index.strides[:n], s.index.offset)) for s in kernel.stores)
    return PointwiseKernel(kernel.name, kernel.ranges, kernel.buffers, tuple(values), stores)


# ---- lowering ------------------------------------------------------------------------------


def lower(kernel: ReductionKernel, mode: str) -> ReductionLowering:
    where = f"kernel {kernel.name!r}"
    if mode == "resident":
        kernel = exact_welford(kernel)
    outer, outer_map, K, acc_strides, looped, looped_strides = canonical(kernel)
    if looped and mode != "chunked":
        raise Unsupported(f"{where}: reduced dims {kernel.reduction_ranges} do not merge into one contiguously "
                          f"walked dim: only a chunked plan loops over the others")
    if looped and kernel.has_scan:
        raise Unsupported(f"{where}: a scan over reduced dims {kernel.reduction_ranges} that do not merge")
    n_loads = sum(isinstance(v, Load) for v in kernel.values)
    for b in kernel.buffers:
        if b.dtype not in TILE_DTYPES:
            raise Unsupported(f"{where}: buffer {b.name!r} has dtype {b.dtype}")
    b = _Builder(kernel, mode, outer, K)
    b.looped = looped
    # a scan's values are full-space even when nothing full-space is stored (cumsum(x).sum())
    b.one_row = all(d == 1 for d in outer) and (any(rs for _, rs in acc_strides[n_loads:]) or kernel.has_scan)
    names = loads_and_stores(kernel)
    for k, (os_, rs) in enumerate(acc_strides):
        access = names[k]
        if rs < 0 or any(s < 0 for s in os_ + looped_strides[k]):
            raise Unsupported(f"{where}: {access} walks its buffer backwards (a negative stride, e.g. a flip); "
                              f"reduction tiles move forward rows")
        if rs == 0 and any(looped_strides[k]):
            raise Unsupported(f"{where}: {access} varies over a looped reduced dim but not over the chunked one")
    load_k = 0
    for i, v in enumerate(kernel.values):
        if isinstance(v, Load):
            os_, rs = acc_strides[load_k]
            b.load(i, v, os_, rs, looped_strides[load_k])
            load_k += 1
        elif isinstance(v, Constant):
            b.constant(i, v)
        elif isinstance(v, Cast):
            b.cast(i, v)
        elif isinstance(v, Op):
            b.op(i, v)
        elif isinstance(v, Reduction):
            b.reduction(i, v)
        elif isinstance(v, Scan):
            b.scan(i, v)
    for k, s in enumerate(kernel.stores):
        os_, rs = acc_strides[n_loads + k]
        b.store(s, os_, rs, looped_strides[n_loads + k])
    return b.finish(outer_map)


class _Builder:
    def __init__(self, kernel, mode, outer, K):
        self.kernel, self.mode, self.outer, self.K = kernel, mode, outer, K
        self.where = f"kernel {kernel.name!r}"
        self.tiles: dict[str, RTile] = {}
        self.vtile: dict[int, str] = {}
        self.vspace: dict[int, str] = {}
        self.depth: dict[int, int] = {}
        self.defs: dict[int, list] = {}      # F/R value -> its step(s) (recomputed per pass when chunked)
        self.deps: dict[int, tuple] = {}
        self.constants, self.once_loads, self.group_loads = [], [], []
        self.f_loads: dict[int, tuple] = {}  # value -> (tile, access) per chunk
        self.o_steps: list[tuple[int, RStep]] = []   # (depth, step) outer epilogue
        self.red: list[tuple[int, int]] = []          # (level, value) reductions
        self.red_init: dict[int, list] = {}
        self.red_chunk: dict[int, list] = {}
        self.red_combine: list[RStep] = []
        self.scan_init: dict[int, RStep] = {}        # scan value -> its carry's identity fill
        self.accs: list[str] = []
        self.f_stores, self.outer_stores = [], []
        self.resident_steps: list[RStep] = []
        self.transposed = False
        self.one_row = False  # see _space
        self.looped: tuple[int, ...] = ()
        self._consts: dict[tuple, str] = {}

    # tiles
    def new(self, prefix, dtype, space, role) -> str:
        name = f"{prefix}{len(self.tiles)}"
        self.tiles[name] = RTile(name, dtype, space, role)
        return name

    def const(self, value, dtype) -> str:
        value = operand_value(value, dtype)  # what the tile holds (1e39 in fp32 is inf), not a run-time fill error
        key = (repr(value), dtype)
        if key not in self._consts:
            self._consts[key] = self.new("k", dtype, "S", "const")
            self.constants.append((self._consts[key], value))
        return self._consts[key]

    def emit(self, i, step: RStep, space: str) -> None:
        """A step computing value i (or a helper of it)."""
        if space in ("F", "R"):
            self.defs.setdefault(i, []).append(step)
        else:
            self.o_steps.append((self.depth[i], step))
        self.resident_steps.append(step)

    # values
    def load(self, i, v: Load, os_, rs, ls_=()) -> None:
        space = _space(os_, rs, self.K, self.one_row)
        if v.dtype not in TILE_DTYPES:
            raise Unsupported(f"{self.where}: value {i} loads {v.dtype}")
        tr = space == "F" and rs != 1 and self.K > 1
        gathered = space == "R" and rs not in (0, 1) and self.K > 1
        if tr and (not os_ or os_[-1] != 1):  # neither r nor o contiguous
            tr, gathered = False, True
        self.transposed |= tr
        acc = RAccess(v.buffer, v.dtype, tuple(os_), rs, v.index.offset, tr, gathered, tuple(ls_))
        t = self.new("in", v.dtype, space, "load")
        self.vtile[i], self.vspace[i], self.depth[i], self.deps[i] = t, space, 0, ()
        if space == "F" or (space == "R" and self.mode != "resident"):
            self.f_loads[i] = (t, acc)
        elif space == "O":
            self.group_loads.append((t, acc))
        else:
            self.once_loads.append((t, acc))

    def constant(self, i, v: Constant) -> None:
        # Integers keep their width (int64 values live in int64 tiles: exact, never narrowed).
        dtype = v.dtype if v.dtype in ("bool",) + INTEGERS else "fp32"
        if v.dtype not in FLOATS + ("bool",) + INTEGERS:
            raise Unsupported(f"{self.where}: constant of {v.dtype}")
        self.vtile[i], self.vspace[i], self.depth[i], self.deps[i] = self.const(v.value, dtype), "S", 0, ()

    def cast(self, i, v: Cast) -> None:
        src = self.vtile[v.arg]
        src_dtype, space = self.tiles[src].dtype, self.vspace[v.arg]
        self.vspace[i], self.depth[i], self.deps[i] = space, self.depth[v.arg], (v.arg,)
        dtype = v.dtype if v.dtype in ("fp16", "bf16") else "fp32" if v.dtype in FLOATS else v.dtype
        if dtype not in TILE_DTYPES:
            raise Unsupported(f"{self.where}: value {i} casts to {v.dtype}")
        if dtype == src_dtype or (dtype == "fp32" and src_dtype in FLOATS):
            self.vtile[i] = src
            return
        self.vtile[i] = self.new("t", dtype, space, "work")
        self.emit(i, RStep("unary", "copy", self.vtile[i], (src,)), space)

    def op(self, i, v: Op) -> None:
        args = tuple(self.vtile[a] for a in v.args)
        space = _join(self.vspace[a] for a in v.args)
        self.vspace[i], self.depth[i], self.deps[i] = space, max(self.depth[a] for a in v.args), v.args
        kind, op, args = _isa_op(self.where, i, v, args, [self.tiles[a].dtype for a in args])
        dtype = "fp32" if v.dtype in FLOATS else v.dtype
        if dtype not in TILE_DTYPES:
            raise Unsupported(f"{self.where}: value {i} computes {v.dtype}")
        self.vtile[i] = self.new("t", dtype, space, "work")
        self.emit(i, RStep(kind, op, self.vtile[i], args), space)

    def reduction(self, i, v: Reduction) -> None:
        arg = self.vtile[v.arg]
        level = self.depth[v.arg] + 1
        self.vspace[i], self.depth[i], self.deps[i] = "O", level, (v.arg,)
        if self.vspace[v.arg] not in ("F", "R"):
            self._of_a_constant(i, v, arg)
            return
        op = v.op
        if op in WELFORD:
            self._welford(i, v, arg, level)
            return
        if op in INDEX_OPS:
            self._argreduce(i, v, arg, level)
            return
        if op in ("max", "min") and self.tiles[arg].dtype == "bool" and v.dtype == "bool":
            op = "any" if op == "max" else "all"  # the max of bools is their any, the min their all
        if op in ("any", "all"):
            dtype = "bool"
            if self.tiles[arg].dtype != "bool":  # nonzero -> True, as torch.any
                b = self.new("t", "bool", self.vspace[v.arg], "work")
                self.defs.setdefault(v.arg, []).append(RStep("binary", "ne", b, (arg, self.const(0.0, "fp32")
                                                                                   if self.tiles[arg].dtype in FLOATS
                                                                                   else self.const(0, "int32"))))
                self.resident_steps.append(self.defs[v.arg][-1])
                arg = b
        else:
            dtype = self._accumulator(i, v, self.tiles[arg].dtype, f"{op} of")
        t = self.new("r", dtype, "O", "acc")
        self.vtile[i] = t
        self.red.append((level, i))
        self.resident_steps.append(RStep("reduce", op, t, (arg,)))
        self.red_init[i] = [RStep("fill", "fill", t, value=_identity(op, dtype))]
        self.red_chunk[i] = [RStep("reduce", op, t, (arg,), accumulate=True)]
        self.accs.append(t)
        comb = COMBINE[op]
        self.red_combine.append(RStep("binary", comb, t, (f"in:{t}", t)))

    def scan(self, i, v: Scan) -> None:
        arg = self.vtile[v.arg]
        if self.vspace[v.arg] != "F":
            raise Unsupported(f"{self.where}: value {i} scans a value that does not vary over both the "
                              f"outer and the scanned dims")
        dtype = self._accumulator(i, v, self.tiles[arg].dtype, f"cum{v.op} of")
        self.vspace[i], self.depth[i], self.deps[i] = "F", self.depth[v.arg], (v.arg,)
        self.vtile[i] = self.new("t", dtype, "F", "work")
        if self.mode == "resident":
            self.emit(i, RStep("scan", v.op, self.vtile[i], (arg,)), "F")
            return
        carry = self.new("c", dtype, "O", "acc")
        self.scan_init[i] = RStep("fill", "fill", carry, value=_identity(v.op, dtype))
        self.emit(i, RStep("scan", v.op, self.vtile[i], (arg, carry)), "F")
        if self.mode == "ring":
            self.accs.append(carry)
            self.red_combine.append(RStep("binary", COMBINE[v.op], carry,
                                          (f"in:{carry}", carry)))

    def _of_a_constant(self, i, v: Reduction, arg: str) -> None:
        """A reduction of a value that does not vary over the reduced dim (an argmax over a dim
        of 1 summed, a broadcast constant): K copies of it, computed without a loop."""
        space, K = self.vspace[v.arg], self.K * math.prod(self.looped)
        self.vspace[i], self.depth[i] = space, self.depth[v.arg]
        adt = self.tiles[arg].dtype
        if v.op in INDEX_OPS:  # every element ties: the first index
            self.vtile[i] = self.const(0, "int32")
            self.vspace[i] = "S"
            return
        if v.op == "welford_weight":
            self.vtile[i], self.vspace[i] = self.const(float(K), "fp32"), "S"
            return
        if v.op in WELFORD:  # as eager's Welford: an inf or nan turns the mean (K > 1) and m2 into nan
            nan_or_0 = self.new("t", "fp32", space, "work")
            self.emit(i, RStep("binary", "sub", nan_or_0, (arg, arg)), space)
            if v.op == "welford_mean" and K == 1:
                self.vtile[i] = arg
                return
            self.vtile[i] = self.new("t", "fp32", space, "work")
            step = ("add", (arg, nan_or_0)) if v.op == "welford_mean" else ("add", (nan_or_0, nan_or_0))
            self.emit(i, RStep("binary", step[0], self.vtile[i], step[1]), space)
            return
        if v.op in ("any", "all"):
            dtype, step = "bool", ("binary", "ne", (arg, self.const(0.0, "fp32") if adt in FLOATS
                                                   else self.const(0, "int32")))
        else:
            dtype = self._accumulator(i, v, "int32" if adt == "bool" else adt, f"{v.op} of")
            if v.op == "prod" and dtype == "fp32" and K > 2 ** 24:  # fp32 would round an odd K even
                raise Unsupported(f"{self.where}: value {i}: a float product of {K} copies of one value")
            k = self.const(float(K), "fp32") if dtype == "fp32" else self.const(K, dtype)
            step = {"sum": ("binary", "mul", (arg, k)), "prod": ("binary", "pow", (arg, k)),
                    "max": ("unary", "copy", (arg,)), "min": ("unary", "copy", (arg,))}[v.op]
        self.vtile[i] = self.new("t", dtype, space, "work")
        self.emit(i, RStep(step[0], step[1], self.vtile[i], step[2]), space)

    def _accumulator(self, i, v, arg_dtype: str, what: str) -> str:
        """The tile dtype a sum/prod/max/min (or scan) of `arg_dtype` into `v.dtype` accumulates in:
        fp32 for floats; for integers the result's own width (PyTorch sums and prods integers
        into int64, max/min keep the dtype), so the result is exact and wraps only where
        PyTorch's does."""
        if v.dtype in FLOATS and arg_dtype in FLOATS:
            return "fp32"
        if v.dtype in INTEGERS and arg_dtype in INTEGERS + ("bool",):
            return v.dtype
        raise Unsupported(f"{self.where}: value {i}: {what} {arg_dtype} into {v.dtype}")

    def _argreduce(self, i, v, arg, level) -> None:
        adt = self.tiles[arg].dtype
        if adt == "bool":  # compared as 0/1 (the index instruction, like torch.argmax, takes no bools)
            b = self.new("t", "int32", self.vspace[v.arg], "work")
            self.defs.setdefault(v.arg, []).append(RStep("unary", "copy", b, (arg,)))
            self.resident_steps.append(self.defs[v.arg][-1])
            arg, adt = b, "int32"
        if adt not in FLOATS + INTEGERS:
            raise Unsupported(f"{self.where}: value {i}: {v.op} of {adt}")
        vdt = "fp32" if adt in FLOATS else adt  # integers are compared in their own width: exact
        vop = INDEX_OPS[v.op]
        idx = self.new("r", "int32", "O", "acc")
        self.vtile[i] = idx
        self.red.append((level, i))
        self.resident_steps.append(RStep("reduce", v.op, idx, (arg,)))
        if self.mode == "resident":
            self.accs.append(idx)
            return
        best = self.new("r", vdt, "O", "acc")
        m, li = self.new("w", vdt, "O", "work"), self.new("w", "int32", "O", "work")
        base = self.new("base", "int32", "S", "acc")  # codegen fills it with the slice's first index
        self.red_init[i] = [RStep("fill", "fill", best, value=_identity(vop, vdt)), RStep("fill", "fill", idx, value=0),
                            RStep("fill", "fill", base, value=0)]
        chunk = [RStep("reduce", vop, m, (arg,)), RStep("reduce", v.op, li, (arg,)),
                 RStep("binary", "add", li, (li, base))]
        chunk += self._take(m, li, best, idx, vop)
        chunk.append(RStep("binary", "add", base, (base, "@n_i")))
        self.red_chunk[i] = chunk
        self.accs += [best, idx]
        # ring: incoming (earlier indices) vs own (later): own wins only if strictly better or NaN over non-NaN
        self.red_combine += self._take(f"in:{best}", f"in:{idx}", best, idx, vop, own_wins=True)

    def _take(self, new_v, new_i, best, idx, vop, own_wins=False):
        """(best, idx) <- (new_v, new_i) where new_v is strictly better or NaN over a non-NaN best.

        own_wins=True is the ring combine: `best`/`idx` are the later candidate and the incoming
        ones the earlier, so the roles swap (the earlier wins ties)."""
        w = [self.new("w", "bool", "O", "work") for _ in range(3)]
        if own_wins:  # result = own if own better else incoming; write into own tiles
            early_v, early_i, late_v, late_i = new_v, new_i, best, idx
        else:
            early_v, early_i, late_v, late_i = best, idx, new_v, new_i
        cmp = "gt" if vop == "max" else "lt"
        steps = [RStep("binary", cmp, w[0], (late_v, early_v)),       # strictly better
                 RStep("binary", "ne", w[1], (late_v, late_v)),        # late is NaN
                 RStep("binary", "eq", w[2], (early_v, early_v)),      # early is not NaN
                 RStep("binary", "and", w[1], (w[1], w[2])),
                 RStep("binary", "or", w[0], (w[0], w[1]))]
        steps += [RStep("select", "where", best, (w[0], late_v, early_v)),
                  RStep("select", "where", idx, (w[0], late_i, early_i))]
        return steps

    def _welford(self, i, v, arg, level) -> None:
        # chunked / ring: Chan's combine of per-chunk (mean, m2, n) into (M, M2, W)
        key = ("welford", arg)
        if key not in self._consts:
            M, M2, W = (self.new("r", "fp32", "O", "acc") for _ in range(3))
            self._consts[key] = (M, M2, W)
            s, mc, m2c = (self.new("w", "fp32", "O", "work") for _ in range(3))
            d = self.new("w", "fp32", "F", "work")
            self.red.append((level, i))
            self.red_init[i] = [RStep("fill", "fill", t, value=0.0) for t in (M, M2, W)]
            chunk = [RStep("reduce", "sum", s, (arg,)), RStep("binary", "mul", mc, (s, "@inv_n")),
                     RStep("binary", "sub", d, (arg, mc)), RStep("binary", "mul", d, (d, d)),
                     RStep("reduce", "sum", m2c, (d,))]
            n_tile = self.new("w", "fp32", "O", "work")
            chunk += [RStep("fill", "fill", n_tile, value="@n")]
            chunk += self._chan(M, M2, W, mc, m2c, n_tile)
            self.red_chunk[i] = chunk
            self.accs += [M, M2, W]
            self.red_combine += self._chan(M, M2, W, f"in:{M}", f"in:{M2}", f"in:{W}", incoming_first=True)
        M, M2, W = self._consts[key]
        self.vtile[i] = {"welford_mean": M, "welford_m2": M2, "welford_weight": W}[v.op]

    def _chan(self, M, M2, W, mb, m2b, wb, incoming_first=False):
        """(M, M2, W) <- combine((M, M2, W), (mb, m2b, wb)): n = W + wb, delta = mb - M,
        M += delta * wb / n, M2 += m2b + delta^2 * W * wb / n (Chan et al.); symmetric, so the
        ring may combine incoming and own either way."""
        n, delta, f, g = (self.new("w", "fp32", "O", "work") for _ in range(4))
        return [RStep("binary", "add", n, (W, wb)),
                RStep("binary", "sub", delta, (mb, M)),
                RStep("binary", "div", f, (wb, n)),          # wb / n
                RStep("binary", "mul", g, (delta, f)),        # delta * wb / n
                RStep("binary", "add", M, (M, g)),
                RStep("binary", "mul", g, (g, delta)),        # delta^2 * wb / n
                RStep("binary", "mul", g, (g, W)),            # * W
                RStep("binary", "add", M2, (M2, m2b)),
                RStep("binary", "add", M2, (M2, g)),
                RStep("unary", "copy", W, (n,))]

    def store(self, s, os_, rs, ls_=()) -> None:
        buf = self.kernel.buffer(s.buffer)
        src = self.vtile[s.value]
        space = self.vspace[s.value]
        t = self.tiles[src]
        if space in ("F", "R"):
            if space == "R":
                raise Unsupported(f"{self.where}: store to {s.buffer!r} of a value that does not vary over the outer dims")
            tr = rs != 1 and self.K > 1
            gathered = tr and (not os_ or os_[-1] != 1)  # neither dim contiguous: scattered
            tr = tr and not gathered
            self.transposed |= tr
            out = self.new("o", buf.dtype, "F", "out")
            step = RStep("unary", "copy", out, (src,))
            self.defs.setdefault(("store", s.buffer), []).append(step)
            self.deps[("store", s.buffer)] = (s.value,)
            self.depth[("store", s.buffer)] = self.depth[s.value]
            self.resident_steps.append(step)
            self.f_stores.append((out, RAccess(s.buffer, buf.dtype, tuple(os_), rs, s.index.offset, tr,
                                               gathered, tuple(ls_)), ("store", s.buffer)))
        else:
            out = self.new("o", buf.dtype, "O", "out")
            step = RStep("unary", "copy", out, (src,))
            self.o_steps.append((self.depth[s.value], step))
            self.resident_steps.append(step)
            self.outer_stores.append((out, RAccess(s.buffer, buf.dtype, tuple(os_), 0, s.index.offset)))

    # assembly
    def _closure(self, roots) -> list:
        """F/R values (in IR order) the roots need within one chunk."""
        need, stack = set(), list(roots)
        while stack:
            v = stack.pop()
            if v in need:
                continue
            need.add(v)  # aliases (casts that change nothing) have no step but their deps count
            stack.extend(self.deps.get(v, ()))
        order = [k for k in list(self.f_loads) + list(self.defs) if k in need]
        seen, out = set(), []
        for k in sorted(order, key=lambda k: k if isinstance(k, int) else 10**9):
            if k not in seen:
                seen.add(k)
                out.append(k)
        return out

    def _ring_scan(self, outer_map) -> ReductionLowering:
        """Ring mode for scans (module docstring): one resident slice per core, split at the scans."""
        if self.red or self.group_loads or self.outer_stores or self.o_steps:
            raise Unsupported(f"{self.where}: scans next to reductions or per-row values: no ring plan")
        before, after = _split_at_scans(self.resident_steps)
        totals = []
        for st in after:
            if st.kind == "scan":
                arg, carry = st.args
                if any(arg == s.dst for s in after if s is not st):
                    raise Unsupported(f"{self.where}: a scan of a scan's result: no ring plan")
                if st.op == "prod" and self.tiles[carry].dtype in FLOATS:
                    # a slice's float product reduced in one go drifts (~1e-5 per 6K factors) from
                    # the prefix eager accumulates in double; sums (pairwise) and integers do not
                    raise Unsupported(f"{self.where}: a float cumprod: no ring plan")
                totals.append(RStep("reduce", st.op, carry, (arg,)))  # this slice's total
        after = [replace(st, args=(st.args[0], f"in:{st.args[1]}")) if st.kind == "scan" else st for st in after]
        before = _fold_copies(before, self.tiles, later=totals + after)  # the totals and scans read them
        p = RPass(1, (), tuple(self.f_loads.values()), tuple(before) + tuple(totals),
                  tuple((t, a) for t, a, _ in self.f_stores), (),
                  "the core's slice resident: reduced to its total, scanned from the earlier cores' prefix")
        return ReductionLowering(
            self.mode, self.outer, outer_map, self.K, tuple(self.tiles.values()), tuple(self.constants),
            tuple(self.once_loads), tuple(self.group_loads), (p,), (), tuple(self.outer_stores),
            tuple(self.accs), tuple(self.red_combine), self.transposed, tuple(_fold_copies(after, self.tiles)))

    def finish(self, outer_map) -> ReductionLowering:
        tiles = self.tiles
        if self.mode == "ring" and self.scan_init:
            return self._ring_scan(outer_map)
        if self.mode == "resident":
            steps = tuple(_fold_copies(self.resident_steps, tiles))
            loads = tuple(self.f_loads.values())
            p = RPass(1, (), loads, steps, tuple((t, a) for t, a, _ in self.f_stores), (),
                      "rows resident: loaded once, every reduction and the epilogue from scratchpad")
            passes, post = (p,), ()
        else:
            levels = sorted({lv for lv, _ in self.red})
            store_pass = {key: self.depth[key] + 1 for _, _, key in self.f_stores}
            if not levels and not store_pass:  # every reduction was of a constant: nothing to stream
                raise Unsupported(f"{self.where}: nothing varies over the reduced dim: no {self.mode} plan")
            n = max(levels + list(store_pass.values()))
            passes = []
            for p in range(1, n + 1):
                reds = [i for lv, i in self.red if lv == p]
                roots = [self.kernel.values[i].arg for i in reds] + [k for k, sp in store_pass.items() if sp == p]
                vals = self._closure(roots)
                loads = tuple(self.f_loads[v] for v in vals if v in self.f_loads)
                steps = [s for v in vals if v in self.defs for s in self.defs[v]]
                for i in reds:
                    steps += self.red_chunk[i]
                steps = _fold_copies(steps, tiles)
                # a scan restarts its carry in every pass that (re)computes it
                init = tuple(s for i in reds for s in self.red_init[i]) + tuple(
                    self.scan_init[v] for v in vals if v in self.scan_init)
                post = tuple(s for d, s in self.o_steps if d == p and p < n)
                stores = tuple((t, a) for t, a, key in self.f_stores if store_pass[key] == p)
                why = []
                if reds:
                    why.append(f"level-{p} reduction(s) of values {reds}"
                               + (" (they need the level-" + str(p - 1) + " results)" if p > 1 else ""))
                if stores:
                    why.append("the epilogue stores, which need the complete reductions")
                passes.append(RPass(p, init, loads, tuple(steps), stores, post, "; ".join(why)))
            post = tuple(_fold_copies([s for d, s in self.o_steps if d >= n], tiles))
            # a per-row value computed after pass p's chunks may be read by any later pass
            passes = tuple(replace(p, post=tuple(_fold_copies(
                p.post, tiles, later=[s for q in passes[k + 1:] for s in q.init + q.steps + q.post] + list(post))))
                for k, p in enumerate(passes))
        pre = tuple(s for d, s in self.o_steps if d == 0)
        if self.mode != "resident" and pre:
            passes = (replace(passes[0], init=pre + passes[0].init),) + passes[1:]
        return ReductionLowering(
            self.mode, self.outer, outer_map, self.K, tuple(tiles.values()), tuple(self.constants),
            tuple(self.once_loads), tuple(self.group_loads), passes, post, tuple(self.outer_stores),
            tuple(self.accs), tuple(self.red_combine), self.transposed, looped=self.looped)


def _split_at_scans(steps) -> tuple[list, list]:
    """(steps that need no scan, the scans and every step that needs a scan's result): the
    second list waits for the previous cores' prefix."""
    tainted, before, after = set(), [], []
    for st in steps:
        if st.kind == "scan" or any(a in tainted for a in st.args):
            tainted.add(st.dst)
            after.append(st)
        else:
            before.append(st)
    return before, after


def _identity(op: str, dtype: str):
    """The fill that starts an accumulator: max/min of integers start from the dtype's bounds."""
    if dtype in INTEGERS and op in ("max", "min"):
        info = torch.iinfo(TORCH_DTYPES[dtype])
        return info.min if op == "max" else info.max
    return operand_value(IDENTITY[op], dtype)


def _fold_copies(steps, tiles, kinds=("unary", "binary", "select", "scan"), later=()) -> list:
    """A stored value's final copy (the rounding) folded into the step that computes it, when
    that step's result is a work tile nobody else reads, in `steps` or in the `later` steps that
    run after them: the sfp writes fp32 results straight into the output tile, rounding once,
    and saves a pass over the tile."""
    steps, later = list(steps), list(later)
    out = []
    for k, st in enumerate(steps):
        src = tiles.get(st.args[0]) if st.args else None
        if (st.kind == "unary" and st.op == "copy" and tiles[st.dst].role == "out" and src is not None
                and out and out[-1].dst == st.args[0] and out[-1].kind in kinds
                and src.role == "work" and src.space == tiles[st.dst].space
                and (src.dtype == tiles[st.dst].dtype or (src.dtype == "fp32" and tiles[st.dst].dtype in FLOATS))
                and not any(st.args[0] in (o.args + (o.dst,)) for o in out[:-1])
                and not any(st.args[0] in o.args for o in steps[k + 1:] + later)):
            out[-1] = replace(out[-1], dst=st.dst)
            continue
        out.append(st)
    return out
