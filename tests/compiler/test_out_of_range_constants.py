"""Python constants beyond a dtype's range: converted at compile time as PyTorch converts them.

Inductor hands a graph's scalars to the backend as Python numbers: ``a * 1e39``
on an fp32 tensor is ``ops.constant(1e39, torch.float32)``. A program operand
can only hold what its tile's type represents, and the sfp's ``fill`` of 1e39
into an fp32 tile is a run-time error ("value cannot be converted to type
float without overflow") that also leaves the stream in error, where PyTorch
on the CPU computes ``inf``. The compiler converts every constant it turns
into a program operand (pointwise constants, reduction and scan constants,
accumulator identities; core/layout.operand_value) the way PyTorch converts
a Python scalar to a tensor type: through float64 to the tile type (beyond
the range is +-inf, nan stays nan) and, for integers, by wrapping to the
type's width.

Float constants live in fp32 tiles whatever the tensor's dtype, because that
is where the arithmetic happens (eager's opmath, Inductor's compute type):
``fp16 * 1e6`` multiplies by 1e6 and rounds the product once, so a small
fp16 value times 1e6 stays finite as in eager, and rounding the constant to
fp16 (inf) would be wrong.

Every compiled result here must come from spyre programs (strict mode: a CPU
fallback is a compile error; each kernel has an artifact and the programs
ran), and equal CPU eager exactly: inf where eager gives inf, nan where it
gives nan. No tolerance: the products and sums of an infinite constant are
+-inf or nan whatever the rounding, and the fp16 products are rounded once
from the same fp32 product in both.
"""

from __future__ import annotations

import math

import pytest
import torch

from inductor_helpers import compile_on_spyre, refuse_every_kernel
from pointwise_ir import KernelBuilder
from spyre_inductor.compiler.backend import compile_kernel
from spyre_inductor.compiler.core.layout import operand_value
from spyre_runtime.launch import launch_jobplan
from spyre_runtime.prepare import prepare_kernel
from spyre_runtime.program.run import kernel_reports, reset_kernel_reports

F32_INF = float(torch.tensor(1e40, dtype=torch.float64).to(torch.float32))  # PyTorch's own conversion: inf


@pytest.fixture(autouse=True)
def strict(monkeypatch):
    monkeypatch.setenv("SPYRE_STRICT", "1")


def _data(dtype, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(8, 64, generator=g) * scale).to(dtype)


def _check_on_spyre(fn, x, want):
    """fn compiled for spyre on x equals `want` exactly (same infs and nans), and ran as spyre programs."""
    reset_kernel_reports()
    out, _, records, warned, _ = compile_on_spyre(fn, x)
    torch.spyre.synchronize()
    assert not warned and records and all(r.artifact is not None for r in records), records
    assert kernel_reports(), "no spyre program ran"
    got = out[0].cpu()
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


# (id, function, input dtype, input scale): the reference is the same function in CPU eager.
EAGER_CASES = [
    ("fp32_mul_1e39", lambda a: a * 1e39, torch.float32, 1.0),  # +-inf
    ("fp32_add_1e39", lambda a: a + 1e39, torch.float32, 1.0),  # inf
    ("fp32_sub_from_neg_1e39", lambda a: -1e39 - a, torch.float32, 1.0),  # -inf
    ("fp32_mul_1e39_mul_0", lambda a: a * 1e39 * 0.0, torch.float32, 1.0),  # inf * 0: nan, as eager
    ("bf16_add_1e39", lambda a: a + 1e39, torch.bfloat16, 1.0),
    ("fp16_add_1e39", lambda a: a + 1e39, torch.float16, 1.0),
    # fp16's max is 65504: |a| < 0.0655 stays finite (1e6 is not rounded to fp16 first), the rest is +-inf.
    ("fp16_mul_1e6", lambda a: a * 1e6, torch.float16, 0.1),
    # a reduction's constant operand, and a scan's (inf + -inf in the prefix is nan, as eager's).
    ("fp32_sum_of_add_1e39", lambda a: (a + 1e39).sum(1), torch.float32, 1.0),
    ("fp32_amax_of_mul_1e39", lambda a: (a * -1e39).amax(1), torch.float32, 1.0),
    ("fp32_cumsum_of_mul_1e39", lambda a: (a * 1e39).cumsum(1), torch.float32, 1.0),
    # integer scalars wrap to the tensor's width in eager (300 is 44 in int8), and so here.
    ("int32_add_2_pow_40", lambda a: a + 2 ** 40, torch.int32, 100.0),
    ("int8_add_300", lambda a: a + 300, torch.int8, 10.0),
]


@pytest.mark.parametrize("fn, dtype, scale", [c[1:] for c in EAGER_CASES], ids=[c[0] for c in EAGER_CASES])
def test_a_constant_beyond_the_range_computes_what_eager_computes(fn, dtype, scale):
    x = _data(dtype, scale)
    _check_on_spyre(fn, x, fn(x))


