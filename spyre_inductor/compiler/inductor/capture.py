"""Capture: Inductor scheduler nodes -> one Kernel (kernel_ir), or a reason why not.

Each node's loop body is an FX graph of Inductor ``ops`` calls. We run it
under our own ops handler (``with V.set_ops_handler(h): node._body(vars, [])``)
with symbolic loop variables; every call appends a value to the kernel IR
instead of printing code. Anything the IR cannot say raises NotCapturable
with a reason, and the caller turns the node into a CPU fallback.

A group of nodes (a fusion candidate or a FusedSchedulerNode) becomes one
kernel over the common ranges of its nodes. A group with reduction nodes
(issue 8) iterates (outer ranges, reduction ranges): its reductions must
agree on both sizes, pointwise prologues/epilogues over the whole space
are re-expressed in (outer..., reduced...) variables, pointwise nodes over
the outer space only (``mean = sum / n``) in the outer variables. Inside
the group:

- a load of a buffer an earlier node stored, at the same index, takes the
  stored value (cast to the buffer's dtype, as a round trip through memory
  would); any other index refuses the group (the value is not on chip);
- a store whose buffer nobody outside the group reads (Inductor's
  ``can_buffer_be_removed_through_fusion``) stays on chip: no Store, and the
  scheduler removes the buffer so the wrapper never allocates it;
- buffer names go through ``mutation_real_name``, so an in-place update of
  a graph input stores into the input itself;
- identical values are captured once (Inductor inlines a producer into every
  use, so the same load or op arrives many times);
- ``ops.reduction`` becomes a Reduction value (welford_reduce: three, one
  per result, of the same argument); ``ops.store_reduction`` is a store of
  it, and a later load of that buffer in the group (a softmax's ``x - max``)
  takes the Reduction value itself, broadcast over the reduced dims;
- ``ops.scan`` (cumsum, cumprod) becomes a Scan value when its combine
  function is one add or one multiply of the running value and the next
  element (found by calling it on probes); any other combine (logcumsumexp)
  refuses the group;
- ``ops.index_expr`` with Min, Max or Abs terms (issue 31: T5's ``-Min(0, j - i)``, a
  clamp) is computed as eager computes it: its affine parts iotas, each bend an sfp
  minimum/maximum/abs over them (index_bends.py), summed with its integer coefficients;
- ``ops.indirect_indexing`` (issue 16) becomes an Indirect value (named after
  the node's aten op, for the out-of-range error) and hands back a fresh
  symbol, which ``affine_index`` turns into the Index's indirect term; a
  store with mode "atomic_add" keeps its mode. A scattered store is never
  forwarded on chip, and a group that scatters into a buffer it also reads,
  or that mixes indirect indexing with a reduction, is refused.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import sympy
import torch
from torch._inductor import ir
from torch._inductor.dtype_propagation import DtypePropagationOpsHandler
from torch._inductor.ops_handler import DefaultHandler
from torch._inductor.virtualized import V
from torch.utils._sympy.functions import FloorDiv, ModularIndexing
from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

from torch._inductor.utils import sympy_index_symbol

from .nodes import loop_body, real_name
from . import index_bends, indexing
from ...launcher.fallback_policy import origin_ops
from ...launcher.nesting import negative_indices_wrap
from ..ir.errors import NotCapturable, OutOfRange
from .indexing import (affine_index, common_ranges, dim_cuts, piecewise_affine, split_sizes, loop_vars, node_vars,
    reduction_common_ranges, static_int)
from ..ir.kernel_ir import (BINARY_OPS, DTYPE_NAMES, TERNARY_OPS, UNARY_OPS, Buffer, Cast, Constant, Index,
    IndexValue, Indirect, Load, Op, Kernel, Reduction, Scan, SizeValue, Store, renumbered)

# Inductor ops spelled differently in the IR (same semantics).
_OP_ALIASES = {
    "and_": "bitwise_and", "or_": "bitwise_or", "xor": "bitwise_xor",
    "mul_rn": "mul",
}
_IR_OPS = UNARY_OPS | BINARY_OPS | TERNARY_OPS
# Inductor reduction types with the same meaning in the IR. (``all`` reaches
# Inductor decomposed into ``any``; welford_combine only appears in split
# reductions, which REDUCE_TO_SINGLE_ELEMENT turns off; argmax_value and
# friends are Triton-only lowerings.)
_REDUCTIONS = frozenset({"sum", "prod", "max", "min", "argmax", "argmin", "any", "all",
                         "dot"})  # Inductor's native-matmul reduction (lowerings.py): a matmul
_WELFORD = ("welford_mean", "welford_m2", "welford_weight")
_LOW_PRECISION = frozenset({torch.float16, torch.bfloat16})
# IR dtype -> the dtypes that represent each of its values exactly.
_EXACT_WIDENING = {
    "bool": ("int8", "uint8", "int16", "int32", "int64", "fp16", "bf16", "fp32"),
    "int8": ("int16", "int32", "int64", "fp16", "fp32"),
    "uint8": ("int16", "int32", "int64", "fp16", "fp32"),
    "int16": ("int32", "int64", "fp32"),
    "int32": ("int64",),
    "fp16": ("fp32",),
    "bf16": ("fp32",),
}


@dataclass(frozen=True)
class Capture:
    """What capture made of a group of nodes."""

    kernel: Kernel | None  # None: nothing to run (no elements, or nothing stored)
    removed: frozenset[str]  # Inductor buffers that stay on chip (the wrapper must not allocate them)
    # Sizes the kernel is specialized to per value at launch (symbolic/exact.py): their symbols, in
    # the order the launch passes their values, and the Template that makes a value's kernel.
    exact: tuple[str, ...] = ()
    template: object = None


@dataclass(frozen=True)
class _V:
    """A value inside the handler: its position in the kernel's values and its dtype."""

    pos: int
    dtype: torch.dtype
    is_scalar: bool = False  # read by Inductor's dtype propagation rules


