"""A graph fuzzer for the spyre torch.compile path: random small graphs, compiled vs CPU eager.

A graph (``Graph``) is a few inputs and 2-8 ops drawn from the pointwise ops
and reductions the compiler supports. It is kept as data and rendered to
Python source (``Graph.source``); that source is what runs, under the real
``torch.compile``, and what a failure prints, so a report is a reproducer.

What the generator draws (``graphs()``, a hypothesis strategy):

* a base shape of rank 1-3 from dims that do and do not fill a 128-byte
  stick (1, 3, 5, 32, 64, 67, 130), at most ~16K elements;
* 1-3 inputs: the base shape, a broadcastable one (dims set to 1 or leading
  dims dropped), or transposed (the tensor passed is ``.transpose(-1, -2)``
  of a contiguous one, so the kernel reads it across its strides);
* ops on earlier values: unary ops, binary ops (with broadcasting), scalar
  arithmetic, and reductions over one dim with keepdim both ways
  (sum/mean/amax/amin/var/softmax/log_softmax/logsumexp/cumsum); each op
  is written so it stays in its domain
  (log of |x| + 1, exp of a bounded value), because a NaN or an overflow
  both sides agree on tests nothing;
* 1-3 outputs (the last value and others, reductions included): one
  compile per example checks several kernels.

The comparison (``check``), per dtype:

* fp32: against eager fp32 on the CPU. The compiled kernels accumulate in
  another order (tiles, chunks, cores), so the tolerance is the graph's own
  sensitivity to rounding, measured as |eager fp32 - eager fp64| (x4),
  plus rtol = atol = 1e-5 per op on the output's path scaled by the
  output's magnitude.
* fp16: the compiled kernels keep fp32 intermediates and round at stores
  (Inductor's contract), so the reference is the fp32 computation from the
  same fp16 inputs, rounded to fp16 once. Where the graph is split into
  several kernels, values are rounded to fp16 in between; how much such
  roundings can move an output is measured by eager fp16 (which rounds
  after EVERY op): 2 x |eager fp16 - fp32 reference|, plus 1e-3 (one fp16
  ulp is 2^-10 relative) per op on the path, relative and scaled by the
  output's magnitude.
* bools and indices: exactly.

Neither tolerance can hide a wrong result: both are bounded by what
rounding alone does to this graph on these inputs, not a blanket constant.

Fallbacks: every node must become a spyre program, except ops listed in
``NOT_COMPILED`` (documented as not compiled yet); those are counted.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass, field

import torch
from hypothesis import strategies as st

DIMS = (1, 3, 5, 32, 64, 67, 130)
MAX_NUMEL = 16 * 1024
DTYPES = (torch.float32, torch.float16)

# Ops compiled graphs may still run on the CPU (documented as not compiled yet);
# any other fallback is a fuzzer finding. None now: cumsum compiles (issue 9).
NOT_COMPILED: frozenset[str] = frozenset()

# name -> (source template, magnitude bound of the result given the argument's bound).
# The templates keep every op in its domain for any finite input.
UNARY = {
    "neg": ("-{a}", lambda b: b),
    "abs": ("torch.abs({a})", lambda b: b),
    "exp": ("torch.exp(torch.tanh({a}) * 2)", lambda b: math.exp(2)),
    "log": ("torch.log(torch.abs({a}) + 1)", lambda b: math.log(b + 1)),
    "sqrt": ("torch.sqrt(torch.abs({a}))", lambda b: math.sqrt(b)),
    "rsqrt": ("torch.rsqrt(torch.abs({a}) + 0.5)", lambda b: 1.5),
    "reciprocal": ("torch.reciprocal(torch.abs({a}) + 1)", lambda b: 1.0),
    "sigmoid": ("torch.sigmoid({a})", lambda b: 1.0),
    "tanh": ("torch.tanh({a})", lambda b: 1.0),
    "relu": ("torch.relu({a})", lambda b: b),
    "gelu": ("F.gelu({a})", lambda b: b),
    "silu": ("F.silu({a})", lambda b: b),
    "sin": ("torch.sin({a})", lambda b: 1.0),
    "cos": ("torch.cos({a})", lambda b: 1.0),
    "clamp": ("{a}.clamp(-1.5, 2.0)", lambda b: min(b, 2.0)),
    "scale": ("{a} * 1.5 + 0.25", lambda b: 1.5 * b + 0.25),
    "square": ("{a} * {a}", lambda b: b * b),
}
BINARY = {
    "add": ("{a} + {b}", lambda a, b: a + b),
    "sub": ("{a} - {b}", lambda a, b: a + b),
    "mul": ("{a} * {b}", lambda a, b: a * b),
    "div": ("{a} / (torch.abs({b}) + 1)", lambda a, b: a),
    "maximum": ("torch.maximum({a}, {b})", max),
    "minimum": ("torch.minimum({a}, {b})", max),
    "where": ("torch.where({a} > {b}, {a}, {b} * 0.5)", max),
}
# Reductions over one dim `d`; bound given the argument's bound and the reduced size.
REDUCE = {
    "sum": ("{a}.sum({d}, keepdim={k})", lambda b, n: b * n),
    "mean": ("{a}.mean({d}, keepdim={k})", lambda b, n: b),
    "amax": ("{a}.amax({d}, keepdim={k})", lambda b, n: b),
    "amin": ("{a}.amin({d}, keepdim={k})", lambda b, n: b),
    "var": ("{a}.var({d}, keepdim={k})", lambda b, n: 4 * b * b),
    "logsumexp": ("torch.logsumexp({a}, {d}, keepdim={k})", lambda b, n: b + math.log(n)),
}
# Reductions whose result keeps the shape (no keepdim choice).
SHAPED = {
    "softmax": ("torch.softmax({a}, {d})", lambda b, n: 1.0),
    "log_softmax": ("torch.log_softmax({a}, {d})", lambda b, n: 2 * b + math.log(n)),
    "cumsum": ("torch.cumsum({a}, {d})", lambda b, n: b * n),
}
# Bounded magnitudes keep fp16 away from overflow (65504) by a wide margin.
MAX_BOUND = 1000.0


@dataclass(frozen=True)
class Input:
    shape: tuple[int, ...]
    transposed: bool  # passed as .transpose(-1, -2) of a contiguous tensor


@dataclass(frozen=True)
class Node:
    expr: str  # Python expression over earlier names
    shape: tuple[int, ...]
    depth: int  # ops on the longest path from an input
    bound: float  # a bound on |value| (inputs are |x| <= 3)


@dataclass(frozen=True)
class Graph:
    dtype: torch.dtype
    inputs: tuple[Input, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[int, ...]  # node positions
    seed: int = 0  # data seed
    ops: tuple[str, ...] = field(default=())

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
            t = f"(torch.rand({shape}, generator=g) * 6 - 3).to({self.dtype})"
            lines.append(f"x{i} = {t}" + (".transpose(-1, -2)" if inp.transposed else ""))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"\n# dtype {self.dtype}, ops {list(self.ops)}\n{self.inputs_source()}\n{self.source()}\n"

    def _repr_pretty_(self, p, cycle) -> None:  # how hypothesis prints a falsifying example
        p.text(repr(self))

    @classmethod
    def from_source(cls, torch_dtype: str, inputs, body, outputs, seed: int = 0) -> "Graph":
        """A hand-written graph (regression tests): `inputs` as (shape, transposed), `body` one
        expression per op over v-names (inputs are v0..), `outputs` positions among all values."""
        ins = tuple(Input(tuple(s), t) for s, t in inputs)
        nodes = [Node(f"x{i}", inp.shape, 0, 3.0) for i, inp in enumerate(ins)]
        nodes += [Node(expr, (), k + 1, MAX_BOUND) for k, expr in enumerate(body)]
        return cls(getattr(torch, torch_dtype), ins, tuple(nodes), tuple(outputs), seed, ("hand-written",))

    def function(self):
        scope = {"torch": torch, "F": torch.nn.functional}
        exec(compile(self.source(), "<fuzzed graph>", "exec"), scope)  # noqa: S102 - our own source
        return scope["f"]

    def make_inputs(self) -> list[torch.Tensor]:
        scope = {"torch": torch}
        exec(self.inputs_source(), scope)  # noqa: S102 - our own source
        return [scope[f"x{i}"] for i in range(len(self.inputs))]


def _broadcasts(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    try:
        return tuple(torch.broadcast_shapes(a, b))
    except RuntimeError:
        return None


@st.composite
def graphs(draw, reductions=tuple(REDUCE), shaped=tuple(SHAPED)):
    """A random small graph (see the module docstring)."""
    dtype = draw(st.sampled_from(DTYPES))
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
        inputs.append(Input(s, transposed))
    nodes = [Node(f"x{i}", inp.shape, 0, 3.0) for i, inp in enumerate(inputs)]
    first_op = len(nodes)  # the source aliases input xI as vI, so every op reads a name vK
    ops = []
    n_ops = draw(st.integers(2, 8))
    for _ in range(n_ops):
        kinds = ["unary", "binary", "reduce"] if any(len(n.shape) for n in nodes) else ["unary", "binary"]
        kind = draw(st.sampled_from(kinds))
        a = draw(st.integers(0, len(nodes) - 1))
        na = nodes[a]
        if kind == "unary":
            name = draw(st.sampled_from(sorted(UNARY)))
            template, bound = UNARY[name]
            node = Node(template.format(a=f"v{a}"), na.shape, na.depth + 1, bound(na.bound))
        elif kind == "binary":
            partners = [j for j, n in enumerate(nodes) if _broadcasts(na.shape, n.shape) is not None
                        and math.prod(_broadcasts(na.shape, n.shape)) <= MAX_NUMEL]
            b = draw(st.sampled_from(partners))
            nb = nodes[b]
            name = draw(st.sampled_from(sorted(BINARY)))
            template, bound = BINARY[name]
            node = Node(template.format(a=f"v{a}", b=f"v{b}"), _broadcasts(na.shape, nb.shape),
                        max(na.depth, nb.depth) + 1, bound(na.bound, nb.bound))
        else:
            ranked = [j for j, n in enumerate(nodes) if len(n.shape)]
            a = draw(st.sampled_from(ranked))
            na = nodes[a]
            d = draw(st.integers(0, len(na.shape) - 1))
            n = na.shape[d]
            # var over one element is NaN on both sides, and NaN downstream would test nothing
            names = [r for r in sorted(reductions) if not (r == "var" and n == 1)] + sorted(shaped)
            name = draw(st.sampled_from(names))
            if name in SHAPED:
                template, bound = SHAPED[name]
                out_shape = na.shape
                expr = template.format(a=f"v{a}", d=d)
            else:
                template, bound = REDUCE[name]
                keep = draw(st.booleans())
                out_shape = tuple(1 if i == d else s for i, s in enumerate(na.shape)) if keep else \
                    na.shape[:d] + na.shape[d + 1:]
                expr = template.format(a=f"v{a}", d=d, k=keep)
            node = Node(expr, out_shape, na.depth + 1, bound(na.bound, n))
        if node.bound > MAX_BOUND:
            # keep magnitudes bounded: squash instead (an op of its own)
            node = Node(f"torch.tanh({node.expr})", node.shape, node.depth + 1, 1.0)
            name = f"{name}+tanh"
        nodes.append(node)
        ops.append(name)
    last = len(nodes) - 1
    # Outputs: the last value and up to two other ops nothing reads (dead ops test nothing),
    # else any other ops.
    used = {int(m) for n in nodes for m in re.findall(r"\bv(\d+)\b", n.expr)}
    leaves = [j for j in range(first_op, last) if j not in used]
    pool = leaves or list(range(first_op, last))
    others = draw(st.lists(st.sampled_from(pool), max_size=2, unique=True)) if pool else []
    outputs = tuple(dict.fromkeys([last, *leaves[-2:], *others]))[:3]
    seed = draw(st.integers(0, 2**16))
    return Graph(dtype, tuple(inputs), tuple(nodes), outputs, seed, tuple(ops))


# ---- running and checking one graph ----------------------------------------------------


@dataclass
class Outcome:
    compiled: int  # kernels that became spyre programs
    fallbacks: list[str]  # ops that ran on the CPU (allowed ones)


def _depths(graph: Graph) -> list[int]:
    return [graph.nodes[i].depth for i in graph.outputs]


def _tolerance(ref: torch.Tensor, sens: torch.Tensor, depth: int, dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) for one output (module docstring)."""
    per_op = 1e-5 if dtype == torch.float32 else 1e-3
    sens_factor = 4.0 if dtype == torch.float32 else 2.0
    finite = ref[torch.isfinite(ref)]
    scale = max(1.0, float(finite.abs().max())) if finite.numel() else 1.0
    s = sens[torch.isfinite(sens)]
    spread = float(s.max()) if s.numel() else 0.0
    steps = depth + 1
    return per_op * steps, per_op * steps * scale + sens_factor * spread


