"""A graph fuzzer for the spyre torch.compile path: random small graphs, compiled vs CPU eager.

A graph (``Graph``) is a few inputs and 2-8 ops drawn from the pointwise ops,
reductions and matmuls the compiler supports. It is kept as data and rendered to
Python source (``Graph.source``); that source is what runs, under the real
``torch.compile``, and what a failure prints, so a report is a reproducer.

What the generator draws (``graphs()``, a hypothesis strategy):

* the graph's dtype: fp32, fp16, int32 or int64 (``DTYPES``);
* a base shape of rank 1-3 from dims that do and do not fill a 128-byte
  stick (1, 3, 5, 32, 64, 67, 130), at most ~16K elements;
* 1-3 inputs: the base shape, a broadcastable one (dims set to 1 or leading
  dims dropped), or transposed (the tensor passed is ``.transpose(-1, -2)``
  of a contiguous one, so the kernel reads it across its strides; a matmul
  adds its own weight and bias inputs, below). Inputs are in the graph's
  dtype (floats U(-3, 3); integers uniform in [-R, R],
  R one of ``INT_RANGES`` per graph: small ranges make ties and equal
  values common), except that an input after the first is a bool mask
  (U(0, 1) < 0.5) one time in four;
* ops on earlier values, chosen by the kind of value they read (``OPS``:
  float, integer, bool): unary ops, binary ops (with broadcasting), scalar
  arithmetic, and reductions over one dim with keepdim both ways.
  Floats: the float pointwise ops, sum/mean/amax/amin/var/logsumexp and,
  shape-keeping, softmax/log_softmax/cumsum/cumprod. Integers: add, sub,
  mul, neg, abs, maximum, minimum, where, clamp, comparisons (bool results),
  bitwise and/or/xor/not, floor division, truncating division and
  remainder (by ``abs(b) + 1``, never zero), a multiply that wraps int32
  (see below); sum/prod/amax/amin/argmax/argmin/max and min with indices/
  any/all and cumsum/cumprod (sums, prods and scans of int32 promote to
  int64, as in PyTorch). Bools (masks from comparisons or inputs): &, |, ^,
  ~, where(mask, a, b), a * mask, sum/cumsum (int64 counts), any/all/max.
  Floats meet the others through masks and counts only where that stays
  exact: a comparison, argmax/argmin or max's indices of floats reads graph
  INPUTS only (a computed float may differ from eager's in the last bit and
  flip a comparison; an input is the same bits on both sides); a float is
  masked (``a * mask``, ``where(mask, a, b)``) or divided by a count
  (``a / (abs(count) + 1)``, masked mean pooling).
  Each op is written so it stays in its domain (log of |x| + 1, exp of a
  bounded value, an integer divisor abs(b) + 1), because a NaN, an overflow
  or an error both sides agree on tests nothing;
* float matmuls (float graphs only; one op in ``MATMUL_ONE_IN`` where one
  can be drawn; integer matmuls are a CPU fallback by design and are not
  drawn), with ``a`` a float value of rank 1-3, so K = a's last dim comes
  from ``DIMS`` (K = 1, dims that do and do not fill a stick) and M = 1 /
  N = 1 occur (1-D values, dims of 1, N drawn from ``DIMS``):
  ``a @ w`` and ``w @ a`` with a fresh weight input ``w`` (2-D, or batched
  like a 3-D ``a``: its batch or 1, broadcast), which is sometimes passed
  transposed like any input; ``a @ w.t()`` / ``a @ w.transpose(-1, -2)``
  with ``w`` a fresh (N, K) input (read in its own layout, transposed on
  chip); ``F.linear(a, w)`` and ``F.linear(a, w, bias)``; and ``a @ b`` or
  ``a @ b.transpose(-1, -2)`` between two computed values of compatible
  shapes (a value with itself included: a Gram matrix). N (M for ``w @ a``)
  is a's own dim half the time, so the result keeps a's shape and a residual
  add can follow. The op after a matmul reads its result half the time, as a
  unary or binary pointwise op (an epilogue: activation, bias-like or
  residual add, scaling);
* bounded magnitudes: every value carries a bound on |value|; a float op
  whose bound passes ``MAX_BOUND`` is squashed by tanh, an integer one past
  ``MAX_INT_BOUND`` by ``% 2047 - 1023`` (floor remainder: an op of its
  own). So int32 products of bounded values can pass 2**31 only inside the
  squashed expression, where they wrap; integer overflow wraps (two's
  complement) in eager and must in the program (int32 is computed in int64
  tiles and has to wrap at int32 exactly as eager does), so a wrap compares
  exactly too. ``wrapmul`` (x * 7654321) makes int32 wrap on purpose.
  Integer products stay bounded: prod/cumprod multiply the tiny factors
  ``x % 3 - 1`` (-1, 0, 1) or ``1 - x % 2 * 2`` (-1, 1: no zero ends the
  prefix); float cumprod multiplies ``1 + tanh(x) * 0.01`` (at most
  1.01**130 < 4 over the longest dim). A matmul's bound is
  K * bound_a * bound_b (+ the bias's); it reads only values for which that
  stays below ``MAX_MATMUL_BOUND`` = 2**14 (its own result is rounded to the
  graph's dtype before anything can squash it, and fp16 holds 65504), and
  past ``MAX_BOUND`` it is squashed as ``tanh((a @ b) * 3 / (sqrt(K) b_a
  b_b))`` (two ops): the scale makes a typical value of uniform operands
  (sqrt(K) b_a b_b / 3) about 1, on tanh's slope, where a plain tanh would be
  saturated at +-1 and hide any error in the matmul;
* 1-3 outputs (the last value and others, reductions included): one
  compile per example checks several kernels.

The comparison (``check``), per dtype:

* integer and bool results (integer graphs, and the masks, counts and
  indices of float graphs): exactly, dtype included (``torch.equal``)
  against eager on the CPU. They never depend on a rounded float.
* fp32: against eager fp32 on the CPU. The compiled kernels accumulate in
  another order (tiles, chunks, cores), so the tolerance is the graph's own
  sensitivity to rounding, measured as |eager fp32 - eager fp64| (x4),
  plus rtol = atol = 1e-5 per op on the output's path scaled by the
  output's magnitude. A cumprod counts as two ops: its n - 1 fp32 products
  are within gamma_(n-1) = (n-1) u / (1 - (n-1) u) (u = 2**-24) of the
  exact prefix product in any order (Higham 3.1), 7.7e-6 for n = 130, and
  its n factors' own roundings compound to n u / 2 = 3.9e-6 more; each is
  within one op's 1e-5 for n <= 130 (asserted below for ``DIMS``). Eager
  accumulates fp32 cumprod/cumsum in double, so the measured sensitivity
  does not see that accumulation: the per-op share has to cover it.
* fp16: the compiled kernels keep fp32 intermediates and round at stores
  (Inductor's contract), so the reference is the fp32 computation from the
  same fp16 inputs, rounded to fp16 once. Where the graph is split into
  several kernels, values are rounded to fp16 in between; how much such
  roundings can move an output is measured by eager fp16 (which rounds
  after EVERY op): 2 x |eager fp16 - fp32 reference|, plus 1e-3 (one fp16
  ulp is 2^-10 relative) per op on the path, relative and scaled by the
  output's magnitude. (The fp32 accumulation above is far inside 1e-3.)

* matmuls, both dtypes: a matmul (and everything downstream of it) differs
  from eager by its accumulation order, which eager's own rounding measures
  only by chance (a BLAS sums in its order, the PE arrays in theirs), so each
  output's atol adds a derived term. A K-term dot product accumulated in
  fp32 in any order is within gamma_(K+1) (|a| @ |b| + |bias|) of the exact
  one (gamma_n = n u / (1 - n u), u = 2**-24: Higham 3.1, as in
  tests/compiler/test_compiled_matmul.py; fp16 and bf16 products are exact in
  fp32), so the program's and eager's results differ by at most twice that,
  per element. How far that moves an output downstream (through epilogues,
  softmaxes, further matmuls) is measured like the sensitivity: the graph is
  run in fp64 with every matmul's result moved by that bound with a random
  sign per element (``_PerturbMatmuls``, a TorchFunctionMode, so the graph's
  source stays plain torch), ``ACCUMULATION_DRAWS`` = 2 times, and the
  output's largest |perturbed - exact| (``accumulation_spread``) is added
  x ``ACCUMULATION_FACTOR`` = 2 (random signs, unlike the bound, partly
  cancel in a downstream sum). A graph without matmuls adds nothing. The
  bound is the worst case; actual accumulation errors are ~sqrt(K) smaller.
  A matmul counts as one op on the path (the rounding of its result), its
  squash as two.

Neither tolerance can hide a wrong result: both are bounded by what
rounding alone does to this graph on these inputs, not a blanket constant.
Integer and bool values carry no rounding, so an op on them adds nothing to
a float output's path (their depth is 0).

Fallbacks: every node must become a spyre program, except ops listed in
``NOT_COMPILED`` (documented as not compiled yet); those are counted. A
float matmul is no exception (an extern ``mm`` call is a fallback too). A
compile that raises fails like a wrong value, with the graph in the message.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from hypothesis import strategies as st
from torch.overrides import TorchFunctionMode

DIMS = (1, 3, 5, 32, 64, 67, 130)
MAX_NUMEL = 16 * 1024
FLOATS = (torch.float32, torch.float16)
INTS = (torch.int32, torch.int64)
DTYPES = FLOATS + INTS
INT_RANGES = (2, 20, 1000)  # integer inputs are uniform in [-R, R]
FLOAT_INPUT_BOUND = 3.0  # float inputs are U(-3, 3)

# Ops compiled graphs may still run on the CPU (documented as not compiled yet);
# any other fallback is a fuzzer finding. None now: cumsum compiles (issue 9).
NOT_COMPILED: frozenset[str] = frozenset()

_U32 = 2.0 ** -24
# A float cumprod's two ops (module docstring): each within one fp32 op's share over the longest dim.
assert (max(DIMS) - 1) * _U32 / (1 - (max(DIMS) - 1) * _U32) <= 1e-5 and max(DIMS) * _U32 / 2 <= 1e-5


@dataclass(frozen=True)
class Op:
    """One op: a source template over `{a}` (and `{b}`, `{c}`, `{d}` the dim, `{k}` keepdim).

    `bound` maps the operands' bounds (and for reductions the reduced length) to a bound of the
    result. `partner` says what a binary op's other operands are: "f", "i", "b" a value of that
    kind as `{b}`; "b=" a mask as `{b}` and a value of `{a}`'s kind as `{c}`. `inputs_only`: every
    float operand must be a graph input (comparisons, indices: exact only on unrounded values).
    `steps`: ops this one counts as on a float output's path (the tolerance, module docstring).
    """
    template: str
    bound: Callable[..., float]
    partner: str = ""
    inputs_only: bool = False
    steps: int = 1


def _bits(*bounds: float) -> float:
    """A bound of a bitwise and/or/xor/not of values bounded by `bounds` (two's complement)."""
    return 2.0 ** math.ceil(math.log2(max(bounds) + 1))


# ---- floats (the graph's float dtype) ---------------------------------------------------
# The templates keep every op in its domain for any finite input.
UNARY = {
    "neg": Op("-{a}", lambda b: b),
    "abs": Op("torch.abs({a})", lambda b: b),
    "exp": Op("torch.exp(torch.tanh({a}) * 2)", lambda b: math.exp(2)),
    "log": Op("torch.log(torch.abs({a}) + 1)", lambda b: math.log(b + 1)),
    "sqrt": Op("torch.sqrt(torch.abs({a}))", lambda b: math.sqrt(b)),
    "rsqrt": Op("torch.rsqrt(torch.abs({a}) + 0.5)", lambda b: 1.5),
    "reciprocal": Op("torch.reciprocal(torch.abs({a}) + 1)", lambda b: 1.0),
    "sigmoid": Op("torch.sigmoid({a})", lambda b: 1.0),
    "tanh": Op("torch.tanh({a})", lambda b: 1.0),
    "relu": Op("torch.relu({a})", lambda b: b),
    "gelu": Op("F.gelu({a})", lambda b: b),
    "silu": Op("F.silu({a})", lambda b: b),
    "sin": Op("torch.sin({a})", lambda b: 1.0),
    "cos": Op("torch.cos({a})", lambda b: 1.0),
    "clamp": Op("{a}.clamp(-1.5, 2.0)", lambda b: min(b, 2.0)),
    "scale": Op("{a} * 1.5 + 0.25", lambda b: 1.5 * b + 0.25),
    "square": Op("{a} * {a}", lambda b: b * b),
    "gt0": Op("{a} > 0.5", lambda b: 1.0, inputs_only=True),  # -> bool
}
BINARY = {
    "add": Op("{a} + {b}", lambda a, b: a + b, "f"),
    "sub": Op("{a} - {b}", lambda a, b: a + b, "f"),
    "mul": Op("{a} * {b}", lambda a, b: a * b, "f"),
    "div": Op("{a} / (torch.abs({b}) + 1)", lambda a, b: a, "f"),
    "maximum": Op("torch.maximum({a}, {b})", max, "f"),
    "minimum": Op("torch.minimum({a}, {b})", max, "f"),
    "where": Op("torch.where({a} > {b}, {a}, {b} * 0.5)", max, "f"),
    "gt": Op("{a} > {b}", lambda a, b: 1.0, "f", inputs_only=True),  # -> bool
    "div_count": Op("{a} / (torch.abs({b}) + 1)", lambda a, b: a, "i"),  # an integer converted in the kernel
    "mask_mul": Op("{a} * {b}", lambda a, b: a, "b"),
    "where_mask": Op("torch.where({b}, {a}, {c})", lambda a, b, c: max(a, c), "b="),
}
# Reductions over one dim `d`; bound given the argument's bound and the reduced size.
REDUCE = {
    "sum": Op("{a}.sum({d}, keepdim={k})", lambda b, n: b * n),
    "mean": Op("{a}.mean({d}, keepdim={k})", lambda b, n: b),
    "amax": Op("{a}.amax({d}, keepdim={k})", lambda b, n: b),
    "amin": Op("{a}.amin({d}, keepdim={k})", lambda b, n: b),
    "var": Op("{a}.var({d}, keepdim={k})", lambda b, n: 4 * b * b),
    "logsumexp": Op("torch.logsumexp({a}, {d}, keepdim={k})", lambda b, n: b + math.log(n)),
    # -> int64 indices (ties: the first index, on both sides)
    "argmax": Op("{a}.argmax({d}, keepdim={k})", lambda b, n: n, inputs_only=True),
    "argmin": Op("{a}.argmin({d}, keepdim={k})", lambda b, n: n, inputs_only=True),
    "max_indices": Op("torch.max({a}, {d}, keepdim={k})[1]", lambda b, n: n, inputs_only=True),
}
# Data movement along {d} (issue 16: index masks cut into pieces, piecewise indices, on-chip
# index values): the values are moved, never changed (steps=0: no rounding on the path).
MOVES = {
    "roll": Op("torch.roll({a}, 3, {d})", lambda b, n: b, steps=0),
    "flip": Op("torch.flip({a}, [{d}])", lambda b, n: b, steps=0),
    "cat_rotate": Op("torch.cat([{a}.narrow({d}, 1, {a}.shape[{d}] - 1), {a}.narrow({d}, 0, 1)], {d})",
                     lambda b, n: b, steps=0),
    "pad_crop": Op("F.pad({a}.movedim({d}, -1), (2, 1), value=1)[..., 1:-2].movedim(-1, {d})",
                   lambda b, n: max(b, 1), steps=0),
    "first_two": Op("({a}.movedim({d}, -1) * (torch.arange({a}.shape[{d}], device={a}.device) < 2))"
                    ".movedim(-1, {d})", lambda b, n: b, steps=0),
}

# Reductions whose result keeps the shape (no keepdim choice).
SHAPED = {
    "softmax": Op("torch.softmax({a}, {d})", lambda b, n: 1.0),
    "log_softmax": Op("torch.log_softmax({a}, {d})", lambda b, n: 2 * b + math.log(n)),
    "cumsum": Op("torch.cumsum({a}, {d})", lambda b, n: b * n),
    # factors in [0.99, 1.01]: finite over any dim here; two ops on the path (module docstring)
    "cumprod": Op("torch.cumprod(1 + torch.tanh({a}) * 0.01, {d})", lambda b, n: 1.01 ** n, steps=2),
    **MOVES,
    # a replicate pad's index is clamped (Min/Max: piecewise affine); floats only in ATen
    "replicate_crop": Op("F.pad({a}.movedim({d}, -1).reshape(1, -1, {a}.shape[{d}]), (3, 2), mode='replicate')"
                         "[..., 2:-3].reshape({a}.movedim({d}, -1).shape).movedim(-1, {d})", lambda b, n: b, steps=0),
}

# ---- integers (int32, int64; int32 promoted to int64 by sums, prods and scans) ----------
INT_UNARY = {
    "neg": Op("-{a}", lambda b: b),
    "abs": Op("torch.abs({a})", lambda b: b),
    "clamp": Op("{a}.clamp(-7, 9)", lambda b: min(b, 9)),
    "scale": Op("{a} * 3 - 2", lambda b: 3 * b + 2),
    "square": Op("{a} * {a}", lambda b: b * b),
    "remainder": Op("{a} % 5", lambda b: 4),
    "fmod": Op("torch.fmod({a}, 5)", lambda b: 4),
    "bitwise_not": Op("~{a}", lambda b: b + 1),
    # wraps int32 for |a| >= 281 (then squashed by % 2047: the wrapped value matters)
    "wrapmul": Op("{a} * 7654321", lambda b: b * 7654321),
    "gt0": Op("{a} > 0", lambda b: 1),  # -> bool
    "even": Op("{a} % 2 == 0", lambda b: 1),  # -> bool
}
INT_BINARY = {
    "add": Op("{a} + {b}", lambda a, b: a + b, "i"),
    "sub": Op("{a} - {b}", lambda a, b: a + b, "i"),
    "mul": Op("{a} * {b}", lambda a, b: a * b, "i"),
    "maximum": Op("torch.maximum({a}, {b})", max, "i"),
    "minimum": Op("torch.minimum({a}, {b})", max, "i"),
    "where": Op("torch.where({a} > {b}, {a}, -{b})", max, "i"),
    "bitwise_and": Op("{a} & {b}", _bits, "i"),
    "bitwise_or": Op("{a} | {b}", _bits, "i"),
    "bitwise_xor": Op("{a} ^ {b}", _bits, "i"),
    # divisors abs(b) + 1 are never zero (abs(b) >= 0 within the bounds; abs(INT_MIN) + 1 != 0 anyway)
    "floor_divide": Op("{a} // (torch.abs({b}) + 1)", lambda a, b: a, "i"),
    "trunc_divide": Op("torch.div({a}, torch.abs({b}) + 1, rounding_mode='trunc')", lambda a, b: a, "i"),
    "remainder": Op("{a} % (torch.abs({b}) + 1)", lambda a, b: b + 1, "i"),
    "gt": Op("{a} > {b}", lambda a, b: 1, "i"),  # comparisons -> bool
    "le": Op("{a} <= {b}", lambda a, b: 1, "i"),
    "eq": Op("{a} == {b}", lambda a, b: 1, "i"),
    "ne": Op("{a} != {b}", lambda a, b: 1, "i"),
    "mask_mul": Op("{a} * {b}", lambda a, b: a, "b"),
    "where_mask": Op("torch.where({b}, {a}, {c})", lambda a, b, c: max(a, c), "b="),
}
INT_REDUCE = {
    "sum": Op("{a}.sum({d}, keepdim={k})", lambda b, n: b * n),
    "prod": Op("({a} % 3 - 1).prod({d}, keepdim={k})", lambda b, n: 1),
    "prod_sign": Op("(1 - {a} % 2 * 2).prod({d}, keepdim={k})", lambda b, n: 1),
    "amax": Op("{a}.amax({d}, keepdim={k})", lambda b, n: b),
    "amin": Op("{a}.amin({d}, keepdim={k})", lambda b, n: b),
    "argmax": Op("{a}.argmax({d}, keepdim={k})", lambda b, n: n),
    "argmin": Op("{a}.argmin({d}, keepdim={k})", lambda b, n: n),
    "max_values": Op("torch.max({a}, {d}, keepdim={k})[0]", lambda b, n: b),
    "max_indices": Op("torch.max({a}, {d}, keepdim={k})[1]", lambda b, n: n),
    "min_indices": Op("torch.min({a}, {d}, keepdim={k})[1]", lambda b, n: n),
    "any": Op("{a}.any({d}, keepdim={k})", lambda b, n: 1),
    "all": Op("{a}.all({d}, keepdim={k})", lambda b, n: 1),
}
INT_SHAPED = {
    "cumsum": Op("torch.cumsum({a}, {d})", lambda b, n: b * n),
    "cumprod": Op("torch.cumprod({a} % 3 - 1, {d})", lambda b, n: 1),
    "cumprod_sign": Op("torch.cumprod(1 - {a} % 2 * 2, {d})", lambda b, n: 1),
    **MOVES,
}

# ---- bools (masks) ----------------------------------------------------------------------
BOOL_UNARY = {
    "not": Op("~{a}", lambda b: 1),
    "to_int": Op("{a}.int()", lambda b: 1),  # -> int32
}
BOOL_BINARY = {
    "and": Op("{a} & {b}", lambda a, b: 1, "b"),
    "or": Op("{a} | {b}", lambda a, b: 1, "b"),
    "xor": Op("{a} ^ {b}", lambda a, b: 1, "b"),
    "where_mask": Op("torch.where({b}, {a}, {c})", lambda a, b, c: 1, "b="),
}
BOOL_REDUCE = {
    "sum": Op("{a}.sum({d}, keepdim={k})", lambda b, n: n),  # -> int64 counts
    "any": Op("{a}.any({d}, keepdim={k})", lambda b, n: 1),
    "all": Op("{a}.all({d}, keepdim={k})", lambda b, n: 1),
    "max_values": Op("torch.max({a}, {d}, keepdim={k})[0]", lambda b, n: 1),
    "max_indices": Op("torch.max({a}, {d}, keepdim={k})[1]", lambda b, n: n),
}
BOOL_SHAPED = {
    "cumsum": Op("torch.cumsum({a}, {d})", lambda b, n: n),  # -> int64 running counts
}

# kind of value read -> the ops on it
OPS = {
    "f": {"unary": UNARY, "binary": BINARY, "reduce": REDUCE, "shaped": SHAPED},
    "i": {"unary": INT_UNARY, "binary": INT_BINARY, "reduce": INT_REDUCE, "shaped": INT_SHAPED},
    "b": {"unary": BOOL_UNARY, "binary": BOOL_BINARY, "reduce": BOOL_REDUCE, "shaped": BOOL_SHAPED},
}
# Bounded magnitudes keep fp16 away from overflow (65504) by a wide margin.
MAX_BOUND = 1000.0
# Integers: a product of two bounded values is at most 2**40 (int32 wraps, inside the squash).
MAX_INT_BOUND = 2 ** 20
# Matmuls (float graphs only): one op in MATMUL_ONE_IN is a matmul where one can be drawn. Its
# bound before the squash, K * bound_a * bound_b, must stay below MAX_MATMUL_BOUND: the matmul's
# own result is rounded to the graph's dtype (eager does, and so does the program) before any
# squash could act, and fp16 holds 65504.
MATMUL_ONE_IN = 5
MAX_MATMUL_BOUND = 2.0 ** 14


def _kind(dtype: torch.dtype) -> str:
    return "f" if dtype.is_floating_point else "b" if dtype == torch.bool else "i"


@dataclass(frozen=True)
class Input:
    shape: tuple[int, ...]
    transposed: bool  # passed as .transpose(-1, -2) of a contiguous tensor
    mask: bool = False  # a bool mask instead of the graph's dtype


@dataclass(frozen=True)
class Node:
    expr: str  # Python expression over earlier names
    shape: tuple[int, ...]
    depth: int  # rounding ops on the longest path from an input (0 for integer and bool values)
    bound: float  # a bound on |value|
    dtype: torch.dtype | None = None  # None: not tracked (hand-written graphs)

    @property
    def is_input(self) -> bool:
        return re.fullmatch(r"x\d+", self.expr) is not None


@dataclass(frozen=True)
class Graph:
    dtype: torch.dtype
    inputs: tuple[Input, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[int, ...]  # node positions
    seed: int = 0  # data seed
    ops: tuple[str, ...] = field(default=())
    int_range: int = 20  # integer inputs are uniform in [-int_range, int_range]

    def source(self) -> str:
        """The graph as a Python function `f` (what runs, what a failure prints)."""
        args = ", ".join(f"x{i}" for i in range(len(self.inputs)))
        lines = [f"def f({args}):"]
        for i, n in enumerate(self.nodes):
            lines.append(f"    v{i} = {n.expr}")
        outs = ", ".join(f"v{i}" for i in self.outputs)
        lines.append(f"    return ({outs},)")
        return "\n".join(lines)

    def inputs_source(self) -> str:
        lines = [f"g = torch.Generator().manual_seed({self.seed})"]
        for i, inp in enumerate(self.inputs):
            shape = inp.shape[:-2] + inp.shape[:-3:-1] if inp.transposed else inp.shape
            if inp.mask:
                t = f"(torch.rand({shape}, generator=g) < 0.5)"
            elif self.dtype.is_floating_point:
                t = f"(torch.rand({shape}, generator=g) * 6 - 3).to({self.dtype})"
            else:
                r = self.int_range
                t = f"torch.randint({-r}, {r + 1}, {shape}, generator=g).to({self.dtype})"
            lines.append(f"x{i} = {t}" + (".transpose(-1, -2)" if inp.transposed else ""))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"\n# dtype {self.dtype}, ops {list(self.ops)}\n{self.inputs_source()}\n{self.source()}\n"

    def _repr_pretty_(self, p, cycle) -> None:  # how hypothesis prints a falsifying example
        p.text(repr(self))

    @classmethod
    def from_source(cls, torch_dtype: str, inputs, body, outputs, seed: int = 0, int_range: int = 20) -> "Graph":
        """A hand-written graph (regression tests): `inputs` as (shape, transposed) or (shape,
        transposed, mask), `body` one expression per op over v-names (inputs are v0..), `outputs`
        positions among all values."""
        ins = tuple(Input(tuple(s), t, *rest) for s, t, *rest in inputs)
        nodes = [Node(f"x{i}", inp.shape, 0, FLOAT_INPUT_BOUND) for i, inp in enumerate(ins)]
        nodes += [Node(expr, (), k + 1, MAX_BOUND) for k, expr in enumerate(body)]
        return cls(getattr(torch, torch_dtype), ins, tuple(nodes), tuple(outputs), seed, ("hand-written",),
                   int_range)

    def function(self):
        scope = {"torch": torch, "F": torch.nn.functional}
        exec(compile(self.source(), "<fuzzed graph>", "exec"), scope)  # noqa: S102 - our own source
        return scope["f"]

    def make_inputs(self) -> list[torch.Tensor]:
        scope = {"torch": torch}
        exec(self.inputs_source(), scope)  # noqa: S102 - our own source
        return [scope[f"x{i}"] for i in range(len(self.inputs))]


def _broadcasts(*shapes: tuple[int, ...]) -> tuple[int, ...] | None:
    try:
        return tuple(torch.broadcast_shapes(*shapes))
    except RuntimeError:
        return None


def _fits(*shapes: tuple[int, ...]) -> bool:
    s = _broadcasts(*shapes)
    return s is not None and math.prod(s) <= MAX_NUMEL


def _meta(nodes: list[Node], expr: str) -> tuple[tuple[int, ...], torch.dtype]:
    """The shape and dtype PyTorch gives `expr` (evaluated on meta tensors: no data, no compute)."""
    scope = {"torch": torch, "F": torch.nn.functional}
    scope.update({f"v{i}": torch.empty(n.shape, dtype=n.dtype, device="meta") for i, n in enumerate(nodes)})
    out = eval(expr, scope)  # noqa: S307 - our own source
    return tuple(out.shape), out.dtype


def _gamma(n: int) -> float:
    """gamma_n = n u / (1 - n u), u = 2**-24: the relative error bound of an n-term fp32 dot product."""
    return n * _U32 / (1 - n * _U32)


def _matmul_k(shape: tuple[int, ...], left: bool) -> int:
    """The contracted length when a value of `shape` is a matmul's left (or right) operand."""
    return shape[-1] if left or len(shape) == 1 else shape[-2]


def _draw_matmul(draw, nodes: list[Node], inputs: list[Input], dtype: torch.dtype):
    """Draw one float matmul over `nodes` (module docstring), appending the fresh weight and bias
    inputs it reads to `inputs` and `nodes`. Returns (expr, K, the operands' bounds, label) or None
    when no float value can be an operand."""
    def fits(j: int, k: int, other: float = FLOAT_INPUT_BOUND) -> bool:
        n = nodes[j]
        return (_kind(n.dtype) == "f" and len(n.shape) >= 1 and len(n.shape) <= 3
                and k * n.bound * other <= MAX_MATMUL_BOUND)

    left = [j for j in range(len(nodes)) if fits(j, nodes[j].shape[-1] if nodes[j].shape else 0)]
    if not left:
        return None
    a = draw(st.sampled_from(left))
    na = nodes[a]

    def pairs(j: int) -> list[tuple[str, int]]:  # value @ value: (form, right operand)
        out, k = [], na.shape[-1]
        for i, nb in enumerate(nodes):
            if _kind(nb.dtype) != "f" or not 1 <= len(nb.shape) <= 3 or k * na.bound * nb.bound > MAX_MATMUL_BOUND:
                continue
            for form, expr in (("@", f"v{j} @ v{i}"), ("@T", f"v{j} @ v{i}.transpose(-1, -2)")):
                if form == "@T" and len(nb.shape) < 2:
                    continue
                try:
                    shape, _ = _meta(nodes, expr)
                except RuntimeError:
                    continue
                if 0 < math.prod(shape) <= MAX_NUMEL:
                    out.append((form, i))
        return out

    forms = ["a@w", "a@wT", "linear"]
    if fits(a, _matmul_k(na.shape, left=False)):
        forms.append("w@a")
    vv = pairs(a)
    if vv:
        forms.append("a@b")
    form = draw(st.sampled_from(forms))

    def fresh(shape: tuple[int, ...], transposable: bool) -> int:
        transposed = transposable and len(shape) >= 2 and shape[-1] > 1 and shape[-2] > 1 and draw(st.booleans())
        inputs.append(Input(shape, transposed))
        nodes.append(Node(f"x{len(inputs) - 1}", shape, 0, FLOAT_INPUT_BOUND, dtype))
        return len(nodes) - 1

    def other_dim(keep: int, rows: int) -> int:
        """N (or M): `keep` (the result keeps `a`'s shape: a residual can follow) or a drawn dim,
        so that the weight and the result both stay within MAX_NUMEL."""
        ok = [d for d in sorted(set(DIMS) | {keep}) if d * rows <= MAX_NUMEL]
        return keep if keep in ok and draw(st.booleans()) else draw(st.sampled_from(ok))

    batch = na.shape[:-2] if len(na.shape) == 3 else ()
    if form == "a@b":
        kind, b = draw(st.sampled_from(vv))
        expr = f"v{a} @ v{b}" + (".transpose(-1, -2)" if kind == "@T" else "")
        return expr, na.shape[-1], (na.bound, nodes[b].bound), "matmul.vv" + ("T" if kind == "@T" else "")
    if form == "w@a":
        k = _matmul_k(na.shape, left=False)
        cols = na.shape[-1] if len(na.shape) >= 2 else 1
        m = other_dim(k, max(k, math.prod(batch) * cols))
        wb = batch if batch and batch[0] * m * k <= MAX_NUMEL and draw(st.booleans()) else ()
        w = fresh(wb + (m, k), True)
        return f"v{w} @ v{a}", k, (FLOAT_INPUT_BOUND, na.bound), "w@matmul"
    k = na.shape[-1]
    rows = math.prod(na.shape[:-1])
    n = other_dim(k, max(k, rows))
    if form == "linear":
        w = fresh((n, k), True)
        bias = fresh((n,), False) if draw(st.booleans()) else None
        expr = f"F.linear(v{a}, v{w}" + (f", v{bias})" if bias is not None else ")")
        return expr, k, (na.bound, FLOAT_INPUT_BOUND, 0.0 if bias is None else FLOAT_INPUT_BOUND), \
            "linear+bias" if bias is not None else "linear"
    wb = ((draw(st.sampled_from(sorted({batch[0], 1}))),) if batch and batch[0] * k * n <= MAX_NUMEL
          and draw(st.booleans()) else ())
    if form == "a@w":
        w = fresh(wb + (k, n), True)
        return f"v{a} @ v{w}", k, (na.bound, FLOAT_INPUT_BOUND), "matmul"
    w = fresh(wb + (n, k), True)  # a @ w.t(): the weight is read in its own (N, K) layout
    t = ".t()" if not wb and draw(st.booleans()) else ".transpose(-1, -2)"
    return f"v{a} @ v{w}{t}", k, (na.bound, FLOAT_INPUT_BOUND), "matmul.wT"


@st.composite
def graphs(draw, reductions=tuple(REDUCE), shaped=tuple(SHAPED), dtypes=DTYPES, matmuls=True):
    """A random small graph (see the module docstring). `reductions` and `shaped` restrict the
    float reductions; integer and bool ones are always drawn. `matmuls`: float graphs draw
    matmuls too."""
    dtype = draw(st.sampled_from(dtypes))
    is_float = dtype.is_floating_point
    int_range = 20 if is_float else draw(st.sampled_from(INT_RANGES))
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.sampled_from(DIMS), min_size=rank, max_size=rank)))
    while math.prod(shape) > MAX_NUMEL:
        shape = shape[1:]
    n_inputs = draw(st.integers(1, 3))
    inputs = []
    for i in range(n_inputs):
        s = shape
        if i > 0 and draw(st.booleans()):  # broadcastable: drop leading dims, set dims to 1
            s = s[draw(st.integers(0, len(s) - 1)):]
            s = tuple(1 if draw(st.booleans()) else d for d in s)
        transposed = len(s) >= 2 and s[-1] > 1 and s[-2] > 1 and draw(st.booleans())
        mask = i > 0 and draw(st.integers(0, 3)) == 0
        inputs.append(Input(s, transposed, mask))
    nodes = [Node(f"x{i}", inp.shape, 0, 1.0 if inp.mask else FLOAT_INPUT_BOUND if is_float else int_range,
                  torch.bool if inp.mask else dtype) for i, inp in enumerate(inputs)]
    first_op = len(nodes)  # the source aliases input xI as vI, so every op reads a name vK
    ops = []
    n_ops = draw(st.integers(2, 8))
    follow = None  # a matmul just drawn: the next op may be its epilogue
    for _ in range(n_ops):
        if is_float and matmuls and draw(st.integers(1, MATMUL_ONE_IN)) == MATMUL_ONE_IN:
            mm = _draw_matmul(draw, nodes, inputs, dtype)
            if mm is not None:
                expr, k, bounds, label = mm
                out_shape, out_dtype = _meta(nodes, expr)
                operands = [nodes[int(m)] for m in re.findall(r"\bv(\d+)\b", expr)]
                depth = max(n.depth for n in operands) + 1
                bound = k * bounds[0] * bounds[1] + (bounds[2] if len(bounds) > 2 else 0.0)
                label = f"{label}(K={k})"
                node = Node(expr, out_shape, depth, bound, out_dtype)
                if bound > MAX_BOUND:
                    # squash, scaled so that a typical value (sqrt(K) b_a b_b / 3 for uniform data) is
                    # about 1, inside tanh's slope: a plain tanh of it would be saturated and hide errors
                    scale = 3 / (math.sqrt(k) * bounds[0] * bounds[1])
                    node = Node(f"torch.tanh(({expr}) * {scale:.3g})", out_shape, depth + 2, 1.0, out_dtype)
                    label = f"{label}+tanh"
                nodes.append(node)
                ops.append(label)
                follow = len(nodes) - 1
                continue
        kinds = ["unary", "binary", "reduce"] if any(len(n.shape) for n in nodes) else ["unary", "binary"]
        if follow is not None and draw(st.booleans()):  # an epilogue on the matmul's result
            category = draw(st.sampled_from(["unary", "binary"]))
            a = follow
        else:
            category = draw(st.sampled_from(kinds))
            if category == "reduce":
                a = draw(st.sampled_from([j for j, n in enumerate(nodes) if len(n.shape)]))
            else:
                a = draw(st.integers(0, len(nodes) - 1))
        follow = None
        na = nodes[a]
        kind = _kind(na.dtype)
        table = OPS[kind]

        def usable(j: int, op: Op) -> bool:  # float operands of inputs_only ops must be graph inputs
            return not op.inputs_only or _kind(nodes[j].dtype) != "f" or nodes[j].is_input

        depth = na.depth
        if category == "unary":
            names = [m for m, op in sorted(table["unary"].items()) if usable(a, op)]
            name = draw(st.sampled_from(names))
            op = table["unary"][name]
            expr, bound = op.template.format(a=f"v{a}"), op.bound(na.bound)
        elif category == "binary":
            def partners(op: Op, shapes=(na.shape,)) -> list[int]:
                return [j for j, n in enumerate(nodes) if _kind(n.dtype) == op.partner[0] and usable(j, op)
                        and _fits(*shapes, n.shape)]
            names = [m for m, op in sorted(table["binary"].items()) if usable(a, op) and partners(op)]
            name = draw(st.sampled_from(names))
            op = table["binary"][name]
            b = draw(st.sampled_from(partners(op)))
            nb = nodes[b]
            depth = max(depth, nb.depth)
            if op.partner == "b=":  # where(mask b, a, c)
                c = draw(st.sampled_from([j for j, n in enumerate(nodes) if _kind(n.dtype) == kind
                                          and _fits(na.shape, nb.shape, n.shape)]))
                depth = max(depth, nodes[c].depth)
                expr = op.template.format(a=f"v{a}", b=f"v{b}", c=f"v{c}")
                bound = op.bound(na.bound, nb.bound, nodes[c].bound)
            else:
                expr, bound = op.template.format(a=f"v{a}", b=f"v{b}"), op.bound(na.bound, nb.bound)
        else:
            d = draw(st.integers(0, len(na.shape) - 1))
            n = na.shape[d]
            allowed = (set(reductions) | set(shaped)) if kind == "f" else None
            # var over one element is NaN on both sides, and NaN downstream would test nothing
            names = [m for m, op in sorted(table["reduce"].items()) + sorted(table["shaped"].items())
                     if usable(a, op) and (allowed is None or m in allowed)
                     and not (kind == "f" and m == "var" and n == 1)]
            name = draw(st.sampled_from(names))
            if name in table["shaped"]:  # (no name is in both tables)
                op = table["shaped"][name]
                expr = op.template.format(a=f"v{a}", d=d)
            else:
                op = table["reduce"][name]
                expr = op.template.format(a=f"v{a}", d=d, k=draw(st.booleans()))
            bound = op.bound(na.bound, n)
        out_shape, out_dtype = _meta(nodes, expr)
        out_kind = _kind(out_dtype)
        node = Node(expr, out_shape, depth + op.steps if out_kind == "f" else 0, bound, out_dtype)
        label = name if kind == "f" else f"{kind}.{name}"
        if out_kind == "f" and node.bound > MAX_BOUND:
            # keep magnitudes bounded: squash instead (an op of its own)
            node = Node(f"torch.tanh({node.expr})", node.shape, node.depth + 1, 1.0, out_dtype)
            label = f"{label}+tanh"
        elif out_kind == "i" and node.bound > MAX_INT_BOUND:
            node = Node(f"({node.expr}) % 2047 - 1023", node.shape, 0, 1023, out_dtype)
            label = f"{label}+mod"
        nodes.append(node)
        ops.append(label)
    last = len(nodes) - 1
    # Outputs: the last value and up to two other ops nothing reads (dead ops test nothing),
    # else any other ops.
    used = {int(m) for n in nodes for m in re.findall(r"\bv(\d+)\b", n.expr)}
    leaves = [j for j in range(first_op, last) if j not in used and not nodes[j].is_input]
    pool = leaves or [j for j in range(first_op, last) if not nodes[j].is_input]  # (a matmul's weights)
    others = draw(st.lists(st.sampled_from(pool), max_size=2, unique=True)) if pool else []
    outputs = tuple(dict.fromkeys([last, *leaves[-2:], *others]))[:3]
    seed = draw(st.integers(0, 2**16))
    return Graph(dtype, tuple(inputs), tuple(nodes), outputs, seed, tuple(ops), int_range)


