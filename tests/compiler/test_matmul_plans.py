"""The matmul family's plans, without Inductor: what the planner decides for kernel IR it is handed.

Each test builds a MatmulKernel (sum over k of a[m, k] * b[k, n], Inductor's native-matmul form)
and checks one decision: the tile kernel's roles and spaces, that x @ W.t() moves W once in its own
layout and transposes it on chip (no temporary in device memory), that a decode-shaped matmul uses
every core, that a plan re-reading an operand shares it over the ring instead, that a planner bug
raises PlanError, and that a slice wider than the per-core addressable span is refused by name.
"""

from __future__ import annotations

import dataclasses

import pytest

from spyre_inductor.compiler.backend import plan_kernel
from spyre_inductor.compiler.ir.errors import PlanError, Unsupported
from spyre_inductor.compiler.ir.kernel_ir import Buffer, Constant, Index, Kernel, Load, MatmulKernel, Op, Reduction, Store
from spyre_inductor.compiler.core.allocate import check_needs
from spyre_inductor.compiler.families.matmul.planner import plan_matmul
from spyre_inductor.compiler.families.matmul.plan import tile_needs
from spyre_inductor.compiler.core.tiles import Relayout, Role
from spyre_runtime.program.isa import Load as LoadInstr
from spyre_runtime.program.isa import Transpose
from spyre_runtime.program.timing import estimate


def matmul_kernel(M, K, N, dtype="fp16", transposed_b=False, bias=False) -> MatmulKernel:
    b_shape, b_index = ((N, K), Index((0, K, 1))) if transposed_b else ((K, N), Index((0, 1, N)))
    buffers = [Buffer("a", dtype, (M, K), (K, 1)), Buffer("w", dtype, b_shape, (K, 1) if transposed_b else (N, 1))]
    values = [Load("a", Index((K, 0, 1)), dtype), Load("w", b_index, dtype), Op("mul", (0, 1), "fp32"),
              Reduction("dot", 2, "fp32")]
    out = 3
    if bias:
        buffers.append(Buffer("bias", dtype, (N,), (1,)))
        values += [Load("bias", Index((0, 1, 0)), dtype), Op("add", (3, 4), "fp32"), Constant(0.5, "fp32"),
                   Op("mul", (5, 6), "fp32")]
        out = 7
    buffers.append(Buffer("out", dtype, (M, N), (N, 1)))
    k = Kernel.of("mm", (M, N), buffers, values, [Store("out", Index((N, 1, 0)), out)], (K,))
    assert isinstance(k, MatmulKernel)
    return k


def loads_from(program, symbol):
    return [ins for c in program.cores for unit, instrs in c.units for ins in instrs
            if isinstance(ins, LoadInstr) and ins.src.symbol == symbol]


def test_the_tile_kernel_names_roles_and_spaces_not_strings():
    compiled = plan_kernel(matmul_kernel(64, 128, 64, bias=True))
    tk = compiled.plans.tile_kernel
    assert compiled.plans.family == "matmul" and tk.family == "matmul"
    roles = {t.name: (t.role, t.space) for t in tk.tiles}
    (a, _), (b, _) = tk.phases[0].loads
    assert roles[a] == (Role.INPUT, frozenset({"m", "k"}))
    assert roles[b] == (Role.INPUT, frozenset({"k", "n"}))
    acc = tk.with_role(Role.ACCUMULATOR)
    assert len(acc) == 1 and acc[0].dtype == "fp32" and acc[0].space == frozenset({"m", "n"})
    bias = [t for t in tk.tiles if t.role is Role.INPUT and t.name not in (a, b)]
    assert [t.space for t in bias] == [frozenset({"n"})]  # a broadcast row, loaded once per output tile
    assert [t.role for t in tk.tiles if t.role is Role.OUTPUT] == [Role.OUTPUT]
    assert tk.with_role(Role.CONSTANT)