def references(graph: Graph, inputs) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(the reference outputs in the graph's dtype, per output the rounding sensitivity)."""
    fn = graph.function()
    if graph.dtype == torch.float16:
        exact = fn(*(x.float() for x in inputs))
        rounded = fn(*inputs)  # eager fp16: rounds after every op
        ref = [r.to(torch.float16) for r in exact]
        sens = [(r16.float() - r).abs() for r16, r in zip(rounded, exact)]
    else:
        ref = list(fn(*inputs))
        wide = fn(*(x.double() for x in inputs))
        sens = [(r.double() - w).abs() for r, w in zip(ref, wide)]
    return ref, sens


def check(graph: Graph) -> Outcome:
    """Compile `graph` on spyre, run it, compare with the CPU; raise AssertionError with the graph."""
    from inductor_helpers import compile_on_spyre

    inputs = graph.make_inputs()
    fn = graph.function()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, _, records, _, code = compile_on_spyre(fn, *inputs)
    ref, sens = references(graph, inputs)
    problems = []
    if len(out) != len(ref):
        problems.append(f"the compiled graph returned {len(out)} outputs, eager {len(ref)}")
    for i, (got, want, s, depth) in enumerate(zip(out, ref, sens, _depths(graph))):
        got = got.cpu()
        if got.shape != want.shape or got.dtype != want.dtype:
            problems.append(f"output {i}: {got.dtype}{tuple(got.shape)} vs {want.dtype}{tuple(want.shape)}")
            continue
        rtol, atol = _tolerance(want.float(), s.float(), depth, graph.dtype)
        try:
            torch.testing.assert_close(got, want, rtol=rtol, atol=atol, equal_nan=True)
        except AssertionError as e:
            problems.append(f"output {i} (v{graph.outputs[i]}, rtol {rtol:.3g}, atol {atol:.3g}): {e}")
    fallbacks = [r.ops for r in records if r.artifact is None and r.kernel is not None or r.fallback_reason]
    reasons = [f"{r.ops}: {r.fallback_reason}" for r in records if r.fallback_reason]
    # Inductor's own fallback kernels (aten ops it does not lower) run eagerly on the device.
    extern = sorted({line.split("(")[0].split("=")[-1].strip() for line in code.splitlines()
                     if "torch.ops.aten." in line and "=" in line})
    bad = [f for f in fallbacks + extern if not any(ok in f for ok in NOT_COMPILED)]
    if bad:
        problems.append(f"CPU fallbacks: {reasons or bad}")
    if problems:
        raise AssertionError("fuzzed graph failed:\n" + "\n".join(problems) + f"\n{graph!r}")
    return Outcome(sum(r.artifact is not None for r in records), fallbacks + extern)