def dtype_name(dtype: torch.dtype, what: str) -> str:
    name = DTYPE_NAMES.get(dtype)
    if name is None:
        raise NotCapturable(f"{what} has dtype {dtype}, which spyre kernels do not handle")
    return name


def storage_of(name: str) -> str:
    """The buffer that owns `name`'s memory (itself, unless it is a view such as a cat slot)."""
    layout = V.graph.get_buffer(name).get_output_spec()
    if isinstance(layout, ir.NonOwningLayout) and isinstance(layout.view, ir.ReinterpretView):
        return layout.view.data.get_name()
    return name


def buffer_of(name: str) -> Buffer:
    """The IR Buffer for a real (post-mutation) buffer name, from its Inductor layout."""
    node = V.graph.get_buffer(name)
    if node is None:
        raise NotCapturable(f"no buffer named {name}")
    device = node.get_device()
    if device is None or device.type != "spyre":
        raise NotCapturable(f"{name} lives on {device}, not on spyre")
    layout = node.get_output_spec()
    # (A NonOwningLayout buffer is a view into another one, e.g. one input's
    # slot in a cat; the wrapper passes that view, so it is an ordinary strided buffer here.)
    if not isinstance(layout, ir.Layout):
        raise NotCapturable(f"{name} has layout {type(layout).__name__}")
    shape = tuple(static_int(s, f"size of {name}") for s in layout.size)
    strides = tuple(_stride(s, n, name) for s, n in zip(layout.stride, shape))
    if static_int(layout.offset, f"offset of {name}") != 0:
        # Indices from Inductor already include a layout offset; keep the IR's
        # Buffer.offset meaning unambiguous by not compiling such buffers yet.
        raise NotCapturable(f"{name} has a storage offset in its layout")
    return Buffer(name, dtype_name(layout.dtype, name), shape, strides, 0)


def _stride(stride, extent: int, name: str) -> int:
    """A layout's stride as an int. A dim of one element is never stepped along, so its stride,
    when it is a size of its own (a sliding window cache's view, made dynamic by Dynamo), is 0
    (launch binding ignores such strides too)."""
    try:
        return static_int(stride, f"stride of {name}")
    except NotCapturable:
        if extent == 1:
            return 0
        raise


class _Group:
    """The kernel under construction, shared by the handlers of the group's nodes."""

    def __init__(self, ranges: tuple[int, ...], removable: frozenset[str],
                 reduction_ranges: tuple[int, ...] = ()):
        self.ranges = ranges
        self.reduction_ranges = reduction_ranges
        self.outer_vars = loop_vars(len(ranges))
        self.reduction_vars = loop_vars(len(reduction_ranges), "r")
        self.vars = self.outer_vars + self.reduction_vars  # every Index has a stride for each
        self.var_ranges = dict(zip(self.vars, ranges + reduction_ranges))  # simplifies a repeat's i mod n
        self.removable = removable
        self.values: list = []
        self.seen: dict[tuple, int] = {}
        self.buffers: dict[str, Buffer] = {}
        self.stores: dict[str, Store] = {}
        self.stored: dict[str, tuple[Index, _V]] = {}  # real name -> last store, for forwarding
        self.loaded: dict[str, set[Index]] = {}  # real name -> indices read from memory
        self.removed: set[str] = set()
        self.indirect: dict[sympy.Symbol, int] = {}  # indirect_indexing's symbols -> Indirect positions
        self.scattered: set[str] = set()  # real names stored at indirect indices
        self.op = ""  # the aten op of the node being captured (Indirect.op)

    def add(self, value, dtype: torch.dtype) -> _V:
        # One value per distinct computation: Inductor inlines a producer into
        # each of its uses, and fused nodes repeat each other's loads; the
        # kernel should compute and read each thing once. (repr keeps -0.0
        # apart from 0.0; the values are pure, so sharing is always safe.)
        key = (type(value), repr(value))
        pos = self.seen.get(key)
        if pos is None:
            self.values.append(value)
            pos = self.seen[key] = len(self.values) - 1
        return _V(pos, dtype)

    def use_buffer(self, name: str) -> Buffer:
        if name not in self.buffers:
            self.buffers[name] = buffer_of(name)
        return self.buffers[name]


