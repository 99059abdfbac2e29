"""The pointwise coverage of issue 9 as data: ops, dtypes, inputs, references, tolerances
(and the reductions': see the reductions section at the end).

Shared by tests/compiler/test_compiled_coverage.py, test_reduction_coverage.py
and benchmarks/coverage.py (which prints the ops x dtypes summaries), so the
tables and the tests check the same thing.

An op is a function of named inputs (``OP.inputs``): each name says what
values it needs ("x" any value, including NaN, +-inf, +-0 and halves for
floats and the extremes for integers; "pos" positive; "den" a non-zero
divisor; "exp" a small non-negative exponent or shift; "cond" booleans).
An op applies to a dtype exactly when PyTorch eager on the CPU defines it
for inputs of that dtype (``applies``); everything else is "n/a".

References (``reference``):
* floats in fp32, integers and bools: PyTorch eager on the CPU;
* fp16/bf16: the same function on the inputs widened to fp32, each float
  result rounded once to the dtype: Inductor's contract (fp32 inside a
  kernel, one rounding at the store). Eager fp16 rounds after every op and
  may be a few ulps away from both; that is not an error of either. Ops
  whose result depends on the dtype itself (nan_to_num's default
  replacement is the dtype's largest value) use eager in the dtype.

Tolerances (``TOL``; never widened to make a case pass):
* fp32: rtol 1.3e-6, atol 1e-5 (torch.testing's fp32 defaults): the
  program computes in fp32 like the CPU; a decomposed op (gelu, softplus,
  mish...) may differ from eager's fused kernel in the last bits.
* fp16 / bf16: one ulp of the dtype relative (2**-10, 2**-7): the fp32
  results differ in the last fp32 bits at most, which moves the single
  rounding by at most one ulp; atol 1e-5 for results that cancel to near
  zero in fp32.
* integers and bools: exact (int64 is computed in int64; overflow wraps).
NaN compares equal to NaN everywhere. One value is not graded: gelu(+inf),
for which eager gives inf or NaN depending on the tensor's length (its
scalar and vectorized loops disagree); the math, Inductor's CPU backend
and the spyre program give inf.

Casts (``CASTS``): every pair of the ISA's dtypes, graded exactly against
eager's single conversion. Sources converted to integers are finite and in
range (a NaN, an infinity or an out-of-range float converted to an integer
is undefined behaviour in C, and eager's scalar and vectorized loops give
different answers); integer sources include the extremes, which wrap.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
INTS = (torch.int32, torch.int64)
DTYPES = FLOATS + INTS + (torch.bool,)
# Casts: every pair of the ISA's dtypes.
CAST_DTYPES = FLOATS + (torch.int64, torch.int32, torch.int8, torch.bool)
NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.int32: "int32",
         torch.int64: "int64", torch.int8: "int8", torch.bool: "bool"}

TOL = {torch.float32: dict(rtol=1.3e-6, atol=1e-5), torch.float16: dict(rtol=2.0 ** -10, atol=1e-5),
       torch.bfloat16: dict(rtol=2.0 ** -7, atol=1e-5)}


@dataclass(frozen=True)
class OpCase:
    name: str
    fn: Callable
    inputs: tuple[str, ...] = ("x",)
    native_ref: bool = False  # the reference runs in the dtype itself (see the module docstring)
    # Where eager disagrees with itself, a mask of the inputs' broadcast shape that is not graded.
    ungraded: Callable | None = None
    # Reductions (REDUCTIONS): float results are referenced to float64 math rounded once ...
    fp64_ref: bool = False
    # ... and may differ from it by the accumulation's rounding bound: a function of the inputs
    # widened to float64 giving, per output, a tensor of extra absolute tolerance (or None).
    slack: Callable | None = None


def _ops() -> tuple[OpCase, ...]:
    c = OpCase
    return (
        c("add", lambda x, y: x + y, ("x", "y")),
        c("add_alpha", lambda x, y: torch.add(x, y, alpha=3), ("x", "y")),
        c("sub", lambda x, y: x - y, ("x", "y")),
        c("mul", lambda x, y: x * y, ("x", "y")),
        c("div", lambda x, y: x / y, ("x", "den")),
        c("div_floor", lambda x, y: torch.div(x, y, rounding_mode="floor"), ("x", "den")),
        c("div_trunc", lambda x, y: torch.div(x, y, rounding_mode="trunc"), ("x", "den")),
        c("remainder", lambda x, y: torch.remainder(x, y), ("x", "den")),
        c("fmod", lambda x, y: torch.fmod(x, y), ("x", "den")),
        c("neg", lambda x: -x),
        c("abs", torch.abs),
        c("exp", torch.exp),
        c("exp2", torch.exp2),
        c("expm1", torch.expm1),
        c("log", torch.log, ("pos",)),
        c("log2", torch.log2, ("pos",)),
        c("log1p", torch.log1p, ("pos",)),
        c("sqrt", torch.sqrt, ("pos",)),
        c("rsqrt", torch.rsqrt, ("pos",)),
        c("reciprocal", torch.reciprocal, ("den",)),
        c("sigmoid", torch.sigmoid),
        c("tanh", torch.tanh),
        c("relu", torch.relu),
        c("leaky_relu", lambda x: F.leaky_relu(x, 0.1)),
        c("hardtanh", lambda x: F.hardtanh(x, -2.0, 2.0)),
        # gelu(+inf): eager's scalar loop gives inf, its vectorized loop NaN (which one runs
        # depends on the tensor's length); the math, Inductor's CPU backend and we give inf.
        c("gelu", F.gelu, ungraded=lambda x: x == float("inf")),
        c("gelu_tanh", lambda x: F.gelu(x, approximate="tanh")),
        c("silu", F.silu),
        c("softplus", F.softplus),
        c("mish", F.mish),
        c("elu", F.elu),
        c("sin", torch.sin),
        c("cos", torch.cos),
        c("pow", lambda x, y: torch.pow(x, y), ("pos", "exp")),
        c("pow_scalar_exp", lambda x: (x ** 2, x ** 3, torch.pow(x, 0.5), torch.pow(x, 2.5)), ("pos",)),
        c("pow_scalar_base", lambda y: torch.pow(2, y), ("exp",)),
        c("minimum", torch.minimum, ("x", "y")),
        c("maximum", torch.maximum, ("x", "y")),
        c("clamp", lambda x: torch.clamp(x, -2, 2)),
        c("clamp_tensor", lambda x, lo, hi: torch.clamp(x, lo, hi), ("x", "y", "z")),
        c("where", lambda cond, x, y: torch.where(cond, x, y), ("cond", "x", "y")),
        c("eq", torch.eq, ("x", "y")),
        c("ne", torch.ne, ("x", "y")),
        c("lt", torch.lt, ("x", "y")),
        c("le", torch.le, ("x", "y")),
        c("gt", torch.gt, ("x", "y")),
        c("ge", torch.ge, ("x", "y")),
        c("logical_and", torch.logical_and, ("x", "y")),
        c("logical_or", torch.logical_or, ("x", "y")),
        c("logical_not", torch.logical_not),
        c("logical_xor", torch.logical_xor, ("x", "y")),
        c("bitwise_and", torch.bitwise_and, ("x", "y")),
        c("bitwise_or", torch.bitwise_or, ("x", "y")),
        c("bitwise_xor", torch.bitwise_xor, ("x", "y")),
        c("bitwise_not", torch.bitwise_not),
        c("shift_left", torch.bitwise_left_shift, ("x", "exp")),
        c("shift_right", torch.bitwise_right_shift, ("x", "exp")),
        c("floor", torch.floor),
        c("ceil", torch.ceil),
        c("round", torch.round),
        c("trunc", torch.trunc),
        c("sign", torch.sign),
        c("isnan", torch.isnan),
        c("isinf", torch.isinf),
        c("nan_to_num", lambda x: (torch.nan_to_num(x), torch.nan_to_num(x, 0.5, 100.0, -100.0)), native_ref=True),
        c("lerp", lambda x, y, w: (torch.lerp(x, y, w), torch.lerp(x, y, 0.3)), ("x", "y", "w")),
        c("addcmul", lambda x, y, z: torch.addcmul(x, y, z, value=2), ("x", "y", "z")),
        c("addcdiv", lambda x, y, z: torch.addcdiv(x, y, z, value=0.5), ("x", "y", "den")),
    )


OPS = _ops()
OPS_BY_NAME = {op.name: op for op in OPS}


def _cast(dtype: torch.dtype) -> OpCase:
    kind = "x" if dtype.is_floating_point or dtype == torch.bool else "cast"
    return OpCase(f"to_{NAMES[dtype]}", lambda t: t.to(dtype), (kind,), native_ref=True)


# Casts from a source dtype (the group's dtype) to each dtype; float sources reach integers
# through the "cast" kind only (module docstring).
CASTS = tuple(_cast(d) for d in CAST_DTYPES)


# ---- inputs ---------------------------------------------------------------------------------

_FLOAT_SPECIALS = (float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 0.5, 1.5, 2.5, -0.5, -2.5, 1.0, -1.0)


def make_input(kind: str, shape, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Values of `kind` (module docstring) in `shape` and `dtype`, specials first."""
    g = torch.Generator().manual_seed(seed)
    n = 1
    for s in shape:
        n *= s
    if kind == "cond":
        return (torch.rand(n, generator=g) > 0.5).reshape(shape)
    if dtype == torch.bool:
        if kind in ("den", "pos"):
            return torch.ones(shape, dtype=torch.bool)  # the only non-zero bool
        return (torch.rand(n, generator=g) > 0.5).reshape(shape)
    if dtype.is_floating_point:
        if kind == "cast":
            # finite, within int8, fractions of both signs (conversion to integers truncates)
            flat = (torch.rand(n, generator=g) * 250 - 125).clamp(-127.5, 127.5)
            specials = torch.tensor([-2.5, 2.5, -0.75, 0.75, -0.0, 127.9, -128.9, 1e-8])
            k = min(n, len(specials))
            flat[:k] = specials[:k]
        elif kind == "exp":
            flat = torch.randint(0, 4, (n,), generator=g).float() + torch.rand(n, generator=g).round() * 0.5
        elif kind == "pos":
            flat = torch.rand(n, generator=g) * 4 + 0.05
        elif kind == "w":
            flat = torch.rand(n, generator=g) * 1.4 - 0.2  # weights on both sides of 0.5, some outside [0, 1]
        else:
            flat = torch.randn(n, generator=g) * 2
            specials = torch.tensor(_FLOAT_SPECIALS if kind == "x" else (0.5, -1.5, 3.0, -0.0))
            if kind == "den":
                flat = torch.where(flat.abs() < 0.1, torch.full_like(flat, 0.7), flat)
            k = min(n, len(specials))
            flat[:k] = specials[:k]
        return flat.to(dtype).reshape(shape)
    info = torch.iinfo(dtype)
    if kind == "exp":
        flat = torch.randint(0, 5, (n,), generator=g)
    elif kind == "pos":
        flat = torch.randint(1, 100, (n,), generator=g)
    else:
        flat = torch.randint(-60, 60, (n,), generator=g)
        if kind == "den":
            flat = torch.where(flat == 0, torch.full_like(flat, 7), flat)
            specials = [-7, 7, -1, 3]
        else:
            # the extremes (overflow wraps); int64 values no float32 / int32 could hold exactly
            specials = [info.max, info.min, 0, -1, 1, info.max - 3]
            if dtype == torch.int64:
                specials += [2 ** 40 + 3, -(2 ** 53) - 7]
        k = min(n, len(specials))
        flat[:k] = torch.tensor(specials[:k])
    return flat.to(dtype).reshape(shape)


