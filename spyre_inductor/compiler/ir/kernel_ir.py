"""The kernel IR: what the Inductor side hands the passes, and nothing more.

One ``Kernel`` is one future dataflow program: an iteration space
(``ranges``, outermost first), the device buffers it touches in PyTorch's
strided layout, a straight-line list of values (SSA: a value refers to
earlier values by their position) and the stores that leave the kernel.

Every index is affine in the iteration variables: element index =
``offset + sum(strides[d] * i_d)``. A stride of 0 is a broadcast. Inductor
index expressions that are not affine (modular indexing from reshapes,
indirect indexing) do not reach this IR: capture turns such a node into a
CPU fallback.

Reductions (issue 8): a kernel may also have ``reduction_ranges``, the
reduced dims, iterated innermost after ``ranges``; every Index then has one
stride per range and per reduction range (len(ranges) + len(reduction_ranges)).
A ``Reduction`` value reduces its argument over all reduction ranges: its
result depends on the outer ranges only, and a value computed from outer
values only (reduction results, constants, loads with stride 0 on every
reduced dim) is outer too. Anything that mixes an outer value with a
full-space value (e.g. x - max(x)) is full-space again: the outer value is
broadcast over the reduced dims. A store of an outer value has stride 0 on
every reduced dim; a store of a full-space value (an epilogue) does not.
Welford (var/std/layer_norm) arrives as three Reductions of the same
argument: welford_mean, welford_m2 (sum of squared deviations from the
mean) and welford_weight (the count), which the planner computes in two
passes over resident rows or combines across tiles and cores (Chan).

Scans (issue 9): a ``Scan`` is the inclusive prefix of its argument along the
reduced dim (cumsum: "sum", cumprod: "prod"): result[o, k] = arg[o, 0] op ...
op arg[o, k]. Unlike a Reduction it varies over the reduced dim, so it is a
full-space value, stored like an epilogue. A kernel with a Scan has exactly
one reduction range (Inductor scans one dim).

Values whose result is only used inside the kernel stay on chip; a value
reaches device memory only through a ``Store``. Arithmetic follows
Inductor's contract: floats are computed in fp32 and rounded when stored
(or when a ``Cast`` says so), integers in their own width.

Matmuls (issue 15): a ``Reduction`` "dot" is the sum over the reduction range
of its argument, a product of two operands (Inductor's native-matmul form:
``ops.dot`` of the two loads, reduced by "dot"); a kernel that has one is a
matmul, planned on the PE arrays.

Random values (issue 19): ``rand``, ``randn`` and ``random_bits63`` are
binary ops of an integer key and counter (RANDOM_OPS): a pure function, so they are ordinary
pointwise values (a dropout mask fuses with its multiply).

Values from indices (issue 16): an ``IndexValue`` is an integer affine in the
iteration variables (Inductor's ``index_expr``: arange, the compares of
masks). Inductor's ``masked(mask, body, other)`` is captured as
``where(mask, body, other)``; the body's loads may then index outside their
buffer where the mask is false (a cat's other parts), which the planner
resolves by cutting the iteration space at the masks (families/pointwise/pieces.py) and
checks (no program reads outside a buffer).

Indirect indexing (issue 16): an ``Indirect`` value is the checked, wrapped
integer index computed from value ``arg`` (an embedding's ids, a scatter's
positions): in [0, bound) after adding ``bound`` to a negative value when
``wrap_neg``, else an IndexError naming ``op`` (the aten op it came from),
the value and the bound. An ``Index`` may add ``indirect`` terms
(Indirect value position, element stride) to its affine part: a gather when a
Load has them, a scatter when a Store has them. A ``Store`` with mode
"atomic_add" adds its value to what the buffer holds (index_put_ with
accumulate, scatter_add, index_add): every contribution, duplicates
included. A kernel with indirect terms is an ``IndirectKernel``.

Sizes known only at launch (issue 18): a ``SizeValue`` is ``coef * size + const`` of the
kernel's size symbol, a scalar the program reads from its size words; symbolic/reduce.py compares the
reduced index with one to mask a reduction over a symbolic range.

The kernel's type names what it is (``Kernel.of`` picks it from the
content, ``check`` insists on it): a ``PointwiseKernel`` has no reduction
ranges, a ``ReductionKernel`` reduces or scans over them, a
``MatmulKernel`` is a reduction whose one reduction is a dot.

The IR is frozen and JSON-serialisable (``to_json``/``from_json``) so a
kernel can be dumped, diffed and unit-tested without Inductor.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

import torch

# IR dtype names; the same spelling as the program format (operands.DTYPES) where both exist.
DTYPE_NAMES = {
    torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
    torch.int64: "int64", torch.int32: "int32", torch.int16: "int16", torch.int8: "int8",
    torch.uint8: "uint8", torch.bool: "bool",
}
TORCH_DTYPES = {v: k for k, v in DTYPE_NAMES.items()}

# Operations a pointwise kernel may contain, by arity; names are Inductor's ops names.
UNARY_OPS = frozenset({
    "neg", "abs", "exp", "exp2", "expm1", "log", "log2", "log1p", "sqrt", "rsqrt", "reciprocal", "sigmoid",
    "tanh", "relu", "erf", "sin", "cos", "floor", "ceil", "trunc", "round", "sign", "logical_not",
    "bitwise_not", "square", "isnan", "isinf",
})
BINARY_OPS = frozenset({
    "add", "sub", "mul", "truediv", "div", "floordiv", "mod", "remainder", "pow", "maximum", "minimum",
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
    "bitwise_and", "bitwise_or", "bitwise_xor",
    # issue 9: C's fmod on floats (``mod`` is its integer spelling), integer division rounding
    # toward zero, shifts, and div_rn: IEEE division rounded to nearest (truediv, kept apart because
    # floor(div_rn(a, b)) is Inductor's float floor division, which capture turns into floordiv).
    "fmod", "truncdiv", "bitwise_left_shift", "bitwise_right_shift", "div_rn",
})
TERNARY_OPS = frozenset({"where"})  # where(cond, a, b)
# Random values (issue 19): op(key, counter), one value per element from Philox-4x32-10
# (spyre_runtime/program/philox.py) with those integers; names are Inductor's (rand, randn)
# where it has them, and the integer draw Inductor's randint64 is made of (inductor/capture.py).
# IR op -> philox mode.
RANDOM_OPS = {"rand": "uniform", "randn": "normal", "random_bits63": "bits63"}
BINARY_OPS = BINARY_OPS | frozenset(RANDOM_OPS)
# Reductions over all reduction ranges. argmax/argmin give int64 indices into the
# flattened reduced dims (first occurrence on ties, NaN counts as the maximum, as PyTorch).
REDUCTION_OPS = frozenset({
    "sum", "prod", "max", "min", "argmax", "argmin", "any", "all",
    "welford_mean", "welford_m2", "welford_weight",
    "dot",  # the sum of a product of two operands: a matmul (issue 15)
})
SCAN_OPS = frozenset({"sum", "prod"})  # inclusive prefixes along the one reduction range


@dataclass(frozen=True)
class Buffer:
    """A device buffer the kernel reads or writes, in PyTorch's strided layout (elements)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0  # storage offset, elements