def test_clamp_to_a_bound_beyond_the_range_is_a_clamp_to_inf():
    """Eager refuses ``clamp(max=1e40)`` on fp32 (it checks the Python scalar), but the compiled
    graph is handed the constant and converts it as PyTorch converts any scalar: 1e40 in fp32 is
    inf, so the clamp is the identity, as Inductor computes it on the CPU. The same for a lower
    bound of -1e39 in front of a reduction (the reduction's constant operand)."""
    x = _data(torch.float32)
    _check_on_spyre(lambda a: a.clamp(max=1e40), x, x.clamp(max=F32_INF))
    _check_on_spyre(lambda a: a.clamp(min=-1e39).amax(1), x, x.clamp(min=-F32_INF).amax(1))


@pytest.mark.parametrize("fn, dtype, scale", [c[1:] for c in EAGER_CASES], ids=[c[0] for c in EAGER_CASES])
def test_the_cpu_fallback_kernels_convert_constants_the_same_way(monkeypatch, fn, dtype, scale):
    """The same graphs with every kernel refused, so each runs as an in-graph CPU fallback kernel
    (host_runtime.constant): the same values as eager, so a kernel gives one answer whichever way
    it runs."""
    monkeypatch.delenv("SPYRE_STRICT")
    refuse_every_kernel(monkeypatch)
    x = _data(dtype, scale)
    out, _, records, _, _ = compile_on_spyre(fn, x)
    assert records and all(r.artifact is None for r in records)
    torch.testing.assert_close(out[0].cpu(), fn(x), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("value, dtype", [
    (1e39, "fp32"), (-1e39, "fp32"), (3.4028235e38, "fp32"), (3.4028236e38, "fp32"), (1e-50, "fp32"),
    (0.1, "fp32"), (float("inf"), "fp32"), (float("-inf"), "fp32"), (2 ** 40, "fp32"), (10 ** 400, "fp32"),
    (1e6, "fp16"), (65504.0, "fp16"), (65520.0, "fp16"), (1e39, "bf16"), (-0.0, "fp32"),
    (2 ** 40, "int32"), (2 ** 31, "int32"), (-(2 ** 31) - 1, "int32"), (300, "int8"), (-129, "int8"),
    (2 ** 63 - 1, "int64"), (-(2 ** 63), "int64"), (2.0, "int32"), (2, "bool"), (0, "bool"),
], ids=lambda v: "10**400" if v == 10 ** 400 else str(v))
def test_operand_value_is_pytorchs_conversion_of_a_python_scalar(value, dtype):
    """What a tile of `dtype` holds for a Python constant is what PyTorch makes of the scalar:
    float64 (int64 for integers) converted to the type, overflow to +-inf, integers wrapped.
    (10 ** 400 is no float64: it is +inf, as any float beyond the range.)"""
    torch_dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "int32": torch.int32,
                   "int8": torch.int8, "int64": torch.int64, "bool": torch.bool}[dtype]
    if torch_dtype == torch.bool:
        want = bool(value)
    elif torch_dtype.is_floating_point:
        wide = math.inf if value == 10 ** 400 else value
        want = torch.tensor(wide, dtype=torch.float64).to(torch_dtype).item()
    else:
        want = torch.tensor(int(value), dtype=torch.int64).to(torch_dtype).item()
    got = operand_value(value, dtype)
    assert type(got) is type(want) and got == want and math.copysign(1, got) == math.copysign(1, want)


def test_nan_stays_nan():
    assert math.isnan(operand_value(float("nan"), "fp32")) and math.isnan(operand_value(float("nan"), "bf16"))


def test_an_integer_constant_beyond_int32_in_a_hand_built_kernel_wraps(tmp_path):
    """The kernel IR may carry an int32 constant outside int32 (an ``index_expr`` value, a
    hand-built kernel); Inductor's lowerings wrap scalars before they reach us today, but
    the program must hold the wrapped value (2 ** 40 + 5 is 5 in int32, as
    ``torch.tensor(2 ** 40 + 5).to(torch.int32)``), not fail filling the tile."""
    k = KernelBuilder("wrapped_int32", (4, 64))
    k.buffer("x", "int32", (4, 64))
    k.buffer("out", "int32", (4, 64))
    k.store("out", k.op("add", k.load("x"), k.const(2 ** 40 + 5, "int32"), dtype="int32"))
    plan = prepare_kernel(compile_kernel(k.build(), tmp_path))
    x = torch.arange(256, dtype=torch.int32).reshape(4, 64)
    dev = [x.to("spyre"), torch.empty(4, 64, dtype=torch.int32, device="spyre")]
    launch_jobplan(plan, dev)
    assert torch.equal(dev[1].cpu(), x + torch.tensor(2 ** 40 + 5).to(torch.int32))