class CaptureHandler(DefaultHandler):
    """Inductor ops -> kernel IR values, for one node of a group."""

    def __init__(self, group: _Group):
        self.g = group

    # ---- values --------------------------------------------------------------------

    def _as_value(self, x, like: torch.dtype | None = None) -> _V:
        if isinstance(x, _V):
            return x
        if isinstance(x, bool):
            return self.constant(x, torch.bool)
        if isinstance(x, int):
            return self.constant(x, torch.int64)
        if isinstance(x, float):
            dtype = like if like is not None and like.is_floating_point else torch.float32
            return self.constant(x, dtype)
        raise NotCapturable(f"operand {x!r} of type {type(x).__name__}")

    def constant(self, value, dtype: torch.dtype) -> _V:
        name = dtype_name(dtype, "a constant")
        if dtype.is_floating_point:
            value = float(value)
        elif dtype == torch.bool:
            value = bool(value)
        else:
            value = int(value)
        return self.g.add(Constant(value, name), dtype)

    def index_expr(self, expr, dtype: torch.dtype) -> _V:
        expr = indexing.specialized(expr, f"the index value {expr}")
        if isinstance(expr, sympy.Integer):
            return self.constant(int(expr), dtype)
        sized = self._size_term(expr)
        if sized is not None:
            rest, size = sized
            value = self.g.add(Op("add", (self.index_expr(rest, torch.int64).pos, size.pos), "int64"), torch.int64)
            # (rest == 0: a Constant 0 added; the sfp adds it, once per tile)
            return value if dtype == torch.int64 else self.to_dtype(value, dtype)
        if index_bends.is_bent(expr):
            value = self._bent_index_value(expr)
            return value if dtype == torch.int64 else self.to_dtype(value, dtype)
        index = affine_index(expr, self.g.vars, f"the index value {expr}", self.g.var_ranges)
        if dtype in (torch.int64, torch.int32):
            return self.g.add(IndexValue(index, dtype_name(dtype, "an index value")), dtype)
        # (Inductor asks for other dtypes directly at times: the index in int64, then a cast,
        # is what eager computes: arange's values are exact integers.)
        value = self.g.add(IndexValue(index, "int64"), torch.int64)
        return self.to_dtype(value, dtype)

    value_expr = index_expr

    def _bent_index_value(self, expr) -> _V:
        """An index value with Min, Max or Abs terms (index_bends.py) as eager computes it, in
        int64: its affine rest an iota, each bend an sfp op over its arguments' values (each
        captured as an index value itself, bends nested in bends included), times its integer
        coefficient, all summed. (The int64 ops are exact: no rounding to argue about.)"""
        rest, bends = index_bends.split(expr, f"the index value {expr}")
        value = self.index_expr(rest, torch.int64) if rest != 0 or not bends else None
        for bend in bends:
            args = [self.index_expr(a, torch.int64) for a in bend.args]
            term = args[0]
            for arg in args[1:]:  # sympy's Min/Max take any number of arguments
                term = self._default(bend.op, (term, arg), {})
            if bend.op == "abs":
                term = self._default("abs", (term,), {})
            if bend.coef == -1:
                term = self._default("neg", (term,), {})
            elif bend.coef != 1:
                term = self._default("mul", (term, self.constant(bend.coef, torch.int64)), {})
            value = term if value is None else self._default("add", (value, term), {})
        return value

    def _size_term(self, expr):
        """(expr without it, its SizeValue) when `expr` adds coef * size to what the loop indices
        give (a mean's divisor, x.shape[0] in a value) while symbolic/capture.py captures over that size
        (issue 18): the size is read at launch, not baked at the capture's value. None otherwise."""
        values = indexing.SIZE_VALUES.get()
        if not values:
            return None
        expr = sympy.expand(expr)
        sizes = [x for x in expr.free_symbols if x in values]
        if len(sizes) != 1:
            return None
        (size,) = sizes
        coef = expr.coeff(size, 1)
        if not (isinstance(coef, sympy.Integer) and coef >= 1) or size in sympy.expand(expr - coef * size).free_symbols:
            return None  # (a size times a loop index is a symbolic stride: refused where indices are captured)
        return sympy.expand(expr - coef * size), self.g.add(SizeValue(str(size), int(coef)), torch.int64)

    def to_dtype(self, x, dtype: torch.dtype, src_dtype=None, use_compute_types=True) -> _V:
        x = self._as_value(x)
        target = dtype_name(dtype, "a cast")
        inner = self.g.values[x.pos]
        if isinstance(inner, Cast):
            # Cast(Cast(y, M), D) is Cast(y, D) when M holds every value of y's
            # dtype exactly: decompositions widen and narrow back (torch.all is
            # any(not x) through int64), and the planner need not see the detour.
            source = self.g.values[inner.arg].dtype
            if inner.dtype in _EXACT_WIDENING.get(source, ()):
                if target == source and source not in ("fp16", "bf16", "fp32"):
                    return _V(inner.arg, dtype)  # an integer or bool round trip: the value itself
                return self.g.add(Cast(inner.arg, target), dtype)
        return self.g.add(Cast(x.pos, target), dtype)

    def identity(self, x):
        return x

    def _is_div_rn(self, x: _V) -> bool:
        v = self.g.values[x.pos]
        return isinstance(v, Op) and v.name == "div_rn" and x.dtype.is_floating_point

    def fma(self, a, b, c):
        # Inductor's prims.fma (its _softmax_backward_data: new_grad - output * sum, written
        # fma(-output, sum, new_grad)): a multiply and an add here, rounded twice where the
        # fused op rounds once, as the CPU kernel of _softmax_backward_data does.
        return self._default("add", (self._default("mul", (a, b), {}), c), {})

    def dot(self, a, b):
        # The product inside Inductor's native-matmul form (lowerings.py: ops.dot of the two
        # operands, reduced by "dot"); pointwise it is a multiply, the "dot" reduction sums it.
        return self._default("mul", (a, b), {})

    # ---- random values (issue 19) -------------------------------------------------------

    def load_seed(self, name: str, offset) -> _V:
        # Inductor's inductor_lookup_seed: element `offset` of the seeds buffer its RandomSeeds
        # extern kernel filled (aten.randint.low_out on the device generator), read as a scalar.
        return self.load(name, sympy.Integer(int(offset)))

    def rand(self, seed, offset) -> _V:
        return self._random("rand", seed, offset)

    def randn(self, seed, offset) -> _V:
        return self._random("randn", seed, offset)

    def randint64(self, seed, offset, low, high) -> _V:
        # low + bits % (high - low): 63 random bits reduced to the range (a bias of at most
        # range / 2**63, as CUDA's randint has).
        bits = self._random("random_bits63", seed, offset)
        low, high = self._as_value(low), self._as_value(high)
        span = self._default("sub", (high, low), {})
        return self._default("add", (low, self._default("remainder", (bits, span), {})), {})

    def _random(self, op: str, seed, offset) -> _V:
        seed, offset = self._as_value(seed), self._as_value(offset)
        for what, v in (("seed", seed), ("offset", offset)):
            if v.dtype.is_floating_point or v.dtype == torch.bool:
                raise NotCapturable(f"op {op} with a {v.dtype} {what}")
        dtype = torch.float32 if op in ("rand", "randn") else torch.int64
        return self.g.add(Op(op, (seed.pos, offset.pos), dtype_name(dtype, f"op {op}")), dtype)

    def _default(self, name: str, args, kwargs):
        if kwargs:
            raise NotCapturable(f"op {name} with keyword arguments")
        ir_name = _OP_ALIASES.get(name, name)
        if ir_name not in _IR_OPS:
            raise NotCapturable(f"op {name} is not in the spyre kernel IR")
        like = next((a.dtype for a in args if isinstance(a, _V)), None)
        values = [self._as_value(a, like) for a in args]
        if ir_name == "floor" and self._is_div_rn(values[0]):
            # floor(div_rn(a, b)) is Inductor's lowering of float floor division, which rounds
            # differently from PyTorch's (1 // 0.1 is 9 in eager, floor(1 / 0.1) is 10; inf // x is
            # NaN in eager): it is one floordiv, with PyTorch's semantics in the ISA.
            name = ir_name = "floordiv"
            values = [_V(a, values[0].dtype) for a in self.g.values[values[0].pos].args]
        result = getattr(DtypePropagationOpsHandler(), name)(*values)
        return self.g.add(Op(ir_name, tuple(v.pos for v in values), dtype_name(result, f"op {name}")),
                          result)

    # ---- memory --------------------------------------------------------------------

    def load(self, name: str, index) -> _V:
        g = self.g
        try:
            idx = affine_index(index, g.vars, f"the load of {name}", g.var_ranges, g.indirect)
        except NotCapturable:
            found = piecewise_affine(index, g.vars, g.var_ranges, f"the load of {name}")
            if found is None:
                raise
            return self._piecewise_load(name, found)
        return self._load(name, idx)

    def _piecewise_load(self, name: str, found) -> _V:
        """where(i < end0, load at run 0, where(i < end1, ...)): a load whose index is affine on
        runs of a loop variable (`found`: indexing.piecewise_affine; nested for bends in several),
        as index masks the planner cuts."""
        g, what = self.g, f"the load of {name}"
        d, runs = found

        def part(expr) -> _V:
            inner = piecewise_affine(expr, g.vars, g.var_ranges, what)
            if inner is None:
                return self._load(name, affine_index(expr, g.vars, what, g.var_ranges, g.indirect))
            return self._piecewise_load(name, inner)

        value = part(runs[-1][2])
        for lo, hi, expr in reversed(runs[:-1]):
            strides = tuple(1 if k == d else 0 for k in range(len(g.vars)))
            mask = self._default("lt", (g.add(IndexValue(Index(strides), "int64"), torch.int64),
                                        self.constant(hi, torch.int64)), {})
            value = self._default("where", (mask, part(expr), value), {})
        return value

    def _load(self, name: str, idx: Index) -> _V:
        g = self.g
        real = real_name(name)
        if real in g.scattered:
            raise NotCapturable(f"{name} is read after a scatter into it in the same kernel")
        if real in g.stored:
            stored_idx, value = g.stored[real]
            if stored_idx != idx:
                raise NotCapturable(f"{name} is read at another index than this kernel writes it")
            dtype = V.graph.get_dtype(real)
            # What a round trip through the buffer would do. A Reduction's result
            # is accumulated in fp32 even when its dtype says fp16, so it is
            # rounded here too (Inductor's own pointwise values carry explicit casts).
            rounds = dtype in _LOW_PRECISION and isinstance(g.values[value.pos], (Reduction, Scan))
            if value.dtype != dtype or rounds:
                value = g.add(Cast(value.pos, dtype_name(dtype, name)), dtype)
            return value
        buf = g.use_buffer(real)
        g.loaded.setdefault(real, set()).add(idx)
        dtype = V.graph.get_dtype(real)
        return g.add(Load(real, idx, buf.dtype), dtype)

    def store(self, name: str, index, value, mode=None) -> None:
        g = self.g
        if mode not in (None, "atomic_add"):
            raise NotCapturable(f"store with mode {mode} to {name}")
        real = real_name(name)
        idx = affine_index(index, g.vars, f"the store to {name}", g.var_ranges, g.indirect)
        value = self._as_value(value)
        if mode == "atomic_add" and not idx.indirect:
            # An accumulating store whose index terms all fell away: Inductor makes the
            # indirect index of a dim of size 1 the constant 0 (index_add into a (1, n) buffer).
            # It is an add in place, one element per iteration; as a plain store it lost the
            # buffer's value (x.index_add(0, [0], s) gave s).
            sizes = [g.var_ranges.get(v, 1) for v in g.vars]
            if any(s == 0 and r != 1 for s, r in zip(idx.strides, sizes)):
                raise NotCapturable(f"an accumulating store to {name} at one index from several iterations")
            value = self._default("add", (self._load(name, idx), value), {})
            mode = None
        if idx.indirect or mode is not None:
            # A scatter: which elements it writes depends on data, so nothing is forwarded on chip.
            if g.loaded.get(real) or real in g.stored or real in g.scattered or name in g.removable:
                # (a second scatter into it would replace the first's Store: lost writes)
                raise NotCapturable(f"{name} is scattered into and also read or written otherwise in one kernel")
            g.scattered.add(real)
            g.use_buffer(real)
            g.stores[real] = Store(real, idx, value.pos, mode)
            return
        if real in g.scattered:
            raise NotCapturable(f"{name} is written after a scatter into it in the same kernel")
        if any(i != idx for i in g.loaded.get(real, ())):
            raise NotCapturable(f"{name} is read and written at different indices in one kernel")
        if real in g.stored and g.stored[real][0] != idx:
            raise NotCapturable(f"{name} is written at two different indices in one kernel")
        if g.reduction_ranges and any(idx.strides[len(g.ranges):]) and self._is_outer(value):
            # The IR stores an outer value once per outer index (kernel_ir docstring).
            raise NotCapturable(f"{name} stores a per-row value broadcast over the reduced dims")
        g.stored[real] = (idx, value)
        if name in g.removable:
            g.removed.add(name)
            return
        g.use_buffer(real)
        g.stores[real] = Store(real, idx, value.pos)

    # ---- what the IR does not have (yet) -----------------------------------------------

    def masked(self, mask, body, other):
        # where(mask, body, other). The body's loads may index outside their buffers where the
        # mask is false (a cat's other parts, a pad's border): the planner splits the iteration
        # space at the mask's bounds (families/pointwise/pieces.py) so that no program reads there, and
        # refuses a kernel whose masked-off loads it cannot keep in bounds.
        value = self._as_value(body())
        if isinstance(other, _V):
            fill = other
        else:
            fill = self.constant(other, value.dtype)
        return self._default("where", (self._as_value(mask), value, fill), {})

    def indirect_indexing(self, x, size, check=True, wrap_neg=True):
        wrap_neg = wrap_neg and negative_indices_wrap()
        direct = self._index_from_indices(x, size, wrap_neg)
        if direct is not None:
            return direct
        # Checked whatever `check` says: the program's gather or scatter never moves bytes
        # outside a buffer, so an index Inductor thinks is safe costs no more to check.
        g = self.g
        x = self._as_value(x)
        if x.dtype.is_floating_point or x.dtype == torch.bool:
            raise NotCapturable(f"indirect indexing with a {x.dtype} value")
        bound = static_int(size, "indirect indexing bound")
        value = g.add(Indirect(x.pos, bound, bool(wrap_neg), g.op), torch.int64)
        for sym, pos in g.indirect.items():
            if pos == value.pos:
                return sym
        sym = sympy_index_symbol(f"ind{len(g.indirect)}")
        g.indirect[sym] = value.pos
        # the gathered index is in [0, bound) (wrapped, then checked by the gather): its range lets
        # a view's arithmetic on it simplify, the ModularIndexing(ind, 1, n) of a reshaped source
        g.var_ranges[sym] = bound
        return sym

    def check_bounds(self, expr, size, lower, upper):
        # Inductor's bound check of an indirect index: one computed from the loop indices was
        # checked when it was made (_index_from_indices); the gather/scatter checks each Indirect
        # against its bound, so a check of exactly that is already done; anything else is not in
        # the IR.
        expr = sympy.sympify(expr)
        if not expr.free_symbols & set(self.g.indirect):
            # a direct index (loop indices and sizes: GPT-2's position `past_length + i`, which
            # Inductor folds to the expression): a load like any other, kept inside its buffer
            # by the planner's bounds check at every size it is planned for
            return None
        pos = self.g.indirect.get(expr)
        if pos is None or static_int(size, "bounds check size") != self.g.values[pos].bound:
            raise NotCapturable(f"bounds check of {expr} against {size} (gather/scatter)")
        return None

    def _index_from_indices(self, x, size, wrap_neg):
        """An 'indirect' index computed from the loop indices alone (a roll's (i + s) % n, a
        flip's n - 1 - i) as the sympy index it is, so the load stays direct (affine, or
        piecewise affine: pieces). None when it reads data. Its range is known at compile
        time: an index outside [0, size) is an error here, like eager's IndexError."""
        if not isinstance(x, _V):
            return None
        expr = _symbolic(self.g, x.pos)
        if expr is None:
            return None
        size = static_int(size, "an index bound")
        bounds = bound_sympy(expr, {v: ValueRanges(0, n - 1) for v, n in self.g.var_ranges.items()})
        if not (bounds.lower.is_finite and bounds.upper.is_finite):
            return None  # a range sympy cannot bound: left to the gather path, which checks at run time
        lo, hi = int(bounds.lower), int(bounds.upper)
        if wrap_neg and hi < 0:
            expr, lo, hi = expr + size, lo + size, hi + size
        if lo < 0 or hi >= size:
            raise OutOfRange(f"an index computed from the loop indices spans [{lo}, {hi}], outside "
                             f"[0, {size}) (negative and positive indices mixed, or out of range)")
        return expr

    def _is_outer(self, value: _V) -> bool:
        """kernel_ir's outer() for one value (a Constant may be stored anywhere)."""
        g = self.g
        if isinstance(g.values[value.pos], Constant):
            return False
        n_outer, flags = len(g.ranges), []
        for v in g.values[: value.pos + 1]:
            if isinstance(v, (Reduction, Constant, SizeValue)):  # a SizeValue: a launch scalar
                flags.append(True)
            elif isinstance(v, (Load, IndexValue)):
                flags.append(not any(v.index.strides[n_outer:]))
            elif isinstance(v, (Cast, Indirect)):
                flags.append(flags[v.arg])
            elif isinstance(v, Scan):
                flags.append(False)
            else:
                flags.append(all(flags[a] for a in v.args))
        return flags[value.pos]

    # ---- reductions ------------------------------------------------------------------

    def reduction(self, dtype, src_dtype, reduction_type, value):
        g = self.g
        if not g.reduction_ranges:
            raise NotCapturable(f"reduction {reduction_type} outside a reduction node")
        result = dtype_name(dtype, f"the {reduction_type} reduction")
        if reduction_type == "welford_reduce":
            arg = self._as_value(value)
            # Inductor's body indexes the tuple: [0] mean, [1] m2, [2] weight.
            return tuple(g.add(Reduction(op, arg.pos, result), dtype) for op in _WELFORD)
        if reduction_type not in _REDUCTIONS:
            raise NotCapturable(f"reduction {reduction_type} is not in the spyre kernel IR")
        arg = self._as_value(value)
        return g.add(Reduction(reduction_type, arg.pos, result), dtype)

    def store_reduction(self, name, index, value):
        # The index uses the outer variables only, so the Store has stride 0 on
        # every reduced dim; later loads of `name` in the group forward `value`.
        self.store(name, index, value)

    def scan(self, dtypes, combine_fn, values):
        g = self.g
        if len(g.reduction_ranges) != 1:
            raise NotCapturable(f"a scan over reduction ranges {g.reduction_ranges} (one dim expected)")
        if len(values) != 1:
            raise NotCapturable(f"a scan of {len(values)} values (only single-value scans are in the IR)")
        op = _scan_op(combine_fn)
        if op is None:
            raise NotCapturable("a scan whose combine is not one add or one multiply (e.g. logcumsumexp)")
        result = dtype_name(dtypes[0], f"the cum{op} scan")
        arg = self._as_value(values[0])
        return (g.add(Scan(op, arg.pos, result), dtypes[0]),)