@dataclass(frozen=True)
class Index:
    """Element index = offset + sum(strides[d] * i_d) over the kernel's ranges
    + sum(stride * value) over the `indirect` terms (Indirect value position, stride)."""

    strides: tuple[int, ...]
    offset: int = 0
    indirect: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Load:
    buffer: str
    index: Index
    dtype: str


@dataclass(frozen=True)
class Constant:
    value: float | int | bool  # float("inf") / float("nan") allowed
    dtype: str


@dataclass(frozen=True)
class IndexValue:
    """A value computed from the loop indices (Inductor's ``index_expr``): an integer
    ``index.offset + sum(index.strides[d] * i_d)`` in `dtype` (arange, the compares of causal and
    padding masks, a cat's part boundaries)."""

    index: "Index"
    dtype: str


@dataclass(frozen=True)
class Op:
    """An elementwise operation on earlier values (positions); result dtype `dtype`."""

    name: str
    args: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class Cast:
    arg: int
    dtype: str


@dataclass(frozen=True)
class Reduction:
    """`op` of value `arg` over every reduction range; the result is indexed by the outer ranges only."""

    op: str
    arg: int
    dtype: str


@dataclass(frozen=True)
class Scan:
    """Inclusive `op` prefix of value `arg` along the reduction range; a full-space value."""

    op: str
    arg: int
    dtype: str


@dataclass(frozen=True)
class Indirect:
    """The index value `arg` checked against [0, bound) (negative ones wrapped first when
    `wrap_neg`); `op` is the aten op it came from, for the out-of-range error."""

    arg: int
    bound: int
    wrap_neg: bool
    op: str
    dtype: str = "int64"


@dataclass(frozen=True)
class SizeValue:
    """``coef * size + const`` of the kernel's size symbol `symbol` (issue 18): a scalar known only
    at launch, read from its size words. symbolic/reduce.py builds it for the mask ``r < size`` of a
    reduction over a symbolic range (the reduced elements past the size take the identity)."""

    symbol: str
    coef: int = 1
    const: int = 0
    dtype: str = "int64"


Value = Load | Constant | IndexValue | Op | Cast | Reduction | Scan | Indirect | SizeValue


def operands(v) -> set[int]:
    """The positions value `v` reads: an op's arguments; a cast's, index check's, reduction's or
    scan's argument; a gather's index terms."""
    found = set(getattr(v, "args", ()))
    if hasattr(v, "arg"):
        found.add(v.arg)
    if isinstance(v, Load):
        found |= {p for p, _ in v.index.indirect}
    return found


def needed(values, stores) -> set[int]:
    """The positions some store needs (its value, its scatter's index terms, and what they read)."""
    need = {s.value for s in stores} | {p for s in stores for p, _ in s.index.indirect}
    for pos in range(len(values) - 1, -1, -1):
        if pos in need:
            need |= operands(values[pos])
    return need
STORE_MODES = (None, "atomic_add")


@dataclass(frozen=True)
class Store:
    buffer: str
    index: Index
    value: int  # position in Kernel.values
    mode: str | None = None  # "atomic_add": buffer[index] += value (STORE_MODES)


def renumbered(v, new):
    """Value or store `v` with every position it refers to mapped through `new` (a callable):
    what ``operands`` reads, and a store's value and scatter terms. For whoever inserts, drops
    or moves values in a kernel's list."""
    if isinstance(v, Op):
        return dataclasses.replace(v, args=tuple(new(a) for a in v.args))
    if hasattr(v, "arg"):  # (as operands finds it: Cast, Reduction, Scan, Indirect, and any later kind)
        return dataclasses.replace(v, arg=new(v.arg))
    if isinstance(v, (Load, Store)) and v.index.indirect:
        v = dataclasses.replace(v, index=dataclasses.replace(
            v.index, indirect=tuple((new(p), st) for p, st in v.index.indirect)))
    if isinstance(v, Store):
        return dataclasses.replace(v, value=new(v.value))
    return v


