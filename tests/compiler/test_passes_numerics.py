"""Compiled pointwise kernels (hand-built IR) launched on spyre tensors, against the same math in torch on CPU.

Tolerances, and why:

* fp32: rtol 1.3e-6, atol 1e-5. The program computes in fp32 with the same
  torch elementwise functions the CPU reference uses, in the same order, so
  results are equal or within an ulp or two (vectorized vs scalar paths of
  transcendental functions).
* fp16: rtol 2**-10 (one fp16 ulp), atol 1e-5 (results near zero). The reference is
  Inductor's CPU contract (what the program implements): widen the fp16
  inputs to fp32, compute the whole chain in fp32, round once at the store.
  A one-ulp difference remains possible where fp32 transcendental results
  of the two implementations fall on either side of an fp16 rounding
  boundary.
"""

from __future__ import annotations

import pytest
import torch

from pointwise_ir import KernelBuilder, binary_kernel, unary_kernel
from spyre_inductor.compiler.backend import compile_kernel
from spyre_runtime.launch import launch_jobplan
from spyre_runtime.prepare import prepare_kernel

TOL = {"fp32": dict(rtol=1.3e-6, atol=1e-5), "fp16": dict(rtol=2.0 ** -10, atol=1e-5)}
TORCH = {"fp32": torch.float32, "fp16": torch.float16, "int32": torch.int32, "bool": torch.bool}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("artifacts")


def run(kernel, root, *tensors, **compile_options):
    """Compile, prepare and launch `kernel`; tensors in launch order (CPU, copied to spyre); outputs back on CPU."""
    plan = prepare_kernel(compile_kernel(kernel, root, **compile_options))
    dev = [t.to("spyre") if t.is_contiguous() else _strided_copy(t) for t in tensors]
    launch_jobplan(plan, dev)
    torch.spyre.synchronize()
    return [d.cpu() for d in dev]


def _strided_copy(t):
    """A spyre tensor with t's strides (t a view of a contiguous CPU base)."""
    base = t._base if t._base is not None else t
    dev_base = base.to("spyre")
    return dev_base.as_strided(t.shape, t.stride(), t.storage_offset())


def rand(shape, dtype="fp32", seed=0, positive=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    if positive:
        x = x.abs() + 0.1
    return x.to(TORCH[dtype])


def check(got, want, dtype):
    torch.testing.assert_close(got, want.to(got.dtype), **TOL[dtype], equal_nan=True)


REF_BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "truediv": torch.div,
              "maximum": torch.maximum, "minimum": torch.minimum}


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("shape", [(67,), (67, 71), (3, 255), (2, 3, 4, 5, 6)])
@pytest.mark.parametrize("op", sorted(REF_BINARY))
def test_binary_ops(root, op, shape, dtype):
    x, y = rand(shape, dtype, 1), rand(shape, dtype, 2)
    out = torch.empty(shape, dtype=TORCH[dtype])
    (_, _, got) = run(binary_kernel(op, shape, dtype), root, x, y, out)
    check(got, REF_BINARY[op](x.float(), y.float()), dtype)


REF_UNARY = {"neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
             "rsqrt": torch.rsqrt, "reciprocal": torch.reciprocal, "sigmoid": torch.sigmoid,
             "tanh": torch.tanh, "relu": torch.relu, "erf": torch.erf, "expm1": torch.expm1,
             "log1p": torch.log1p, "sign": torch.sign, "floor": torch.floor, "round": torch.round,
             "square": torch.square, "sin": torch.sin}
POSITIVE = {"log", "sqrt", "rsqrt", "log1p"}


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("op", sorted(REF_UNARY))
def test_unary_ops(root, op, dtype):
    shape = (67, 71)
    x = rand(shape, dtype, 3, positive=op in POSITIVE)
    (_, got) = run(unary_kernel(op, shape, dtype), root, x, torch.empty(shape, dtype=TORCH[dtype]))
    check(got, REF_UNARY[op](x.float()), dtype)


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_gelu_silu_clamp_chain(root, dtype):
    """gelu (erf form), silu, clamp and alpha as Inductor decomposes them, three outputs of one kernel."""
    shape = (3, 255)
    k = KernelBuilder(f"acts_{dtype}", shape)
    for name in ("x", "y", "gelu", "silu", "clamp"):
        k.buffer(name, dtype, shape)
    x = k.cast(k.load("x"), "fp32")
    y = k.cast(k.load("y"), "fp32")
    half, one, r2 = k.const(0.5), k.const(1.0), k.const(0.7071067811865476)
    gelu = k.op("mul", k.op("mul", x, half), k.op("add", k.op("erf", k.op("mul", x, r2)), one))
    silu = k.op("mul", x, k.op("sigmoid", x))
    xa = k.op("add", x, k.op("mul", y, k.const(2.5)))  # x + 2.5 * y (alpha)
    clamp = k.op("minimum", k.op("maximum", xa, k.const(-0.5)), k.const(0.75))
    for name, v in (("gelu", gelu), ("silu", silu), ("clamp", clamp)):
        k.store(name, k.cast(v, dtype))
    xs, ys = rand(shape, dtype, 4), rand(shape, dtype, 5)
    empty = [torch.empty(shape, dtype=TORCH[dtype]) for _ in range(3)]
    _, _, g, s, c = run(k.build(), root, xs, ys, *empty)
    xf, yf = xs.float(), ys.float()
    check(g, torch.nn.functional.gelu(xf), dtype)
    check(s, torch.nn.functional.silu(xf), dtype)
    check(c, torch.clamp(xf + 2.5 * yf, -0.5, 0.75), dtype)