_KINDS = ("x", "y", "z", "pos", "den", "exp", "w", "cond", "cast")


def inputs_for(op: OpCase, shape, dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    return [make_input(kind, shape, dtype, seed + 7 * k + _KINDS.index(kind)) for k, kind in enumerate(op.inputs)]


def as_tuple(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


def applies(op: OpCase, dtype: torch.dtype) -> bool:
    """Whether PyTorch eager on the CPU defines `op` for `dtype` inputs."""
    try:
        op.fn(*inputs_for(op, (4,), dtype))
    except (RuntimeError, TypeError, NotImplementedError):
        return False
    return True


def reference(op: OpCase, args, dtype: torch.dtype) -> tuple:
    """The expected results of `op` on CPU `args` of `dtype` (module docstring; reductions: the
    REDUCTIONS section)."""
    if op.fp64_ref:
        eager = as_tuple(op.fn(*args))
        if not any(r.is_floating_point() for r in eager):
            return eager
        wide = as_tuple(op.fn(*(a.double() for a in args)))
        return tuple(w.to(e.dtype) if e.is_floating_point() else e for e, w in zip(eager, wide))
    if dtype in (torch.float16, torch.bfloat16) and not op.native_ref:
        wide = [a.float() if a.dtype == dtype else a for a in args]
        return tuple(r.to(dtype) if r.is_floating_point() else r for r in as_tuple(op.fn(*wide)))
    return as_tuple(op.fn(*args))


def mismatch(got: torch.Tensor, want: torch.Tensor, ungraded: torch.Tensor | None = None,
             slack: torch.Tensor | None = None) -> str | None:
    """None if `got` (a CPU tensor) matches `want` within the dtype's tolerance (except where
    `ungraded`; plus `slack`, a per-element absolute allowance, for floats), else why not."""
    if got.dtype != want.dtype:
        return f"dtype {got.dtype} != {want.dtype}"
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)} != {tuple(want.shape)}"
    if slack is not None and want.is_floating_point():
        return _beyond(got, want, slack)
    if ungraded is not None:
        keep = ~ungraded.expand(want.shape)
        got, want = got[keep], want[keep]
    try:
        if want.is_floating_point():
            torch.testing.assert_close(got, want, equal_nan=True, **TOL[want.dtype])
        elif not torch.equal(got, want):
            bad = (got != want).nonzero()[:3].tolist()
            return f"not equal at {bad}: got {[got[tuple(i)].item() for i in bad]}, " \
                   f"want {[want[tuple(i)].item() for i in bad]}"
    except AssertionError as e:
        return str(e).splitlines()[0] + " " + " ".join(str(e).splitlines()[1:4])
    return None