_SYMBOLIC_OPS = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b}


def _symbolic(g: "_Group", pos: int):
    """Value `pos` as a sympy expression in the group's loop variables when it is integer
    arithmetic on index values and constants only (else None)."""
    v = g.values[pos]
    if isinstance(v, IndexValue):
        return sympy.Integer(v.index.offset) + sum(s * var for s, var in zip(v.index.strides, g.vars))
    if isinstance(v, Constant):
        return sympy.Integer(v.value) if isinstance(v.value, int) and not isinstance(v.value, bool) else None
    if isinstance(v, Cast) and v.dtype in ("int64", "int32"):
        return _symbolic(g, v.arg)
    if isinstance(v, Op) and v.dtype in ("int64", "int32"):
        args = [_symbolic(g, a) for a in v.args]
        if any(a is None for a in args):
            return None
        if v.name in _SYMBOLIC_OPS:
            return _SYMBOLIC_OPS[v.name](*args)
        if v.name in ("fmod", "remainder", "mod", "floordiv") and isinstance(args[1], sympy.Integer) and args[1] > 0:
            low = bound_sympy(args[0], {x: ValueRanges(0, n - 1) for x, n in g.var_ranges.items()}).lower
            if low >= 0 or v.name == "remainder":  # C's fmod and Python's % agree on non-negatives
                if v.name == "floordiv":
                    return FloorDiv(args[0], args[1])
                return ModularIndexing(args[0], 1, args[1])
    return None


