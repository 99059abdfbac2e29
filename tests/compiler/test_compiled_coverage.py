"""torch.compile on spyre vs CPU eager for issue 9's pointwise coverage, every dtype it applies to.

The ops, inputs, references and per-dtype tolerances are in coverage_ops.py
(its docstring): fp32 rtol 1.3e-6 / atol 1e-5; fp16 and bf16 against fp32
math rounded once, one ulp of the dtype (rtol 2**-10, 2**-7) / atol 1e-5;
integers and bools exact, int64 computed in int64. Every graph runs in
strict mode: a kernel that would fall back to the CPU is a compile error,
and an ATen call Inductor leaves in the wrapper (an extern kernel) fails
the check too.

Many ops share one compiled graph (one torch.compile per dtype), so the
default suite covers every op x dtype on (3, 67) inputs (rows that do not
fill a stick) plus every input layout (0-d, empty, size-1 dims,
broadcasting, transposed, sliced, 1-D to 6-D) for a representative subset;
the full op x dtype x layout matrix and the casts on every layout are
``slow`` (``pytest -m slow tests/compiler/test_compiled_coverage.py``).
``.venv/bin/python benchmarks/coverage.py`` prints the summary table.
"""

from __future__ import annotations

import pytest
import torch

from coverage_ops import (
    CAST_DTYPES, CASTS, DTYPES, NAMES, OPS, OPS_BY_NAME, SHAPES, applies, extern_calls, pool, run_group,
)
from inductor_helpers import compile_on_spyre
from spyre_runtime.program import isa


@pytest.fixture(autouse=True)
def strict(monkeypatch):
    monkeypatch.setenv("SPYRE_STRICT", "1")


def _assert_all_pass(cells):
    bad = {name: f"{c.status}: {c.detail}" for name, c in cells.items() if c.status != "pass"}
    assert not bad, bad


def _ops_for(dtype, names=None):
    ops = OPS if names is None else [OPS_BY_NAME[n] for n in names]
    return [op for op in ops if applies(op, dtype)]


# A subset touching every kind of step: float math, integer division, selects, compares,
# NaN tests, bitwise ops, promotions and a decomposed activation.
SUBSET = ("add", "mul", "div", "div_floor", "remainder", "exp", "sigmoid", "gelu_tanh", "where", "lt",
          "isnan", "clamp_tensor", "bitwise_xor", "logical_or", "pow", "lerp", "abs")


@pytest.mark.parametrize("dtype", DTYPES, ids=NAMES.get)
def test_every_op_in_one_graph(dtype):
    _assert_all_pass(run_group(_ops_for(dtype), pool((3, 67), dtype), dtype, compile_on_spyre))


@pytest.mark.parametrize("dtype", CAST_DTYPES, ids=NAMES.get)
def test_casts_to_every_dtype(dtype):
    _assert_all_pass(run_group(CASTS, pool((3, 67), dtype), dtype, compile_on_spyre))


@pytest.mark.parametrize("layout", [s for s in SHAPES if s != "2d_67"])
def test_input_layouts(layout):
    for dtype in (torch.float32, torch.int64):
        _assert_all_pass(run_group(_ops_for(dtype, SUBSET), SHAPES[layout](dtype, 1), dtype, compile_on_spyre))


def test_int64_stays_exact():
    """Values no int32 or fp64 holds: add, multiply (wrapping), floor-divide, compare, shift."""
    x = torch.tensor([2 ** 62 + 1, -(2 ** 62) - 3, 2 ** 53 + 1, -(2 ** 40) + 7, 2 ** 63 - 1], dtype=torch.int64)
    y = torch.tensor([3, -7, 2, 5, 2], dtype=torch.int64)

    def f(x, y):
        return x + y, x * y, x // y, x % y, x > x - 1, x >> y, x ^ (x + y)

    out, _, records, warned, code = compile_on_spyre(f, x, y)
    assert not warned and not extern_calls(code) and records and all(r.artifact is not None for r in records)
    for got, want in zip(out, f(x, y), strict=True):
        assert torch.equal(got.cpu(), want)


def test_float_floor_division_follows_pytorch_not_floor_of_quotient():
    """1 // 0.1 is 9 in PyTorch (and Python), floor(1 / 0.1) is 10; inf // 2 is NaN, x // 0 is +-inf."""
    x = torch.tensor([1.0, float("inf"), -float("inf"), 5.0, -5.0, 7.0, -0.0, 0.3])
    y = torch.tensor([0.1, 2.0, 3.0, 0.0, 0.0, -2.0, 3.0, 0.1])

    def f(x, y):
        return x // y, torch.div(x, y, rounding_mode="floor") * 2, torch.floor(x / y)

    out, _, records, warned, code = compile_on_spyre(f, x, y)
    assert not warned and not extern_calls(code) and records and all(r.artifact is not None for r in records)
    for got, want in zip(out, f(x, y), strict=True):
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, equal_nan=True)
    assert out[0].cpu()[0] == 9 and out[2].cpu()[0] == 10


def test_integer_division_by_zero_fails_like_the_cpu():
    """PyTorch on the CPU raises for an integer division by zero; so does the program (at run time)."""
    x = torch.tensor([7, 8, 9], dtype=torch.int32)
    y = torch.tensor([1, 0, 2], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        x // y
    compiled = torch.compile(lambda x, y: x // y)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="division by zero") as failed:
        compiled(x.to("spyre"), y.to("spyre")).cpu()
    torch.spyre.clear_errors()
    assert "program" in str(failed.value)  # the program failed, not the compile


def test_isa_integer_division_wraps_where_the_cpu_traps():
    """INT_MIN // -1 traps the CPU's divide (SIGFPE in eager): the ISA wraps it like any overflow."""
    for dtype in (torch.int32, torch.int64):
        low = torch.iinfo(dtype).min
        a = torch.tensor([low, low, 7, -7], dtype=dtype)
        b = torch.tensor([-1, 3, -1, 2], dtype=dtype)
        assert isa.BINARY["floordiv"](a, b).tolist() == [low, low // 3, -7, -4]
        assert isa.BINARY["truncdiv"](a, b).tolist() == [low, -(-low // 3), -7, -3]
        assert isa.BINARY["remainder"](a, b).tolist() == [0, low % 3, 0, 1]
        assert isa.BINARY["fmod"](a, b).tolist() == [0, -(-low % 3), 0, -1]


def test_extern_aten_calls_are_caught():
    """The coverage counts an ATen call left in the wrapper as a fallback, not as a pass."""
    code = ("def call(args):\n    buf0 = torch.ops.aten.pow.Scalar(2, arg0_1)\n"
            "    extern_kernels.mm(a, b, out=c)\n    launch_jobplan(spyre_plan_0, [buf0, c])\n")
    assert [c.split()[2] for c in extern_calls(code)] == ["torch.ops.aten.pow.Scalar", "extern_kernels.mm"]


# ---- the full matrix (slow) --------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(SHAPES))
@pytest.mark.parametrize("dtype", DTYPES, ids=NAMES.get)
def test_full_matrix(dtype, layout):
    _assert_all_pass(run_group(_ops_for(dtype), SHAPES[layout](dtype, 2), dtype, compile_on_spyre))


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(SHAPES))
@pytest.mark.parametrize("dtype", CAST_DTYPES, ids=NAMES.get)
def test_casts_on_every_layout(dtype, layout):
    _assert_all_pass(run_group(CASTS, SHAPES[layout](dtype, 3), dtype, compile_on_spyre))