def _beyond(got: torch.Tensor, want: torch.Tensor, slack: torch.Tensor) -> str | None:
    """`mismatch` for floats with a per-element slack: |got - want| <= atol + rtol |want| + slack,
    NaN where NaN is wanted and exactly the infinity where one is wanted."""
    g, w = got.double(), want.double()
    slack = slack.double().nan_to_num(0.0, 0.0, 0.0).expand(w.shape)  # non-finite results: exact
    allowed = TOL[want.dtype]["atol"] + TOL[want.dtype]["rtol"] * w.abs() + slack
    ok = (g == w) | (g.isnan() & w.isnan()) | (w.isfinite() & ((g - w).abs() <= allowed))
    if ok.all():
        return None
    err = torch.where(ok, torch.zeros_like(g), (g - w).abs().nan_to_num(float("inf")))
    at = tuple(int(i) for i in torch.unravel_index(err.argmax(), err.shape))
    return (f"{int((~ok).sum())} of {ok.numel()} elements beyond tolerance; worst at {list(at)}: got "
            f"{g[at].item():.9g}, want {w[at].item():.9g} (|diff| {err[at].item():.3g} > allowed "
            f"{allowed[at].item():.3g}, of which rounding slack {slack[at].item():.3g})")


# ---- compiling a group of ops in one graph --------------------------------------------------