class _Probe(DefaultHandler):
    """Records what a scan's combine function does to two probe operands."""

    def _default(self, name, args, kwargs):
        return (name, *args)


def _scan_op(combine_fn) -> str | None:
    """'sum' / 'prod' if combine_fn((a,), (b,)) is (a + b,) / (a * b,), else None."""
    with V.set_ops_handler(_Probe()):
        try:
            out = combine_fn(("a",), ("b",))
        except Exception:  # a combine the probe cannot follow is simply not one of ours
            return None
    def plain(x):  # V.ops wraps results (and may wrap operands) in OpsValue
        return getattr(x, "value", x)

    if len(out) != 1 or not isinstance(plain(out[0]), tuple):
        return None
    name, *args = (plain(x) for x in plain(out[0]))
    if sorted(map(str, args)) != ["a", "b"]:
        return None
    return {"add": "sum", "mul": "prod"}.get(name)


def _node_ranges(node) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The node's static (ranges, reduction ranges); reduction ranges () for pointwise."""
    if not hasattr(node, "_body") or node.is_template() or node.is_extern():
        raise NotCapturable(f"{type(node).__name__} node")
    (sizes, reduction_sizes), _ = loop_body(node)
    ranges = tuple(static_int(s, "loop range") for s in sizes)
    reduction_ranges = tuple(static_int(s, "reduction range") for s in reduction_sizes)
    if node.is_reduction():
        return ranges, reduction_ranges or (1,)
    if math.prod(reduction_ranges) != 1:
        raise NotCapturable("a pointwise node with reduction ranges")
    return ranges, ()


