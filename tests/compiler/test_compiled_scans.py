"""cumsum and cumprod compile to spyre programs (issue 9), and so do integer and bool
reductions and scans.

A scan is a full-space value in the reduction planner (families/reduction/scan.py):
the sfp's ``scan`` runs the inclusive prefix along tile rows; over resident
rows once, and when a row does not fit, chunk after chunk in order with an
fp32 carry column that continues each row's prefix. A scan over dim 0 loads
transposed tiles, like a sum over dim 0. Prologues and epilogues fuse into
the same program.

Integers are exact: sums, prods and scans of integers and bools accumulate
in the result's dtype (int64, as PyTorch promotes them), max/min keep theirs;
nothing is narrowed to int32.

Tolerances: fp32 as the other compiled kernels (1e-5); fp16/bf16 one unit in
the last place of the result, the single rounding at the store (eager CPU
accumulates fp16 in fp32 and fp32 in double, and so does the program, up to
the one fp32 add of each chunk's carry).
"""

from __future__ import annotations

import pytest
import torch

from spyre_inductor.compiler.backend import plan_kernel
from spyre_inductor.compiler.ir.kernel_ir import Scan
from spyre_runtime.program.timing import estimate

from inductor_helpers import compile_on_spyre, refuse_every_kernel
from pointwise_ir import contiguous
from reduction_ir import ReductionBuilder

TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float16: dict(rtol=2 ** -10, atol=1e-5),
       torch.bfloat16: dict(rtol=2 ** -7, atol=1e-5)}


@pytest.fixture(autouse=True)
def strict(monkeypatch):
    monkeypatch.setenv("SPYRE_STRICT", "1")  # a CPU fallback is a compile error here


def _data(shape, dtype=torch.float32, seed=0):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _check(fn, *args, dtype=torch.float32, programs=None):
    out, _, records, warned, _ = compile_on_spyre(fn, *args)
    ref = fn(*(a.float() for a in args))
    ref = ref if isinstance(ref, tuple) else (ref,)
    for got, want in zip(out, ref, strict=True):
        torch.testing.assert_close(got.cpu(), want.to(dtype), **TOL[dtype])
    assert not warned
    compiled = [r for r in records if r.kernel is not None]
    assert compiled and all(r.artifact is not None for r in compiled), records
    if programs is not None:
        assert len(compiled) == programs, [r.kernel.name for r in compiled]
    return compiled


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_cumsum_along_every_dim_matches_cpu(dtype):
    """Rows of 67 (not whole sticks), the last, first and a middle dim, 1-D."""
    x, y, v = _data((9, 67), dtype), _data((3, 40, 70), dtype, 1), _data((100,), dtype, 2)
    _check(lambda a: torch.cumsum(a, -1), x, dtype=dtype)
    _check(lambda a: torch.cumsum(a, 0), x, dtype=dtype)
    _check(lambda a: torch.cumsum(a, 1), y, dtype=dtype)
    _check(lambda a: torch.cumsum(a, 0), v, dtype=dtype)


def test_cumprod_matches_cpu():
    x = 1 + 0.05 * _data((5, 130))  # near 1: the products stay finite over 130 steps
    _check(lambda a: torch.cumprod(a, -1), x)
    _check(lambda a: torch.cumprod(a, 0), x)


def test_prologue_scan_and_epilogue_are_one_program():
    x = _data((16, 200))
    [rec] = _check(lambda a: torch.sigmoid(torch.cumsum(a * 2 + 1, -1)) - 0.5, x, programs=1)
    assert sum(isinstance(v, Scan) for v in rec.kernel.values) == 1
    assert rec.kernel.name.startswith("spyre_scan_")


def test_transposed_and_sliced_inputs():
    x = _data((70, 40))
    _check(lambda a: torch.cumsum(a.t(), -1), x)
    _check(lambda a: torch.cumsum(a[:, 3:50], -1) * 2, _data((8, 64)))