@dataclass(frozen=True)
class Cell:
    status: str       # "pass", "fail" (wrong result or error), "fallback" (ran on the CPU), "n/a"
    detail: str = ""


def pool(shape, dtype: torch.dtype, seed: int = 0) -> dict[str, torch.Tensor]:
    """One CPU tensor per input kind, shared by every op of a group."""
    return {kind: make_input(kind, shape, dtype, seed + k) for k, kind in enumerate(_KINDS)}


def _transposed(shape, dtype, seed):
    """Inputs that are transposes of contiguous tensors (non-contiguous, no stride-1 last dim)."""
    return {k: t.t() for k, t in pool(shape[::-1], dtype, seed).items()}


def _sliced(shape, dtype, seed):
    """Every other column of a wider tensor (stride 2 along the last dim), offset by one."""
    wide = shape[:-1] + (2 * shape[-1] + 1,)
    return {k: t[..., 1::2] for k, t in pool(wide, dtype, seed).items()}


def _broadcast(dtype, seed):
    """Operands of different shapes broadcasting to (37, 130): a column, a row, a 0-d tensor."""
    shapes = {"x": (37, 130), "y": (130,), "z": (37, 1), "pos": (1, 130), "den": (), "exp": (37, 1),
              "w": (), "cond": (37, 130), "cast": (37, 130)}
    return {k: make_input(k, shapes[k], dtype, seed + i) for i, k in enumerate(_KINDS)}


