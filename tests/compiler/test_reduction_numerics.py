"""Compiled reduction kernels (hand-built IR) launched on spyre, against torch on CPU.

Tolerances: fp32 rtol 1e-5 / atol 1e-5 (the program accumulates in fp32 like the
CPU reference, but in a different order: tile rows, chunks, cores); fp16
rtol 1e-3 / atol 1e-3 (inputs widened to fp32, one rounding at the store, as
Inductor's CPU code). Index results and bools exactly.
"""

from __future__ import annotations

import pytest
import torch

from reduction_ir import ReductionBuilder, layer_norm_kernel, row_reduce, softmax_kernel
from spyre_inductor.compiler.backend import compile_kernel
from spyre_runtime.launch import launch_jobplan, prepare_kernel

TOL = {"fp32": dict(rtol=1e-5, atol=1e-5), "fp16": dict(rtol=1e-3, atol=1e-3)}
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
    if op in ("argmax", "argmin") and x.numel() > 4:
        x.view(-1)[3] = x.view(-1)[1] = x.max() if op == "argmax" else x.min()  # ties: the first index wins
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
