"""Reductions over several dims that do not merge into one (issue 9's coverage).

``x.sum((0, 2))``, BatchNorm's statistics over (N, H, W) and ``a.t().argmax()``
reduce over dims that are not neighbours in memory. The planner chunks the
innermost reduced dim and loops over the others around each pass's chunks
(families/reduction/space.py, "looped" dims), so every (looped index, chunk) meets
the same accumulators in row-major order.

argmax/argmin over several dims: Inductor reorders a node's loops by stride,
and the index an argmax returns counts in loop order; Inductor corrects it
only for its own Triton and C++ backends. Spyre runs such a node in the
logical order of its dims (nodes.loop_body), compiled or on the CPU; both
return eager's index (they returned the memory-order index before).
"""

from __future__ import annotations

import pytest
import torch

from inductor_helpers import compile_on_spyre, refuse_every_kernel

TOL = dict(rtol=1e-5, atol=1e-5)


def _rand(shape, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _check(fn, *args, compiled=True):
    out, _, records, warned, _ = compile_on_spyre(fn, *args)
    want = fn(*args)
    want = want if isinstance(want, tuple) else (want,)
    for got, ref in zip(out, want, strict=True):
        torch.testing.assert_close(got.cpu(), ref, **TOL)
    if compiled:
        assert not warned and all(r.artifact is not None for r in records if r.kernel is not None), records
    else:  # the path under test really was the CPU fallback
        assert warned and any(r.fallback_reason for r in records), records
    return records


CASES = {
    "sum over dims 1 and 3 of 6-D": (lambda a: a.sum((1, 3)), (2, 3, 4, 5, 3, 2)),
    "batch-norm statistics": (lambda a: (a.mean((0, 2, 3)), a.var((0, 2, 3))), (4, 16, 9, 11)),
    "logsumexp over (0, 2), keepdim": (lambda a: torch.logsumexp(a, (0, 2), keepdim=True), (3, 4, 5)),
    "amax over (0, 2), long rows": (lambda a: a.amax((0, 2)), (6, 7, 3000)),
    "two passes: max, then exp-sum": (lambda a: (a - a.amax((0, 2), keepdim=True)).exp().sum((0, 2)), (5, 6, 70)),
    "training batch_norm": (lambda a: torch.nn.functional.batch_norm(a, None, None, training=True), (4, 16, 9, 11)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_reductions_over_dims_that_do_not_merge_compile(name, monkeypatch):
    monkeypatch.setenv("SPYRE_STRICT", "1")
    fn, shape = CASES[name]
    _check(fn, _rand(shape))


ARG_CASES = {
    "argmax of a transpose": (lambda a: a.t().argmax(), (67, 45)),
    "argmin of a permutation": (lambda a: a.permute(2, 0, 1).argmin(), (5, 6, 70)),
    "argmax over all dims of a 3-D transpose": (lambda a: a.transpose(0, 2).argmax(), (3, 40, 50)),
}


@pytest.mark.parametrize("name", sorted(ARG_CASES))
@pytest.mark.parametrize("path", ["compiled", "cpu fallback"])
def test_argmax_over_reordered_dims_returns_the_logical_index(name, path, monkeypatch):
    fn, shape = ARG_CASES[name]
    x = _rand(shape, 1)
    x.view(-1)[17] = 9.0    # the extreme sits where memory order and logical order disagree
    x.view(-1)[23] = -9.0
    if path == "compiled":
        monkeypatch.setenv("SPYRE_STRICT", "1")
    else:
        refuse_every_kernel(monkeypatch)
    _check(fn, x, compiled=path == "compiled")
