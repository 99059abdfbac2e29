"""CPU fallback kernels: a node's loop body written out as torch CPU code.

When a node cannot become a spyre program (a reduction, a gather, an op the
IR lacks, a dynamic shape, or the backend says Unsupported), the graph still
runs it, inside the compiled graph, on the CPU over the device bytes. We do
not guess which aten op the node came from: fusion, inlining and views have
already changed that. We run the node's own loop body, the exact thing
Inductor would have compiled, under an ops handler that writes one line of
torch code per op (vectorised over the whole iteration space; see
launcher/host.py for the helpers it calls). That covers every index form
(ModularIndexing, FloorDiv, indirect), masks and reductions, so the result
is right by construction.

An op this writer does not know raises HostUnsupported at compile time: an
error naming the op, never a wrong result.
"""

from __future__ import annotations

import math

import sympy
import torch
from torch._inductor.codegen.common import PythonPrinter
from torch._inductor.ops_handler import DefaultHandler
from torch._inductor.utils import sympy_index_symbol
from torch._inductor.virtualized import OpsValue, V

from ...launcher import host as host_runtime
from .nodes import loop_body, real_name
from ...launcher.nesting import negative_indices_wrap

_UNARY = {
    name: f"torch.{name}({{0}})" for name in (
        "abs", "acos", "acosh", "asin", "asinh", "atan", "atanh", "ceil", "cos", "cosh", "digamma", "erf",
        "erfc", "erfinv", "exp", "exp2", "expm1", "floor", "i0", "isinf", "isnan", "lgamma", "log", "log10",
        "log1p", "log2", "neg", "reciprocal", "relu", "round", "rsqrt", "sigmoid", "sign", "signbit", "sin",
        "sinh", "sqrt", "square", "tan", "tanh", "trunc", "logical_not", "bitwise_not",
    )
}
_UNARY.update({
    name: f"torch.special.{name}({{0}})" for name in (
        "erfcx", "ndtr", "ndtri", "log_ndtr", "i0e", "i1", "i1e", "bessel_j0", "bessel_j1", "bessel_y0",
        "bessel_y1", "modified_bessel_i0", "modified_bessel_i1", "modified_bessel_k0", "modified_bessel_k1",
        "scaled_modified_bessel_k0", "scaled_modified_bessel_k1", "spherical_bessel_j0", "airy_ai",
    )
})
_BINARY = {
    name: f"torch.{name}({{0}}, {{1}})" for name in (
        "add", "sub", "mul", "pow", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge", "logical_and",
        "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift",
        "bitwise_right_shift", "atan2", "copysign", "hypot", "nextafter", "fmod", "remainder", "ldexp",
    )
}
_BINARY.update({
    # a matmul's product (lowerings.native_matmul): kept apart, so the "dot" reduction contracts the
    # two operands instead of materializing their broadcast product over (m, n, k)
    "dot": "spyre_host.Product({0}, {1})",
    "truediv": "torch.true_divide({0}, {1})", "div_rn": "torch.true_divide({0}, {1})",
    "int_truediv": "torch.true_divide({0}, {1})", "mul_rn": "torch.mul({0}, {1})",
    "floordiv": "torch.floor_divide({0}, {1})", "truncdiv": "spyre_host.truncdiv({0}, {1})",
    "mod": "torch.fmod({0}, {1})", "and_": "torch.bitwise_and({0}, {1})", "or_": "torch.bitwise_or({0}, {1})",
    "xor": "torch.bitwise_xor({0}, {1})", "lshift": "torch.bitwise_left_shift({0}, {1})",
    "rshift": "torch.bitwise_right_shift({0}, {1})", "igamma": "torch.special.gammainc({0}, {1})",
    "igammac": "torch.special.gammaincc({0}, {1})", "gammainc": "torch.special.gammainc({0}, {1})",
    "gammaincc": "torch.special.gammaincc({0}, {1})", "zeta": "torch.special.zeta({0}, {1})",
    "polygamma": "torch.special.polygamma(int({0}), {1})",
    "chebyshev_polynomial_t": "torch.special.chebyshev_polynomial_t({0}, {1})",
    "chebyshev_polynomial_u": "torch.special.chebyshev_polynomial_u({0}, {1})",
    "chebyshev_polynomial_v": "torch.special.chebyshev_polynomial_v({0}, {1})",
    "chebyshev_polynomial_w": "torch.special.chebyshev_polynomial_w({0}, {1})",
    "hermite_polynomial_h": "torch.special.hermite_polynomial_h({0}, {1})",
    "hermite_polynomial_he": "torch.special.hermite_polynomial_he({0}, {1})",
    "laguerre_polynomial_l": "torch.special.laguerre_polynomial_l({0}, {1})",
    "legendre_polynomial_p": "torch.special.legendre_polynomial_p({0}, {1})",
})
_TERNARY = {"where": "spyre_host.where({0}, {1}, {2})", "fma": "spyre_host.fma({0}, {1}, {2})"}
_TEMPLATES = {**_UNARY, **_BINARY, **_TERNARY}