# ---- running and checking one graph ----------------------------------------------------


@dataclass
class Outcome:
    compiled: int  # kernels that became spyre programs
    fallbacks: list[str]  # ops that ran on the CPU (allowed ones)


def _depths(graph: Graph) -> list[int]:
    return [graph.nodes[i].depth for i in graph.outputs]


def _tolerance(ref: torch.Tensor, sens: torch.Tensor, depth: int, dtype: torch.dtype,
               accumulation: float = 0.0) -> tuple[float, float]:
    """(rtol, atol) for one output (module docstring); `accumulation`: how far the matmuls'
    accumulation bounds move it (``accumulation_spread``)."""
    per_op = 1e-5 if dtype == torch.float32 else 1e-3
    sens_factor = 4.0 if dtype == torch.float32 else 2.0
    finite = ref[torch.isfinite(ref)]
    scale = max(1.0, float(finite.abs().max())) if finite.numel() else 1.0
    s = sens[torch.isfinite(sens)]
    spread = float(s.max()) if s.numel() else 0.0
    steps = depth + 1
    return per_op * steps, per_op * steps * scale + sens_factor * spread + ACCUMULATION_FACTOR * accumulation


def _widen(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype) if x.is_floating_point() else x  # masks stay bools


# The matmul accumulation term (module docstring): twice the larger deviation of two perturbed runs.
ACCUMULATION_FACTOR = 2.0
ACCUMULATION_DRAWS = 2
_MATMUL_FUNCTIONS = frozenset({"matmul", "__matmul__", "mm", "bmm", "linear"})