def test_a_scan_and_a_reduction_of_the_same_rows():
    x = _data((12, 90))
    _check(lambda a: torch.cumsum(a, -1) / a.abs().sum(-1, keepdim=True), x)


def test_size_one_and_empty_scanned_dims():
    _check(lambda a: torch.cumsum(a, 1) + 1, _data((7, 1)))
    out, _, _, warned, _ = compile_on_spyre(lambda a: torch.cumsum(a, 1), _data((7, 0)))
    assert out[0].shape == (7, 0) and not warned


INT_CASES = {
    "sum": lambda a: a.sum(-1),
    "sum dim 0": lambda a: a.sum(0),
    "count": lambda a: (a > 0).sum(-1),
    "amax": lambda a: a.amax(-1),
    "amin dim 0": lambda a: a.amin(0),
    "prod": lambda a: (a % 3 + 1).prod(-1),
    "cumsum": lambda a: a.cumsum(-1),
    "cumsum dim 0": lambda a: a.cumsum(0),
    "cumprod": lambda a: (a % 2 + 1).cumprod(0),
    "position ids": lambda a: (a > 0).long().cumsum(-1) - 1,  # HF models' position ids from a mask
}


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool])
def test_integer_and_bool_reductions_and_scans_compile_exactly(dtype):
    x = torch.randint(-50, 50, (9, 67), generator=torch.Generator().manual_seed(3)).to(dtype)
    if dtype == torch.bool:
        cases = {k: f for k, f in INT_CASES.items() if k in ("sum", "sum dim 0", "cumsum", "cumsum dim 0", "amax")}
    else:
        cases = INT_CASES
    fn = lambda a: tuple(f(a) for f in cases.values())  # noqa: E731
    out, _, records, warned, _ = compile_on_spyre(fn, x)
    for name, got, want in zip(cases, out, fn(x), strict=True):
        assert got.dtype == want.dtype and torch.equal(got.cpu(), want), name
    assert not warned and all(r.artifact is not None for r in records if r.kernel is not None)


def test_int64_sums_beyond_int32_stay_exact():
    x = torch.full((4, 100), 2 ** 40, dtype=torch.int64)
    out, _, _, _, _ = compile_on_spyre(lambda a: (a.sum(-1), a.cumsum(-1)), x)
    assert torch.equal(out[0].cpu(), x.sum(-1)) and torch.equal(out[1].cpu(), x.cumsum(-1))


# ---- plans (hand-built IR: what capture hands over for cumsum) ---------------------------------


def cumsum_kernel(shape, dim=-1, dtype="fp32", op="sum"):
    rows, cols = shape
    xs = contiguous(shape)
    if dim in (-1, 1):
        ranges, red, strides = (rows,), (cols,), [xs[0], xs[1]]
    else:
        ranges, red, strides = (cols,), (rows,), [xs[1], xs[0]]
    b = ReductionBuilder(f"cum{op}_{dim}_{dtype}", ranges, red)
    b.buffer("x", dtype, shape)
    b.buffer("out", dtype, shape)
    x = b.load("x", strides)
    if dtype != "fp32":
        x = b.cast(x, "fp32")
    s = b._add(Scan(op, x, dtype))
    b.store("out", b.cast(s, dtype) if dtype != "fp32" else s, strides)
    return b.build()


def test_resident_rows_are_read_once_and_written_once():
    c = plan_kernel(cumsum_kernel((512, 1024), -1, "fp16"))
    assert c.plans.stage("plan").mode == "resident"
    r = estimate(c.program)
    assert r.bytes_read == r.bytes_written == 512 * 1024 * 2


def test_rows_that_do_not_fit_are_scanned_chunk_after_chunk_with_a_carry():
    c = plan_kernel(cumsum_kernel((3, 300_000), -1, "fp32"), cores=1)  # one core: no ring split
    plan = c.plans.stage("plan")
    assert plan.mode == "chunked" and plan.passes == 1  # the carry makes one pass enough
    r = estimate(c.program)
    assert r.bytes_read == r.bytes_written == 3 * 300_000 * 4


