"""Pointwise kernels whose producer and consumer disagree on the stick dim (issue 16, relayout on chip).

``x.t().contiguous()``: the load walks dim 0 contiguously, the store dim 1.
The pointwise layout takes the stick dim from one side and the row dim from
the other and moves the disagreeing access as rows of whole sticks along its
own contiguous dim, through a TRANSPOSED staging tile the load/store unit
transposes on chip (layout.py, fusion.py, codegen.py). Before, such a kernel
moved one element per stick (64x the bytes). The one-element-per-stick
layout stays only for accesses no pair of dims serves, charged for every
stick it moves.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from inductor_helpers import compile_on_spyre
from pointwise_ir import KernelBuilder
from spyre_inductor.compiler.backend import compile_kernel, plan_kernel
from spyre_inductor.compiler.ir.errors import PlanError
from spyre_inductor.compiler.core.fusion import plan_fusion
from spyre_inductor.compiler.core.layout import plan_layout
from spyre_inductor.compiler.core.scratchpad import plan_scratchpad
from spyre_inductor.compiler.core.tiles import Relayout, Role
from spyre_inductor.compiler.core.tiling import plan_tiling
from spyre_inductor.compiler.core.verify import verify
from spyre_runtime.launch import launch_jobplan
from spyre_runtime.prepare import prepare_kernel
from spyre_runtime.program.timing import estimate

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@pytest.fixture(autouse=True)
def strict(monkeypatch):
    monkeypatch.setenv("SPYRE_STRICT", "1")


def _rand(shape, dtype=torch.float32, seed=0):
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * 3).to(dtype)


def _compiled(fn, *args):
    """(outputs, the plan.json of every compiled kernel); nothing may fall back to the CPU."""
    out, _, records, warned, _ = compile_on_spyre(fn, *args)
    assert not warned
    plans = [json.loads((r.artifact / "plan.json").read_text()) for r in records if r.kernel is not None]
    assert plans and all(r.artifact is not None for r in records if r.kernel is not None)
    return out, plans


def _staged(plan) -> list[dict]:
    return [t for t in plan["tile_kernel"]["tiles"] if t["role"] == "staging"]


def _assert_transposed(plan) -> None:
    assert plan["family"] == "pointwise" and plan["layout"]["relayout"] == "transposed"
    assert plan["layout"]["stick_dim"] is not None
    staged = _staged(plan)
    assert staged and all(t["relayout"] == "transposed" for t in staged)
    assert any("transposed on chip" in n for n in plan["tile_kernel"]["notes"])


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("shape", [(128, 192), (67, 130)])
def test_a_transpose_is_exact_and_staged_on_chip(dtype, shape):
    x = _rand(shape, DTYPES[dtype])
    (out,), (plan,) = _compiled(lambda a: a.t().contiguous(), x)
    assert torch.equal(out.cpu(), x.t().contiguous())
    _assert_transposed(plan)


def test_a_transpose_fused_with_pointwise_math_is_one_kernel():
    a, b = _rand((96, 200), seed=1), _rand((200, 96), seed=2)
    fn = lambda x, y: torch.relu(x.t() * 2.0 + y).contiguous()  # noqa: E731
    (out,), plans = _compiled(fn, a, b)
    assert len(plans) == 1
    _assert_transposed(plans[0])
    assert torch.equal(out.cpu(), fn(a, b))  # the same fp32 ops in the same order: exact


def test_a_transpose_computed_in_fp32_rounds_once_to_fp16():
    x = _rand((70, 140), torch.float16, seed=3)
    fn = lambda a: (torch.sigmoid(a.t().float()) * 3.0).half().contiguous()  # noqa: E731
    (out,), (plan,) = _compiled(fn, x)
    _assert_transposed(plan)
    torch.testing.assert_close(out.cpu(), fn(x), rtol=2.0 ** -10, atol=1e-6)


@pytest.mark.parametrize("shape, dims, relayout", [
    ((5, 67, 130), (2, 0, 1), "transposed"),
    ((3, 40, 66), (0, 2, 1), "transposed"),        # batched transpose: dim 0 a loop around it
    ((2, 70, 5, 13), (0, 2, 3, 1), "transposed"),  # NCHW -> NHWC
    ((1, 64, 8, 128), (0, 2, 1, 3), "sticks"),     # attention's head permute: the last dim agrees
])
def test_permutes_are_exact(shape, dims, relayout):
    x = _rand(shape, torch.float16, seed=4)
    (out,), (plan,) = _compiled(lambda a: a.permute(*dims).contiguous(), x)
    assert torch.equal(out.cpu(), x.permute(*dims).contiguous())
    assert plan["layout"]["relayout"] == relayout
    if relayout == "transposed":
        _assert_transposed(plan)
    else:
        assert not _staged(plan)


def test_reductions_and_matmuls_over_a_transposed_operand_still_compile():
    x, w = _rand((64, 96), seed=5), _rand((80, 96), seed=6)
    (s,), _ = _compiled(lambda a: (a.t() * 2.0).sum(-1), x)
    torch.testing.assert_close(s.cpu(), (x.t() * 2.0).sum(-1), rtol=1e-5, atol=1e-5)
    (m,), _ = _compiled(lambda a, b: a @ b.t(), x, w)
    torch.testing.assert_close(m.cpu(), x @ w.t(), rtol=1e-4, atol=1e-4)


# ---- hand-built kernels: the planner's choices and edges -------------------------------------


def _transpose_kernel(rows, cols, dtype="fp16"):
    """out[i, j] = x[j, i]: out (rows, cols), x (cols, rows), both contiguous."""
    k = KernelBuilder(f"t_{rows}x{cols}", (rows, cols))
    k.buffer("x", dtype, (cols, rows))
    k.buffer("out", dtype, (rows, cols))
    k.store("out", k.load("x", (1, rows)))
    return k.build()


def _launch(kernel, root, *tensors, **options):
    plan = prepare_kernel(compile_kernel(kernel, root, **options))
    dev = [t.to("spyre") for t in tensors]
    launch_jobplan(plan, dev)
    torch.spyre.synchronize()
    return [d.cpu() for d in dev]


@pytest.mark.parametrize("rows, cols, cores", [
    (300, 700, 3),   # the stick dim in chunks, the row dim in blocks of 64: a short last block
    (67, 130, 2),    # whole rows, streamed in 64 rows and a remainder of 3
    (200, 520, 32),  # more cores than blocks of rows
])
def test_blocks_chunks_and_ragged_shares_are_exact(tmp_path, rows, cols, cores):
    x = _rand((cols, rows), torch.float16, seed=7)
    _, out = _launch(_transpose_kernel(rows, cols), tmp_path, x, torch.zeros(rows, cols, dtype=torch.float16),
                     cores=cores)
    assert torch.equal(out, x.t())


def test_the_pair_transposing_fewest_bytes_wins():
    # out = x + y + z, x contiguous, y and z transposed: staging y and z beats staging x and out
    k = KernelBuilder("pair", (64, 96))
    k.buffer("x", "fp32", (64, 96))
    k.buffer("y", "fp32", (96, 64))
    k.buffer("z", "fp16", (96, 64))
    k.buffer("out", "fp32", (64, 96), (1, 64))
    v = k.op("add", k.op("add", k.load("x"), k.load("y", (1, 64))), k.cast(k.load("z", (1, 64)), "fp32"))
    k.store("out", v, (1, 64))
    lay = plan_layout(k.build())
    assert lay.relayout == "transposed" and (lay.stick_dim, lay.row_dim) == (0, 1)
    assert [(a.buffer, a.transposed) for a in lay.accesses()] == [
        ("x", True), ("y", False), ("z", False), ("out", False)]


def test_the_elements_layout_is_the_last_resort_and_is_charged_every_stick(tmp_path):
    # three accesses contiguous in three different dims: no pair of dims serves them all
    shape = (40, 33, 70)
    k = KernelBuilder("three_ways", shape)
    k.buffer("x", "fp32", (33, 70, 40))   # x[j, k, i]: contiguous along i
    k.buffer("y", "fp32", (40, 70, 33))   # y[i, k, j]: contiguous along j
    k.buffer("out", "fp32", shape)        # contiguous along k
    k.store("out", k.op("add", k.load("x", (1, 70 * 40, 40)), k.load("y", (70 * 33, 1, 33))))
    kernel = k.build()
    lay = plan_layout(kernel)
    assert lay.relayout == "elements" and lay.stick_dim is None and "no pair" in lay.reason
    x, y = _rand((33, 70, 40), seed=8), _rand((40, 70, 33), seed=9)
    *_, out = _launch(kernel, tmp_path, x, y, torch.zeros(shape))
    assert torch.equal(out, x.permute(2, 0, 1) + y.permute(0, 2, 1))
    report = estimate(plan_kernel(kernel).program)
    n = 40 * 33 * 70
    assert (report.bytes_read, report.bytes_written) == (2 * n * 128, n * 128)  # one whole stick per element


def test_the_plan_records_the_relayout_and_why():
    compiled = plan_kernel(_transpose_kernel(256, 512))
    described = compiled.plans.describe()
    assert described["layout"]["relayout"] == "transposed"
    assert "the load of 'x'" in described["layout"]["reason"]
    (st,) = compiled.plans.tile_kernel.with_role(Role.STAGING)
    assert st.relayout is Relayout.TRANSPOSED and compiled.plans.tile_kernel.tile(st.of).role is Role.INPUT
    assert "transposed relayout" in compiled.program.notes


def test_a_staging_tile_that_splits_sticks_is_a_planner_bug():
    kernel = _transpose_kernel(256, 512)
    layout = plan_layout(kernel)
    tk = plan_fusion(kernel, layout)
    placement, tiling = plan_scratchpad(tk, plan_tiling(layout, tk))
    verify(tk, tiling, placement)
    bad = dataclasses.replace(tiling, tile_rows=48)  # 48 fp16 rows: a staging row of 96 bytes
    placement, bad = plan_scratchpad(tk, bad)
    with pytest.raises(PlanError, match="split sticks"):
        verify(tk, bad, placement)


def test_the_4096_square_transpose_runs_near_its_bandwidth_roofline():
    report = estimate(plan_kernel(_transpose_kernel(4096, 4096)).program)
    assert report.bytes_moved == report.minimum_bytes == 2 * 4096 * 4096 * 2
    assert report.efficiency >= 0.85, report.describe()