class _PerturbMatmuls(TorchFunctionMode):
    """Adds to every float matmul's result its accumulation bound with a random sign per element:
    2 gamma_(K+1) (|a| @ |b| + |bias|), the most two fp32 accumulations of it in different orders
    (the program's and eager's) can differ by (module docstring). Run on fp64 values."""

    def __init__(self, seed: int):
        super().__init__()
        self.generator = torch.Generator().manual_seed(seed)
        self.matmuls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)  # (the mode is not active inside its own handler)
        if getattr(func, "__name__", "") not in _MATMUL_FUNCTIONS or not out.is_floating_point():
            return out
        if getattr(func, "__name__", "") == "linear":
            x, w, *rest = args
            bias = rest[0] if rest else kwargs.get("bias")
            k, mag = x.shape[-1], F.linear(x.abs(), w.abs(), None if bias is None else bias.abs())
        else:
            a, b = args[:2]
            k, mag = a.shape[-1], torch.matmul(a.abs(), b.abs())
        self.matmuls += 1
        sign = torch.randint(0, 2, out.shape, generator=self.generator).to(out.dtype) * 2 - 1
        return out + sign * (2 * _gamma(k + 1) * mag)


def accumulation_spread(graph: Graph, inputs) -> list[float]:
    """Per output, how far the matmuls' accumulation bounds move it (0 without matmuls): the
    larger |perturbed - exact| of ACCUMULATION_DRAWS fp64 runs under ``_PerturbMatmuls``."""
    fn = graph.function()
    wide = [_widen(x, torch.float64) for x in inputs]
    exact = fn(*wide)
    spread = [0.0] * len(exact)
    for draw in range(ACCUMULATION_DRAWS):
        mode = _PerturbMatmuls(graph.seed + draw)
        with mode:
            moved = fn(*wide)
        if not mode.matmuls:
            break
        for i, (m, e) in enumerate(zip(moved, exact)):
            if e.is_floating_point():
                d = (m - e).abs()
                d = d[torch.isfinite(d)]
                spread[i] = max(spread[i], float(d.max()) if d.numel() else 0.0)
    return spread