@dataclass(frozen=True)
class SymbolicSizes:
    """A kernel over sizes known only at launch (issue 18; spyre_inductor/compiler/symbolic/).

    The kernel's ranges and buffer shapes are those of the bucket's maximum (what the planner
    plans for); this says which of them are `coef * size + const` of which size symbol, and the
    bucket [lo, hi] of each size the artifact serves."""

    sizes: tuple[tuple[str, int, int], ...]  # (name, lo, hi)
    ranges: tuple[tuple[int, str, int, int], ...]  # (index into ranges + reduction_ranges, size, coef, const)
    buffers: tuple[tuple[str, int, str, int, int], ...]  # (buffer, dim, size, coef, const)
    # Per size, what Dynamo's guards admit (name, min, max; max None: unbounded): every bucket
    # stays inside it, so an artifact never claims a size Dynamo would not hand it.
    limits: tuple[tuple[str, int, int | None], ...] = ()
    # Strides that are `coef * size + const` (an AttentionKernel's heads over a symbolic sequence:
    # (batch, heads, seq, dim) has a head stride of seq * dim): (buffer, dim, size, coef, const).
    strides: tuple[tuple[str, int, str, int, int], ...] = ()


@dataclass(frozen=True)
class Kernel:
    """The common shape of every kernel; build one with ``Kernel.of``, which picks the type."""

    name: str
    ranges: tuple[int, ...]
    buffers: tuple[Buffer, ...]
    values: tuple[Value, ...]
    stores: tuple[Store, ...]
    reduction_ranges: tuple[int, ...] = ()
    symbolic: SymbolicSizes | None = None  # issue 18: None for a kernel of static sizes

    @staticmethod
    def kind_of(values, reduction_ranges) -> type["Kernel"]:
        if any(isinstance(v, Indirect) for v in values):
            return IndirectKernel
        if not reduction_ranges:
            return PointwiseKernel
        if any(isinstance(v, Reduction) and v.op == "dot" for v in values):
            return MatmulKernel
        return ReductionKernel

    @staticmethod
    def of(name, ranges, buffers, values, stores, reduction_ranges=(), symbolic=None) -> "Kernel":
        """The kernel of that content, as the type it is."""
        cls = Kernel.kind_of(values, reduction_ranges)
        return cls(name, tuple(ranges), tuple(buffers), tuple(values), tuple(stores), tuple(reduction_ranges),
                   symbolic)

    def as_kind(self) -> "Kernel":
        """This content as the type it is (after a ``replace`` that changed what it is)."""
        return Kernel.of(self.name, self.ranges, self.buffers, self.values, self.stores, self.reduction_ranges,
                         self.symbolic)

    @property
    def is_reduction(self) -> bool:
        return any(isinstance(v, Reduction) for v in self.values)

    @property
    def has_scan(self) -> bool:
        return any(isinstance(v, Scan) for v in self.values)

    def outer(self) -> tuple[bool, ...]:
        """Per value: True if it depends on the outer ranges only (see the module docstring)."""
        n_outer, flags = len(self.ranges), []
        for v in self.values:
            if isinstance(v, Reduction):
                flags.append(True)
            elif isinstance(v, (Constant, SizeValue)):
                flags.append(True)
            elif isinstance(v, (Load, IndexValue)):
                flags.append(all(s == 0 for s in v.index.strides[n_outer:]))
            elif isinstance(v, (Cast, Indirect)):
                flags.append(flags[v.arg])
            elif isinstance(v, Scan):
                flags.append(False)  # a prefix varies along the reduced dim
            else:
                flags.append(all(flags[a] for a in v.args))
        return tuple(flags)

    def buffer(self, name: str) -> Buffer:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(f"kernel {self.name!r} has no buffer {name!r}")

    @property
    def inputs(self) -> tuple[str, ...]:
        seen = []
        for v in self.values:
            if isinstance(v, Load) and v.buffer not in seen:
                seen.append(v.buffer)
        return tuple(seen)

    @property
    def outputs(self) -> tuple[str, ...]:
        seen = []
        for s in self.stores:
            if s.buffer not in seen:
                seen.append(s.buffer)
        return tuple(seen)

    def check(self) -> None:
        """Raise ValueError naming the first malformed part (a bad IR is a capture bug)."""
        kind = Kernel.kind_of(self.values, self.reduction_ranges)
        if type(self) is not kind:
            raise ValueError(f"kernel {self.name!r} is a {kind.__name__} built as a {type(self).__name__} "
                             f"(use Kernel.of)")
        names = {b.name for b in self.buffers}
        rank = len(self.ranges) + len(self.reduction_ranges)

        def index_ok(where: str, index: Index) -> None:
            if len(index.strides) != rank:
                raise ValueError(f"kernel {self.name!r}: {where} has {len(index.strides)} strides for "
                                 f"{rank} ranges")
            for pos, _ in index.indirect:
                if not (0 <= pos < len(self.values) and isinstance(self.values[pos], Indirect)):
                    raise ValueError(f"kernel {self.name!r}: {where} has an indirect term of value {pos}, "
                                     f"which is not an Indirect index")

        for i, v in enumerate(self.values):
            if isinstance(v, Load):
                if v.buffer not in names:
                    raise ValueError(f"kernel {self.name!r}: value {i} loads unknown buffer {v.buffer!r}")
                index_ok(f"value {i} (load of {v.buffer})", v.index)
            elif isinstance(v, IndexValue):
                index_ok(f"value {i} (an index value)", v.index)
                if v.dtype not in ("int64", "int32"):
                    raise ValueError(f"kernel {self.name!r}: value {i} is an index value of dtype {v.dtype} "
                                     f"(int64 or int32)")
            elif isinstance(v, Op):
                arity = 1 if v.name in UNARY_OPS else 2 if v.name in BINARY_OPS else 3 if v.name in TERNARY_OPS else None
                if arity is None:
                    raise ValueError(f"kernel {self.name!r}: value {i} uses unknown op {v.name!r}")
                if len(v.args) != arity or any(not 0 <= a < i for a in v.args):
                    raise ValueError(f"kernel {self.name!r}: value {i} ({v.name}) has bad args {v.args}")
            elif isinstance(v, Cast):
                if not 0 <= v.arg < i:
                    raise ValueError(f"kernel {self.name!r}: value {i} (cast) has bad arg {v.arg}")
            elif isinstance(v, Reduction):
                if v.op not in REDUCTION_OPS:
                    raise ValueError(f"kernel {self.name!r}: value {i} uses unknown reduction {v.op!r}")
                if not 0 <= v.arg < i:
                    raise ValueError(f"kernel {self.name!r}: value {i} ({v.op}) has bad arg {v.arg}")
                if not self.reduction_ranges:
                    raise ValueError(f"kernel {self.name!r}: value {i} ({v.op}) in a kernel without reduction ranges")
            elif isinstance(v, Scan):
                if v.op not in SCAN_OPS or not 0 <= v.arg < i:
                    raise ValueError(f"kernel {self.name!r}: value {i} is a bad scan {v!r}")
                if len(self.reduction_ranges) != 1:
                    raise ValueError(f"kernel {self.name!r}: value {i} scans over reduction ranges "
                                     f"{self.reduction_ranges}, not one dim")
            elif isinstance(v, Indirect):
                if not 0 <= v.arg < i or v.bound < 0:
                    raise ValueError(f"kernel {self.name!r}: value {i} is a bad indirect index {v!r}")
                if self.values[v.arg].dtype not in ("int64", "int32", "int16", "int8", "uint8"):
                    raise ValueError(f"kernel {self.name!r}: value {i} indexes with a "
                                     f"{self.values[v.arg].dtype} value")
            elif isinstance(v, SizeValue):
                # (while symbolic/capture.py captures a kernel, it has no SymbolicSizes yet: the size's
                # name is checked once it has)
                sizes = [n for n, _, _ in self.symbolic.sizes] if self.symbolic is not None else [v.symbol]
                if v.symbol not in sizes or v.dtype != "int64" or v.coef < 1:
                    raise ValueError(f"kernel {self.name!r}: value {i} is {v!r}, not an int64 multiple of one "
                                     f"of the kernel's sizes {sizes}")
            elif not isinstance(v, Constant):
                raise ValueError(f"kernel {self.name!r}: value {i} is not an IR value: {v!r}")
            if v.dtype not in TORCH_DTYPES:
                raise ValueError(f"kernel {self.name!r}: value {i} has unknown dtype {v.dtype!r}")
        for s in self.stores:
            if s.buffer not in names:
                raise ValueError(f"kernel {self.name!r}: store to unknown buffer {s.buffer!r}")
            if not 0 <= s.value < len(self.values):
                raise ValueError(f"kernel {self.name!r}: store to {s.buffer!r} of missing value {s.value}")
            index_ok(f"store to {s.buffer}", s.index)
            if s.mode not in STORE_MODES:
                raise ValueError(f"kernel {self.name!r}: store to {s.buffer!r} has unknown mode {s.mode!r}")
        outer = self.outer()
        for s in self.stores:
            reduced = s.index.strides[len(self.ranges):]
            if outer[s.value] and any(reduced) and not isinstance(self.values[s.value], Constant):
                raise ValueError(f"kernel {self.name!r}: store to {s.buffer!r} of an outer value walks a "
                                 f"reduced dim (strides {s.index.strides})")

    # ---- dump / load ---------------------------------------------------------------

    def to_json(self) -> str:
        def bare(d):
            # Fields at their defaults are left out: an affine kernel dumps as it did before
            # indirect indexing existed (same JSON, same artifact key).
            if isinstance(d.get("index"), dict) and not d["index"].get("indirect"):
                d["index"].pop("indirect", None)
            if d.get("mode", 0) is None:
                d.pop("mode")
            return d

        def enc(v):
            d = bare(dataclasses.asdict(v))
            d["kind"] = type(v).__name__
            return d

        doc = {
            "kind": type(self).__name__, "name": self.name, "ranges": list(self.ranges), "reduction_ranges": list(self.reduction_ranges),
            "buffers": [dataclasses.asdict(b) for b in self.buffers],
            "values": [enc(v) for v in self.values],
            "stores": [bare(dataclasses.asdict(s)) for s in self.stores],
        }
        if self.symbolic is not None:  # (only then: a static kernel dumps as before, same key)
            doc["symbolic"] = symbolic_doc(self.symbolic)
        return json.dumps(doc, indent=1)

    @classmethod
    def from_json(cls, text: str) -> "Kernel":
        d = json.loads(text)
        kinds = {"Load": Load, "Constant": Constant, "IndexValue": IndexValue, "Op": Op, "Cast": Cast,
                 "Reduction": Reduction, "Scan": Scan, "Indirect": Indirect, "SizeValue": SizeValue}

        def index(x):
            return Index(tuple(x["strides"]), x["offset"], tuple(tuple(t) for t in x.get("indirect", ())))

        def dec(v):
            kind = kinds[v.pop("kind")]
            if kind is Load:
                return Load(v["buffer"], index(v["index"]), v["dtype"])
            if kind is IndexValue:
                return IndexValue(index(v["index"]), v["dtype"])
            if kind is Op:
                return Op(v["name"], tuple(v["args"]), v["dtype"])
            return kind(**v)

        return Kernel.of(
            d["name"], tuple(d["ranges"]),
            tuple(Buffer(b["name"], b["dtype"], tuple(b["shape"]), tuple(b["strides"]), b["offset"])
                  for b in d["buffers"]),
            tuple(dec(v) for v in d["values"]),
            tuple(Store(s["buffer"], index(s["index"]), s["value"], s.get("mode")) for s in d["stores"]),
            tuple(d.get("reduction_ranges", ())),
            _symbolic_of(d.get("symbolic")),
        )