class HostUnsupported(Exception):
    """The CPU fallback writer has no translation for an op (a compile error, not a wrong answer)."""


class _TensorIndexPrinter(PythonPrinter):
    """Index expressions over tensors of positions: no Python min/max/math.floor."""

    def _print_Min(self, expr):
        return f"spyre_host.minimum({', '.join(map(self._print, expr.args))})"

    def _print_Max(self, expr):
        return f"spyre_host.maximum({', '.join(map(self._print, expr.args))})"

    def _print_Where(self, expr):
        return f"spyre_host.where({', '.join(map(self._print, expr.args))})"

    def _print_floor(self, expr):
        return f"torch.floor(torch.as_tensor({self._print(expr.args[0])}))"

    def _print_ceiling(self, expr):
        return f"torch.ceil(torch.as_tensor({self._print(expr.args[0])}))"

    _print_FloorToInt = _print_floor
    _print_CeilToInt = _print_ceiling


_printer = _TensorIndexPrinter()


def _literal(value) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "float('nan')"
        if math.isinf(value):
            return "float('inf')" if value > 0 else "float('-inf')"
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, (sympy.Expr, sympy.logic.boolalg.Boolean)):
        return _printer.doprint(value)
    return repr(value)


class _Writer:
    """Lines of the body function, its parameters and what it writes."""

    def __init__(self):
        self.lines: list[str] = []
        self.params: dict[str, None] = {}  # real buffer names, in first-use order
        self.written: dict[str, None] = {}
        self.symbols: set[sympy.Symbol] = set()
        self.loop_symbols: set[sympy.Symbol] = set()
        self._count = 0

    def fresh(self) -> str:
        self._count += 1
        return f"t{self._count}"

    def assign(self, expr: str) -> str:
        name = self.fresh()
        self.lines.append(f"{name} = {expr}")
        return name

    def expr(self, e) -> str:
        e = sympy.sympify(e)
        self.symbols |= e.free_symbols
        return _printer.doprint(e)


