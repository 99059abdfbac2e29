"""Compiled reduction kernels (hand-built IR) launched on spyre, against torch on CPU.

Tolerances: fp32 rtol 1e-5 / atol 1e-5 (the program accumulates in fp32 like the
CPU reference, but in a different order: tile rows, chunks, cores); fp16
rtol 2**-10 (one fp16 ulp) / atol 1e-5 (inputs widened to fp32, one rounding at the store, as
Inductor's CPU code). Index results and bools exactly.
"""

from __future__ import annotations

import pytest
import torch

from reduction_ir import ReductionBuilder, layer_norm_kernel, row_reduce, softmax_kernel
from spyre_inductor.compiler.backend import compile_kernel
from spyre_runtime.launch import launch_jobplan
from spyre_runtime.prepare import prepare_kernel

TOL = {"fp32": dict(rtol=1e-5, atol=1e-5), "fp16": dict(rtol=2.0 ** -10, atol=1e-5)}
TORCH = {"fp32": torch.float32, "fp16": torch.float16}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("artifacts")


def run(kernel, root, *tensors, **options):
    plan = prepare_kernel(compile_kernel(kernel, root, **options))
    dev = [t.to("spyre") for t in tensors]
    launch_jobplan(plan, dev)
    torch.spyre.synchronize()
    return [d.cpu() for d in dev]


def rand(shape, dtype="fp32", seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(TORCH[dtype])


REF = {"sum": lambda x, d: x.float().sum(d), "max": lambda x, d: x.float().amax(d),
       "min": lambda x, d: x.float().amin(d), "prod": lambda x, d: x.float().prod(d),
       "argmax": lambda x, d: x.argmax(d), "argmin": lambda x, d: x.argmin(d),
       "any": lambda x, d: (x != 0).any(d), "all": lambda x, d: (x != 0).all(d)}


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("shape,dim", [((67, 71), 1), ((67, 71), 0), ((3, 255), 1), ((5, 1), 1), ((2, 3, 40), 1),
                                       ((130,), 0)])
@pytest.mark.parametrize("op", sorted(REF))
def test_reductions(root, op, shape, dim, dtype):
    x = rand(shape, dtype, 1)
    if op == "prod":
        x = (x.float().abs() * 0.2 + 0.9).to(x.dtype)
    if op in ("any", "all"):
        x = (x.float() > (-2.0 if op == "all" else 2.0)).to(x.dtype) * x
    if op in ("argmax", "argmin") and shape[dim] > 3:
        # ties along the reduced dim, in the first slice: the first index wins
        extreme = x.max() if op == "argmax" else x.min()
        for i in (1, 3):
            x[tuple(i if d == dim else 0 for d in range(len(shape)))] = extreme
    k = row_reduce(op, shape, dim, dtype)
    want = REF[op](x, dim)
    out = torch.empty(want.shape, dtype=want.dtype if op in ("argmax", "argmin", "any", "all") else TORCH[dtype])
    _, got = run(k, root, x, out)
    if op in ("argmax", "argmin", "any", "all"):
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got.float(), want.to(TORCH[dtype]).float(), **TOL[dtype], equal_nan=True)