def test_a_long_row_is_split_over_cores_and_read_once():
    """Too few rows for the cores: each core reduces its slice to a total, the totals travel the
    ring as running prefixes, and each core scans its slice from the prefix it received."""
    c = plan_kernel(cumsum_kernel((1, 1 << 20), -1, "fp16"))
    assert c.plans.stage("plan").mode == "ring" and c.plans.division.cores == 32
    r = estimate(c.program)
    assert r.bytes_read == r.bytes_written == (1 << 20) * 2 and r.ring_bytes > 0
    assert r.roofline_us / r.simulated_us >= 0.85


def test_a_float_cumprod_is_not_split_over_cores():
    # its slices' products, reduced in one go, would drift from eager's double-accumulated prefix
    c = plan_kernel(cumsum_kernel((1, 1 << 18), -1, "fp32", op="prod"))
    assert c.plans.stage("plan").mode != "ring"


def test_cumsum_over_dim0_scans_transposed_tiles():
    c = plan_kernel(cumsum_kernel((512, 1024), 0, "fp16"))
    assert c.plans.stage("lowering").transposed
    r = estimate(c.program)
    assert r.bytes_read == r.bytes_written == 512 * 1024 * 2


# ---- chunked numerics (hand-built IR, launched directly) -----------------------------------------


def _run(kernel, root, *tensors, cores=None):
    from spyre_inductor.compiler.backend import compile_kernel
    from spyre_runtime.launch import launch_jobplan
    from spyre_runtime.prepare import prepare_kernel

    plan = prepare_kernel(compile_kernel(kernel, root, cores=cores))
    dev = [t.to("spyre") for t in tensors]
    launch_jobplan(plan, dev)
    torch.spyre.synchronize()
    return [d.cpu() for d in dev]


BIG = (3, 300_000)  # 1.2 MB fp32 rows: chunked (on one core; on more, the rows split over the ring)


def test_chunked_cumsum_continues_each_row_across_chunks(tmp_path):
    x = _data(BIG)
    _, got = _run(cumsum_kernel(BIG, -1), tmp_path, x, torch.empty_like(x), cores=1)
    # one fp32 rounding of each chunk's carry add on top of eager's double accumulation:
    # within a few ulp of values up to ~1000
    torch.testing.assert_close(got, torch.cumsum(x, -1), rtol=1e-5, atol=1e-3)


def test_a_scan_recomputed_in_a_later_pass_restarts_its_carry(tmp_path):
    """y = cumsum(x); out = y / sum(y): pass 1 scans to sum, pass 2 scans again to store."""
    rows, cols = BIG
    b = ReductionBuilder("cumsum_normalised", (rows,), (cols,))
    b.buffer("x", "fp32", BIG)
    b.buffer("out", "fp32", BIG)
    s = b._add(Scan("sum", b.load("x", [cols, 1]), "fp32"))
    b.store("out", b.op("truediv", s, b.reduce("sum", s)), [cols, 1])
    k = b.build()
    assert plan_kernel(k, cores=1).plans.stage("plan").passes == 2
    x = _data(BIG).abs() + 0.1  # positive: no cancellation in the total
    _, got = _run(k, tmp_path, x, torch.empty_like(x), cores=1)
    y = torch.cumsum(x.double(), -1)
    torch.testing.assert_close(got, (y / y.sum(-1, keepdim=True)).float(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool])