class PointwiseKernel(Kernel):
    """Elementwise work over ``ranges``: no reduction ranges."""


class ReductionKernel(Kernel):
    """Reductions and scans over ``reduction_ranges``, with their prologues and epilogues."""


class IndirectKernel(Kernel):
    """Gathers and scatters: some Load or Store index has indirect terms (Indirect values)."""


class MatmulKernel(ReductionKernel):
    """A reduction whose one reduction is a "dot": out[..., m, n] = sum_k a[..., m, k] * b[..., k, n]."""


@dataclass(frozen=True)
class AttentionKernel:
    """Fused attention (issue 17): for every batch b, head h, query row i,

        out[b, h, i, :] = softmax_j(scale * q[b, h, i, :] . k[b, h // G, j, :] + mask) @ v[b, h // G, j, :]

    with G = heads / kv_heads (grouped-query attention: K and V are read per kv head, never
    copied per query head). The mask keeps position j where j <= i + ``causal`` (when set),
    adds ``bias`` (a float buffer) and keeps only where ``keep`` (a bool buffer) is true (a
    position it drops scores ``masked_score``: -inf, or the finite fill model code writes);
    with a ``positions`` buffer (an integer per query row, ``positions_stride`` elements apart:
    a KV cache's ``arange(S) <= pos[:, None]``) the diagonal is j <= positions[i] + causal; each
    of them broadcast over (b, h, i, j) by its own element strides (0: broadcast). A row that
    has no finite score gives zeros when ``empty_rows`` is "zero" (SDPA's math path) and NaN when
    it is "nan" (a plain softmax). QK^T and PV run on the PE arrays with fp32 accumulation; the
    softmax probabilities are rounded to the output dtype before PV (what the explicit
    ``softmax(...).to(q.dtype) @ v`` does).

    Buffers, in order: q [B, H, L, D], k [B, KVH, S, D], v [B, KVH, S, Dv], then bias and/or keep
    (any shape; their strides are ``bias_strides`` / ``keep_strides``) and positions, then out
    [B, H, L, Dv].
    Not a ``Kernel``: its work is two matmuls around an online softmax, not one loop nest.
    """

    name: str
    buffers: tuple[Buffer, ...]
    scale: float
    causal: int | None = None
    bias_strides: tuple[int, ...] | None = None
    keep_strides: tuple[int, ...] | None = None
    empty_rows: str = "zero"
    p_dtype: str | None = None   # the probabilities' dtype in PV (None: the output's)
    masked_score: float = float("-inf")  # the score of a position the keep mask drops (model code's finfo.min)
    positions_stride: int | None = None  # rows' positions from a buffer: keep j <= positions[i] + causal
    # Issue 18: a sequence length known only at launch (families/attention/sizes.py). `ranges` then
    # index dims (B, H, KVH, L, S, D, Dv); the shapes and strides above are the bucket's maximum's.
    symbolic: SymbolicSizes | None = None

    # ---- the buffers by role ------------------------------------------------------------

    @property
    def q(self) -> Buffer:
        return self.buffers[0]

    @property
    def k(self) -> Buffer:
        return self.buffers[1]

    @property
    def v(self) -> Buffer:
        return self.buffers[2]

    @property
    def bias(self) -> Buffer | None:
        return self.buffers[3] if self.bias_strides is not None else None

    @property
    def keep(self) -> Buffer | None:
        return self.buffers[3 + (self.bias_strides is not None)] if self.keep_strides is not None else None

    @property
    def positions(self) -> Buffer | None:
        return self.buffers[-2] if self.positions_stride is not None else None

    @property
    def out(self) -> Buffer:
        return self.buffers[-1]

    @property
    def dims(self) -> tuple[int, int, int, int, int, int, int]:
        """(B, H, KVH, L, S, D, Dv)."""
        B, H, L, D = self.q.shape
        return B, H, self.k.shape[1], L, self.k.shape[2], D, self.v.shape[3]

    @property
    def group(self) -> int:
        _, H, KVH, *_ = self.dims
        return H // KVH

    @property
    def ranges(self) -> tuple[int, ...]:
        B, H, _, L, _, _, Dv = self.dims
        return (B, H, L, Dv)

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(b.name for b in self.buffers[:-1])

    @property
    def outputs(self) -> tuple[str, ...]:
        return (self.out.name,)

    def buffer(self, name: str) -> Buffer:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(f"kernel {self.name!r} has no buffer {name!r}")

    def check(self) -> None:
        """Raise ValueError naming the first malformed part."""
        where = f"attention kernel {self.name!r}"
        extra = (self.bias_strides is not None) + (self.keep_strides is not None) + (self.positions_stride is not None)
        if len(self.buffers) != 4 + extra:
            raise ValueError(f"{where}: {len(self.buffers)} buffers, expected q, k, v, {extra} mask(s) and out")
        if self.positions is not None and self.positions.dtype not in ("int64", "int32"):
            raise ValueError(f"{where}: positions of dtype {self.positions.dtype} (int64 or int32)")
        if self.positions is not None and self.causal is None:
            raise ValueError(f"{where}: positions without a diagonal (causal) offset")
        for role, b in (("q", self.q), ("k", self.k), ("v", self.v), ("out", self.out)):
            if len(b.shape) != 4 or len(b.strides) != 4:
                raise ValueError(f"{where}: {role} must be 4-D (batch, heads, rows, features), got {b.shape}")
        B, H, KVH, L, S, D, Dv = self.dims
        if self.k.shape != (B, KVH, S, D) or self.v.shape[:3] != (B, KVH, S):
            raise ValueError(f"{where}: k {self.k.shape} and v {self.v.shape} do not match q {self.q.shape}")
        if KVH == 0 or H % KVH:
            raise ValueError(f"{where}: {H} query heads are not a multiple of {KVH} kv heads")
        if self.out.shape != (B, H, L, Dv):
            raise ValueError(f"{where}: out {self.out.shape}, expected {(B, H, L, Dv)}")
        for role, strides, b in (("bias", self.bias_strides, self.bias), ("keep", self.keep_strides, self.keep)):
            if strides is not None and len(strides) != 4:
                raise ValueError(f"{where}: {role} strides {strides} (one per batch, head, row, position)")
        if self.keep is not None and self.keep.dtype != "bool":
            raise ValueError(f"{where}: the keep mask is {self.keep.dtype}, not bool")
        if self.p_dtype is not None and self.p_dtype not in ("fp16", "bf16", "fp32"):
            raise ValueError(f"{where}: probabilities in {self.p_dtype}")
        if self.masked_score != float("-inf") and self.causal is not None and self.positions is None:
            raise ValueError(f"{where}: a causal diagonal drops positions to -inf, not {self.masked_score}")
        if self.empty_rows not in ("zero", "nan"):
            raise ValueError(f"{where}: empty_rows {self.empty_rows!r} (zero or nan)")
        for b in self.buffers:
            if b.dtype not in TORCH_DTYPES:
                raise ValueError(f"{where}: buffer {b.name!r} has unknown dtype {b.dtype!r}")

    def to_json(self) -> str:
        return json.dumps({"kind": "AttentionKernel", "name": self.name,
                           "buffers": [dataclasses.asdict(b) for b in self.buffers], "scale": self.scale,
                           "causal": self.causal, "bias_strides": self.bias_strides,
                           "keep_strides": self.keep_strides, "empty_rows": self.empty_rows,
                           **({"p_dtype": self.p_dtype} if self.p_dtype else {}),
                           **({"masked_score": self.masked_score} if self.masked_score != float("-inf") else {}),
                           **({"positions_stride": self.positions_stride} if self.positions_stride is not None else {}),
                           **({"symbolic": symbolic_doc(self.symbolic)} if self.symbolic is not None else {})},
                          indent=1)

    @classmethod
    def from_json(cls, text: str) -> "AttentionKernel":
        d = json.loads(text)
        buffers = tuple(Buffer(b["name"], b["dtype"], tuple(b["shape"]), tuple(b["strides"]), b["offset"])
                        for b in d["buffers"])
        tup = lambda s: None if s is None else tuple(s)  # noqa: E731
        return cls(d["name"], buffers, d["scale"], d["causal"], tup(d["bias_strides"]), tup(d["keep_strides"]),
                   d["empty_rows"], d.get("p_dtype"), d.get("masked_score", float("-inf")), d.get("positions_stride"),
                   _symbolic_of(d.get("symbolic")))