def test_x_at_w_t_moves_w_once_and_transposes_it_on_chip():
    compiled = plan_kernel(matmul_kernel(512, 1024, 1024, transposed_b=True))
    tk, program = compiled.plans.tile_kernel, compiled.program
    staging = tk.with_role(Role.STAGING)
    assert [(t.relayout, t.of) for t in staging] == [(Relayout.TRANSPOSED, tk.phases[0].loads[1][0])]
    assert all(s.offset is None for s in program.symbols), "no temporary in device memory"
    assert any(isinstance(i, Transpose) for c in program.cores for _, instrs in c.units for i in instrs)
    moved = sum(ins.rows * -(-ins.row_bytes // 128) * 128 for ins in loads_from(program, "w"))
    assert moved == 1024 * 1024 * 2, "W is read from device memory exactly once"
    report = estimate(program)
    assert report.refetch <= 1.02


def test_x_at_w_t_costs_about_what_x_at_w_costs():
    plain = estimate(plan_kernel(matmul_kernel(512, 1024, 1024)).program).simulated_ns
    transposed = estimate(plan_kernel(matmul_kernel(512, 1024, 1024, transposed_b=True)).program).simulated_ns
    assert transposed <= 1.25 * plain, (plain, transposed)


def test_a_decode_shaped_matmul_uses_every_core():
    compiled = plan_kernel(matmul_kernel(1, 4096, 4096, transposed_b=True))
    assert compiled.plans.division.cores == 32
    assert estimate(compiled.program).refetch <= 1.02


def test_a_plan_that_would_reread_an_operand_shares_it_over_the_ring():
    compiled = plan_kernel(matmul_kernel(512, 512, 512))
    tiling = compiled.plans.stage("tiling")
    report = estimate(compiled.program)
    assert tiling.share in ("a", "b"), compiled.plans.division.reason
    assert report.refetch <= 1.02 and report.ring_bytes > 0


def test_a_small_x_at_w_t_shares_w_in_groups_each_core_transposing_its_slices():
    # 128x256x128 (a Llama prefill projection): sharing x over the ring could use only N/64 = 2
    # cores, each transposing all of its W; groups of cores sharing W's columns spread the transposes
    compiled = plan_kernel(matmul_kernel(128, 256, 128, transposed_b=True))
    grid, tiling = compiled.plans.stage("grid"), compiled.plans.stage("tiling")
    assert tiling.share == "b" and grid.gn == 2 and grid.ring == grid.gm == 4, compiled.plans.division.reason
    program = compiled.program
    moved = sum(ins.rows * -(-ins.row_bytes // 128) * 128 for ins in loads_from(program, "w"))
    assert moved == 256 * 128 * 2, "each group reads its columns of W once"
    transposing = {c.core for c in program.cores for _, instrs in c.units for i in instrs if isinstance(i, Transpose)}
    assert len(transposing) == grid.cores, "every core transposes its own slices of W"
    assert estimate(program).simulated_ns < 2_700


def test_a_placement_missing_or_shrinking_a_tile_is_a_plan_error():
    compiled = plan_kernel(matmul_kernel(64, 128, 64))
    plans = compiled.plans
    needs = tile_needs(plans.tile_kernel, plans.stage("tiling"))
    acc = plans.tile_kernel.with_role(Role.ACCUMULATOR)[0].name
    missing = dataclasses.replace(plans.placement, allocations=tuple(
        a for a in plans.placement.allocations if a.tile != acc))
    with pytest.raises(PlanError, match=acc):
        check_needs("matmul scratchpad plan", needs, missing)
    small = dataclasses.replace(plans.placement, allocations=tuple(
        dataclasses.replace(a, nbytes=a.nbytes - 128) if a.tile == acc else a for a in plans.placement.allocations))
    with pytest.raises(PlanError, match=acc):
        check_needs("matmul scratchpad plan", needs, small)


def test_a_slice_beyond_the_per_core_span_is_refused_by_name(monkeypatch):
    from spyre_runtime import hardware

    small = dataclasses.replace(hardware.HARDWARE, core_span_bytes=64 * 1024)
    monkeypatch.setattr("spyre_inductor.compiler.families.matmul.plan.HARDWARE", small)
    with pytest.raises(Unsupported, match="per-core addressable span"):
        plan_matmul(matmul_kernel(64, 4096, 64, dtype="fp32"))