class _IndexRecorder(DefaultHandler):
    """Runs a loop body only to see its index expressions (for _split_dims)."""

    def __init__(self):
        self.exprs: list = []

    def _default(self, name, args, kwargs):
        return None

    def load(self, name, index):
        self.exprs.append(index)

    def store(self, name, index, value, mode=None):
        self.exprs.append(index)

    def store_reduction(self, name, index, value):
        self.exprs.append(index)

    def index_expr(self, expr, dtype):
        self.exprs.append(expr)

    def indirect_indexing(self, x, size, check=True, wrap_neg=True):
        return sympy.Symbol(f"indirect{len(self.exprs)}", integer=True)

    def masked(self, mask, body, other):
        body()

    def reduction(self, dtype, src_dtype, reduction_type, value):
        return (None, None, None) if reduction_type == "welford_reduce" else None

    def scan(self, dtypes, combine_fn, values):
        return tuple(None for _ in values)


_SPLITS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _split_dims(node, ranges, reduction_ranges):
    """(ranges, reduction ranges) of `node` with each dim split where its variable's modular
    indexing needs it (indexing.dim_cuts), and per dim the split sizes (for _regroup)."""
    body = loop_body(node)[1]
    key = (tuple(ranges), tuple(reduction_ranges))  # a node whose loops were reordered is looked at again
    seen = _SPLITS.get(node, {}).get(key)
    found = seen[1] if seen is not None and seen[0] is body else None
    if found is None:
        outer, reduced = loop_vars(len(ranges), "q"), loop_vars(len(reduction_ranges), "qr")
        recorder = _IndexRecorder()
        try:
            with V.set_ops_handler(recorder):
                body(outer, reduced)
            cuts = dim_cuts(recorder.exprs, outer + reduced, tuple(ranges) + tuple(reduction_ranges))
        except Exception:  # noqa: BLE001 - a body the recorder cannot follow is captured unsplit
            cuts = [() for _ in (*ranges, *reduction_ranges)]
        sizes = [split_sizes(n, c) for n, c in zip((*ranges, *reduction_ranges), cuts)]
        found = (tuple(sizes[: len(ranges)]), tuple(sizes[len(ranges):]))
        _SPLITS.setdefault(node, {})[key] = (body, found)
    return found


