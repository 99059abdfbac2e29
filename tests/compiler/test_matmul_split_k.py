"""A decode projection (few rows) splits k over a chain of cores and combines the fp32 partials on the ring.

With M from 1 to 64 the output has too few blocks of whole sticks to give every core one (a k/v
projection's N = 128 is two fp16 blocks): the planner also tries grids whose blocks are each split
into k slices on consecutive cores (plan.make_grid's gk), each core's fp32 partial handed along
the chain (core/combine.py, the tile kernel's Combine) and the epilogue run once, by the chain's
last core, on the whole sum. The tests pin that the split is chosen where it pays and only there,
that the partials combine in fp32 and round once (the derived bound of test_compiled_matmul.py,
which holds for any summation order, would not hold for partials rounded to fp16), with an
epilogue, and for a function compiled over a symbolic M.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from spyre_inductor.compiler.backend import plan_kernel
from spyre_inductor.compiler.core.tiles import Role
from spyre_inductor.compiler.families.matmul.planner import plan_matmul
from spyre_runtime.program.timing import estimate

from inductor_helpers import compile_on_spyre
from test_compiled_matmul import assert_on_card, check, matmul_bound, matmul_records
from test_matmul_plans import matmul_kernel


@pytest.fixture(autouse=True)
def strict(monkeypatch):
    monkeypatch.setenv("SPYRE_STRICT", "1")


def test_a_k_v_projection_splits_k_over_the_card():
    compiled = plan_kernel(matmul_kernel(1, 4096, 128))
    grid, tk = compiled.plans.stage("grid"), compiled.plans.tile_kernel
    assert grid.gk > 1 and compiled.plans.division.cores > 2, compiled.plans.division.reason
    assert sorted({b.starts[3] for b in grid.blocks}) == [i * 4096 // grid.gk for i in range(grid.gk)]
    [landing] = tk.with_role(Role.RING_LANDING)
    [acc] = tk.with_role(Role.ACCUMULATOR)
    assert landing.of == acc.name and landing.dtype == acc.dtype == "fp32"
    assert tk.combine is not None and tk.combine.tiles == (acc.name,)
    report = estimate(compiled.program)
    assert report.ring_bytes > 0 and report.refetch <= 1.02
    assert report.roofline_ns / report.simulated_ns >= 0.85


def test_the_llama_demo_k_v_projection_splits_on_whole_sticks_of_k():
    # x @ W.t() with W (128, 256): k is W's contiguous dim, so a slice is whole sticks of it
    compiled = plan_matmul(matmul_kernel(1, 256, 128, transposed_b=True))
    grid = compiled.plans.stage("grid")
    assert grid.gk > 1
    assert all(b.starts[3] % 64 == 0 for b in grid.blocks)
    report = estimate(compiled.program)
    assert report.refetch <= 1.02


def test_a_decode_row_against_a_transposed_weight_runs_as_dots_on_the_sfp_when_that_is_faster():
    """One row against W (n, k) row-major: each output is a dot of a contiguous row of W with x,
    so the reduction family's plan reads W once and needs none of the PE plan's on-chip transposes
    of W; the matmul family times both whole and keeps the faster (the k/v projection: 0.62 us
    against the split-k PE plan's 0.74 us). Not for x @ W (a column of W per output)."""
    kernel = matmul_kernel(1, 256, 128, transposed_b=True)
    chosen, pe = plan_kernel(kernel), plan_matmul(kernel)
    assert chosen.plans.family == "reduction"
    assert estimate(chosen.program).simulated_ns < 0.9 * estimate(pe.program).simulated_ns
    report = estimate(chosen.program)  # W read once; x (512 B) by each core
    assert report.bytes_read <= 128 * 256 * 2 + report.cores_used * 256 * 2
    assert plan_kernel(matmul_kernel(1, 256, 128)).plans.family == "matmul"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_decode_projection_as_dots_matches_the_cpu(dtype):
    torch.manual_seed(3)
    x, w = torch.randn(1, 256).to(dtype), torch.randn(128, 256).to(dtype)
    (out,), _, records, _, code = compile_on_spyre(F.linear, x, w)
    assert_on_card(records, code)
    ref = x.double() @ w.double().t()
    check(out.cpu(), ref, matmul_bound(x, w.t(), ref, dtype), f"{dtype} decode x @ W.t() as dots")


@pytest.mark.parametrize("mkn", [(512, 1024, 1024), (1, 4096, 4096), (128, 4096, 128)])
def test_plans_with_a_block_for_every_core_or_many_rows_do_not_split(mkn):
    compiled = plan_kernel(matmul_kernel(*mkn))
    assert compiled.plans.stage("grid").gk == 1
    assert compiled.plans.tile_kernel.combine is None
    assert not compiled.plans.tile_kernel.with_role(Role.RING_LANDING)


def _split_plans(records):
    plans = [json.loads((r.artifact / "plan.json").read_text()) for r in matmul_records(records)]
    return [p["grid"]["gk"] for p in plans]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("M", [1, 8, 64])
def test_split_k_linear_with_bias_and_activation_matches_the_cpu(M, dtype):
    torch.manual_seed(M)
    x, w, bias = torch.randn(M, 1024).to(dtype), torch.randn(128, 1024).to(dtype), torch.randn(128).to(dtype)

    def fn(x, w, bias):
        return torch.relu(F.linear(x, w, bias))

    (out,), _, records, _, code = compile_on_spyre(fn, x, w, bias)
    assert_on_card(records, code)
    assert all(gk > 1 for gk in _split_plans(records)), _split_plans(records)
    assert out.dtype == dtype
    ref = torch.relu(x.double() @ w.double().t() + bias.double())
    check(out.cpu(), ref, matmul_bound(x, w.t(), ref, dtype, epilogue=True), f"{dtype} M={M}")


def test_split_k_over_a_symbolic_number_of_rows():
    # planned per size bucket at launch: the reports show the chain (the card's 32 cores, partials
    # on the ring) where no plain grid could use them (a few rows by 4 column blocks of fp32)
    torch.manual_seed(7)
    w = torch.randn(1024, 128)
    torch._dynamo.reset()
    ws = w.to("spyre")
    fn = torch.compile(lambda x, w: x @ w, dynamic=True)
    for M in (3, 9, 40):
        x = torch.randn(M, 1024)
        torch.spyre.synchronize()
        torch.spyre.reset_kernel_reports()
        out = fn(x.to("spyre"), ws)
        torch.spyre.synchronize()
        ref = x.double() @ w.double()
        check(out.cpu(), ref, matmul_bound(x, w, ref, torch.float32), f"M={M}")
        [report] = torch.spyre.kernel_reports()
        if M < 10:
            assert report.cores_used == 32 and report.ring_bytes > 0, (M, report.cores_used, report.ring_bytes)