def test_argmax_nan_and_ties(root):
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0], [float("nan"), 5.0, float("nan"), 1.0], [2.0, 2.0, 2.0, 2.0]])
    for op in ("argmax", "argmin"):
        out = torch.empty(3, dtype=torch.int64)
        _, got = run(row_reduce(op, (3, 4), 1), root, x, out)
        assert torch.equal(got, getattr(x, op)(1)), op
    out = torch.empty(3)
    _, got = run(row_reduce("max", (3, 4), 1), root, x, out)
    torch.testing.assert_close(got, x.amax(1), equal_nan=True)


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("shape,dim", [((64, 300), -1), ((33, 1000), -1), ((256, 64), 0)])
@pytest.mark.parametrize("log", [False, True])
def test_softmax(root, shape, dim, dtype, log):
    x = rand(shape, dtype, 2)
    out = torch.empty_like(x)
    _, got = run(softmax_kernel(shape, dtype, dim, log), root, x, out)
    f = torch.log_softmax if log else torch.softmax
    check = f(x.float(), dim).to(x.dtype)
    torch.testing.assert_close(got.float(), check.float(), **TOL[dtype])


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize("shape", [(16, 300), (7, 64)])
def test_layer_norm(root, shape, dtype):
    x, w, b = rand(shape, dtype, 3), rand(shape[1:], dtype, 4), rand(shape[1:], dtype, 5)
    out = torch.empty_like(x)
    _, _, _, got = run(layer_norm_kernel(shape, dtype), root, x, w, b, out)
    want = torch.nn.functional.layer_norm(x.float(), shape[1:], w.float(), b.float(), 1e-5).to(x.dtype)
    torch.testing.assert_close(got.float(), want.float(), **TOL[dtype])


def var_kernel(shape, correction=1, dtype="fp32", std=False):
    """var/std over the last dim as Inductor hands it over: the welford triple, then pointwise."""
    rows, cols = shape
    b = ReductionBuilder("std" if std else "var", (rows,), (cols,))
    b.buffer("x", dtype, shape)
    b.buffer("out", dtype, (rows,))
    x = b.load("x", [cols, 1])
    x = b.cast(x, "fp32") if dtype != "fp32" else x
    b.reduce("welford_mean", x)
    m2 = b.reduce("welford_m2", x)
    w = b.reduce("welford_weight", x)
    v = b.op("truediv", m2, b.op("sub", w, b.const(float(correction))))
    if std:
        v = b.op("sqrt", v)
    b.store("out", b.cast(v, dtype) if dtype != "fp32" else v, [1, 0])
    return b.build()


@pytest.mark.parametrize("shape", [(5, 300), (3, 1)])
@pytest.mark.parametrize("std", [False, True])
def test_var_std_resident(root, shape, std):
    x = rand(shape, "fp32", 6) + 3.0
    out = torch.empty(shape[0])
    _, got = run(var_kernel(shape, 0 if shape[1] == 1 else 1, std=std), root, x, out)
    want = (torch.std if std else torch.var)(x, 1, correction=0 if shape[1] == 1 else 1)
    torch.testing.assert_close(got, want, **TOL["fp32"])


# Rows too long for the scratchpad: chunks along the reduced dim (accumulators, Chan for welford,
# (value, index) pairs for argmax) and extra passes for epilogues that need the full reduction.
BIG = (3, 300_000)


@pytest.mark.parametrize("op", ["sum", "max", "argmax", "argmin", "prod", "all"])
def test_chunked_reductions(root, op):
    x = rand(BIG, "fp32", 7)
    if op == "prod":
        x = 1.0 + x * 1e-4
    if op == "all":
        x[1, 250_000] = 0.0
    if op in ("argmax", "argmin"):
        x[0, 200_001] = x[0, 5] = 50.0 if op == "argmax" else -50.0   # a tie across chunks: the first wins
        x[2, 123_456] = float("nan")                                  # NaN wins, like PyTorch
    want = REF[op](x, 1)
    out = torch.empty(3, dtype=want.dtype)
    _, got = run(row_reduce(op, BIG, 1), root, x, out)
    if op in ("argmax", "argmin", "all"):
        assert torch.equal(got, want)
    elif op == "prod":  # 300000 fp32 products: both orders drift ~1e-3 from the exact product
        torch.testing.assert_close(got, x.double().prod(1).float(), rtol=2e-3, atol=0)
    else:
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)


def test_chunked_softmax_is_three_passes(root):
    x = rand(BIG, "fp32", 8)
    out = torch.empty_like(x)
    _, got = run(softmax_kernel(BIG, "fp32"), root, x, out)
    torch.testing.assert_close(got, torch.softmax(x, 1), rtol=1e-4, atol=1e-8)


