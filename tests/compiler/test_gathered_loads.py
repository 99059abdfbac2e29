"""Reduction operands that walk no dim contiguously are gathered on the card (issue 9).

The reduction planner moves tiles as rows: along the reduced dim, or along
the innermost outer dim and transposed on chip. An operand that walks
neither contiguously (transposed in another pair of dims), or a per-column
weight read with a stride along the reduced dim (``w[::2]``), is gathered:
each tile row's elements are loaded one per stick into a column and
transposed into the row (a result laid out that way is scattered: the mirror
image). Before this, the strided weight was read as if it
were contiguous: a silently wrong result (fixed, pinned below); the other
case fell back to the CPU (the graph fuzzer's seed-42 findings). An operand
walked backwards (a flip) is refused, and runs correctly on the CPU: tiles
move forward rows (before, the gathered load tried a negative stride and the
program failed at run time).
"""

from __future__ import annotations

import pytest
import torch

from inductor_helpers import compile_on_spyre

TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(autouse=True)
def strict(monkeypatch):
    monkeypatch.setenv("SPYRE_STRICT", "1")


def _rand(shape, seed=0):
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed)) * 6 - 3


def _check(fn, *args):
    out, _, records, warned, _ = compile_on_spyre(fn, *args)
    want = fn(*args)
    want = want if isinstance(want, tuple) else (want,)
    for got, ref in zip(out, want, strict=True):
        torch.testing.assert_close(got.cpu(), ref, **TOL)
    assert not warned and all(r.artifact is not None for r in records if r.kernel is not None)


def test_a_weight_strided_along_the_reduced_dim():
    x, w = _rand((8, 64)), _rand((128,), 1)
    _check(lambda a, b: (a * b[::2]).sum(-1), x, w)


def test_a_strided_weight_in_chunked_rows():
    x, w = _rand((4, 300_000)), _rand((900_000,), 2)  # rows too long for the scratchpad
    _check(lambda a, b: torch.softmax(a * b[::3], -1), x, w)


def test_an_operand_transposed_in_other_dims_than_the_reduced_one():
    """Fuzzer seed 42, example 679: a sum over dim 0 of operands transposed in their last two dims."""
    x1 = _rand((32, 1, 64), 3)
    x2 = _rand((32, 64, 3), 4).transpose(-1, -2)
    _check(lambda a, b: (a / (torch.abs(b) + 1)).sum(0, keepdim=True), x1, x2)


def test_a_scan_after_a_reduction_over_another_dim():
    """Fuzzer seed 42, example 622: mean over dim 1 then cumsum over dim 1 of the result."""
    x0 = _rand((67, 64, 3), 314).transpose(-1, -2)

    def f(a):
        v1 = torch.exp(torch.tanh(a) * 2)
        return torch.logsumexp(v1, 1, keepdim=True).mean(0), torch.cumsum(v1.mean(1), 1)

    _check(f, x0)


def test_a_flipped_operand_runs_correctly_on_the_cpu(monkeypatch):
    monkeypatch.delenv("SPYRE_STRICT")
    x = _rand((5, 67), 6)
    fn = lambda a: (a.flip(-1).cumsum(-1), a.flip(0).sum(0))  # noqa: E731
    out, _, records, warned, _ = compile_on_spyre(fn, x)
    for got, want in zip(out, fn(x), strict=True):
        torch.testing.assert_close(got.cpu(), want, **TOL)
    assert warned and any("backwards" in (r.fallback_reason or "") for r in records)


def test_a_result_whose_layout_walks_neither_dim_is_scattered():
    """The store's mirror image (fuzzer seed 99): the output is contiguous in an outer dim the
    kernel does not walk innermost, so each tile row is transposed into a column and stored one
    element per stick."""
    x = _rand((6, 70, 40), 9)
    _check(lambda a: a.transpose(1, 2).softmax(0), x)
    _check(lambda a: a.transpose(1, 2).cumsum(0) * 2, x)
    i = torch.randint(-2, 3, (3, 130, 5), generator=torch.Generator().manual_seed(19845)).transpose(-1, -2)
    out, _, records, warned, _ = compile_on_spyre(lambda a: torch.cumprod(1 - a % 2 * 2, 0), i)
    assert torch.equal(out[0].cpu(), torch.cumprod(1 - i % 2 * 2, 0)) and not warned