# Input layouts of the coverage (issue 9's "Inputs"): name -> function (dtype, seed) -> inputs.
SHAPES = {
    "2d_67": lambda dt, s: pool((3, 67), dt, s),
    "0d": lambda dt, s: pool((), dt, s),
    "empty": lambda dt, s: pool((0,), dt, s),
    "empty_3d": lambda dt, s: pool((3, 0, 5), dt, s),
    "size1": lambda dt, s: pool((1, 67, 1), dt, s),
    "broadcast": _broadcast,
    "transposed": lambda dt, s: _transposed((40, 67), dt, s),
    "sliced": lambda dt, s: _sliced((5, 33), dt, s),
    "1d": lambda dt, s: pool((67,), dt, s),
    "3d": lambda dt, s: pool((5, 7, 9), dt, s),
    "4d": lambda dt, s: pool((2, 3, 4, 65), dt, s),
    "5d": lambda dt, s: pool((2, 3, 2, 5, 33), dt, s),
    "6d": lambda dt, s: pool((2, 1, 3, 2, 5, 9), dt, s),
}


def group_fn(ops, kinds=_KINDS):
    """One function of the shared inputs (positional, in `kinds` order) computing every op of `ops`,
    its outputs flattened."""
    def fn(*args):
        inputs = dict(zip(kinds, args))
        out = []
        for op in ops:
            out += as_tuple(op.fn(*(inputs[k] for k in op.inputs)))
        return tuple(out)
    return fn


def run_group(ops, inputs: dict[str, torch.Tensor], dtype: torch.dtype, compile_on_spyre) -> dict[str, Cell]:
    """Compile `ops` as ONE graph on spyre (whatever the strict setting says), run it on spyre copies
    of `inputs` (CPU tensors, any strides) and grade each op against its reference.

    A CPU fallback inside the graph is charged to the ops whose kernel fell back: when there is
    one, each op of the group is compiled alone to find out which (the rest still pass)."""
    ops = list(ops)
    kinds = tuple(inputs)  # the graph's inputs, in the pool's order
    fn = group_fn(ops, kinds)
    from spyre_inductor.compiler.inductor.scheduling import record_kernels

    try:
        with record_kernels() as seen:  # kept when the call raises: a failing fallback is named
            out, _, records, warned, code = compile_on_spyre(fn, *(inputs[k] for k in kinds))
        if any(o.device.type != "spyre" for o in out):
            raise AssertionError("an output is not on spyre")
    except Exception as e:  # noqa: BLE001 - graded, not raised: the summary names it
        if len(ops) > 1:
            return _one_by_one(ops, inputs, dtype, compile_on_spyre)
        reasons = [r.fallback_reason for r in seen if r.fallback_reason]
        graph = f" (the graph runs a CPU fallback kernel: {reasons[0]})" if reasons else ""
        return {ops[0].name: Cell("fail", f"{type(e).__name__}: {str(e).splitlines()[0][:300]}{graph}")}
    fallbacks = [r.fallback_reason for r in records if r.fallback_reason] + extern_calls(code)
    if fallbacks and len(ops) > 1:
        return _one_by_one(ops, inputs, dtype, compile_on_spyre)
    cells, k = {}, 0
    for op in ops:
        want = reference(op, [inputs[kind] for kind in op.inputs], dtype)
        got = out[k:k + len(want)]
        if len(got) != len(want):  # the compiled graph lost outputs: a failure, not a pass
            cells[op.name] = Cell("fail", f"{len(got)} of {len(want)} outputs returned")
            k += len(want)
            continue
        k += len(want)
        graded = op.ungraded(*(inputs[kind] for kind in op.inputs)) if op.ungraded else None
        slack = as_tuple(op.slack(*(inputs[kind].double() for kind in op.inputs))) if op.slack else ()
        slack += (None,) * (len(want) - len(slack))
        bad = [m for g, w, s in zip(got, want, slack) if (m := mismatch(g.cpu(), w, graded, s))]
        if bad:
            cells[op.name] = Cell("fail", bad[0])
        elif fallbacks:
            cells[op.name] = Cell("fallback", fallbacks[0])
        else:
            cells[op.name] = Cell("pass")
    return cells