def test_chunked_welford_chan(root):
    x = rand(BIG, "fp32", 9) * 2 + 10.0
    out = torch.empty(3)
    _, got = run(var_kernel(BIG, 1), root, x, out)
    torch.testing.assert_close(got, x.var(1), rtol=1e-4, atol=1e-4)
    w, b, y = torch.ones(BIG[1]), torch.zeros(BIG[1]), torch.empty_like(x)
    _, _, _, got = run(layer_norm_kernel(BIG, "fp32"), root, x, w, b, y)
    torch.testing.assert_close(got, torch.nn.functional.layer_norm(x, BIG[1:], eps=1e-5), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("op", ["sum", "max", "argmin", "any"])
def test_full_reduction_over_the_ring(root, op):
    x = rand((100_003,), "fp32", 10)
    if op == "any":
        x = (x > 4.5).float()
    want = REF[op](x, 0)
    out = torch.empty((), dtype=want.dtype)
    _, got = run(row_reduce(op, (100_003,), 0), root, x, out)
    if op in ("argmin", "any"):
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)


def test_full_welford_over_the_ring(root):
    x = rand((1, 200_000), "fp32", 11) + 5.0
    out = torch.empty(1)
    _, got = run(var_kernel((1, 200_000), 1), root, x, out)
    torch.testing.assert_close(got, x.var(1), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_rms_norm_and_x_minus_mean_and_sum_of_squares(root, dtype):
    rows, cols = 24, 200
    x = rand((rows, cols), dtype, 12)
    b = ReductionBuilder("rms_norm", (rows,), (cols,))
    b.buffer("x", dtype, (rows, cols))
    b.buffer("w", dtype, (cols,))
    b.buffer("y", dtype, (rows, cols))
    b.buffer("c", dtype, (rows, cols))
    b.buffer("ss", "fp32", (rows,))
    xv = b.load("x", [cols, 1])
    xf = b.cast(xv, "fp32") if dtype != "fp32" else xv
    ss = b.reduce("sum", b.op("mul", xf, xf))
    r = b.op("rsqrt", b.op("add", b.op("mul", ss, b.const(1.0 / cols)), b.const(1e-6)))
    wf = b.load("w", [0, 1])
    y = b.op("mul", b.op("mul", xf, r), b.cast(wf, "fp32") if dtype != "fp32" else wf)
    mean = b.op("mul", b.reduce("sum", xf), b.const(1.0 / cols))
    cen = b.op("sub", xf, mean)
    b.store("y", b.cast(y, dtype) if dtype != "fp32" else y, [cols, 1])
    b.store("c", b.cast(cen, dtype) if dtype != "fp32" else cen, [cols, 1])
    b.store("ss", ss, [1, 0])
    w = rand((cols,), dtype, 13)
    y_, c_, ss_ = torch.empty_like(x), torch.empty_like(x), torch.empty(rows)
    _, _, gy, gc, gss = run(b.build(), root, x, w, y_, c_, ss_)
    xf = x.float()
    want_ss = (xf * xf).sum(1)
    torch.testing.assert_close(gss, want_ss, **TOL["fp32"])
    want_y = (xf * torch.rsqrt(want_ss[:, None] / cols + 1e-6) * w.float()).to(x.dtype)
    torch.testing.assert_close(gy.float(), want_y.float(), **TOL[dtype])
    torch.testing.assert_close(gc.float(), (xf - xf.mean(1, keepdim=True)).to(x.dtype).float(), **TOL[dtype])


@pytest.mark.parametrize("op,identity", [("sum", 0.0), ("prod", 1.0), ("any", False), ("all", True)])
def test_empty_reduced_dim_gives_the_identity(root, op, identity):
    x = torch.empty((4, 0))
    want = REF[op](x, 1)
    assert torch.equal(want, torch.full((4,), identity, dtype=want.dtype))
    out = torch.full((4,), 7, dtype=want.dtype)
    _, got = run(row_reduce(op, (4, 0), 1), root, x, out)
    assert torch.equal(got, want)