def references(graph: Graph, inputs) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    """(the reference outputs, per output the rounding sensitivity; None for integer and bool
    outputs, which compare exactly)."""
    fn = graph.function()
    if graph.dtype == torch.float16:
        exact = fn(*(_widen(x, torch.float32) for x in inputs))
        rounded = fn(*inputs)  # eager fp16: rounds after every op
        ref = [_widen(r, torch.float16) for r in exact]
        sens = [(r16.float() - r).abs() if r.is_floating_point() else None for r16, r in zip(rounded, exact)]
    elif graph.dtype == torch.float32:
        ref = list(fn(*inputs))
        wide = fn(*(_widen(x, torch.float64) for x in inputs))
        sens = [(r.double() - w).abs() if r.is_floating_point() else None for r, w in zip(ref, wide)]
    else:  # integer graphs: eager is exact
        ref = list(fn(*inputs))
        sens = [None] * len(ref)
    return ref, sens


def check(graph: Graph) -> Outcome:
    """Compile `graph` on spyre, run it, compare with the CPU; raise AssertionError with the graph."""
    from inductor_helpers import compile_on_spyre

    inputs = graph.make_inputs()
    fn = graph.function()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            out, _, records, _, code = compile_on_spyre(fn, *inputs)
        except Exception as e:  # a compiler crash is a finding like a wrong value: report the graph
            message = str(e).split("\n\nSet TORCHDYNAMO_VERBOSE")[0]
            raise AssertionError(f"fuzzed graph failed:\ncompiling raised {type(e).__name__}: {message}"
                                 f"\n{graph!r}") from e
    ref, sens = references(graph, inputs)
    spread = accumulation_spread(graph, inputs)
    problems = []
    if len(out) != len(ref):
        problems.append(f"the compiled graph returned {len(out)} outputs, eager {len(ref)}")
    for i, (got, want, s, depth, acc) in enumerate(zip(out, ref, sens, _depths(graph), spread)):
        got = got.cpu()
        if got.shape != want.shape or got.dtype != want.dtype:
            problems.append(f"output {i}: {got.dtype}{tuple(got.shape)} vs {want.dtype}{tuple(want.shape)}")
            continue
        if s is None:  # integer and bool results: exactly
            if not torch.equal(got, want):
                wrong = (got != want).nonzero()
                problems.append(f"output {i} (v{graph.outputs[i]}, {want.dtype}, exact): {len(wrong)} of "
                                f"{want.numel()} elements differ, first at {tuple(wrong[0].tolist())}: "
                                f"got {got[tuple(wrong[0])].item()}, eager {want[tuple(wrong[0])].item()}")
            continue
        rtol, atol = _tolerance(want.float(), s.float(), depth, graph.dtype, acc)
        try:
            torch.testing.assert_close(got, want, rtol=rtol, atol=atol, equal_nan=True)
        except AssertionError as e:
            problems.append(f"output {i} (v{graph.outputs[i]}, rtol {rtol:.3g}, atol {atol:.3g}): {e}")
    fallbacks = [r.ops for r in records if r.artifact is None and r.kernel is not None or r.fallback_reason]
    reasons = [f"{r.ops}: {r.fallback_reason}" for r in records if r.fallback_reason]
    # Inductor's own fallback kernels (aten ops it does not lower, extern kernels) run eagerly.
    from coverage_ops import extern_calls

    extern = extern_calls(code)
    bad = [f for f in fallbacks + extern if not any(ok in f for ok in NOT_COMPILED)]
    if bad:
        problems.append(f"CPU fallbacks: {reasons or bad}")
    if problems:
        raise AssertionError("fuzzed graph failed:\n" + "\n".join(problems) + f"\n{graph!r}")
    return Outcome(sum(r.artifact is not None for r in records), fallbacks + extern)