def extern_calls(wrapper_code: str) -> list[str]:
    """ATen calls Inductor left in the generated wrapper (FallbackKernels, extern kernels): they run
    on the eager device, outside any spyre program, so they count as CPU fallbacks."""
    body = wrapper_code[wrapper_code.find("def call"):]
    calls = re.findall(r"\b(torch\.ops\.\w+\.\w+(?:\.\w+)?|extern_kernels\.\w+)\(", body)
    return [f"Inductor calls {c} (an extern ATen kernel, not a spyre program)" for c in dict.fromkeys(calls)]


def _one_by_one(ops, inputs, dtype, compile_on_spyre) -> dict[str, Cell]:
    cells = {}
    for op in ops:
        cells.update(run_group([op], inputs, dtype, compile_on_spyre))
    return cells


# ---- reductions ------------------------------------------------------------------------------
#
# Each reduction is graded over the last dim and over dim 0 of REDUCTION_SHAPE, an odd 2-D shape,
# as two cells: "sum(-1)" and "sum(0)". Rows of 67 do not fill whole sticks; columns of 11 are
# long enough to stay reductions: Inductor unrolls a reduction of fewer than 8 elements
# (config.unroll_reductions_threshold) into pointwise code, so over dim 0 of (5, 67) no reduction
# would reach the backend at all.
#
# Inputs (``reduction_pool``), by kind:
# * "x" (sum, mean, amax, amin, max, argmax, argmin, var, std, softmax, log_softmax, logsumexp,
#   cumsum): floats 2 * randn with a NaN at (3, 10), +inf at (4, 20), -inf at (1, 40) (the other rows
#   and columns are finite), a tie for row 2's maximum at columns 5 and 50 and for its
#   minimum at 7 and 60 (the first index wins), and a constant column 12 (ties all along dim 0,
#   variance exactly 0). Integers: randint(-60, 60) (plenty of ties) with the same row-2 ties and
#   constant column, and the dtype's extremes in row 0 (int64 also values above 2**53: no float
#   holds them, so an integer sum computed through floats shows); sums wrap like eager's.
#   Bools: random.
# * "unit" (prod, cumprod): products that stay finite: floats +-(1 + U(-0.1, 0.1)), integers
#   from {1, 1, 1, -1, 2}, bools mostly True; one exact zero at (2, 7).
# * "sparse" (any): mostly zero, with an all-zero row 0 and column 0; floats also hold a -0.0
#   (zero) in row 0 and a NaN (non-zero, so True) at (2, 30).
# * "dense" (all): mostly non-zero, with an all-non-zero row 1 and column 1; floats also hold a
#   NaN (non-zero) in row 1 and a -0.0 (zero, so False) at (3, 30).
#
# Applicability: a cell is n/a exactly when eager on the CPU raises for the pool of the dtype
# (``reduction_applies``): mean, var, std, softmax and log_softmax of integers, argmax/argmin of
# bools.
#
# References (``OpCase.fp64_ref``): integer and bool results (sums, products and scans of
# integers, indices, any/all) are eager's, exactly. Every float result is the same op computed in
# float64 from the same inputs, rounded once to eager's result dtype: the exact value up to that
# one rounding, which is what the program's result approximates. Not eager in the dtype: eager's
# fp16 / bf16 prod rounds after every product (up to ~4 ulps from the exact product rounded, on
# these inputs), and its fp16 log_softmax and logsumexp use up to 0.99 of the tolerance.
#
# Tolerances: the per-dtype TOL above (fp32 rtol 1.3e-6 / atol 1e-5; fp16, bf16 one ulp relative,
# 2**-10 and 2**-7, / atol 1e-5), plus, for results that accumulate (``slack``), the rounding bound
# of that accumulation. Inductor computes fp16 and bf16 in fp32 inside a kernel and rounds once at
# the store, so every accumulation runs in fp32 (u = 2**-24), in an order of the program's choosing
# (tiles, chunks, cores, the ring). A sum of k + 1 terms in fp32, in ANY order, is within
# gamma_k * sum |term| of the exact sum (gamma_k = k u / (1 - k u)) (Higham, Accuracy and Stability
# of Numerical Algorithms, 4.2); for n = 67 that is about 4e-6 of sum |x|, for n = 11 6e-7. Per op
# (n the reduced length; all in float64 from the inputs):
#   sum         gamma_(n-1) * sum |x|
#   mean        gamma_(n-1) * sum |x| / n                 (the division is one more rounding: rtol)
#   cumsum      gamma_(n-1) * cumsum |x|                  (each prefix is a sum of at most n terms)
#   prod        gamma_(n-1) * |prod x|                    (n - 1 multiplications, each relative u)
#   cumprod     gamma_(n-1) * |cumprod x|
#   softmax     gamma_(n+2) * softmax x                   (exp rounds each term: the sum's relative
#                                                          error is below gamma_(n+2); the division
#                                                          adds one rounding: rtol)
#   log_softmax gamma_(n+2)                               (d log s = ds / s: the sum's relative
#   logsumexp   gamma_(n+2)                                error becomes absolute)
#   var         gamma_(2n+2) * kappa * var                (terms (x - m)^2 take a subtraction and a
#   std         gamma_(2n+2) * kappa * std / 2             square; Welford / Chan updates re-round
#                                                          the running mean, whose error enters
#                                                          scaled by kappa = sqrt(1 + m^2 / var),
#                                                          ~1 here (Chan, Golub & LeVeque: O(n kappa
#                                                          u)); sqrt halves the relative error)
# For fp16 / bf16 results the fp32 value is within that slack of the exact one and is then rounded
# once, at the store: at most one ulp of the dtype from the exact value rounded (rtol), or the slack
# where the result cancels towards zero. Maxima, minima, indices and any/all are exact (no slack).
# Nothing here is widened to make a cell pass: a bug (a lost or repeated element, an fp16
# accumulator, a wrong correction or identity) is orders of magnitude beyond these bounds.