def test_max_with_indices_of_integers_and_bools(dtype):
    """Compared in their own width (int64 beyond 2**53 stays exact); bools as 0/1, first True wins."""
    x = torch.randint(-5, 5, (11, 67), generator=torch.Generator().manual_seed(4)).to(dtype)
    if dtype == torch.int64:
        x[3, 10], x[3, 20] = 2 ** 60 + 1, 2 ** 60  # differ below fp32's (and fp64's) resolution
    fn = lambda a: (*torch.max(a, -1), *torch.min(a, 0))  # noqa: E731
    out, _, records, warned, _ = compile_on_spyre(fn, x)
    for got, want in zip(out, fn(x), strict=True):
        assert torch.equal(got.cpu(), want)
    assert not warned and all(r.artifact is not None for r in records if r.kernel is not None)


def test_the_cpu_fallback_takes_max_with_indices_of_bools(monkeypatch):
    """torch.argmax refuses bools; the fallback compares them as 0/1 (it crashed before)."""
    monkeypatch.delenv("SPYRE_STRICT")
    refuse_every_kernel(monkeypatch)
    x = torch.rand(5, 67, generator=torch.Generator().manual_seed(5)) > 0.5
    out, _, _, warned, _ = compile_on_spyre(lambda a: torch.max(a, -1), x)
    for got, want in zip(out, torch.max(x, -1), strict=True):
        assert torch.equal(got.cpu(), want)
    assert warned


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64])
def test_ring_scans_match_cpu(dtype):
    """A 1-D cumsum and a few long rows with an epilogue: split over 32 cores."""
    g = torch.Generator().manual_seed(9)
    if dtype == torch.int64:
        v, m = torch.randint(-9, 9, (300_001,), generator=g), torch.randint(-9, 9, (3, 70_000), generator=g)
        fns = (lambda a: torch.cumsum(a, 0), lambda a: torch.cumsum(a, -1) * 2 - 1)
    else:
        v, m = torch.randn(300_001, generator=g).to(dtype), torch.randn(3, 70_000, generator=g).to(dtype)
        fns = (lambda a: torch.cumsum(a, 0), lambda a: torch.tanh(torch.cumsum(a * 2, -1) / 300))
    for fn, x in zip(fns, (v, m)):
        out, _, records, warned, _ = compile_on_spyre(fn, x)
        if dtype == torch.int64:
            assert torch.equal(out[0].cpu(), fn(x))
        else:
            # fp32: the cores' totals are pairwise fp32 sums added once: a few ulp of values ~1000
            tol = dict(rtol=1e-5, atol=1e-3) if dtype == torch.float32 else TOL[dtype]
            torch.testing.assert_close(out[0].cpu(), fn(x.float()).to(dtype), **tol)
        assert not warned and all(r.artifact is not None for r in records if r.kernel is not None)


def test_a_ring_scan_whose_input_is_also_stored():
    """The prologue's value is stored and scanned: its store copy must not be folded into the
    step the slice total and the scan read (it was: they read a tile never written; found in
    review). The HF position-ids pattern with the mask also returned is the same shape."""
    x = torch.randn(1, 100_000, generator=torch.Generator().manual_seed(12))
    fn = lambda a: (a * 2, torch.cumsum(a * 2, -1))  # noqa: E731
    out, _, records, warned, _ = compile_on_spyre(fn, x)
    torch.testing.assert_close(out[0].cpu(), fn(x)[0], **TOL[torch.float32])
    # 32 slice totals (pairwise fp32 sums) added in fp32: a few ulp of prefixes up to ~500
    torch.testing.assert_close(out[1].cpu(), fn(x)[1], rtol=1e-5, atol=1e-3)
    assert len(records) == 1 and records[0].artifact is not None and not warned
    m = torch.randint(-9, 9, (2, 100_000), generator=torch.Generator().manual_seed(13))
    fn = lambda a: ((a > 0).long(), (a > 0).long().cumsum(-1))  # noqa: E731
    out, _, records, warned, _ = compile_on_spyre(fn, m)
    for got, want in zip(out, fn(m), strict=True):
        assert torch.equal(got.cpu(), want)
    assert not warned and records[0].kernel is not None