class HostHandler(DefaultHandler):
    """Inductor ops -> lines of torch code (values are variable names)."""

    def __init__(self, writer: _Writer, shape: str, reduced: int):
        self.w = writer
        self.shape = shape  # the node's full iteration shape, as source text
        self.reduced = reduced
        self.masks: list[str] = []

    def _arg(self, x) -> str:
        return x if isinstance(x, str) else _literal(x)

    def _mask(self) -> str:
        return self.masks[-1] if self.masks else "None"

    def _buffer(self, name: str) -> str:
        real = real_name(name)
        self.w.params.setdefault(real, None)
        return real

    def load(self, name, index):
        return self.w.assign(f"spyre_host.load({self._buffer(name)}, {self.w.expr(index)}, {self._mask()})")

    def store(self, name, index, value, mode=None):
        if mode not in host_runtime.STORE_MODES:
            raise HostUnsupported(f"store mode {mode!r}")
        buf = self._buffer(name)
        self.w.written.setdefault(buf, None)
        self.w.lines.append(f"spyre_host.store({buf}, {self.w.expr(index)}, {self._arg(value)}, {mode!r})")

    def store_reduction(self, name, index, value):
        self.store(name, index, value)

    def reduction(self, dtype, src_dtype, reduction_type, value):
        if reduction_type not in host_runtime.REDUCTIONS:
            raise HostUnsupported(f"reduction {reduction_type}")
        if isinstance(value, tuple):
            value = "(" + ", ".join(self._arg(v) for v in value) + ",)"
        call = f"spyre_host.reduce({self._arg(value)}, {reduction_type!r}, {self.shape}, {self.reduced}, {dtype})"
        if reduction_type.startswith("welford"):
            names = [self.w.fresh() for _ in range(3)]
            self.w.lines.append(f"{', '.join(names)} = {call}")
            return tuple(names)
        return self.w.assign(call)

    def scan(self, dtypes, combine_fn, values):
        """An inclusive scan along the iteration's last dim (the scan range).

        combine_fn is Inductor's closure over ``ops.*``: run under this handler
        it writes its own lines, which become a nested ``def combine_k(a..., b...)``
        that spyre_host.scan applies column by column.
        """
        if self.reduced != 1:
            raise HostUnsupported(f"scan over {self.reduced} dims")
        n = len(values)
        a_names = [self.w.fresh() for _ in range(n)]
        b_names = [self.w.fresh() for _ in range(n)]
        outer, masks = self.w.lines, self.masks
        self.w.lines, self.masks = [], []  # the combine body is its own function, under no mask
        try:
            # OpsValue params: a combine_fn may use operators (a + b) as well as ops.add(a, b).
            results = combine_fn(tuple(map(OpsValue, a_names)), tuple(map(OpsValue, b_names)))
            results = [self._arg(getattr(r, "value", r)) for r in results]  # V.ops wraps in OpsValue
            inner = self.w.lines
        finally:
            self.w.lines, self.masks = outer, masks
        if len(results) != n:
            raise HostUnsupported(f"scan combine_fn returning {len(results)} values for {n} inputs")
        combine = f"combine_{self.w.fresh()}"
        self.w.lines.append(f"def {combine}({', '.join(a_names + b_names)}):")
        self.w.lines.extend(f"    {line}" for line in inner)
        self.w.lines.append(f"    return ({''.join(r + ', ' for r in results)})")
        names = [self.w.fresh() for _ in range(n)]
        self.w.lines.append(
            f"{''.join(v + ', ' for v in names)}= spyre_host.scan(({''.join(self._arg(v) + ', ' for v in values)}), "
            f"{combine}, {self.shape}, ({''.join(_literal(d) + ', ' for d in dtypes)}))"
        )
        return tuple(names)

    def constant(self, value, dtype):
        return self.w.assign(f"spyre_host.constant({_literal(value)}, {dtype})")

    def index_expr(self, expr, dtype):
        return self.w.assign(f"spyre_host.index_value({self.w.expr(expr)}, {dtype})")

    value_expr = index_expr

    def to_dtype(self, x, dtype, src_dtype=None, use_compute_types=True):
        return self.w.assign(f"spyre_host.to_dtype({self._arg(x)}, {dtype})")

    def to_dtype_bitcast(self, x, dtype, src_dtype):
        return self.w.assign(f"spyre_host.bitcast({self._arg(x)}, {dtype}, {src_dtype})")

    def trunc_to_int(self, x, dtype):
        return self.w.assign(f"torch.trunc({self._arg(x)}).to({dtype})")

    def floor_to_int(self, x, dtype):
        return self.w.assign(f"torch.floor({self._arg(x)}).to({dtype})")

    def ceil_to_int(self, x, dtype):
        return self.w.assign(f"torch.ceil({self._arg(x)}).to({dtype})")

    def round_to_int(self, x, dtype):
        return self.w.assign(f"torch.round({self._arg(x)}).to({dtype})")

    def identity(self, x):
        return x

    def frexp(self, x):
        names = [self.w.fresh(), self.w.fresh()]
        self.w.lines.append(f"{names[0]}, {names[1]} = torch.frexp({self._arg(x)})")
        return tuple(names)

    def indirect_indexing(self, x, size, check=True, wrap_neg=True):
        wrap_neg = wrap_neg and negative_indices_wrap()
        name = self.w.assign(f"spyre_host.indirect({self._arg(x)}, {self.w.expr(size)}, {wrap_neg!r})")
        symbol = sympy_index_symbol(name)
        self.w.loop_symbols.add(symbol)
        return symbol

    def check_bounds(self, expr, size, lower, upper):
        self.w.lines.append(
            f"spyre_host.check_bounds({self.w.expr(expr)}, {self.w.expr(size)}, {lower!r}, {upper!r}, "
            f"{self._mask()})"
        )

    def masked(self, mask, body, other):
        combined = mask if not self.masks else self.w.assign(f"{self.masks[-1]} & {mask}")
        self.masks.append(combined)
        try:
            result = body()
        finally:
            self.masks.pop()
        return self.w.assign(f"spyre_host.where({combined}, {self._arg(result)}, {_literal(other)})")

    def _default(self, name, args, kwargs):
        template = _TEMPLATES.get(name)
        if template is None or kwargs:
            raise HostUnsupported(f"op {name}")
        return self.w.assign(template.format(*(self._arg(a) for a in args)))