@dataclass(frozen=True)
class SortKernel:
    """A sort along rows (issue 31): for every row r of ``source`` [R, n], ``values[r, :k]`` and
    ``indices[r, :k]`` are the first k of the row's stable sort (``descending`` or not): NaN
    greater than every number and equal to NaN, -0.0 equal to 0.0, ties in input order.
    ``sort`` and ``argsort`` are k = n, ``topk`` is k <= n in the order of ``largest``.

    Buffers, in order: source [R, n], values [R, k] (the source's dtype), indices [R, k] (int64);
    each row's elements contiguous (stride 1). Not a ``Kernel``: a sorting network's steps
    pair elements across the row, which no loop nest of per-element values states.
    """

    name: str
    buffers: tuple[Buffer, ...]
    descending: bool
    symbolic: SymbolicSizes | None = None  # a dynamic count of rows: dim 0 of every buffer (issue 18)

    @property
    def source(self) -> Buffer:
        return self.buffers[0]

    @property
    def values(self) -> Buffer:
        return self.buffers[1]

    @property
    def indices(self) -> Buffer:
        return self.buffers[2]

    @property
    def rows(self) -> int:
        return self.source.shape[0]

    @property
    def n(self) -> int:
        return self.source.shape[1]

    @property
    def k(self) -> int:
        return self.values.shape[1]

    @property
    def ranges(self) -> tuple[int, ...]:
        return (self.rows, self.k)

    @property
    def inputs(self) -> tuple[str, ...]:
        return (self.source.name,)

    @property
    def outputs(self) -> tuple[str, ...]:
        return (self.values.name, self.indices.name)

    def buffer(self, name: str) -> Buffer:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(f"kernel {self.name!r} has no buffer {name!r}")

    def check(self) -> None:
        """Raise ValueError naming the first malformed part."""
        where = f"sort kernel {self.name!r}"
        if len(self.buffers) != 3:
            raise ValueError(f"{where}: {len(self.buffers)} buffers, expected source, values and indices")
        for b in self.buffers:
            if len(b.shape) != 2 or len(b.strides) != 2:
                raise ValueError(f"{where}: {b.name} must be 2-D (rows, elements), got {b.shape}")
            if b.dtype not in TORCH_DTYPES:
                raise ValueError(f"{where}: buffer {b.name!r} has unknown dtype {b.dtype!r}")
            if b.strides[1] != 1 and b.shape[1] > 1:
                raise ValueError(f"{where}: {b.name}'s rows are not contiguous (stride {b.strides[1]})")
        R, n = self.source.shape
        if self.values.shape != self.indices.shape or self.values.shape[0] != R or not 0 <= self.k <= n:
            raise ValueError(f"{where}: values {self.values.shape} and indices {self.indices.shape} are not "
                             f"the first k <= {n} of {R} rows")
        if self.values.dtype != self.source.dtype or self.indices.dtype != "int64":
            raise ValueError(f"{where}: values of {self.values.dtype} (the source's {self.source.dtype}) and "
                             f"indices of {self.indices.dtype} (int64)")

    def to_json(self) -> str:
        return json.dumps({"kind": "SortKernel", "name": self.name,
                           "buffers": [dataclasses.asdict(b) for b in self.buffers], "descending": self.descending,
                           **({"symbolic": symbolic_doc(self.symbolic)} if self.symbolic is not None else {})},
                          indent=1)

    @classmethod
    def from_json(cls, text: str) -> "SortKernel":
        d = json.loads(text)
        buffers = tuple(Buffer(b["name"], b["dtype"], tuple(b["shape"]), tuple(b["strides"]), b["offset"])
                        for b in d["buffers"])
        return cls(d["name"], buffers, d["descending"], _symbolic_of(d.get("symbolic")))