def _regroup(variables, sizes) -> list:
    """The original dims' variables from the split dims' (variables in split order)."""
    out, k = [], 0
    for parts in sizes:
        expr, scale = sympy.Integer(0), 1
        for j in reversed(range(len(parts))):
            expr += variables[k + j] * scale
            scale *= parts[j]
        out.append(expr)
        k += len(parts)
    return out


def _plan_vars(nodes, node_ranges):
    """(outer ranges, reduction ranges, per node a function from the group's vars to
    the node's (index vars, reduction vars))."""
    reductions = [r for n, r in zip(nodes, node_ranges) if n.is_reduction()]
    if not reductions:
        ranges = common_ranges([r for r, _ in node_ranges])
        return ranges, (), [lambda g, r=r: (node_vars(r, ranges, g.vars), []) for r, _ in node_ranges]
    numel = math.prod(reductions[0][0])
    rnumel = math.prod(reductions[0][1])
    full, outer = [], []
    for n, (r, _) in zip(nodes, node_ranges):
        if not n.is_reduction():
            # Over the whole (outer x reduced) space, or over the outer space only.
            (full if math.prod(r) == numel * rnumel else outer).append(r)
    ranges, reduction_ranges = reduction_common_ranges(reductions, full, outer)
    every = ranges + reduction_ranges
    plans = []
    for n, (r, rr) in zip(nodes, node_ranges):
        if n.is_reduction():
            plans.append(lambda g, r=r, rr=rr: (node_vars(r, ranges, g.outer_vars),
                                                node_vars(rr, reduction_ranges, g.reduction_vars)))
        elif math.prod(r) == numel * rnumel:
            plans.append(lambda g, r=r: (node_vars(r, every, g.vars), []))
        else:
            plans.append(lambda g, r=r: (node_vars(r, ranges, g.outer_vars), []))
    return ranges, reduction_ranges, plans


