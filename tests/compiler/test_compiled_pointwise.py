"""torch.compile on spyre, end to end, for the pointwise coverage of issue 7.

Every graph here must compile completely to spyre programs (strict mode: a
CPU fallback would be a compile error) and match PyTorch on the CPU.

Tolerances:
* fp32: rtol 1.3e-6, atol 1e-5 (torch.testing's fp32 defaults): the program
  computes in fp32 like the CPU; fused ops and transcendental kernels may
  differ in the last bits.
* fp16: compared with the same function computed in fp32 and rounded to
  fp16 once, which is Inductor's contract (intermediates in fp32, one
  rounding at the store) and what the program does: within one fp16 ulp
  (rtol 2**-10) plus a small atol for results near zero. Eager fp16 on the
  CPU rounds after every op instead, so it can differ from both by a few
  ulps; that is not an error of either.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from inductor_helpers import compile_on_spyre

TOL = {torch.float32: dict(rtol=1.3e-6, atol=1e-5), torch.float16: dict(rtol=2.0 ** -10, atol=1e-4)}


@pytest.fixture(autouse=True)
def strict(monkeypatch):
    monkeypatch.setenv("SPYRE_STRICT", "1")


def _data(shape, dtype, seed, low=-3.0, high=3.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g) * (high - low) + low).to(dtype)


def _check(fn, *args, dtype):
    out, _, records, warned, _ = compile_on_spyre(fn, *args)
    assert not warned and records and all(r.artifact is not None for r in records), records
    cpu = tuple(a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
    ref = fn(*cpu)
    ref = ref if isinstance(ref, tuple) else (ref,)
    for got, want in zip(out, ref, strict=True):
        got = got.cpu()
        if want.is_floating_point():
            want = want.to(dtype)
            torch.testing.assert_close(got, want, **TOL[dtype])
        else:
            assert torch.equal(got, want)
    return records


def unary(x):
    a = x.abs()
    return (-x, a, torch.exp(x), torch.log(a + 1), torch.sqrt(a), torch.rsqrt(a + 0.5), torch.reciprocal(a + 1),
            torch.sigmoid(x), torch.tanh(x), torch.relu(x), F.gelu(x), F.silu(x))


def binary(x, y):
    return (x + y, x - y, x * y, x / (y.abs() + 1), torch.minimum(x, y), torch.maximum(x, y),
            torch.clamp(x, -0.5, 0.5), torch.where(x > y, x, y), torch.add(x, y, alpha=2.5), x * 2.5, 3 - x)


def comparisons(x, y):
    return x < y, x <= y, x > y, x >= y, x == y.round(), x != y


def broadcast(x, row, col):
    return x + row * col - 1.5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_unary_ops(dtype):
    _check(unary, _data((67, 71), dtype, 1), dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_binary_ops_scalars_alpha_clamp_where(dtype):
    _check(binary, _data((3, 255), dtype, 2), _data((3, 255), dtype, 3), dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_comparisons_give_bools(dtype):
    x, y = _data((67,), dtype, 4), _data((67,), dtype, 5)
    y[::3] = x[::3]  # some equal elements
    _check(comparisons, x, y, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_broadcasting_rows_and_columns(dtype):
    _check(broadcast, _data((37, 130), dtype, 6), _data((130,), dtype, 7), _data((37, 1), dtype, 8), dtype=dtype)


@pytest.mark.parametrize("shape", [(67,), (5, 7, 9), (2, 3, 4, 65), (2, 3, 2, 5, 33)], ids=lambda s: f"{len(s)}d")
def test_one_to_five_dims(shape):
    _check(lambda x, y: torch.sigmoid(x * y + 1), _data(shape, torch.float32, 9), _data(shape, torch.float32, 10),
           dtype=torch.float32)


def test_casts_between_dtypes():
    def casts(x, i):
        h = x.half()
        return h.float() * 2, (x > 0).float() + i.float(), h * h, x.to(torch.bfloat16).float()

    x = _data((67, 71), torch.float32, 11)
    i = torch.randint(-5, 5, (67, 71), dtype=torch.int32)
    out, _, records, warned, _ = compile_on_spyre(casts, x, i)
    assert not warned and all(r.artifact is not None for r in records)
    h = x.half()
    want = (h.float() * 2, (x > 0).float() + i.float(), (h.float() * h.float()).half(), x.bfloat16().float())
    for got, ref in zip(out, want, strict=True):
        torch.testing.assert_close(got.cpu(), ref, rtol=0, atol=0)


def test_non_contiguous_inputs():
    base = _data((64, 130), torch.float32, 12)
    other = _data((130, 64), torch.float32, 13)
    _check(lambda a, b: a.t() * 2 + b, base, other, dtype=torch.float32)
    _check(lambda a: a[:, ::2] - a[:, 1::2], base, dtype=torch.float32)


def test_in_place_update_of_a_graph_input():
    def update(x, y):
        x.mul_(2).add_(y)
        return x.sigmoid()

    x, y = _data((67, 71), torch.float32, 14), _data((67, 71), torch.float32, 15)
    out, args, records, warned, _ = compile_on_spyre(update, x, y)
    assert not warned and all(r.artifact is not None for r in records)
    torch.testing.assert_close(args[0].cpu(), x * 2 + y, **TOL[torch.float32])
    torch.testing.assert_close(out[0].cpu(), (x * 2 + y).sigmoid(), **TOL[torch.float32])
