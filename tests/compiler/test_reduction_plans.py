"""Plan tests for reduction kernels: what the planner promises, checked on the compiled program's report."""

from __future__ import annotations

from dataclasses import replace

import pytest

from reduction_ir import layer_norm_kernel, row_reduce, softmax_kernel
from spyre_inductor.compiler.backend import plan_kernel
from spyre_inductor.compiler.ir.errors import PlanError
from spyre_inductor.compiler.families.reduction.plan import verify_reduction
from spyre_inductor.compiler.core.tiles import Role
from spyre_runtime.program.timing import estimate


def test_softmax_512x1024_fp16_reads_the_input_once_and_writes_the_output_once():
    c = plan_kernel(softmax_kernel((512, 1024), "fp16"))
    r = estimate(c.program)
    assert c.plans.stage("plan").mode == "resident" and c.plans.stage("plan").passes == 1
    assert r.bytes_read == 512 * 1024 * 2      # whole sticks, each once
    assert r.bytes_written == 512 * 1024 * 2
    assert r.efficiency > 0.9


def test_layer_norm_4096_fp16_reads_the_input_once_and_writes_the_output_once():
    c = plan_kernel(layer_norm_kernel((4096, 4096), "fp16"))
    r = estimate(c.program)
    cores = c.plans.division.cores
    assert c.plans.stage("plan").mode == "resident" and c.plans.stage("plan").passes == 1
    # x once; weight and bias once per core (pinned in scratchpad for all of its rows)
    assert r.bytes_read == 4096 * 4096 * 2 + cores * 2 * 4096 * 2
    assert r.bytes_written == 4096 * 4096 * 2
    assert r.efficiency > 0.9


def test_full_reduction_is_split_across_cores_over_the_ring():
    c = plan_kernel(row_reduce("sum", (1 << 20,), 0, "fp32"))
    r = estimate(c.program)
    assert c.plans.stage("plan").mode == "ring" and c.plans.division.cores > 1
    assert r.ring_bytes > 0
    assert all(s.role != "temp" for s in c.program.symbols)  # partials never touch device memory
    assert r.bytes_written == 128                              # one stick: the scalar result


def test_rows_that_do_not_fit_make_passes_and_say_why():
    c = plan_kernel(softmax_kernel((3, 300_000), "fp32"))
    plan = c.plans.stage("plan")
    assert plan.mode == "chunked" and plan.passes == 3
    assert "level-1" in plan.pass_reasons[0] and "level-2" in plan.pass_reasons[1]
    assert "epilogue" in plan.pass_reasons[2]
    r = estimate(c.program)
    assert r.bytes_read >= 3 * 3 * 300_000 * 4 and r.bytes_written == 3 * 300_000 * 4
    c = plan_kernel(layer_norm_kernel((3, 300_000), "fp32"))
    assert c.plans.stage("plan").passes == 2  # Chan-combined welford in one pass, the normalisation in another


def test_sum_over_dim0_is_timed_in_both_orientations_and_reads_its_input_once():
    """The reduced dim is not the contiguous one: row tiles move x transposed (through the load/store
    unit's on-chip transpose), column tiles move it as it lies and fold rows; the timing model picks."""
    c = plan_kernel(row_reduce("sum", (512, 1024), 0, "fp16"))
    labels = [label for label, _ in c.plans.division.candidates]
    assert any(label.startswith("resident columns") for label in labels)
    assert any(label.startswith("resident ") and "columns" not in label for label in labels)
    best = {cols: min(ns for label, ns in c.plans.division.candidates
                      if label.startswith("resident") and ("columns" in label) == cols) for cols in (False, True)}
    low = c.plans.stage("lowering")
    assert low.columns == (best[True] < best[False]) and not low.transposed
    assert estimate(c.program).bytes_read == 512 * 1024 * 2


def test_the_verifier_rejects_overlapping_accumulators():
    c = plan_kernel(softmax_kernel((64, 256), "fp32"))
    plan, low = c.plans.stage("plan"), c.plans.stage("lowering")
    tk = c.plans.tile_kernel
    accs = [a for a in plan.placement.allocations if tk.tile(a.tile).role is Role.ACCUMULATOR]
    bad = replace(plan, placement=replace(plan.placement, allocations=tuple(
        replace(a, offset=accs[0].offset) if a is accs[1] else a for a in plan.placement.allocations)))
    with pytest.raises(PlanError, match="overlap"):
        verify_reduction(bad, low)


def test_an_int64_constant_beyond_int32_stays_int64_not_wrapped():
    from spyre_inductor.compiler.backend import plan_kernel
    from spyre_inductor.compiler.ir.kernel_ir import Buffer, Constant, Index, Kernel, Load, Op, Reduction, Store

    k = Kernel.of("big", (4,), (Buffer("x", "int64", (4, 64), (64, 1)), Buffer("out", "int64", (4,), (1,))),
                        (Load("x", Index((64, 1)), "int64"), Constant(2 ** 40, "int64"),
                         Op("mul", (0, 1), "int64"), Reduction("sum", 2, "int64")),
                        (Store("out", Index((1, 0)), 3),), (64,))
    tk = plan_kernel(k).plans.tile_kernel
    [(name, value)] = tk.constants
    assert value == 2 ** 40 and tk.tile(name).dtype == "int64"
    assert all(t.dtype == "int64" for t in tk.tiles  # exact: nothing narrowed
               if t.role in (Role.ACCUMULATOR, Role.CARRY, Role.TEMPORARY))