REDUCTION_SHAPE = (11, 67)
REDUCTION_DIMS = (-1, 0)
REDUCTION_KINDS = ("x", "unit", "sparse", "dense")
_U32 = 2.0 ** -24


def _gamma(k: int) -> float:
    return k * _U32 / (1 - k * _U32)


def _kappa(x, d):
    var = x.var(d, keepdim=True)
    return (1 + x.mean(d, keepdim=True) ** 2 / var).sqrt().squeeze(d)


_SLACK = {
    "sum": lambda x, d, n: _gamma(n - 1) * x.abs().sum(d),
    "mean": lambda x, d, n: _gamma(n - 1) * x.abs().sum(d) / n,
    "cumsum": lambda x, d, n: _gamma(n - 1) * x.abs().cumsum(d),
    "prod": lambda x, d, n: _gamma(n - 1) * x.prod(d).abs(),
    "cumprod": lambda x, d, n: _gamma(n - 1) * x.cumprod(d).abs(),
    "softmax": lambda x, d, n: _gamma(n + 2) * torch.softmax(x, d),
    "log_softmax": lambda x, d, n: torch.tensor(_gamma(n + 2)),
    "logsumexp": lambda x, d, n: torch.tensor(_gamma(n + 2)),
    "var": lambda x, d, n: _gamma(2 * n + 2) * _kappa(x, d) * x.var(d),
    "std": lambda x, d, n: _gamma(2 * n + 2) * _kappa(x, d) * x.std(d) / 2,
}

# name -> (function of (tensor, dim), input kind)
_REDUCE = {
    "sum": (lambda x, d: x.sum(d), "x"),
    "mean": (lambda x, d: x.mean(d), "x"),
    "prod": (lambda x, d: x.prod(d), "unit"),
    "amax": (lambda x, d: x.amax(d), "x"),
    "amin": (lambda x, d: x.amin(d), "x"),
    "max": (lambda x, d: tuple(torch.max(x, d)), "x"),  # values and indices
    "argmax": (lambda x, d: x.argmax(d), "x"),
    "argmin": (lambda x, d: x.argmin(d), "x"),
    "any": (lambda x, d: x.any(d), "sparse"),
    "all": (lambda x, d: x.all(d), "dense"),
    "var": (lambda x, d: x.var(d), "x"),
    "std": (lambda x, d: x.std(d), "x"),
    "softmax": (lambda x, d: torch.softmax(x, d), "x"),
    "log_softmax": (lambda x, d: torch.log_softmax(x, d), "x"),
    "logsumexp": (lambda x, d: torch.logsumexp(x, d), "x"),
    "cumsum": (lambda x, d: torch.cumsum(x, d), "x"),
    "cumprod": (lambda x, d: torch.cumprod(x, d), "unit"),
}