def test_where_compare_and_bool_output(root):
    shape = (67, 71)
    k = KernelBuilder("where", shape)
    for name, dt in (("x", "fp32"), ("y", "fp32"), ("out", "fp32"), ("mask", "bool")):
        k.buffer(name, dt, shape)
    x, y = k.load("x"), k.load("y")
    gt = k.op("gt", x, y, dtype="bool")
    k.store("out", k.op("where", gt, x, k.op("mul", y, k.const(-2.0))))
    k.store("mask", k.op("logical_and", gt, k.op("ge", x, k.const(0.0), dtype="bool"), dtype="bool"))
    x, y = rand(shape, seed=6), rand(shape, seed=7)
    _, _, out, mask = run(k.build(), root, x, y, torch.empty(shape), torch.empty(shape, dtype=torch.bool))
    check(out, torch.where(x > y, x, y * -2.0), "fp32")
    assert torch.equal(mask, (x > y) & (x >= 0))


def test_casts(root):
    """fp32 -> fp16 (round to nearest even), -> int32 (truncation), int32 arithmetic, fp16 -> fp32 exact."""
    shape = (67,)
    k = KernelBuilder("casts", shape)
    k.buffer("x", "fp32", shape)
    k.buffer("h", "fp16", shape)
    k.buffer("i", "int32", shape)
    k.buffer("back", "fp32", shape)
    x = k.load("x")
    k.store("h", k.cast(k.op("mul", x, k.const(3.0)), "fp16"))
    k.store("i", k.op("add", k.cast(k.op("mul", x, k.const(10.0)), "int32"), k.const(7, "int32"), dtype="int32"))
    k.store("back", k.op("add", k.cast(k.cast(x, "fp16"), "fp32"), k.const(0.0)))
    x = rand(shape, seed=8) * 100
    _, h, i, back = run(k.build(), root, x, torch.empty(shape, dtype=torch.float16),
                        torch.empty(shape, dtype=torch.int32), torch.empty(shape))
    assert torch.equal(h, (x * 3.0).half())
    assert torch.equal(i, (x * 10.0).to(torch.int32) + 7)
    assert torch.equal(back, x.half().float())


@pytest.mark.parametrize("y_shape", [(71,), (67, 1), (1, 1), ()])
def test_broadcasts(root, y_shape):
    shape = (67, 71)
    x, y = rand(shape, seed=9), rand(y_shape, seed=10)
    (_, _, got) = run(binary_kernel("sub", shape, "fp32", y_shape=y_shape), root, x, y, torch.empty(shape))
    check(got, x - y, "fp32")


def test_broadcast_5d(root):
    shape, y_shape = (2, 3, 4, 5, 6), (1, 3, 1, 5, 1)
    x, y = rand(shape, "fp16", 11), rand(y_shape, "fp16", 12)
    (_, _, got) = run(binary_kernel("mul", shape, "fp16", y_shape=y_shape), root, x, y,
                      torch.empty(shape, dtype=torch.float16))
    check(got, x.float() * y.float(), "fp16")


@pytest.mark.parametrize("view", ["transpose", "column_slice", "row_step", "inner_step"])
def test_non_contiguous_inputs(root, view):
    base = rand((40, 90), seed=13)
    x = {"transpose": base.t(), "column_slice": base[:, 3:70], "row_step": base[::2],
         "inner_step": base[:, ::2]}[view]
    shape = tuple(x.shape)
    k = KernelBuilder(f"view_{view}", shape)
    k.buffer("x", "fp32", shape, x.stride())
    k.buffer("y", "fp32", shape)
    k.buffer("out", "fp32", shape)
    k.store("out", k.op("add", k.op("exp", k.load("x", x.stride())), k.load("y")))
    y = rand(shape, seed=14)
    (_, _, got) = run(k.build(), root, x, y, torch.empty(shape))
    check(got, torch.exp(x) + y, "fp32")


def test_in_place_update(root):
    shape = (3, 255)
    k = KernelBuilder("add_", shape)
    k.buffer("x", "fp32", shape)
    k.buffer("y", "fp32", shape)
    k.store("x", k.op("add", k.load("x"), k.load("y")))
    x, y = rand(shape, seed=15), rand(shape, seed=16)
    got, _ = run(k.build(), root, x, y)
    check(got, x + y, "fp32")


@pytest.mark.parametrize("shape,cores", [((100003,), None), ((300, 1000), None), ((300, 1000), 3),
                                         ((5, 40000), None)])
def test_many_tiles_and_cores(root, shape, cores):
    """Several tiles per core, a ragged last tile and last core, chunked rows (5 x 40000)."""
    x, y = rand(shape, "fp16", 17), rand(shape, "fp16", 18)
    (_, _, got) = run(binary_kernel("mul", shape, "fp16"), root, x, y, torch.empty(shape, dtype=torch.float16),
                      cores=cores)
    check(got, x.float() * y.float(), "fp16")
