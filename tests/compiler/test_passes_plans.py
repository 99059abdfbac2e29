"""Each planning pass alone, on hand-built kernel IR: results that can be wrong, checked."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch

from pointwise_ir import KernelBuilder, binary_kernel, unary_kernel
from spyre_inductor.compiler.backend import compile_kernel, plan_kernel
from spyre_inductor.compiler.ir.errors import Unsupported
from spyre_inductor.compiler.ir.errors import PlanError
from spyre_inductor.compiler.core.division import choose_division, divide, simulated_ns, split_dim
from spyre_inductor.compiler.core.fusion import plan_fusion
from spyre_inductor.compiler.core.layout import plan_layout
from spyre_inductor.compiler.core.scratchpad import plan_scratchpad
from spyre_inductor.compiler.core.tiles import PhaseKind, Role
from spyre_inductor.compiler.core.tiling import plan_tiling
from spyre_inductor.compiler.core.verify import verify
from spyre_runtime.hardware import HARDWARE
from spyre_runtime.launch import launch_jobplan
from spyre_runtime.prepare import prepare_kernel
from spyre_runtime.program.run import kernel_reports, reset_kernel_reports


def chain5(shape=(67, 71), dtype="fp16"):
    """relu(sigmoid(x * y + 1) - 0.5) * 2: five ops, two inputs, one output."""
    k = KernelBuilder(f"chain5_{dtype}", shape)
    for name in ("x", "y", "out"):
        k.buffer(name, dtype, shape)
    x, y = k.cast(k.load("x"), "fp32"), k.cast(k.load("y"), "fp32")
    v = k.op("add", k.op("mul", x, y), k.const(1.0))
    v = k.op("mul", k.op("relu", k.op("sub", k.op("sigmoid", v), k.const(0.5))), k.const(2.0))
    k.store("out", k.cast(v, dtype))
    return k.build()


# ---- layout -----------------------------------------------------------------------------


def test_layout_merges_contiguous_dims_and_keeps_graph_layouts():
    lay = plan_layout(binary_kernel("add", (4, 67, 71), "fp16"))
    assert lay.ranges == (4 * 67 * 71,) and lay.dim_map == ((0, 1, 2),) and lay.stick_dim == 0
    assert [(b.name, b.layout, b.strides) for b in lay.buffers] == [
        ("x", "strided", (67 * 71, 71, 1)), ("y", "strided", (67 * 71, 71, 1)), ("out", "strided", (67 * 71, 71, 1))]
    # fp16 loads stay fp16 on chip (64 per stick); the fp32 result is an fp32 tile (32 per stick)
    assert {v.dtype: v.elems_per_stick for v in lay.values} == {"fp16": 64, "fp32": 32}


def test_layout_broadcast_keeps_dims_and_transpose_is_staged_on_chip():
    lay = plan_layout(binary_kernel("add", (67, 71), "fp32", y_shape=(71,)))
    assert lay.ranges == (67, 71) and lay.stick_dim == 1 and lay.row_dim == 0 and lay.relayout == "sticks"
    k = KernelBuilder("t", (40, 90))
    k.buffer("x", "fp32", (90, 40))
    k.buffer("out", "fp32", (40, 90))
    k.store("out", k.op("neg", k.load("x", (1, 40))))
    lay = plan_layout(k.build())
    # the store's contiguous dim is the stick dim, the load moves along its own and is transposed
    assert (lay.relayout, lay.stick_dim, lay.row_dim) == ("transposed", 1, 0)
    assert [a.transposed for a in lay.accesses()] == [True, False]


def test_int64_is_computed_in_int64_and_narrow_integers_in_int32():
    # issue 9: int64 stays exact, so its values get int64 tiles (never int32)
    k = KernelBuilder("i64", (8,))
    k.buffer("x", "int64", (8,))
    k.buffer("out", "int64", (8,))
    k.store("out", k.op("add", k.load("x"), k.load("x"), dtype="int64"))
    kernel = k.build()
    tk = plan_fusion(kernel, plan_layout(kernel))
    assert {t.dtype for t in tk.tiles} == {"int64"}
    k = KernelBuilder("i16", (8,))
    k.buffer("x", "int16", (8,))
    k.buffer("out", "int16", (8,))
    k.store("out", k.op("add", k.load("x"), k.load("x"), dtype="int16"))
    kernel = k.build()
    tk = plan_fusion(kernel, plan_layout(kernel))  # issue 16: int16 and uint8 tiles exist
    # int16 tiles hold the input and the sum (the sfp computes in int32 and wraps on the write)
    assert [(t.dtype, t.role) for t in tk.tiles] == [("int16", Role.INPUT), ("int16", Role.OUTPUT)]
    plan_kernel(kernel)
    k = KernelBuilder("bits", (8,))
    k.buffer("x", "fp32", (8,))
    k.buffer("out", "fp32", (8,))
    k.store("out", k.op("bitwise_and", k.load("x"), k.load("x"), dtype="fp32"))
    with pytest.raises(Unsupported, match="bitwise_and"):
        plan_kernel(k.build())


# ---- fusion -----------------------------------------------------------------------------


def test_fusion_reads_each_input_once_and_rounds_only_at_the_store():
    kernel = chain5()
    tk = plan_fusion(kernel, plan_layout(kernel))
    chunk = tk.phase(PhaseKind.CHUNK)
    assert [p.kind for p in tk.phases] == [PhaseKind.CHUNK]  # one phase: per tile, load, compute, store
    assert [a.buffer for _, a in chunk.loads] == ["x", "y"]
    assert [a.buffer for _, a in chunk.stores] == ["out"]
    roles = {t.name: (t.role, t.dtype) for t in tk.tiles}
    work = tk.with_role(Role.TEMPORARY)
    assert work and all(t.dtype == "fp32" for t in work)  # fused intermediates stay fp32
    (out_tile, _), = chunk.stores
    assert roles[out_tile] == (Role.OUTPUT, "fp16")
    assert chunk.steps[-1].op == "copy" and chunk.steps[-1].dst == out_tile  # the one rounding
    assert [s.op for s in chunk.steps] == ["mul", "add", "sigmoid", "sub", "relu", "mul", "copy"]


def test_fusion_dedupes_loads_and_aliases_widening_casts():
    k = KernelBuilder("dup", (64,))
    k.buffer("x", "fp16", (64,))
    k.buffer("out", "fp32", (64,))
    a, b = k.cast(k.load("x"), "fp32"), k.cast(k.load("x"), "fp32")
    k.store("out", k.op("mul", a, b))
    kernel = k.build()
    chunk = plan_fusion(kernel, plan_layout(kernel)).phase(PhaseKind.CHUNK)
    assert len(chunk.loads) == 1
    assert [s.op for s in chunk.steps] == ["mul"]  # no copies for fp16 -> fp32


# ---- tiling and scratchpad -------------------------------------------------------------


def test_tiles_are_stick_aligned_chunks_and_fit_the_scratchpad():
    kernel = binary_kernel("add", (100003,), "fp16")
    lay = plan_layout(kernel)
    tk = plan_fusion(kernel, lay)
    tiling = plan_tiling(lay, tk)
    assert tiling.stream_dim == 0 and tiling.tile_cols % 64 == 0 and tiling.tile_cols * 2 == 32 * 1024
    spad, tiling = plan_scratchpad(tk, tiling)
    assert spad.high_water <= HARDWARE.scratchpad_usable_bytes
    assert all(a.offset % 128 == 0 for a in spad.allocations)
    streamed = {a.tile for a in spad.allocations if a.copy is not None}
    assert streamed == {t.name for t in tk.tiles if t.role in (Role.INPUT, Role.OUTPUT)}  # loaded or stored
    verify(tk, tiling, spad)


def test_scratchpad_shrinks_tiles_that_do_not_fit():
    kernel = chain5((64, 4096), "fp32")
    lay = plan_layout(kernel)
    tk = plan_fusion(kernel, lay)
    big = dataclasses.replace(plan_tiling(lay, tk), tile_rows=64, tile_cols=4096)
    spad, tiling = plan_scratchpad(tk, big, usable=HARDWARE.scratchpad_usable_bytes)
    assert tiling.tile_rows * tiling.tile_cols < 64 * 4096
    assert spad.high_water <= spad.usable
    verify(tk, tiling, spad)


def test_work_tiles_share_bytes_when_their_live_ranges_do_not_overlap():
    kernel = chain5((64, 64), "fp32")
    lay = plan_layout(kernel)
    tk = plan_fusion(kernel, lay)
    spad, _ = plan_scratchpad(tk, plan_tiling(lay, tk))
    work = [a for a in spad.allocations if a.live is not None]
    assert len({a.offset for a in work}) < len(work)


def test_verifier_rejects_an_overlapping_plan_naming_the_buffers():
    kernel = chain5()
    lay = plan_layout(kernel)
    tk = plan_fusion(kernel, lay)
    spad, tiling = plan_scratchpad(tk, plan_tiling(lay, tk))
    x, y = (t.name for t in tk.with_role(Role.INPUT))
    allocs = list(spad.allocations)
    i = next(k for k, a in enumerate(allocs) if (a.tile, a.copy) == (x, 1))
    allocs[i] = dataclasses.replace(allocs[i], offset=spad.at(y, 0).offset)  # x[1] on top of y[0]
    x1, y0 = re.escape(f"{x}[1]"), re.escape(f"{y}[0]")
    with pytest.raises(PlanError, match=f"{x1}.*{y0}|{y0}.*{x1}"):
        verify(tk, tiling, dataclasses.replace(spad, allocations=tuple(allocs)))
    allocs = list(spad.allocations)
    allocs[0] = dataclasses.replace(allocs[0], offset=spad.usable)
    with pytest.raises(PlanError, match="outside the usable"):
        verify(tk, tiling, dataclasses.replace(spad, allocations=tuple(allocs)))
    allocs = list(spad.allocations)
    allocs[0] = dataclasses.replace(allocs[0], offset=allocs[0].offset + 64)
    with pytest.raises(PlanError, match="stick"):
        verify(tk, tiling, dataclasses.replace(spad, allocations=tuple(allocs)))
    # A planner that claims a larger usable scratchpad than the hardware's is held to the hardware.
    with pytest.raises(PlanError, match="outside the usable"):
        big = dataclasses.replace(spad, usable=spad.usable * 2)
        allocs = list(big.allocations)
        allocs[0] = dataclasses.replace(allocs[0], offset=spad.usable)
        verify(tk, tiling, dataclasses.replace(big, allocations=tuple(allocs)))


def test_verifier_rejects_a_tile_whose_rows_overlap_each_other():
    kernel = KernelBuilder("rows", (16, 200))  # slices of (16, 256): the dims cannot merge into one row
    kernel.buffer("x", "fp32", (16, 200), strides=(256, 1))
    kernel.buffer("out", "fp32", (16, 200), strides=(256, 1))
    kernel.store("out", kernel.op("exp", kernel.load("x", strides=(256, 1))))
    kernel = kernel.build()
    lay = plan_layout(kernel)
    tk = plan_fusion(kernel, lay)
    spad, tiling = plan_scratchpad(tk, plan_tiling(lay, tk))
    multi = [a for a in spad.allocations if a.nbytes > a.row_stride]  # tiles of several rows
    assert multi, "the plan should tile several rows at once"
    bad = dataclasses.replace(multi[0], row_stride=128)
    allocs = tuple(bad if a is multi[0] else a for a in spad.allocations)
    with pytest.raises(PlanError, match=f"{re.escape(bad.name)} has a row stride of 128 B"):
        verify(tk, tiling, dataclasses.replace(spad, allocations=allocs))


# ---- division -----------------------------------------------------------------------------


def test_tiny_add_uses_one_core_and_is_not_slower_than_32():
    kernel = binary_kernel("add", (1, 64), "fp32")
    chosen = plan_kernel(kernel)
    forced = plan_kernel(kernel, cores=32)
    assert chosen.plans.division.cores == 1
    assert forced.plans.division.cores == 32
    assert simulated_ns(chosen.program) <= simulated_ns(forced.program)


def test_large_add_uses_many_cores_split_on_stick_boundaries():
    compiled = plan_kernel(binary_kernel("add", (512, 1024), "fp16"))
    division = compiled.plans.division
    assert division.cores >= 8
    dim, granule = split_dim(compiled.plans.stage("tiling"))
    assert division.split == f"dim {dim} in units of {granule}"  # the split the division made
    starts = [s.starts[dim] for s in division.shares]
    assert all(s % granule == 0 for s in starts) and granule == 64
    counts = [s.counts[dim] for s in division.shares]
    assert max(counts) - min(counts) <= granule  # balanced
    assert sum(counts) == compiled.plans.stage("layout").ranges[dim]


def test_division_takes_the_fastest_candidate_and_ties_go_to_fewer_cores():
    kernel = binary_kernel("add", (4096,), "fp32")
    lay = plan_layout(kernel)
    tk = plan_fusion(kernel, lay)
    _, tiling = plan_scratchpad(tk, plan_tiling(lay, tk))
    fake = {1: 10000.0, 2: 5000.0, 4: 4990.0, 8: 8000.0}
    plan = choose_division(tiling, lambda d: d.cores, estimate=lambda n: fake.get(n, 1e9))
    assert plan.cores == 2 and dict(plan.candidates)["4 core(s)"] == 4990.0 and plan.ns == 5000.0
    fake = {1: 2000.0, 2: 1000.0, 4: 500.0}
    assert choose_division(tiling, lambda d: d.cores, estimate=lambda n: fake.get(n, 1e9)).cores == 4
    assert divide(tiling, 3).cores == 3


# ---- emission -----------------------------------------------------------------------------


def test_artifact_is_complete_and_content_addressed(tmp_path):
    kernel = chain5()
    d1 = compile_kernel(kernel, tmp_path)
    renamed = dataclasses.replace(kernel, name="other_name")
    assert compile_kernel(renamed, tmp_path) == d1  # identical kernels reuse the artifact
    assert compile_kernel(kernel, tmp_path, cores=1) != d1
    names = {p.name for p in d1.iterdir()}
    assert {"program.json", "listing.txt", "execution_plan.json", "symbols.json", "launch_spec.json",
            "plan.json", "kernel.json", "summary.txt", "call.py"} <= names
    spec = json.loads((d1 / "launch_spec.json").read_text())
    assert [(a["name"], a["role"], a["dtype"], a["shape"], a["stride"]) for a in spec["args"]] == [
        ("x", "input", "fp16", [67, 71], [71, 1]), ("y", "input", "fp16", [67, 71], [71, 1]),
        ("out", "output", "fp16", [67, 71], [71, 1])]
    symbols = json.loads((d1 / "symbols.json").read_text())["symbols"]
    assert [s["role"] for s in symbols] == ["input", "input", "output"]
    steps = [s["kind"] for s in json.loads((d1 / "execution_plan.json").read_text())["steps"]]
    assert steps == ["host_callback", "transfer", "barrier", "compute"]
    plan = json.loads((d1 / "plan.json").read_text())
    assert set(plan) == {"family", "buffers", "tile_kernel", "layout", "tiling", "scratchpad", "division"}
    assert plan["family"] == "pointwise"
    assert "core 0" in (d1 / "listing.txt").read_text()


def test_five_op_chain_is_one_program_reading_inputs_once_writing_output_once(tmp_path):
    shape = (256, 1024)
    kernel = chain5(shape, "fp16")
    plan = prepare_kernel(compile_kernel(kernel, tmp_path))
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randn(shape, generator=g).half() for _ in range(2))
    out = torch.empty(shape, dtype=torch.float16, device="spyre")
    torch.spyre.synchronize()
    reset_kernel_reports()
    launch_jobplan(plan, [x.to("spyre"), y.to("spyre"), out])
    torch.spyre.synchronize()
    reports = kernel_reports()
    assert len(reports) == 1
    nbytes = x.numel() * 2
    assert reports[0].bytes_read == 2 * nbytes and reports[0].bytes_written == nbytes
    want = (torch.relu(torch.sigmoid(x.float() * y.float() + 1) - 0.5) * 2).half()
    torch.testing.assert_close(out.cpu(), want, rtol=2.0 ** -10, atol=1e-5)  # one fp16 ulp: the single rounding at the store


def test_unsupported_never_writes_an_artifact(tmp_path):
    k = KernelBuilder("bad", (8,))
    k.buffer("x", "fp32", (8,))
    k.buffer("out", "fp32", (8,))
    k.store("out", k.load("x", offset=4))  # reads past the end of x
    with pytest.raises(Unsupported, match="reaches elements"):
        compile_kernel(k.build(), tmp_path)
    assert not any(p.name.endswith("launch_spec.json") for p in tmp_path.rglob("*"))


def test_dead_values_are_dropped():
    k = KernelBuilder("dead", (64,))
    k.buffer("x", "fp32", (64,))
    k.buffer("out", "fp32", (64,))
    x = k.load("x")
    k.op("exp", x)  # never stored
    k.store("out", k.op("neg", x))
    tk = plan_kernel(k.build()).plans.tile_kernel
    assert [s.op for s in tk.phase(PhaseKind.CHUNK).steps] == ["neg"]


def test_unary_kernel_plan_describes_as_json():
    compiled = plan_kernel(unary_kernel("exp", (3, 255), "fp32"))
    json.dumps(compiled.plans.describe())


@pytest.mark.parametrize("kwargs,match", [
    ({"cores": 2.0}, "cores must be an integer in 1..32, got 2.0"),
    ({"max_cores": True}, "max_cores must be an integer"),
    ({"cores": 8, "max_cores": 4}, r"cores \(8\) exceeds max_cores \(4\)"),
])
def test_core_counts_are_checked_naming_the_argument(kwargs, match):
    from spyre_inductor.compiler.backend import plan_kernel

    with pytest.raises(ValueError, match=match):
        plan_kernel(binary_kernel("add", (64,), "fp32"), **kwargs)