def _reduction(name: str, dim: int) -> OpCase:
    fn, kind = _REDUCE[name]
    n = REDUCTION_SHAPE[dim]
    slack = _SLACK.get(name)
    return OpCase(f"{name}({dim})", lambda x: fn(x, dim), (kind,), fp64_ref=True,
                  slack=(lambda x: slack(x, dim, n)) if slack else None)


REDUCTION_NAMES = tuple(_REDUCE)
REDUCTIONS = tuple(_reduction(name, dim) for name in _REDUCE for dim in REDUCTION_DIMS)
REDUCTIONS_BY_NAME = {op.name: op for op in REDUCTIONS}


def reduction_pool(dtype: torch.dtype, seed: int = 0) -> dict[str, torch.Tensor]:
    """The reductions' CPU inputs of REDUCTION_SHAPE and `dtype`, one per kind (see above)."""
    rows, cols = REDUCTION_SHAPE
    g = torch.Generator().manual_seed(seed)

    def rand():
        return torch.rand(REDUCTION_SHAPE, generator=g)

    sign = torch.where(rand() < 0.5, -1.0, 1.0)
    if dtype == torch.bool:
        x = rand() < 0.5
        unit = rand() < 0.9
        unit[1] = True
        unit[2, 7] = False
        sparse, dense = rand() < 0.1, rand() >= 0.05
    elif dtype.is_floating_point:
        x = (torch.randn(REDUCTION_SHAPE, generator=g) * 2).to(dtype)
        x[:, 12] = 0.75
        x[2, 5] = x[2, 50] = x[2].amax() + 1
        x[2, 7] = x[2, 60] = x[2].amin() - 1
        x[3, 10], x[4, 20], x[1, 40] = float("nan"), float("inf"), float("-inf")
        unit = (sign * (1 + (rand() * 0.2 - 0.1))).to(dtype)
        unit[2, 7] = 0
        sparse = torch.where(rand() < 0.1, sign * (0.5 + rand()), 0.0).to(dtype)
        sparse[0, 9], sparse[2, 30] = -0.0, float("nan")
        dense = torch.where(rand() < 0.05, 0.0, sign * (0.5 + rand())).to(dtype)
    else:
        info = torch.iinfo(dtype)
        x = torch.randint(-60, 60, REDUCTION_SHAPE, generator=g).to(dtype)
        x[:, 12] = 7
        x[2, 5] = x[2, 50] = 100
        x[2, 7] = x[2, 60] = -100
        specials = [info.max, info.min, 0, -1, 1, info.max - 3]
        if dtype == torch.int64:
            specials += [2 ** 40 + 3, -(2 ** 53) - 7]
        x[0, :len(specials)] = torch.tensor(specials, dtype=dtype)
        choice = torch.tensor([1, 1, 1, -1, 2], dtype=dtype)
        unit = choice[torch.randint(0, len(choice), REDUCTION_SHAPE, generator=g)]
        unit[2, 7] = 0
        values = (sign * torch.randint(1, 60, REDUCTION_SHAPE, generator=g)).to(dtype)
        sparse = torch.where(rand() < 0.1, values, 0)
        dense = torch.where(rand() < 0.05, 0, values)
    sparse[0], sparse[:, 0] = 0, 0  # any: False along row 0 and column 0
    dense[1] = torch.where(dense[1] == 0, torch.ones_like(dense[1]), dense[1])  # all: True along row 1
    dense[:, 1] = torch.where(dense[:, 1] == 0, torch.ones_like(dense[:, 1]), dense[:, 1])  # and column 1
    if dtype.is_floating_point:
        sparse[0, 9] = -0.0
        dense[1, 33], dense[3, 30] = float("nan"), -0.0
    return {"x": x, "unit": unit, "sparse": sparse, "dense": dense}


def reduction_applies(op: OpCase, dtype: torch.dtype) -> bool:
    """Whether PyTorch eager on the CPU defines the reduction `op` for `dtype` inputs."""
    pool_ = reduction_pool(dtype)
    try:
        op.fn(*(pool_[k] for k in op.inputs))
    except (RuntimeError, TypeError, NotImplementedError):
        return False
    return True