def write_host_kernel(nodes, kernel_name: str, label: str, reason: str = "") -> tuple[str, list[str]]:
    """Source of a wrapper-level function running `nodes` on the CPU, and its call arguments.

    The function takes the nodes' buffers (spyre tensors, by their wrapper
    names) followed by any symbolic sizes, and runs the body as one host
    operation on the current stream. Its name, `label` (the nodes' ops) and
    `reason` (why they are not a program) travel with it, for the warning of
    its first run in a process and its fallback report (host_runtime.run).
    """
    w = _Writer()
    for n, node in enumerate(nodes):
        (sizes, reduction_sizes), node_body = loop_body(node)
        shape = list(sizes) + list(reduction_sizes)
        index_vars = [sympy_index_symbol(f"x{n}_{d}") for d in range(len(sizes))]
        reduction_vars = [sympy_index_symbol(f"r{n}_{d}") for d in range(len(reduction_sizes))]
        all_vars = index_vars + reduction_vars
        w.loop_symbols |= set(all_vars)
        shape_src = "(" + "".join(f"{w.expr(s)}, " for s in shape) + ")"
        w.lines.append(f"# {node.get_name()}: loop over {shape_src}")
        if all_vars:
            w.lines.append(f"{''.join(f'{v}, ' for v in all_vars)}= spyre_host.iota({shape_src})")
        handler = HostHandler(w, shape_src, len(reduction_sizes))
        with V.set_ops_handler(handler):
            node_body(index_vars, reduction_vars)
    body = w.lines
    buffers = list(w.params)
    sizes = sorted((str(s) for s in w.symbols - w.loop_symbols))
    params = buffers + sizes
    written = tuple(i for i, b in enumerate(buffers) if b in w.written)
    signature = ", ".join(params)
    source = "\n".join([
        f"def {kernel_name}({signature}):",
        f"    # CPU fallback for {label}",
        f"    def body({signature}):",
        *(f"        {line}" for line in body),
        f"    spyre_host.run(body, ({''.join(p + ', ' for p in params)}), {written!r}, {label!r}, "
        f"{kernel_name!r}, {reason!r})",
    ])
    return source, params
