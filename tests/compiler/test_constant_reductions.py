"""Reductions of values that do not vary over the reduced dim, and scans only reduced (issue 9).

Found by the graph fuzzer's integer graphs: ``x.argmax(0).sum(0)`` with
x (1, 67) (an argmax over a dim of 1 is the constant 0), ``zeros_like(x).sum()``,
or a broadcast row summed down its broadcast dim, reduce a value that is the
same at every reduced index. The planner computes them without a loop: K
copies of v sum to v * K, multiply to v ** K, and max/min/any/all/mean are v
itself (argmax: index 0; var: 0). And a scan whose result is only reduced in
a one-row kernel (``cumsum(x).sum()`` of a vector) is full-space like any
other scan. Both ran correctly on the CPU before; now they compile (strict).
"""

from __future__ import annotations

import pytest
import torch

from inductor_helpers import compile_on_spyre


@pytest.fixture(autouse=True)
def strict(monkeypatch):
    monkeypatch.setenv("SPYRE_STRICT", "1")


def _check(fn, *args):
    out, _, records, warned, _ = compile_on_spyre(fn, *args)
    want = fn(*args)
    want = want if isinstance(want, tuple) else (want,)
    for got, ref in zip(out, want, strict=True):
        if ref.is_floating_point():
            torch.testing.assert_close(got.cpu(), ref, rtol=1e-5, atol=1e-5, equal_nan=True)
        else:
            assert got.dtype == ref.dtype and torch.equal(got.cpu(), ref)
    assert not warned and all(r.artifact is not None for r in records if r.kernel is not None)


def _g(seed):
    return torch.Generator().manual_seed(seed)


def test_reductions_of_a_value_constant_along_the_reduced_dim():
    x = torch.randn(1, 67, generator=_g(1))
    _check(lambda a: a.argmax(0).sum(0), x)
    i = torch.randint(-1000, 1001, (1, 67, 1), generator=_g(2))
    _check(lambda a: a.argmin(0).amax(0, keepdim=True), i)
    _check(lambda a: a.expand(7, 67, 1).sum(0), i)


def test_a_broadcast_row_reduced_down_its_broadcast_dim():
    a, b = torch.randn(5, 67, generator=_g(3)), torch.randn(1, 67, generator=_g(4))
    e = lambda t: t.expand(5, 67)  # noqa: E731
    _check(lambda x, y: ((x + e(y)).sum(0), e(y).prod(0), e(y).amax(0), e(y).var(0), e(y).any(0),
                         e(y).argmax(0)), a, b)


def test_a_scan_that_is_only_reduced():
    _check(lambda a: torch.cumsum(a, 0).sum(0), torch.randn(67, generator=_g(5)))
    _check(lambda a: torch.cumprod(a % 3 - 1, 0).sum(0, keepdim=True),
           torch.randint(-1000, 1000, (64,), generator=_g(6)))
    _check(lambda a: torch.cumsum(a, 1).amin(1, keepdim=True), torch.randn(1, 67, generator=_g(7)))


def test_a_constant_row_with_inf_or_nan_has_eager_variance_and_product_sign(monkeypatch):
    """Welford turns inf and nan into a nan mean and variance; and K odd copies of -1 multiply to
    -1, where fp32 cannot hold K the product is refused (runs on the CPU) rather than computed
    as (-1) ** float(K) == 1 (both found in review)."""
    a = torch.randn(300_000, 4, generator=_g(8))  # rows too long: a chunked plan
    c = torch.tensor([[float("inf"), float("nan"), 1.0, 2.0]])
    _check(lambda x, y: ((x + y.expand(300_000, 4)).sum(0), y.expand(300_000, 4).var(0)), a, c)
    monkeypatch.delenv("SPYRE_STRICT")
    out, _, _, warned, _ = compile_on_spyre(lambda x: x.expand(1, 2 ** 24 + 1).prod(-1), torch.tensor([[-1.0]]))
    assert out[0].item() == -1.0 and warned