def sort_reference(source, k: int, descending: bool):
    """SortKernel's semantics on torch tensors: (values, indices) of the first k of each row's
    stable sort (the CPU's stable sort has exactly the NaN, -0.0 and tie order above)."""
    values, indices = torch.sort(source, dim=-1, descending=descending, stable=True)
    return values[..., :k], indices[..., :k]


@dataclass(frozen=True)
class ConvKernel:
    """conv2d as an implicit GEMM on the PE arrays (issue 31): for every n, oc, oh, ow,

        out[n, oc, oh, ow] = bias[oc] + sum_{c, kh, kw} image[n, c, oh*sh + kh*dh, ow*sw + kw*dw] * weight[oc, c, kh, kw]

    summed in fp32 and rounded once to the output's dtype. No padding: every tap is inside the
    image (the lowering pads first). Buffers, in order: image [N, C, H, W], weight [OC, C, KH, KW],
    bias [OC] (when ``has_bias``), out [N, OC, OH, OW], each with its own strides (an NCHW or a
    channels-last image alike; families/convolution/lowering.py says which layouts it plans).
    Not a ``Kernel``: the loads of its patches are not affine in one m and one k index.
    """

    name: str
    buffers: tuple[Buffer, ...]
    stride: tuple[int, int]
    dilation: tuple[int, int] = (1, 1)
    has_bias: bool = False
    symbolic: None = None  # (static sizes only)

    @property
    def image(self) -> Buffer:
        return self.buffers[0]

    @property
    def weight(self) -> Buffer:
        return self.buffers[1]

    @property
    def bias(self) -> Buffer | None:
        return self.buffers[2] if self.has_bias else None

    @property
    def out(self) -> Buffer:
        return self.buffers[-1]

    @property
    def ranges(self) -> tuple[int, ...]:
        return tuple(self.out.shape)

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(b.name for b in self.buffers[:-1])

    @property
    def outputs(self) -> tuple[str, ...]:
        return (self.out.name,)

    def buffer(self, name: str) -> Buffer:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(f"kernel {self.name!r} has no buffer {name!r}")

    def check(self) -> None:
        """Raise ValueError naming the first malformed part."""
        where = f"conv kernel {self.name!r}"
        if len(self.buffers) != 3 + self.has_bias:
            raise ValueError(f"{where}: {len(self.buffers)} buffers, expected image, weight, "
                             f"{'bias, ' if self.has_bias else ''}out")
        for role, b in (("image", self.image), ("weight", self.weight), ("out", self.out)):
            if len(b.shape) != 4 or len(b.strides) != 4:
                raise ValueError(f"{where}: {role} must be 4-D, got {b.shape}")
        N, C, H, W = self.image.shape
        OC, CW, KH, KW = self.weight.shape
        (sh, sw), (dh, dw) = self.stride, self.dilation
        if min(sh, sw, dh, dw) < 1:
            raise ValueError(f"{where}: stride {self.stride} and dilation {self.dilation} must be positive")
        if CW != C:
            raise ValueError(f"{where}: weight {self.weight.shape} over {CW} channels, the image has {C}")
        OH, OW = (H - dh * (KH - 1) - 1) // sh + 1, (W - dw * (KW - 1) - 1) // sw + 1
        if self.out.shape != (N, OC, OH, OW):
            raise ValueError(f"{where}: out {self.out.shape}, expected {(N, OC, OH, OW)}")
        if self.bias is not None and (self.bias.shape != (OC,) or len(self.bias.strides) != 1):
            raise ValueError(f"{where}: bias {self.bias.shape}, expected {(OC,)}")
        for b in self.buffers:
            if b.dtype not in TORCH_DTYPES:
                raise ValueError(f"{where}: buffer {b.name!r} has unknown dtype {b.dtype!r}")

    def to_json(self) -> str:
        return json.dumps({"kind": "ConvKernel", "name": self.name,
                           "buffers": [dataclasses.asdict(b) for b in self.buffers], "stride": list(self.stride),
                           "dilation": list(self.dilation), "has_bias": self.has_bias}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> "ConvKernel":
        d = json.loads(text)
        buffers = tuple(Buffer(b["name"], b["dtype"], tuple(b["shape"]), tuple(b["strides"]), b["offset"])
                        for b in d["buffers"])
        return cls(d["name"], buffers, tuple(d["stride"]), tuple(d["dilation"]), d["has_bias"])


@dataclass(frozen=True)
class GroupedMatmulKernel:
    """A grouped matmul (mixture-of-experts routing, issue 31): for every row s of a [S, K],

        out[s, :] = a[s, :] @ w[g(s)],   g(s) = #{e : offs[e] <= s}

    with w [E, K, N] and offs [E] the cumulative row ends of the experts (rows offs[e-1] ..
    offs[e]-1 are expert e's; offs is data, read on chip). Rows from offs[-1] on, which
    ``aten._grouped_mm`` leaves uninitialized, are zeros. The products accumulate in fp32 and
    are rounded once to out's dtype.

    Buffers, in order: a [S, K], w [E, K, N], offs [E] (int32 or int64), out [S, N].
    Not a ``Kernel``: which rows meet which weights is data, not a loop nest.
    """

    name: str
    buffers: tuple[Buffer, ...]

    @property
    def a(self) -> Buffer:
        return self.buffers[0]

    @property
    def w(self) -> Buffer:
        return self.buffers[1]

    @property
    def offs(self) -> Buffer:
        return self.buffers[2]

    @property
    def out(self) -> Buffer:
        return self.buffers[3]

    @property
    def dims(self) -> tuple[int, int, int, int]:
        """(S, K, N, E)."""
        (S, K), (E, _, N) = self.a.shape, self.w.shape
        return S, K, N, E

    @property
    def ranges(self) -> tuple[int, ...]:
        return tuple(self.out.shape)

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(b.name for b in self.buffers[:-1])

    @property
    def outputs(self) -> tuple[str, ...]:
        return (self.out.name,)

    def buffer(self, name: str) -> Buffer:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(f"kernel {self.name!r} has no buffer {name!r}")

    def check(self) -> None:
        """Raise ValueError naming the first malformed part."""
        where = f"grouped matmul kernel {self.name!r}"
        if len(self.buffers) != 4:
            raise ValueError(f"{where}: {len(self.buffers)} buffers, expected a, w, offs and out")
        for role, b, rank in (("a", self.a, 2), ("w", self.w, 3), ("offs", self.offs, 1), ("out", self.out, 2)):
            if len(b.shape) != rank or len(b.strides) != rank:
                raise ValueError(f"{where}: {role} must be {rank}-D, got shape {b.shape} strides {b.strides}")
            if b.dtype not in TORCH_DTYPES:
                raise ValueError(f"{where}: buffer {b.name!r} has unknown dtype {b.dtype!r}")
        S, K, N, E = self.dims
        if self.w.shape[1] != K or self.offs.shape != (E,) or self.out.shape != (S, N):
            raise ValueError(f"{where}: a {self.a.shape}, w {self.w.shape}, offs {self.offs.shape} and out "
                             f"{self.out.shape} do not match (a [S, K], w [E, K, N], offs [E], out [S, N])")
        if self.offs.dtype not in ("int32", "int64"):
            raise ValueError(f"{where}: offs of dtype {self.offs.dtype} (int32 or int64)")
        if self.a.dtype != self.w.dtype or self.a.dtype not in ("fp16", "bf16", "fp32"):
            raise ValueError(f"{where}: a {self.a.dtype} and w {self.w.dtype} (one float dtype)")

    def to_json(self) -> str:
        return json.dumps({"kind": "GroupedMatmulKernel", "name": self.name,
                           "buffers": [dataclasses.asdict(b) for b in self.buffers]}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> "GroupedMatmulKernel":
        d = json.loads(text)
        return cls(d["name"], tuple(Buffer(b["name"], b["dtype"], tuple(b["shape"]), tuple(b["strides"]), b["offset"])
                                    for b in d["buffers"]))


def grouped_mm_reference(a, w, offs, out_dtype=None):
    """GroupedMatmulKernel's semantics on torch tensors (any device): each expert's rows times its
    weights in fp32, rounded once; rows from offs[-1] on are zeros."""
    out = torch.zeros(a.shape[0], w.shape[2], dtype=out_dtype or a.dtype, device=a.device)
    start = 0
    for e, end in enumerate(offs.tolist()):
        if end > start:
            out[start:end] = (a[start:end].float() @ w[e].float()).to(out.dtype)
        start = max(start, end)
    return out


def symbolic_doc(sym: SymbolicSizes) -> dict:
    """SymbolicSizes as JSON; no strides key when none is symbolic (a kernel dumps as it did before
    symbolic strides existed: the same artifact key)."""
    return {k: v for k, v in dataclasses.asdict(sym).items() if k != "strides" or v}


def _symbolic_of(d: dict | None) -> SymbolicSizes | None:
    if d is None:
        return None
    return SymbolicSizes(*(tuple(tuple(x) for x in d.get(k, ())) for k in ("sizes", "ranges", "buffers", "limits",
                                                                          "strides")))


def kernel_from_json(text: str) -> "Kernel | AttentionKernel | SortKernel | ConvKernel | GroupedMatmulKernel":
    """The kernel an artifact's kernel.json holds, of whichever kind it names."""
    kinds = {"AttentionKernel": AttentionKernel, "SortKernel": SortKernel, "ConvKernel": ConvKernel,
             "GroupedMatmulKernel": GroupedMatmulKernel}
    return kinds.get(json.loads(text).get("kind"), Kernel).from_json(text)


def attention_reference(q, k, v, bias=None, keep=None, *, scale: float, causal: int | None = None,
                        empty_rows: str = "zero", p_dtype=None, out_dtype=None, masked_score=float("-inf"),
                        positions=None):
    """AttentionKernel's semantics on torch tensors (any device; broadcast bias/keep to
    [B, H, L, S]): the definition tests and the CPU fallback use."""
    B, H, L, _ = q.shape
    G = H // k.shape[1]
    kf = k.float().repeat_interleave(G, dim=1)
    vf = v.float().repeat_interleave(G, dim=1)
    s = (q.float() @ kf.transpose(-2, -1)) * scale
    S = k.shape[2]
    allowed = torch.ones(L, S, dtype=torch.bool, device=q.device)
    if positions is not None:
        allowed = torch.arange(S, device=q.device)[None, :] <= positions.reshape(L, 1) + causal
    elif causal is not None:
        allowed = allowed.tril(causal)
    allowed = allowed.expand(B, H, L, S)
    s = s.masked_fill(~allowed, float("-inf"))
    if bias is not None:
        s = s + bias.float()
    if keep is not None:
        s = s.masked_fill(~keep.to(torch.bool), masked_score)
    p = torch.softmax(s, -1)
    if empty_rows == "zero":  # a row whose every score is -inf (masked or biased away) gives zeros
        p = p.masked_fill((s == float("-inf")).all(-1, keepdim=True), 0.0)
    out_dtype = out_dtype or q.dtype
    p = p.to(p_dtype or out_dtype).float()
    return (p @ vf).to(out_dtype)
