"""torch.compile on spyre vs CPU eager for the reductions of the coverage table, every dtype they apply to.

The reductions (sum, mean, prod, amax, amin, max with indices, argmax, argmin,
any, all, var, std, softmax, log_softmax, logsumexp, cumsum, cumprod), each
over the last dim and over dim 0 of (11, 67), their inputs, float64
references and rounding bounds are in coverage_ops.py (its reductions
section); ``.venv/bin/python benchmarks/coverage.py`` prints the table.

* ``test_fp32_reductions_in_one_graph`` (default suite): every fp32 reduction
  in one compiled graph, all compiled to spyre programs and correct.
* ``test_reduction_cell`` (``slow``, ``make test-slow``): every applicable
  cell, one compiled graph per dtype. A float cell must pass: spyre programs
  only, results within tolerance. An integer or bool cell must at least be
  correct: it passes, or runs partly on the CPU fallback with the right
  results (integer reductions may or may not be planned; both are graded).

Not strict: a fallback is graded from the kernel records (status
"fallback", with its reason), not raised, so the two cases stay apart.
"""

from __future__ import annotations

import functools

import pytest
import torch

from coverage_ops import (
    DTYPES, NAMES, REDUCTIONS, REDUCTIONS_BY_NAME, mismatch, reduction_applies, reduction_pool, run_group,
)
from inductor_helpers import compile_on_spyre


@pytest.fixture(autouse=True)
def not_strict(monkeypatch):
    monkeypatch.delenv("SPYRE_STRICT", raising=False)


def test_fp32_reductions_in_one_graph():
    ops = [op for op in REDUCTIONS if reduction_applies(op, torch.float32)]
    assert len(ops) == len(REDUCTIONS)  # eager defines every reduction for fp32
    cells = run_group(ops, reduction_pool(torch.float32), torch.float32, compile_on_spyre)
    bad = {name: f"{c.status}: {c.detail}" for name, c in cells.items() if c.status != "pass"}
    assert not bad, bad


def test_rounding_slack_does_not_hide_a_lost_term():
    """The sums' allowance (gamma_(n-1) sum |x|) is far below what a real bug costs: one term of
    the row dropped, or the row accumulated in fp16."""
    x = reduction_pool(torch.float32)["x"][0]  # a finite row of 67
    op = REDUCTIONS_BY_NAME["sum(-1)"]
    slack = op.slack(x.double())
    want = x.double().sum().float()
    assert mismatch(x.sum(), want, slack=slack) is None
    assert mismatch(x.flip(0).cumsum(0)[-1], want, slack=slack) is None  # another order
    assert mismatch(x.sum() - x[x.abs().argmin()], want, slack=slack) is not None
    assert mismatch(x.half().cumsum(0)[-1].float(), want, slack=slack) is not None


# ---- every cell (slow) -----------------------------------------------------------------------

CELLS = [(dtype, op.name) for dtype in DTYPES for op in REDUCTIONS if reduction_applies(op, dtype)]


@functools.cache
def _graded(dtype):
    """Every applicable reduction of `dtype` compiled in one graph (op by op where one falls back)."""
    ops = [op for op in REDUCTIONS if reduction_applies(op, dtype)]
    return run_group(ops, reduction_pool(dtype), dtype, compile_on_spyre)


@pytest.mark.slow
@pytest.mark.parametrize("dtype,name", CELLS, ids=[f"{NAMES[d]}-{n}" for d, n in CELLS])
def test_reduction_cell(dtype, name):
    cell = _graded(dtype)[name]
    if dtype.is_floating_point:
        assert cell.status == "pass", f"{cell.status}: {cell.detail}"
    else:  # "fallback" is only given when the results match
        assert cell.status in ("pass", "fallback"), f"{cell.status}: {cell.detail}"
