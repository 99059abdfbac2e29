"""logsumexp compiles (issue 9); so does cumsum, around other compiled work.

logsumexp: Inductor decomposes it into amax, sub, exp, sum, log, add (with a
guard for infinite maxima: abs, eq, where), which the reduction planner
compiles as ONE program over resident rows. Tolerances as in
test_compiled_reductions.py (fp16 against the fp32 computation rounded once).

cumsum: the backend declares ``BackendFeature.SCAN``, so Inductor lowers it
to a Scan node, which capture turns into a Scan value and the reduction
planner into the sfp's ``scan`` (test_compiled_scans.py has the details).
"""

from __future__ import annotations

import torch

from inductor_helpers import compile_on_spyre

TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=2e-3, atol=2e-3)}


def _data(shape, dtype, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def lse(x, y):
    """Rows of 67 and 130 (not whole sticks), dim 0, keepdim, a 3-D middle dim, an inf row."""
    return (torch.logsumexp(x, 1), torch.logsumexp(x, 0, keepdim=True), torch.logsumexp(y, 1),
            torch.logsumexp(x * 2 - 1, -1, keepdim=True))


def test_logsumexp_compiles_and_matches_cpu():
    for dtype in (torch.float32, torch.float16):
        x, y = _data((9, 67), dtype), _data((3, 130, 5), dtype, 1)
        x[2, 5] = float("-inf")  # one -inf element: ignored by the row's sum
        out, _, records, warned, _ = compile_on_spyre(lse, x, y)
        ref = lse(x.float(), y.float())
        for got, want in zip(out, ref, strict=True):
            torch.testing.assert_close(got.cpu(), want.to(dtype), **TOL[dtype])
        assert records and all(r.artifact is not None for r in records if r.kernel is not None), records
        assert not warned


def test_logsumexp_is_one_program():
    x = _data((32, 100), torch.float32)
    out, _, records, warned, code = compile_on_spyre(lambda a: torch.logsumexp(a, -1), x)
    torch.testing.assert_close(out[0].cpu(), torch.logsumexp(x, -1), **TOL[torch.float32])
    assert len(records) == 1 and records[0].artifact is not None and code.count("launch_jobplan(") == 1
    assert not warned


def test_cumsum_compiles_around_compiled_work():
    x = _data((9, 67), torch.float32)

    def fn(a):
        return torch.cumsum(a * 2, 1), torch.cumsum(a, 0).sigmoid()

    out, _, records, warned, code = compile_on_spyre(fn, x)
    for got, want in zip(out, fn(x), strict=True):
        torch.testing.assert_close(got.cpu(), want, **TOL[torch.float32])
    assert "torch.ops.aten.cumsum" not in code and not warned  # no aten fallback kernel
    assert records and all(r.artifact is not None for r in records), records
    assert sum(r.kernel.has_scan for r in records) == 2