def capture(nodes, name: str = "spyre_kernel") -> Capture:
    """The kernel for `nodes` (SchedulerNodes, in order), or NotCapturable. Nodes whose loop
    ranges have size symbols are captured for their size bucket (symbolic/capture.py)."""
    from ..symbolic import capture as symbolic

    nodes = list(nodes)
    symbols = symbolic.size_symbols(nodes) if _has_nodes_with_bodies(nodes) else []
    if symbols:
        return symbolic.capture_symbolic(nodes, lambda ns: _capture(ns, name), symbols)
    return _capture(nodes, name)


def _has_nodes_with_bodies(nodes) -> bool:
    return all(hasattr(n, "_body") and not n.is_template() and not n.is_extern() for n in nodes)


def _capture(nodes, name: str) -> Capture:
    nodes = list(nodes)
    splits = [_split_dims(n, *_node_ranges(n)) for n in nodes]
    node_ranges = [(tuple(x for p in o for x in p), tuple(x for p in r for x in p)) for o, r in splits]
    ranges, reduction_ranges, plans = _plan_vars(nodes, node_ranges)
    scheduler = V.graph.scheduler
    op_names = {n.get_name() for n in nodes}
    removable = frozenset(
        buf for n in nodes for buf in n.get_buffer_names()
        if scheduler is not None and scheduler.can_buffer_be_removed_through_fusion(buf, op_names)
    )
    group = _Group(ranges, removable, reduction_ranges)
    for node, plan, (outer_sizes, reduced_sizes) in zip(nodes, plans, splits):
        index_vars, reduction_vars = plan(group)
        index_vars, reduction_vars = _regroup(index_vars, outer_sizes), _regroup(reduction_vars, reduced_sizes)
        group.op = origin_ops([node])
        with V.set_ops_handler(CaptureHandler(group)):
            loop_body(node)[1](index_vars, reduction_vars)
    if group.indirect and reduction_ranges:
        raise NotCapturable("indirect indexing (gather/scatter) inside a reduction kernel")
    if math.prod(ranges) * math.prod(reduction_ranges or (1,)) == 0 or not group.stores:
        return Capture(None, frozenset(group.removed))
    # A kernel may not read memory it writes through another name (a cat slot
    # and the whole cat buffer): capture cannot see that hazard element by element.
    # Reading `b` itself (an in-place update at the same index) is checked elsewhere; any OTHER
    # loaded name on the same storage is a hazard, whether or not `b` is also read.
    for b in group.stores:
        others = {storage_of(x) for x in group.loaded if x != b}
        if storage_of(b) in others:
            raise NotCapturable(f"{b} is written while the kernel reads other views of its memory")
    values, stores = _live(group.values, list(group.stores.values()))
    used = {v.buffer for v in values if isinstance(v, Load)} | {st.buffer for st in stores}
    kernel = Kernel.of(name, ranges, tuple(b for b in group.buffers.values() if b.name in used), values,
                       stores, reduction_ranges)
    kernel.check()
    return Capture(kernel, frozenset(group.removed))


def _live(values: list, stores: list[Store]) -> tuple[tuple, tuple[Store, ...]]:
    """Only the values some store needs, renumbered: a value kept on chip for a
    removed buffer, or a cast a later cast made redundant, is no work for the program."""
    needed = {st.value for st in stores} | {p for st in stores for p, _ in st.index.indirect}
    # Welford arrives as a triple of one argument (kernel_ir): keep all three together.
    welford = {}
    for pos, v in enumerate(values):
        if isinstance(v, Reduction) and v.op in _WELFORD:
            welford.setdefault(v.arg, []).append(pos)
    for pos in range(len(values) - 1, -1, -1):
        if pos in needed:
            v = values[pos]
            if isinstance(v, Reduction) and v.op in _WELFORD:
                needed |= set(welford[v.arg])  # siblings need only the same (lower) argument
            needed |= {v.arg} if isinstance(v, (Cast, Reduction, Scan, Indirect)) else set(getattr(v, "args", ()))
            if isinstance(v, Load):
                needed |= {p for p, _ in v.index.indirect}
    new_pos = {old: new for new, old in enumerate(sorted(needed))}
    return (tuple(renumbered(values[p], new_pos.__getitem__) for p in sorted(needed)),
            tuple(renumbered(st, new_pos.__getitem__) for st in stores))
